"""Depthwise Conv on the phase-split plane kernel (kernels/depthwise.py) against onnxruntime on
seeded data: strides 1-3, dilations, asymmetric and SAME pads, odd and tiny planes, channels
not a multiple of the vector width, batch > 1, no bias, fused activations (Relu6 as Clip,
x·sigmoid(x) rewritten to Swish, a per-channel scale) and a fused residual add read at full
size; and the plan: which convolutions take the path and which decline."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from polyml.graph import Node, TensorType
from polyml.options import CodegenConfig
from polyml.testing import compile_and_compare

TOL = 1e-5

CASES = [
    # (N, C, H, W), kernel, attrs
    ((1, 16, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 19, 14, 14), (5, 5), {"pads": [2, 2, 2, 2]}),
    ((2, 5, 13, 11), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 7, 15, 20), (3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 1]}),
    ((1, 9, 12, 17), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((1, 3, 9, 9), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 4, 16, 16), (3, 3), {"strides": [3, 3]}),
    ((1, 6, 10, 12), (3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 33, 3, 5), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 8, 1, 1), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 56, 56), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((2, 61, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}),  # groups of planes, a partial last group
    # output rows of one vector or more: computed row by row on vector-aligned phase rows
    ((1, 5, 16, 16), (3, 3), {"pads": [1, 1, 1, 1]}),  # exactly one vector per row
    ((1, 3, 9, 17), (3, 3), {"pads": [1, 1, 1, 1]}),  # a one-lane tail
    ((1, 4, 12, 70), (5, 5), {"pads": [2, 1, 0, 3]}),  # asymmetric pads, unused input rows
    ((2, 3, 11, 45), (3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}),
    ((1, 3, 20, 66), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 2, 13, 100), (3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 3]}),  # stride 3: scalar copy loops
    ((1, 6, 8, 35), (3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    # strided planes too large to copy in groups: each input row copied just before the first
    # output row that reads it (DepthwisePlan.interleaved)
    ((1, 3, 111, 113), (3, 3), {"pads": [1, 0, 1, 1], "strides": [2, 2]}),
    ((2, 2, 120, 100), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((1, 2, 150, 120), (3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 2], "dilations": [2, 1]}),
]


def _dw_model(xs, ks, attrs, bias=True, chain="", seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    c = xs[1]
    w = rng.standard_normal((c, 1, *ks)).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())]
    ins = ["x", "w"]
    if bias:
        b = rng.standard_normal(c).astype(np.float32)
        inits.append(helper.make_tensor("b", TensorProto.FLOAT, b.shape, b))
        ins.append("b")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))]
    nodes = [helper.make_node("Conv", ins, ["c" if chain else "y"], kernel_shape=list(ks), group=c, **attrs)]
    if chain == "relu6":
        lo, hi = np.array(0, np.float32), np.array(6, np.float32)
        inits += [helper.make_tensor("lo", TensorProto.FLOAT, [], [float(lo)]), helper.make_tensor("hi", TensorProto.FLOAT, [], [float(hi)])]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif chain == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    elif chain == "scale":
        sc = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
        inits.append(helper.make_tensor("sc", TensorProto.FLOAT, sc.shape, sc.ravel()))
        nodes += [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Mul", ["r", "sc"], ["y"])]
    elif chain == "residual":
        nodes += [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "z"], ["y"])]
    graph = helper.make_graph(nodes, "dw", inputs, [helper.make_empty_tensor_value_info("y")], initializer=inits)
    if chain == "residual":
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        shape = onnx.shape_inference.infer_shapes(model).graph.value_info
        cshape = next(vi for vi in shape if vi.name == "c").type.tensor_type.shape
        graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [d.dim_value for d in cshape.dim]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: the two lowerings of a one-image depthwise convolution: its nest under the depthwise schedule
#: (polyml/schedule/depthwise.py), and the hand-written plane kernel (--gemm packed)
PATHS = pytest.mark.parametrize("gemm", ["schedule", "packed"], ids=["schedule", "hand"])


@PATHS
@pytest.mark.parametrize("xs,ks,attrs", CASES)
def test_depthwise_matches_onnxruntime(xs, ks, attrs, gemm) -> None:
    errs = compile_and_compare(_dw_model(xs, ks, attrs), threads=2, cache=False, gemm=gemm)
    assert max(errs.values()) <= TOL, errs


@pytest.mark.parametrize("width", [13, 37, 63], ids=["flat", "rowwise", "rowwise-whole"])
@pytest.mark.parametrize("chain", ["relu6", "silu", "scale", "residual"])
@PATHS
def test_depthwise_fused_chains(chain, width, gemm) -> None:
    errs = compile_and_compare(_dw_model((1, 20, 11, width), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, chain=chain),
                               threads=2, cache=False, gemm=gemm)
    assert max(errs.values()) <= TOL, errs


@pytest.mark.parametrize("size,kernel,stride", [(7, 5, 1), (14, 5, 1), (14, 3, 1), (28, 3, 2)])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_silu_after_the_crop(size, kernel, stride, threads) -> None:
    """A chain of no inputs of its own (SiLU) on planes narrower than a vector runs over each
    group's cropped output (``_chain_after_crop``); EfficientNet's 7x7 and 14x14 shapes (the
    wider ones keep the chain per row), 72 planes."""
    pad = kernel // 2
    errs = compile_and_compare(_dw_model((1, 72, size, size), (kernel, kernel), {"pads": [pad] * 4, "strides": [stride] * 2},
                                         chain="silu"), threads=threads, cache=False)
    assert max(errs.values()) <= TOL, errs


def test_depthwise_silu_after_the_crop_is_interleaved(tmp_path) -> None:
    """The SiLU loop over a group's cropped 7x7 outputs carries an ``llvm.loop.interleave.count``
    hint (a distinct self-referential loop ID) and LLVM keeps that many logistic divisions in
    flight; rows of a vector or more (28 wide: row-wise on AVX2 and AVX-512 alike; 14 is a
    flat plane on AVX-512's 16 lanes) keep the chain per row (no such loop)."""
    import re

    from polyml.compiler import compile as polyml_compile
    from polyml.kernels.depthwise import CHAIN_INTERLEAVE

    def build(size: int) -> tuple[str, str]:
        path = tmp_path / f"dw{size}.onnx"
        onnx.save(_dw_model((1, 64, size, size), (5, 5), {"pads": [2] * 4}, chain="silu"), str(path))
        out = tmp_path / f"b{size}"
        polyml_compile(path, out, emit=["ll"], cache=False, threads=1, gemm="packed")
        ll = "".join(p.read_text() for p in out.glob("ops.off*.ll") if ".opt." not in p.name)
        return ll, "".join(p.read_text() for p in out.glob("ops.off*.opt.ll"))

    hint = rf'!\{{ ?!"llvm.loop.interleave.count", i32 {CHAIN_INTERLEAVE} ?\}}'
    ll, opt = build(7)
    assert re.search(hint, ll) and re.search(r'^(!\d+) = distinct !\{\1, ', ll, re.M)
    assert len(re.findall(r"fdiv[^\n]*<\d+ x float>", opt)) >= CHAIN_INTERLEAVE
    ll, _ = build(28)
    assert not re.search(hint, ll)


def test_depthwise_rows_stored_from_registers(tmp_path) -> None:
    """On AVX-512 a row-wise plane stores each output row from the accumulator's vectors (the
    last lanes by a masked store) instead of a scalar crop loop reading the row back (a
    store-to-load forward that failed on every row: 3x3 192 @28 0.76x the time).  A chain of
    ReLUs and constant Clips runs on those vectors in registers (no pass at all); another
    per-channel chain (a scale) runs on the row's whole vectors (a loop of 16-lane steps, no
    remainder); a chain reading a full-size input (a residual) keeps the crop loop."""
    import re

    from polyml.compiler import compile as polyml_compile
    from polyml.kernels._window import conv_window
    from polyml.kernels.depthwise import depthwise_plan

    node = Node("c", "Conv", ["x", "w"], ["y"], {"group": 8, "pads": [1, 1, 1, 1]})
    x, w = TensorType((1, 8, 28, 28)), TensorType((8, 1, 3, 3))
    lanes = depthwise_plan(CodegenConfig(packed=True), node, x, w, conv_window(node, x, w)).lanes
    for chain, stores, row_pass in (("relu6", True, False), ("scale", True, True), ("residual", False, False)):
        path = tmp_path / f"{chain}.onnx"
        model = _dw_model((1, 8, 28, 28), (3, 3), {"pads": [1, 1, 1, 1]}, chain=chain)
        onnx.save(model, str(path))
        out = tmp_path / chain
        polyml_compile(path, out, emit=["ll"], cache=False, threads=1, gemm="packed")
        ll = "".join(p.read_text() for p in out.glob("ops.off*.ll") if ".opt." not in p.name)
        assert ('"dw.ow' in ll) != (lanes == 16 and stores), chain  # the crop loop
        assert bool(re.search(r'!\{ ?!"llvm.loop.vectorize.width", i32 16 ?\}', ll)) == (lanes == 16 and row_pass), chain
        assert ('"dw.epi' in ll) == (lanes == 16 and row_pass), chain  # the chain's pass over the row
        errs = compile_and_compare(model, threads=1, cache=False, gemm="packed")
        assert max(errs.values()) <= TOL, errs


def test_depthwise_chain_in_registers(tmp_path, monkeypatch) -> None:
    """A ReLU6 after a depthwise convolution on planes narrower than a vector (flat planes)
    runs on the accumulator's vectors, not in a pass over the cropped output ("dw.chain") or
    the accumulator ("dw.epi"); with the switch off (``REGISTER_CHAIN = False``) the pass
    after the crop is back.  Exact against onnxruntime either way."""
    from polyml.compiler import compile as polyml_compile
    from polyml.kernels import depthwise

    model = _dw_model((1, 24, 7, 7), (3, 3), {"pads": [1, 1, 1, 1]}, chain="relu6")
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    for on in (True, False):
        monkeypatch.setattr(depthwise, "REGISTER_CHAIN", on)
        out = tmp_path / f"b{on}"
        polyml_compile(path, out, emit=["ll"], cache=False, threads=1, gemm="packed")
        ll = "".join(p.read_text() for p in out.glob("ops.off*.ll") if ".opt." not in p.name)
        assert ('"dw.chain' in ll) != on, on
        assert '"dw.epi' not in ll
        errs = compile_and_compare(model, threads=1, cache=False, gemm="packed")
        assert max(errs.values()) <= TOL, errs


def test_depthwise_interleaved_copy_choice() -> None:
    """Row-wise planes with a row stride, one plane at a time (larger than GROUP_FLOATS), copy
    their input rows as the output rows need them on AVX-512; unstrided rows and small planes
    copy whole planes first."""
    from polyml.kernels._window import conv_window
    from polyml.kernels.depthwise import GROUP_FLOATS, depthwise_plan

    def plan(size: int, stride: int):
        node = Node("c", "Conv", ["x", "w"], ["y"], {"group": 96, "pads": [1, 1, 1, 1], "strides": [stride] * 2})
        x, w = TensorType((1, 96, size, size)), TensorType((96, 1, 3, 3))
        return depthwise_plan(CodegenConfig(packed=True), node, x, w, conv_window(node, x, w))

    big = plan(112, 2)
    assert big.per_plane > GROUP_FLOATS and big.group == 1 and big.interleaved == (big.lanes == 16)
    assert not plan(112, 1).interleaved  # unstrided rows: the whole plane first
    assert not plan(28, 2).interleaved  # small planes: copied in groups


BAND_CASES = [
    # (N, C, H, W), kernel, attrs, cpu count: output rows in bands per thread (row_bands)
    ((1, 5, 60, 40), (3, 3), {"pads": [1, 1, 1, 1]}, 2),  # planes copied whole rows-band
    ((1, 3, 58, 33), (5, 5), {"pads": [2, 1, 0, 3]}, 2),  # asymmetric pads: 56 rows, 28 each
    ((1, 4, 113, 40), (3, 3), {"pads": [1, 1, 1, 1], "chain": "relu6"}, 4),  # bands 29, 29, 29, 26
    ((1, 3, 113, 111), (3, 3), {"pads": [1, 0, 1, 1], "strides": [2, 2], "chain": "residual"}, 2),  # interleaved copy
]


@pytest.mark.parametrize("xs,ks,attrs,cpus", BAND_CASES)
@PATHS
def test_depthwise_row_bands(xs, ks, attrs, cpus, monkeypatch, gemm) -> None:
    """Large row-wise planes split their output rows over the threads (each thread copies in
    the input rows its band reads, halos included); checked with 2 and 4 parts, uneven bands,
    unstrided (whole-band copy) and strided (interleaved copy) planes, fused chains."""
    from polyml.kernels._window import conv_window
    from polyml.kernels.depthwise import depthwise_plan

    monkeypatch.setattr("os.cpu_count", lambda: cpus)
    attrs = dict(attrs)
    chain = attrs.pop("chain", "")
    node = Node("c", "Conv", ["x", "w"], ["y"], {"group": xs[1], **attrs})
    x, w = TensorType(xs), TensorType((xs[1], 1, *ks))
    plan = depthwise_plan(CodegenConfig(packed=True), node, x, w, conv_window(node, x, w))
    assert plan.parts == cpus and plan.row_bands == (plan.lanes == 16)
    errs = compile_and_compare(_dw_model(xs, ks, attrs, chain=chain), threads=cpus, cache=False, gemm=gemm)
    assert max(errs.values()) <= TOL, errs


def test_depthwise_row_bands_choice(monkeypatch) -> None:
    """Bands of at least BAND_MIN_ROWS rows, batch 1, row-wise planes, AVX-512; else planes."""
    from polyml.kernels._window import conv_window
    from polyml.kernels.depthwise import BAND_MIN_ROWS, depthwise_plan

    monkeypatch.setattr("os.cpu_count", lambda: 2)

    def plan(n: int, size: int, stride: int = 1):
        node = Node("c", "Conv", ["x", "w"], ["y"], {"group": 32, "pads": [1, 1, 1, 1], "strides": [stride] * 2})
        x, w = TensorType((n, 32, size, size)), TensorType((32, 1, 3, 3))
        return depthwise_plan(CodegenConfig(packed=True), node, x, w, conv_window(node, x, w))

    wide = plan(1, 2 * BAND_MIN_ROWS)
    assert wide.row_bands == (wide.lanes == 16) and wide.band == BAND_MIN_ROWS
    assert plan(1, 112, 2).row_bands == (wide.lanes == 16)
    assert not plan(1, 2 * BAND_MIN_ROWS - 2).row_bands  # 27-row bands
    assert not plan(2, 112).row_bands  # batch 2
    assert not plan(1, 2 * BAND_MIN_ROWS, 4).row_bands  # 14-wide output rows: not row-wise


def test_depthwise_no_bias_one_thread() -> None:
    errs = compile_and_compare(_dw_model((1, 17, 9, 23), (3, 3), {"pads": [1, 1, 1, 1]}, bias=False), threads=1, cache=False)
    assert max(errs.values()) <= TOL, errs


def test_depthwise_plan_choice() -> None:
    """Depthwise 2-D convolutions take the path in host builds unless conv=direct; grouped
    (not depthwise), channel-multiplier and 1-D ones keep the nests; the geometry is exact."""
    from polyml.kernels.conv import _plan
    from polyml.kernels.depthwise import depthwise_plan

    def mode(xs, ws, conv="auto", on=True, **attrs):
        node = Node("c", "Conv", ["x", "w"], ["y"], {"group": attrs.pop("group", xs[1]), **attrs})
        return _plan(CodegenConfig(packed=on, conv=conv), node, TensorType(xs), TensorType(ws)).mode

    assert mode((1, 32, 14, 14), (32, 1, 3, 3), pads=[1, 1, 1, 1]) == "depthwise"
    assert mode((1, 32, 14, 14), (32, 1, 3, 3), conv="direct", pads=[1, 1, 1, 1]) != "depthwise"
    assert mode((1, 32, 14, 14), (32, 1, 3, 3), on=False, pads=[1, 1, 1, 1]) != "depthwise"
    assert mode((1, 32, 14, 14), (32, 2, 3, 3), group=16) != "depthwise"
    assert mode((1, 32, 14, 14), (64, 1, 3, 3), group=32) != "depthwise"
    assert mode((1, 32, 40), (32, 1, 3), pads=[1, 1]) != "depthwise"
    node = Node("c", "Conv", ["x", "w"], ["y"], {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]})
    from polyml.kernels._window import conv_window

    x, w = TensorType((1, 8, 14, 14)), TensorType((8, 1, 3, 3))
    plan = depthwise_plan(CodegenConfig(packed=True), node, x, w, conv_window(node, x, w))
    # padded 15x15 (the last pad row/column is never read) split into 2x2 phases of 8x8
    assert (plan.rows, plan.pitch) == (8, 8)
    assert plan.flat % plan.lanes == 0 and plan.flat >= 7 * 8
    assert plan.tap_offset(0, 0) == 0 and plan.tap_offset(1, 1) == 3 * 64
    assert plan.tap_offset(2, 2) == 8 + 1
    # 8 small planes: one group per thread share, each plane its own copy and accumulator
    assert plan.group == -(-8 // plan.parts) and plan.per_thread == plan.group * (plan.in_floats + plan.flat)
    assert not plan.rowwise and plan.acc_floats == plan.flat
    # 56x56 3x3/2: 28-wide output rows, computed row by row; the phase pitch (29) rounded up
    # to whole vectors so each row starts aligned, the accumulator one row
    x, w = TensorType((1, 8, 56, 56)), TensorType((8, 1, 3, 3))
    plan = depthwise_plan(CodegenConfig(packed=True), node, x, w, conv_window(node, x, w))
    assert plan.rowwise and plan.pitch == -(-29 // plan.lanes) * plan.lanes
    assert plan.acc_floats == -(-28 // plan.lanes) * plan.lanes
    assert plan.in_floats % plan.lanes == 0 and plan.per_plane == plan.in_floats + plan.acc_floats


def test_depthwise_and_pool_scops_export(tmp_path) -> None:
    """``--emit jscop`` of a model with depthwise layers and a stride-2 max pool: their
    explicit-vector functions carry ``polly.skip.fn`` (Polly 19's alias grouping segfaulted on
    them), so the export finishes and still dumps the other ops' SCoPs."""
    from polyml.compiler import compile as polyml_compile

    rng = np.random.default_rng(0)
    c = 16
    inits = [helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel())
             for name, shape in (("w1", (c, 1, 3, 3)), ("w2", (c, 1, 3, 3)), ("w3", (32, c, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=c),
             helper.make_node("Conv", ["a", "w2"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], group=c),
             helper.make_node("MaxPool", ["b"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w3"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 56, 56])],
                              [helper.make_empty_tensor_value_info("y")], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    polyml_compile(path, tmp_path / "build", emit=["jscop"], threads=2, cache=False)
    assert list((tmp_path / "build" / "jscop").glob("*.jscop"))
