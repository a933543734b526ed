"""Normalizations against onnxruntime on seeded data: BatchNormalization (inference), Softmax,
LogSoftmax, Hardmax (kernels/norm.py), LayerNormalization, InstanceNormalization,
GroupNormalization and MeanVarianceNormalization (kernels/layernorm.py).

Softmax axes follow the opset: before 13 the input is coerced to 2-D at ``axis`` (default 1),
from 13 on the op normalizes along ``axis`` (default -1).  Shapes over the parallel threshold
run the row loops on two threads (and are also checked on one).  Errors are
max|Δ| / max|ref| ≤ 1e-4.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from polyml.compiler import compile as polyml_compile
from polyml.errors import GraphError, ShapeError, UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.testing import compile_and_compare, onnxruntime_run
from polyml.testing import single_node_model as node_model

TOL = 1e-4


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options) -> None:
    errs = compile_and_compare(model, feeds, **options)
    assert errs and max(errs.values()) <= TOL, errs


def bn_params(pshape: tuple[int, ...], seed: int = 1) -> dict[str, np.ndarray]:
    """scale, B, mean, var (positive) of ``pshape``."""
    rng = np.random.default_rng(seed)
    return {
        "scale": rng.standard_normal(pshape).astype(np.float32),
        "bias": rng.standard_normal(pshape).astype(np.float32),
        "mean": rng.standard_normal(pshape).astype(np.float32),
        "var": rng.uniform(0.1, 2.0, pshape).astype(np.float32),
    }


def x_feed(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"x": (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)}


BN_CASES = [
    ((2, 3, 4, 5), 15, {}),
    ((2, 3, 4, 5), 9, {"epsilon": 1e-2}),
    ((4, 6), 14, {}),
    ((1, 2, 3, 4, 5), 15, {"momentum": 0.5}),
    ((3, 4, 7), 7, {}),
]


@pytest.mark.parametrize("shape,opset,attrs", BN_CASES, ids=[f"{s}-op{o}-{a}" for s, o, a in BN_CASES])
def test_batchnorm(shape: tuple[int, ...], opset: int, attrs: dict) -> None:
    model = node_model("BatchNormalization", {"x": shape}, opset=opset, initializers=bn_params((shape[1],)), **attrs)
    check(model, x_feed(shape))


def test_batchnorm_parameters_as_inputs() -> None:
    """Parameters computed at run time (graph inputs), not weights."""
    shape = (2, 4, 3, 3)
    params = bn_params((4,))
    model = node_model("BatchNormalization", {"x": shape, **{k: v.shape for k, v in params.items()}})
    check(model, {**x_feed(shape), **params})


def test_batchnorm_spatial_0() -> None:
    """opset 7's ``spatial=0``: one set of parameters per (channel, position)."""
    shape = (2, 3, 4, 5)
    model = node_model("BatchNormalization", {"x": shape}, opset=7, initializers=bn_params(shape[1:]), spatial=0)
    check(model, x_feed(shape))


def test_batchnorm_without_polly() -> None:
    shape = (2, 3, 4, 5)
    model = node_model("BatchNormalization", {"x": shape}, initializers=bn_params((3,)))
    check(model, x_feed(shape), polly=False)


@pytest.mark.parametrize(
    "outputs,attrs",
    [(("y", "rm", "rv"), {"training_mode": 1}), (("y",), {"training_mode": 1}), (("y", "m", "v"), {})],
    ids=["training", "training-y-only", "opset9-stat-outputs"],
)
def test_batchnorm_training_is_rejected(outputs: tuple[str, ...], attrs: dict) -> None:
    opset = 15 if "training_mode" in attrs else 9
    model = node_model("BatchNormalization", {"x": (2, 3, 4)}, outputs, opset=opset, initializers=bn_params((3,)), **attrs)
    with pytest.raises(UnsupportedError, match="BatchNormalization"):
        from_onnx(model)


# (shape, opset, attributes)
SOFTMAX_CASES = [
    ((3, 5), 18, {}),
    ((2, 3, 4), 18, {}),
    ((2, 3, 4), 18, {"axis": 1}),
    ((2, 3, 4), 13, {"axis": 0}),
    ((2, 3, 4, 5), 13, {"axis": -2}),
    ((7,), 13, {}),
    ((2, 3, 4), 11, {}),  # coerced to (2, 12)
    ((2, 3, 4), 11, {"axis": 0}),  # coerced to (1, 24)
    ((2, 3, 4), 11, {"axis": -1}),
    ((2, 3, 4, 5), 1, {"axis": 2}),
]


