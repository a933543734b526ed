"""Operator fusion: fused builds match onnxruntime as closely as unfused ones, the
fusion report names what was fused and what blocked the rest, Concat inputs are stored in
place, elementwise chains run as pool prologues, conv nests tile for cache."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import polyml
from polyml.errors import PolymlError
from polyml.options import CodegenConfig
from polyml.testing import onnxruntime_run, rel_error


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", [_vi(n, s) for n, s in inputs], [_vi(n, None) for n in outputs], initializer=list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _both(model: onnx.ModelProto, feeds: dict, tmp_path, **kw) -> dict[bool, polyml.CompiledModel]:
    """Compile fused and unfused; both must match onnxruntime to 1e-5 (relative)."""
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    ref = onnxruntime_run(model, feeds)
    out = {}
    for fuse in (False, True):
        c = polyml.compile(str(path), str(tmp_path / f"f{int(fuse)}"), fuse=fuse, cache=False, **kw)
        got = c.run(feeds)
        for k in ref:
            assert rel_error(got[k], ref[k]) < 1e-5, (fuse, k)
        out[fuse] = c
    return out


def _conv_bn_relu_pool() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    c = 8
    inits = [nh.from_array(rng.standard_normal((c, 4, 3, 3)).astype(np.float32) * 0.2, "w"),
             nh.from_array(rng.standard_normal((c, c, 1, 1)).astype(np.float32) * 0.2, "w2"),
             *[nh.from_array(v.astype(np.float32), n) for n, v in (
                 ("s", rng.random(c) + 0.5), ("b", rng.standard_normal(c)), ("mu", rng.standard_normal(c)), ("var", rng.random(c) + 0.5))]]
    nodes = [h.make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c1", "s", "b", "mu", "var"], ["bn"]),
             h.make_node("Relu", ["bn"], ["r"]),
             h.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             h.make_node("Conv", ["p", "w2"], ["c2"]),
             h.make_node("Add", ["c2", "p"], ["y"])]
    return _model(nodes, [("x", [1, 4, 12, 12])], ["y"], inits)


def test_conv_epilogue_report_and_window_reasons(tmp_path) -> None:
    x = np.random.default_rng(1).standard_normal((1, 4, 12, 12)).astype(np.float32)
    cs = _both(_conv_bn_relu_pool(), {"x": x}, tmp_path)
    fused, plain = cs[True].manifest, cs[False].manifest
    assert fused["loop_nests"] < plain["loop_nests"]
    assert fused["intermediate_bytes"] < plain["intermediate_bytes"]
    rep = fused["fusion"]
    assert {f["op_type"] for f in rep["folded"]} == {"Mul", "Add"}  # batch norm folded into the conv
    assert any(g["kind"] == "epilogue" and "r" in g["ops"] for g in rep["groups"])
    edges = {(b["producer"], b["consumer"]): b["reason"] for b in rep["blocked"]}
    # conv(+relu) → maxpool and maxpool → conv: window reads, refused by the isl check
    pool_in = next(r for (p, c), r in edges.items() if c == "p")
    assert "window" in pool_in and "fused on one loop" in pool_in
    assert ("p", "c2") in edges and "Conv" in edges[("p", "c2")]
    assert cs[False].manifest["fusion"] is None


def test_isl_refuses_broadcast_and_window_reads() -> None:
    from polyml.passes.fuse import _fusion_violations, _window_violation

    assert _fusion_violations((1, 4, 5, 5), (1, 4, 5, 5)) == []
    # a broadcast read of a smaller producer is legal (its writes come first) but the loop
    # domains differ, which the pass refuses on cost (test_broadcast_read_stays_separate)
    assert _fusion_violations((1, 4, 5, 5), (1, 4, 1, 1)) == []
    assert _window_violation(12, 3, 1, 1)  # reads T[o + 1] before it is written
    assert _window_violation(12, 1, 1, 0) == ""  # a 1-tap window is an identity read


def test_broadcast_read_stays_separate(tmp_path) -> None:
    nodes = [h.make_node("ReduceMean", ["x"], ["m"], axes=[2, 3], keepdims=1),
             h.make_node("Relu", ["m"], ["r"]),
             h.make_node("Mul", ["x", "r"], ["y"])]
    m = _model(nodes, [("x", [1, 4, 5, 5])], ["y"])
    m.opset_import[0].version = 17
    x = np.random.default_rng(2).standard_normal((1, 4, 5, 5)).astype(np.float32)
    rep = _both(m, {"x": x}, tmp_path)[True].manifest["fusion"]
    why = [b["reason"] for b in rep["blocked"] if b["producer"] == "r" and b["consumer"] == "y"]
    assert why and ("dependence" in why[0] or "broadcast" in why[0])


def _concat_model() -> onnx.ModelProto:
    nodes = [h.make_node("Relu", ["x"], ["a"]),
             h.make_node("Sigmoid", ["x"], ["b"]),
             h.make_node("Concat", ["a", "b"], ["c1"], axis=1),
             h.make_node("Tanh", ["c1"], ["d"]),  # c1 is read by Tanh and nested in c2
             h.make_node("Concat", ["c1", "d", "x"], ["c2"], axis=1),  # x: a graph input, copied
             h.make_node("Neg", ["c2"], ["e"]),
             h.make_node("Abs", ["x"], ["a2"]),
             h.make_node("Concat", ["e", "a2"], ["y"], axis=1),  # a graph output holds its inputs
             h.make_node("Concat", ["x", "x"], ["z"], axis=3)]  # axis 3: strided slices, copied
    return _model(nodes, [("x", [1, 3, 4, 5])], ["y", "d", "z"])


def test_concat_in_place(tmp_path) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 4, 5)).astype(np.float32)
    cs = _both(_concat_model(), {"x": x}, tmp_path)
    fused, plain = cs[True].manifest, cs[False].manifest
    kinds = [s["kind"] for s in fused["slots"]]
    assert "view" in kinds and "view" not in [s["kind"] for s in plain["slots"]]
    assert fused["loop_nests"] < plain["loop_nests"]
    assert fused["intermediate_bytes"] < plain["intermediate_bytes"]
    rep = fused["fusion"]
    placed = {g["tensor"]: g for g in rep["groups"] if g["kind"] == "concat-in-place"}
    assert set(placed) == {"a", "b", "c1", "e", "a2"}
    assert placed["b"]["byte_offset"] == 3 * 4 * 5 * 4
    reasons = {(b["producer"], b["consumer"]): b["reason"] for b in rep["blocked"]}
    assert "graph output" in reasons[("d", "c2")]
    assert "graph input" in reasons[("x", "c2")]
    assert "strided" in reasons[("x", "z")]
    # the views into the output slot follow the caller's array on every run
    model = _concat_model()
    for seed in (4, 5):
        x2 = np.random.default_rng(seed).standard_normal((1, 3, 4, 5)).astype(np.float32)
        ref, got = onnxruntime_run(model, {"x": x2}), cs[True].run({"x": x2})
        for k in ref:
            assert rel_error(got[k], ref[k]) < 1e-5


def test_pool_prologue(tmp_path) -> None:
    rng = np.random.default_rng(6)
    inits = [nh.from_array(rng.random((1, 4, 1, 1)).astype(np.float32) + 0.5, "a"),
             nh.from_array(rng.random((1, 4, 1, 1)).astype(np.float32) - 0.5, "b")]
    nodes = [h.make_node("Mul", ["x", "a"], ["m"]), h.make_node("Add", ["m", "b"], ["ad"]), h.make_node("Relu", ["ad"], ["r"]),
             h.make_node("MaxPool", ["r"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             h.make_node("Sigmoid", ["x"], ["s"]),  # pads count as 0, not sigmoid(0)
             h.make_node("AveragePool", ["s"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
             h.make_node("Tanh", ["x"], ["t"]),
             h.make_node("AveragePool", ["t"], ["p3"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Neg", ["x"], ["ng"]),
             h.make_node("MaxPool", ["ng"], ["p4"], kernel_shape=[2, 2], strides=[2, 2]),
             h.make_node("Abs", ["ng"], ["p5"])]
    m = _model(nodes, [("x", [1, 4, 9, 9])], ["p1", "p2", "p3", "p4", "p5"], inits)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    cs = _both(m, {"x": x}, tmp_path)
    fused = cs[True].manifest
    assert fused["loop_nests"] < cs[False].manifest["loop_nests"]
    rep = fused["fusion"]
    pro = {g["nest"]: g["ops"] for g in rep["groups"] if g["kind"] == "pool-prologue"}
    assert pro == {"p1": ["m", "ad", "r", "p1"], "p2": ["s", "p2"], "p3": ["t", "p3"]}
    assert not any(g["kind"] == "elementwise" and "r" in g["ops"] for g in rep["groups"])
    assert any(b["producer"] == "ng" and b["consumer"] == "p4" and "2 consumers" in b["reason"] for b in rep["blocked"])


def test_tile_sizes(tmp_path) -> None:
    from polyml.codegen.tiling import cache_sizes, resolve

    assert cache_sizes()[1] > 0 and cache_sizes()[2] > 0
    assert resolve("off").conv_bytes == 0
    assert resolve("l2=2M").conv_bytes == 1 << 20
    assert resolve("conv=64K").conv_bytes == 64 << 10
    with pytest.raises(PolymlError):
        resolve("l3=1M")
    rng = np.random.default_rng(7)
    inits = [nh.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.1, "w")]
    for strides in ([1, 1], [2, 2]):
        nodes = [h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=strides)]
        m = _model(nodes, [("x", [1, 8, 40, 40])], ["y"], inits)
        x = rng.standard_normal((1, 8, 40, 40)).astype(np.float32)
        # an 8 KiB budget splits the 40 output rows into tiles (remainder tile included)
        (tmp_path / str(strides[0])).mkdir()
        cs = _both(m, {"x": x}, tmp_path / str(strides[0]), tile_sizes="conv=8K")
        assert cs[True].manifest["tiling"]["conv_bytes"] == 8192
        assert cs[True].manifest["options"]["tile_sizes"] == "conv=8K"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["densenet121", "inception_v2"])
def test_acceptance_light_models(name: str, tmp_path) -> None:
    """Fused output matches onnxruntime as closely as unfused, fewer loop nests,
    intermediate bytes down by at least 30%."""
    from polyml.testing import random_inputs, seeded_light_model

    model = seeded_light_model(name)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    feeds = random_inputs(model, seed=1)
    ref = onnxruntime_run(model, feeds)
    man, err = {}, {}
    for fuse in (False, True):
        c = polyml.compile(str(path), str(tmp_path / f"f{int(fuse)}"), fuse=fuse, cache=False)
        got = c.run(feeds)
        err[fuse] = max(rel_error(got[k], ref[k]) for k in ref)
        man[fuse] = c.manifest
    assert err[True] <= max(2 * err[False], 1e-5), err
    assert man[True]["loop_nests"] < man[False]["loop_nests"]
    assert man[True]["intermediate_bytes"] <= 0.7 * man[False]["intermediate_bytes"]
    assert any(g["kind"] == "concat-in-place" for g in man[True]["fusion"]["groups"])


def _se_projection(c: int, size: int, m: int, *, swap: bool = False, residual: bool = False,
                   scaled_out: bool = False, kernel: int = 1) -> onnx.ModelProto:
    """A squeeze-excitation block and the projection after it (EfficientNet's MBConv tail):
    GlobalAveragePool → 1x1 → SiLU → 1x1 → Sigmoid → Mul(x, gate) → Conv (+ bias, + x0)."""
    rng = np.random.default_rng(c * 100 + size)
    r = max(1, c // 4)
    inits = [nh.from_array(rng.standard_normal((r, c, 1, 1)).astype(np.float32) * 0.3, "w1"),
             nh.from_array(rng.standard_normal(r).astype(np.float32), "b1"),
             nh.from_array(rng.standard_normal((c, r, 1, 1)).astype(np.float32) * 0.3, "w2"),
             nh.from_array(rng.standard_normal(c).astype(np.float32), "b2"),
             nh.from_array((rng.standard_normal((m, c, kernel, kernel)) / np.sqrt(c)).astype(np.float32), "wp"),
             nh.from_array(rng.standard_normal(m).astype(np.float32), "bp")]
    nodes = [h.make_node("GlobalAveragePool", ["x"], ["pool"]),
             h.make_node("Conv", ["pool", "w1", "b1"], ["s1"]),
             h.make_node("Sigmoid", ["s1"], ["sg1"]), h.make_node("Mul", ["s1", "sg1"], ["a1"]),
             h.make_node("Conv", ["a1", "w2", "b2"], ["s2"]),
             h.make_node("Sigmoid", ["s2"], ["gate"]),
             h.make_node("Mul", ["gate", "x"] if swap else ["x", "gate"], ["scaled"], name="se_mul"),
             h.make_node("Conv", ["scaled", "wp", "bp"], ["proj"], pads=[kernel // 2] * 4, name="projection")]
    outputs = ["y"]
    if residual:
        nodes.append(h.make_node("Add", ["proj", "x0"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    if scaled_out:
        outputs.append("scaled")
    inputs = [("x", [1, c, size, size])] + ([("x0", [1, m, size, size])] if residual else [])
    return _model(nodes, inputs, outputs, inits)


SE_CASES = [(96, 14, 24, {}), (144, 28, 40, {"swap": True}), (240, 14, 80, {"residual": True}), (16, 7, 8, {}),
            (32, 9, 16, {"residual": True, "swap": True})]


@pytest.mark.parametrize("c,size,m,kw", SE_CASES)
@pytest.mark.parametrize("threads", [1, 2])
def test_squeeze_excitation_scale_read_by_the_projection(c: int, size: int, m: int, kw: dict, threads: int,
                                                           tmp_path) -> None:
    """The SE gate's Mul before a 1x1 projection is folded into the projection (no Mul nest):
    the packed GEMM scales x as it packs B, other lowerings scale a copy of x; both match
    onnxruntime, with the projection's own bias and residual epilogue, either Mul operand order."""
    model = _se_projection(c, size, m, **kw)
    rng = np.random.default_rng(size)
    feeds = {"x": rng.standard_normal((1, c, size, size)).astype(np.float32)}
    if kw.get("residual"):
        feeds["x0"] = rng.standard_normal((1, m, size, size)).astype(np.float32)
    cs = _both(model, feeds, tmp_path, threads=threads)
    rep = cs[True].manifest["fusion"]
    assert [g["ops"] for g in rep["groups"] if g["kind"] == "conv-input-scale"] == [["se_mul", "projection"]]
    assert cs[True].manifest["loop_nests"] < cs[False].manifest["loop_nests"]


def test_squeeze_excitation_cases_cover_both_paths() -> None:
    """SE_CASES reach both ways of applying the scale on this host: the packed GEMM scaling x
    as it packs B, and another lowering of the projection reading a scaled copy."""
    from polyml.graph import Node, TensorType
    from polyml.kernels.conv import _plan, _scales_into_copy

    paths = set()
    for c, size, m, _ in SE_CASES:
        node = Node("proj", "Conv", ["x", "wp", "bp", "gate"], ["y"], {"input_scale": 3})
        plan = _plan(CodegenConfig(packed=True), node, TensorType((1, c, size, size)), TensorType((m, c, 1, 1)), True)
        paths.add(_scales_into_copy(node, plan))
    assert paths == {False, True}


@pytest.mark.parametrize("kw", [{"scaled_out": True}, {"kernel": 3}])
def test_squeeze_excitation_scale_stays_where_it_cannot_fold(kw: dict, tmp_path) -> None:
    """Not folded where the scaled map is also a graph output or the consumer is not 1x1."""
    model = _se_projection(32, 8, 16, **kw)
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 32, 8, 8)).astype(np.float32)}
    cs = _both(model, feeds, tmp_path)
    assert not any(g["kind"] == "conv-input-scale" for g in cs[True].manifest["fusion"]["groups"])
