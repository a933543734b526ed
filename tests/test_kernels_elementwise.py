"""Elementwise ops on typed tensors against onnxruntime: float activations and math, integer
arithmetic (int64/int32), comparisons, logic, Where and Cast, with broadcasting and edge values.

Each test builds one model holding many nodes (one compile per dtype group, not per op), then
compares every output with onnxruntime: bit-exact for integer and bool results, relative error
(max|Δ|/max|ref|) for floats.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyml.testing import compile_and_compare, onnxruntime_run

RNG = np.random.default_rng(7)


def model_of(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: list[str], opset: int = 20,
             initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)) for k, v in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "elementwise", vis, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 2e-6, **options) -> None:
    errs = compile_and_compare(model, feeds, **options)
    assert set(errs) == {o.name for o in model.graph.output}
    bad = {k: e for k, e in errs.items() if not e <= rtol}
    assert not bad, bad


FLOAT_UNARY = ["Relu", "Sigmoid", "Tanh", "Exp", "Neg", "Abs", "Reciprocal", "Erf", "HardSwish", "Softplus", "Softsign",
               "Mish", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh",
               "Floor", "Ceil", "Round", "Sign", "Shrink", "Gelu"]
POSITIVE = ["Sqrt", "Log", "Acosh"]  # domain x ≥ 1 here
UNIT = ["Asin", "Acos", "Atanh"]  # domain |x| < 1


def test_float_unary_ops() -> None:
    x = (RNG.standard_normal((2, 3, 17)) * 3).astype(np.float32)
    x.flat[:6] = [0.5, -0.5, 1.5, 2.5, -3.5, 0.25]  # Round's halves go to even
    pos = RNG.uniform(1.0, 5.0, (2, 3, 17)).astype(np.float32)
    unit = RNG.uniform(-0.95, 0.95, (2, 3, 17)).astype(np.float32)
    nodes, outs = [], []
    for src, ops in (("x", FLOAT_UNARY), ("pos", POSITIVE), ("unit", UNIT)):
        for op in ops:
            nodes.append(helper.make_node(op, [src], [f"y_{op}"], name=op))
            outs.append(f"y_{op}")
    attrs = {"LeakyRelu": {"alpha": 0.2}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4}, "Gelu": {"approximate": "tanh"},
             "Elu": {"alpha": 0.7}, "Celu": {"alpha": 1.3}, "ThresholdedRelu": {"alpha": 0.4},
             "Shrink": {"lambd": 0.7, "bias": 0.2}}
    for op, kw in attrs.items():
        nodes.append(helper.make_node(op, ["x"], [f"y_{op}_attr"], name=f"{op}_attr", **kw))
        outs.append(f"y_{op}_attr")
    check(model_of(nodes, {"x": x, "pos": pos, "unit": unit}, outs), {"x": x, "pos": pos, "unit": unit}, rtol=2e-5)


def test_swish_against_its_definition(tmp_path: Path) -> None:
    """Swish (opset 24) is newer than onnxruntime's kernels here: numpy's x·sigmoid(αx)."""
    import polyml

    x = (RNG.standard_normal((3, 50)) * 4).astype(np.float32)
    m = model_of([helper.make_node("Swish", ["x"], ["y"], alpha=0.7)], {"x": x}, ["y"], opset=24)
    onnx.save(m, str(tmp_path / "m.onnx"))
    got = polyml.compile(tmp_path / "m.onnx", tmp_path / "out").run({"x": x})["y"]
    ref = x / (1 + np.exp(-0.7 * x.astype(np.float64)))
    assert np.max(np.abs(got - ref)) / np.max(np.abs(ref)) < 1e-6


def test_prelu_broadcast_slope() -> None:
    x = RNG.standard_normal((1, 4, 3, 5)).astype(np.float32)
    slope = RNG.uniform(0, 1, (4, 1, 1)).astype(np.float32)
    m = model_of([helper.make_node("PRelu", ["x", "s"], ["y"])], {"x": x}, ["y"], initializers={"s": slope})
    check(m, {"x": x})


INT_BINARY = ["Add", "Sub", "Mul", "Div", "Max", "Min", "BitwiseAnd", "BitwiseOr", "BitwiseXor"]
COMPARE = ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_integer_ops(dtype: type) -> None:
    """Integer arithmetic with broadcasting ([2,3,4] op [3,1]), Mod in both modes, unary ops."""
    a = RNG.integers(-50, 50, (2, 3, 4)).astype(dtype)
    b = RNG.integers(1, 9, (3, 1)).astype(dtype) * np.where(RNG.random((3, 1)) < 0.5, -1, 1).astype(dtype)
    nodes, outs = [], []
    for op in INT_BINARY + COMPARE:
        nodes.append(helper.make_node(op, ["a", "b"], [f"y_{op}"], name=op))
        outs.append(f"y_{op}")
    for fmod in (0, 1):
        nodes.append(helper.make_node("Mod", ["a", "b"], [f"y_mod{fmod}"], fmod=fmod))
        outs.append(f"y_mod{fmod}")
    for op in ("Neg", "Abs", "Sign", "BitwiseNot"):
        nodes.append(helper.make_node(op, ["a"], [f"y_{op}"], name=op))
        outs.append(f"y_{op}")
    lo, hi = np.array(-10, dtype), np.array(20, dtype)
    nodes.append(helper.make_node("Clip", ["a", "lo", "hi"], ["y_clip"]))
    nodes.append(helper.make_node("Max", ["a", "b", "lo"], ["y_max3"]))
    outs += ["y_clip", "y_max3"]
    check(model_of(nodes, {"a": a, "b": b}, outs, initializers={"lo": lo, "hi": hi}), {"a": a, "b": b}, rtol=0.0)


def test_integer_division_by_zero_does_not_trap() -> None:
    """x86 traps on integer /0 and INT_MIN/-1; generated code gives 0 (and wraps) instead."""
    import polyml

    a = np.array([7, -7, np.iinfo(np.int64).min, 5], np.int64)
    b = np.array([0, 0, -1, 2], np.int64)
    m = model_of([helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["r"])],
                 {"a": a, "b": b}, ["q", "r"])
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(m, str(Path(tmp) / "m.onnx"))
        got = polyml.compile(Path(tmp) / "m.onnx", Path(tmp) / "out").run({"a": a, "b": b})
    np.testing.assert_array_equal(got["q"], [0, 0, np.iinfo(np.int64).min, 2])
    np.testing.assert_array_equal(got["r"], [0, 0, 0, 1])


def test_float_compare_logic_where_with_nan() -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    y = RNG.standard_normal((1, 4)).astype(np.float32)
    x[0, 0], x[1, 1], x[2, 2] = np.nan, np.inf, -np.inf
    y[0, 1] = x[0, 1]
    nodes = [helper.make_node(op, ["x", "y"], [f"c_{op}"], name=op) for op in COMPARE]
    outs = [f"c_{op}" for op in COMPARE]
    nodes += [
        helper.make_node("IsNaN", ["x"], ["nan"]),
        helper.make_node("IsInf", ["x"], ["inf"]),
        helper.make_node("IsInf", ["x"], ["posinf"], detect_negative=0),
        helper.make_node("And", ["c_Less", "c_Greater"], ["l_and"]),
        helper.make_node("Or", ["c_Less", "nan"], ["l_or"]),
        helper.make_node("Xor", ["c_Less", "inf"], ["l_xor"]),
        helper.make_node("Not", ["nan"], ["l_not"]),
        helper.make_node("Where", ["c_Less", "x", "y"], ["w"]),
        helper.make_node("Equal", ["nan", "inf"], ["b_eq"]),
    ]
    outs += ["nan", "inf", "posinf", "l_and", "l_or", "l_xor", "l_not", "w", "b_eq"]
    m = model_of(nodes, {"x": x, "y": y}, outs)
    errs = compile_and_compare(m, {"x": x, "y": y})
    assert all(e == 0.0 or np.isnan(e) for e in errs.values()), errs


def test_where_broadcasts_condition_and_branches() -> None:
    cond = RNG.random((1, 5)) < 0.5
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    import polyml

    for dtype in (np.float32, np.int64, np.int32, np.bool_):  # onnxruntime lacks some: numpy is the reference
        xv = x.astype(dtype)
        yv = np.array(-1, dtype=dtype) if dtype != np.bool_ else np.array(True)
        m = model_of([helper.make_node("Where", ["c", "x", "y"], ["w"])], {"c": cond, "x": xv}, ["w"], initializers={"y": yv})
        with tempfile.TemporaryDirectory() as tmp:
            onnx.save(m, str(Path(tmp) / "m.onnx"))
            got = polyml.compile(Path(tmp) / "m.onnx", Path(tmp) / "out").run({"c": cond, "x": xv})["w"]
        ref = np.where(cond, xv, yv)
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)


CASTS = [
    (np.float32, [TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL, TensorProto.FLOAT]),
    (np.int64, [TensorProto.FLOAT, TensorProto.INT32, TensorProto.BOOL]),
    (np.int32, [TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL]),
    (np.bool_, [TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32]),
]


@pytest.mark.parametrize("src, targets", CASTS, ids=[np.dtype(s).name for s, _ in CASTS])
def test_cast(src: type, targets: list[int]) -> None:
    if src is np.bool_:
        x = RNG.random((2, 7)) < 0.5
    elif src is np.float32:
        x = (RNG.standard_normal((2, 7)) * 100).astype(np.float32)
        x[0, :3] = [0.0, -0.0, 2.7]
    else:
        x = RNG.integers(-1000, 1000, (2, 7)).astype(src)
        x[0, 0] = 0
    nodes = [helper.make_node("Cast", ["x"], [f"y{t}"], to=t) for t in targets]
    check(model_of(nodes, {"x": x}, [f"y{t}" for t in targets]), {"x": x}, rtol=0.0)


def test_attention_mask_chain_fused_with_typed_inputs() -> None:
    """BERT's extended attention mask: int64 mask → Cast → (1 - m)·min → + scores → Softmax;
    the elementwise chain fuses (bool/int inputs read inside a float chain)."""
    mask = np.ones((1, 1, 1, 8), np.int64)
    mask[..., 6:] = 0
    scores = RNG.standard_normal((1, 2, 8, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Greater", ["mask", "zero"], ["keep"]),
        helper.make_node("Where", ["keep", "masked", "big"], ["sel"]),
        helper.make_node("Softmax", ["sel"], ["p"], axis=-1),
    ]
    inits = {"one": np.array(1.0, np.float32), "big": np.array(-1e4, np.float32), "zero": np.array(0, np.int64)}
    m = model_of(nodes, {"mask": mask, "scores": scores}, ["p"], initializers=inits)
    check(m, {"mask": mask, "scores": scores}, rtol=1e-5)
    check(m, {"mask": mask, "scores": scores}, rtol=1e-5, fuse=False)


def test_pow_mixed_types() -> None:
    x = RNG.uniform(0.5, 2.0, (3, 4)).astype(np.float32)
    e_int = RNG.integers(0, 4, (4,)).astype(np.int64)
    e_f = RNG.uniform(-1, 2, (3, 1)).astype(np.float32)
    nodes = [helper.make_node("Pow", ["x", "ei"], ["p1"]), helper.make_node("Pow", ["x", "ef"], ["p2"])]
    m = model_of(nodes, {"x": x, "ei": e_int, "ef": e_f}, ["p1", "p2"])
    check(m, {"x": x, "ei": e_int, "ef": e_f}, rtol=1e-6)
    assert onnxruntime_run(m, {"x": x, "ei": e_int, "ef": e_f})["p1"].dtype == np.float32


def test_coalesce_dims_groups() -> None:
    """Adjacent dims merge where every operand spans all or none of them; extent-1 dims join."""
    from polyml.codegen.builder import coalesce_dims

    assert coalesce_dims((1, 240, 28, 28), [(1, 240, 28, 28), (1, 240, 1, 1)]) == [[0, 1], [2, 3]]
    assert coalesce_dims((2, 3, 4), [(2, 3, 4), (3, 4)]) == [[0], [1, 2]]
    assert coalesce_dims((2, 3, 4), [(2, 3, 4), (2, 3, 4)]) == [[0, 1, 2]]
    assert coalesce_dims((2, 3, 4), [(2, 1, 4)]) == [[0], [1], [2]]
    assert coalesce_dims((2, 3, 4), [()]) == [[0, 1, 2]]  # a scalar spans none of them
    assert coalesce_dims((5, 1, 7), [(5, 1, 1), (1, 1, 7)]) == [[0, 1], [2]]


@pytest.mark.parametrize("a,b", [((1, 24, 28, 28), (1, 24, 1, 1)), ((2, 5, 3, 17), (5, 1, 17)),
                                 ((3, 1, 6, 33), (3, 4, 1, 1)), ((4, 7, 9), ()), ((1, 16, 40, 40), (1, 16, 40, 40))])
def test_broadcast_products_on_coalesced_nests(a, b) -> None:
    """The SE-style (1,C,H,W)·(1,C,1,1) product and other broadcasts, run on nests whose
    dims that every operand reads alike are merged, match onnxruntime (standalone and with a
    fused Sigmoid producer)."""
    rng = np.random.default_rng(3)
    out = np.broadcast_shapes(a, b)
    nodes = [helper.make_node("Sigmoid", ["s"], ["t"]), helper.make_node("Mul", ["x", "t"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(a)),
                                       helper.make_tensor_value_info("s", TensorProto.FLOAT, list(b))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal(a).astype(np.float32), "s": rng.standard_normal(b).astype(np.float32)}
    errs = compile_and_compare(model, feeds, threads=2, cache=False)
    assert max(errs.values()) <= 1e-6, errs