def _sm_id(case: tuple) -> str:
    shape, opset, attrs = case
    return f"{shape}-op{opset}" + "".join(f"-{k}{v}" for k, v in attrs.items())


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=[_sm_id(c) for c in SOFTMAX_CASES])
def test_softmax(op: str, case: tuple) -> None:
    shape, opset, attrs = case
    check(node_model(op, {"x": shape}, opset=opset, **attrs), x_feed(shape))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large_inputs(op: str) -> None:
    """Inputs around ±1e4: exp would overflow without subtracting the row maximum."""
    shape = (4, 33)
    check(node_model(op, {"x": shape}), x_feed(shape, scale=1e4))  # a NaN error fails the bound


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_masked_rows(op: str) -> None:
    """Attention masks: -inf and float32's lowest value in some positions of every row."""
    x = x_feed((2, 3, 8, 16), scale=4.0)["x"]
    x[..., 5:9] = -np.inf
    x[:, 1, :, 12:] = np.finfo(np.float32).min
    model = node_model(op, {"x": x.shape}, opset=13)
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "m.onnx")
        got = polyml_compile(Path(tmp) / "m.onnx", Path(tmp) / "b").run({"x": x})["y"]
    ref = onnxruntime_run(model, {"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)  # -inf where masked (LogSoftmax)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("case", [SOFTMAX_CASES[2], SOFTMAX_CASES[6]], ids=_sm_id)
def test_softmax_without_polly(op: str, case: tuple) -> None:
    shape, opset, attrs = case
    check(node_model(op, {"x": shape}, opset=opset, **attrs), x_feed(shape), polly=False)


@pytest.mark.parametrize("opset,axis", [(13, 3), (13, -4), (11, 3)])
def test_softmax_axis_out_of_range(opset: int, axis: int) -> None:
    with pytest.raises(GraphError, match="axis"):
        from_onnx(node_model("Softmax", {"x": (2, 3, 4)}, opset=opset, axis=axis))


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape,axis", [((4, 12, 64, 64), -1), ((4, 12, 64, 64), 1), ((1, 21, 48, 48), 1), ((1, 8, 4099), 1)],
                         ids=["attention-last", "inner-axis", "one-outer-chunked", "one-outer-prime"])
def test_softmax_parallel_rows(op: str, shape: tuple[int, ...], axis: int, threads: int) -> None:
    """Large tensors: rows over threads; with one outer row the inner extent is chunked
    (48·48 = 2304 splits, 4099 is prime and does not)."""
    check(node_model(op, {"x": shape}, opset=13, axis=axis), x_feed(shape, scale=3.0), threads=threads)


HARDMAX_CASES = [((3, 5), 13, {}), ((2, 3, 4), 13, {"axis": 1}), ((2, 3, 4), 13, {"axis": 0}), ((2, 3, 4, 5), 13, {"axis": -2}),
                 ((6,), 13, {}), ((2, 3, 4), 11, {}), ((2, 3, 4), 11, {"axis": 2}), ((2, 3, 4), 1, {"axis": 0})]


@pytest.mark.parametrize("case", HARDMAX_CASES, ids=[_sm_id(c) for c in HARDMAX_CASES])
def test_hardmax(case: tuple) -> None:
    """Ties (few distinct values) take the first maximum."""
    shape, opset, attrs = case
    x = np.random.default_rng(2).integers(-2, 3, shape).astype(np.float32)
    check(node_model("Hardmax", {"x": shape}, opset=opset, **attrs), {"x": x})


def test_hardmax_large() -> None:
    shape = (64, 1000)
    check(node_model("Hardmax", {"x": shape}, opset=13), x_feed(shape), threads=2)


# -- LayerNormalization ---------------------------------------------------------------------------

def ln_model(shape: tuple[int, ...], axis: int = -1, pshape: tuple[int, ...] | None = None, bias: bool = True,
             outputs: tuple[str, ...] = ("y",), bshape: tuple[int, ...] | None = None, opset: int = 17, seed: int = 1,
             **attrs) -> onnx.ModelProto:
    """LayerNormalization with Scale (and B) as weights of ``pshape`` (default: the normalized shape)."""
    rng = np.random.default_rng(seed)
    pshape = pshape if pshape is not None else shape[axis % len(shape):]
    inits = {"scale": rng.standard_normal(pshape).astype(np.float32)}
    if bias:
        inits["bias"] = rng.standard_normal(bshape if bshape is not None else pshape).astype(np.float32)
    return node_model("LayerNormalization", {"x": shape}, outputs, opset=opset, initializers=inits, axis=axis, **attrs)


LN_CASES = [
    ((2, 5), -1), ((2, 5), 0), ((2, 5), 1), ((2, 5), -2),
    ((2, 3, 7), -1), ((2, 3, 7), 1), ((2, 3, 7), 0), ((2, 3, 7), -3),
    ((2, 3, 4, 5), 0), ((2, 3, 4, 5), 1), ((2, 3, 4, 5), 2), ((2, 3, 4, 5), 3), ((2, 3, 4, 5), -2),
    ((2, 1, 3, 1, 4), 2), ((2, 1, 3, 1, 4), -1), ((1, 6), -1), ((4, 1), -1),
]


@pytest.mark.parametrize("shape,axis", LN_CASES, ids=[f"{s}-axis{a}" for s, a in LN_CASES])
def test_layernorm(shape: tuple[int, ...], axis: int) -> None:
    """Every axis of ranks 2-5 (size-1 dims too), with the optional Mean and InvStdDev outputs."""
    check(ln_model(shape, axis, outputs=("y", "mean", "inv")), x_feed(shape, scale=2.0))


@pytest.mark.parametrize("outputs", [("y",), ("y", "", "inv"), ("y", "mean")], ids=["y", "y-inv", "y-mean"])
def test_layernorm_optional_outputs(outputs: tuple[str, ...]) -> None:
    """Mean omitted ("") while InvStdDev is produced, or InvStdDev absent."""
    model = ln_model((3, 4, 6), -1, outputs=outputs, bias=False)
    kept = [o for o in model.graph.output if o.name]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    check(model, x_feed((3, 4, 6)))


@pytest.mark.parametrize("pshape,bshape", [((1, 6), (6,)), ((1,), (1,)), ((4, 1), (6,)), ((3, 1, 6), (1, 4, 6)), ((6,), None)],
                         ids=["leading-1", "scalar", "broadcast-in-row", "broadcast-over-rows", "no-bias"])
def test_layernorm_parameter_broadcast(pshape: tuple[int, ...], bshape: tuple[int, ...] | None) -> None:
    """Scale and B broadcast unidirectionally to X (the spec's rule), inside the normalized
    dims or also over the rows (a separate elementwise nest)."""
    shape = (3, 4, 6)
    model = ln_model(shape, -2 if pshape == (4, 1) else -1, pshape=pshape, bias=bshape is not None, bshape=bshape)
    check(model, x_feed(shape))


def test_layernorm_epsilon_and_offset_data() -> None:
    """A large mean (1e3) next to unit variance: the two-pass variance keeps it exact."""
    shape = (4, 16)
    x = (np.random.default_rng(3).standard_normal(shape) + 1e3).astype(np.float32)
    check(ln_model(shape, -1, epsilon=1e-2, outputs=("y", "mean", "inv")), {"x": x})


@pytest.mark.parametrize("threads", [2, 1])
@pytest.mark.parametrize("shape", [(1, 128, 768), (1, 56, 56, 96), (2, 197, 384)], ids=["bert", "convnext", "vit"])
def test_layernorm_transformer_shapes(shape: tuple[int, ...], threads: int) -> None:
    check(ln_model(shape, -1, outputs=("y", "mean", "inv")), x_feed(shape), threads=threads)


def test_layernorm_parameters_as_inputs() -> None:
    """Scale and B computed at run time (graph inputs)."""
    shape = (2, 3, 8)
    rng = np.random.default_rng(4)
    feeds = {**x_feed(shape), "s": rng.standard_normal(8).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)}
    check(node_model("LayerNormalization", {"x": shape, "s": (8,), "b": (8,)}, opset=17), feeds)


def test_layernorm_rejects() -> None:
    x = np.zeros((2, 3), np.int64)
    with pytest.raises(UnsupportedError, match="LayerNormalization"):
        from_onnx(node_model("LayerNormalization", {"x": x}, opset=17, initializers={"s": np.ones(3, np.int64)}))
    with pytest.raises(GraphError, match="axis"):
        from_onnx(ln_model((2, 3), axis=2))
    with pytest.raises(ShapeError, match="broadcast"):
        from_onnx(ln_model((2, 3), pshape=(4,)))


# -- InstanceNormalization, GroupNormalization -------------------------------------------------------

def channel_params(n: int, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"scale": rng.standard_normal(n).astype(np.float32), "bias": rng.standard_normal(n).astype(np.float32)}


@pytest.mark.parametrize("shape", [(2, 3, 7), (2, 3, 4, 5), (1, 2, 3, 2, 4), (2, 3, 1, 1), (2, 1, 9)],
                         ids=["rank3", "rank4", "rank5", "spatial-1", "one-channel"])
def test_instancenorm(shape: tuple[int, ...]) -> None:
    model = node_model("InstanceNormalization", {"x": shape}, initializers=channel_params(shape[1]), epsilon=1e-3)
    check(model, x_feed(shape, scale=2.0))


@pytest.mark.parametrize("threads", [2, 1])
def test_instancenorm_large(threads: int) -> None:
    shape = (2, 64, 32, 32)
    check(node_model("InstanceNormalization", {"x": shape}, initializers=channel_params(64)), x_feed(shape), threads=threads)


# (shape, groups, opset): opset 18 has per-group scale/bias, opset 21 per-channel
GN_CASES = [((2, 6, 5, 7), 3, 18), ((2, 6, 5, 7), 3, 21), ((2, 6, 5), 1, 21), ((2, 6, 5), 6, 21), ((3, 4), 2, 21),
            ((1, 4, 2, 3, 2), 2, 18), ((2, 6, 1, 1), 2, 21)]


@pytest.mark.parametrize("shape,groups,opset", GN_CASES, ids=[f"{s}-g{g}-op{o}" for s, g, o in GN_CASES])
def test_groupnorm(shape: tuple[int, ...], groups: int, opset: int) -> None:
    params = channel_params(groups if opset < 21 else shape[1])
    model = node_model("GroupNormalization", {"x": shape}, opset=opset, initializers=params, num_groups=groups, epsilon=1e-4)
    check(model, x_feed(shape, scale=3.0))


@pytest.mark.parametrize("threads", [2, 1])
def test_groupnorm_large(threads: int) -> None:
    """Stable Diffusion-like: 32 groups over 64 channels of 32x32."""
    shape = (1, 64, 32, 32)
    model = node_model("GroupNormalization", {"x": shape}, opset=21, initializers=channel_params(64), num_groups=32)
    check(model, x_feed(shape), threads=threads)


def test_groupnorm_rejects() -> None:
    with pytest.raises(ShapeError, match="groups"):
        from_onnx(node_model("GroupNormalization", {"x": (2, 6, 5)}, opset=21, initializers=channel_params(6), num_groups=4))
    with pytest.raises(ShapeError, match="scale"):
        from_onnx(node_model("GroupNormalization", {"x": (2, 6, 5)}, opset=21, initializers=channel_params(4), num_groups=3))


# -- MeanVarianceNormalization ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axes", [((2, 3, 4, 5), None), ((2, 3, 4, 5), [1, 3]), ((2, 3, 4, 5), [2, 3]),
                                        ((2, 3, 4, 5), [0, 1, 2, 3]), ((3, 4, 5), [0, 2]), ((3, 1, 5, 1), [0, 2])],
                         ids=["default", "1-3", "2-3", "all", "rank3", "size1"])
def test_mvn(shape: tuple[int, ...], axes: list[int] | None) -> None:
    attrs = {"axes": axes} if axes is not None else {}
    check(node_model("MeanVarianceNormalization", {"x": shape}, opset=13, **attrs), x_feed(shape, scale=2.0))


def test_mvn_large() -> None:
    shape = (1, 32, 64, 64)
    check(node_model("MeanVarianceNormalization", {"x": shape}, opset=13), x_feed(shape), threads=2)


def test_norms_in_one_graph() -> None:
    """LayerNorm feeding Softmax feeding GroupNorm: scratch buffers of consecutive ops."""
    rng = np.random.default_rng(6)
    nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["a"], axis=-1),
             helper.make_node("Softmax", ["a"], ["b"], axis=1),
             helper.make_node("GroupNormalization", ["b", "gs", "gb"], ["y"], num_groups=2)]
    inits = [numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "gs"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "gb")]
    graph = helper.make_graph(nodes, "norms", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4, 3, 5])],
                              [helper.make_empty_tensor_value_info("y")], initializer=inits)
    check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), x_feed((2, 4, 3, 5)))
