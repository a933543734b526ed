"""Shape-building ops against onnxruntime: Expand, Tile, Trilu, EyeLike, CumSum, OneHot,
DepthToSpace, SpaceToDepth, and Range (folded when constant, refused when computed).

Every op is checked in every dtype it accepts (float32, int64, int32, bool) on seeded random
data.  onnxruntime has no kernel for some dtype combinations (DepthToSpace/SpaceToDepth of
integers or bool, EyeLike of bool, most OneHot type triples); there the expected values come from
onnx's reference evaluator, and :func:`expected` says which one answered.  All but CumSum on
float32 only move or select elements, so they must match bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyml.compiler import compile_graph
from polyml.errors import ShapeError, UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.graph import Graph, Node, TensorType
from polyml.testing import onnxruntime_run

DTYPES = ["float32", "int64", "int32", "bool"]
ELEM = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32, "bool": TensorProto.BOOL}


def data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    """Seeded values: normal floats, integers in [-100, 100), bools about half true."""
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    if dtype == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    return rng.integers(-100, 100, size=shape).astype(dtype)


def model_of(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[str, tuple[int, ...]]], outputs: list[str],
             initializers: dict[str, np.ndarray] | None = None, opset: int = 18) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(n, ELEM[dt], list(shape)) for n, (dt, shape) in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "g", vis, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def expected(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[str, dict[str, np.ndarray]]:
    """onnxruntime's outputs, or the reference evaluator's where onnxruntime has no kernel."""
    from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

    try:
        return "onnxruntime", onnxruntime_run(model, feeds)
    except OrtNotImplemented:
        from onnx.reference import ReferenceEvaluator

        names = [o.name for o in model.graph.output]
        return "onnx.reference", dict(zip(names, ReferenceEvaluator(model).run(None, feeds)))


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], rtol: float = 0.0) -> str:
    """Compile with polyml and require each output to equal the reference (dtype, shape, values)."""
    got = compile_graph(from_onnx(model)).run(feeds)
    source, ref = expected(model, feeds)
    assert set(got) == set(ref)
    for k, want in ref.items():
        assert got[k].dtype == want.dtype and got[k].shape == want.shape, (k, source, got[k].dtype, got[k].shape, want.shape)
        if rtol:
            np.testing.assert_allclose(got[k], want, rtol=rtol, atol=rtol * float(np.max(np.abs(want), initial=1.0)), err_msg=k)
        else:
            np.testing.assert_array_equal(got[k], want, err_msg=f"{k} vs {source}")
    return source


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


# -- Expand ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_expand(dtype: str) -> None:
    """Rank growth, size-1 dims on either side, a target of lower rank, a scalar input."""
    cases = {
        "a": ("x", i64(2, 1, 6)),   # (3, 1) -> (2, 3, 6): rank growth
        "b": ("x", i64(3, 4)),      # same rank, size-1 dim broadcast
        "c": ("x", i64(1)),         # lower-rank target of 1s: the input shape wins
        "d": ("x", i64(1, 1)),
        "e": ("v", i64(2, 1, 5)),   # (4, 1) along a target 1: bidirectional
        "f": ("s", i64(2, 3)),      # scalar input
        "g": ("r", i64(5, 2, 7)),   # rank 1 (7,) kept as trailing dim
    }
    nodes = [helper.make_node("Expand", [src, f"shape_{o}"], [o], name=f"expand_{o}") for o, (src, _) in cases.items()]
    inputs = {"x": (dtype, (3, 1)), "v": (dtype, (4, 1)), "s": (dtype, ()), "r": (dtype, (7,))}
    model = model_of(nodes, inputs, list(cases), {f"shape_{o}": s for o, (_, s) in cases.items()})
    check(model, {n: data(shape, dt, i) for i, (n, (dt, shape)) in enumerate(inputs.items())})


def test_expand_of_computed_tensor_to_zero_size() -> None:
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Expand", ["n", "s"], ["y"]),
             helper.make_node("Expand", ["n", "z"], ["e"])]
    model = model_of(nodes, {"x": ("float32", (1, 4))}, ["y", "e"], {"s": i64(3, 2, 4), "z": i64(0, 4)})
    check(model, {"x": data((1, 4), "float32")})


def test_expand_errors_name_the_node() -> None:
    bad = model_of([helper.make_node("Expand", ["x", "s"], ["y"], name="ex")], {"x": ("float32", (3, 2))}, ["y"], {"s": i64(4, 3)})
    with pytest.raises(ShapeError, match="Expand node 'ex'.*do not broadcast"):
        from_onnx(bad)
    computed = model_of([helper.make_node("Expand", ["x", "s"], ["y"], name="ex")],
                        {"x": ("float32", (3, 2)), "s": ("int64", (2,))}, ["y"])
    with pytest.raises(ShapeError, match="Expand node 'ex'.*compile-time constant"):
        from_onnx(computed)


# -- Tile ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_tile(dtype: str) -> None:
    cases = {
        "a": ("x", i64(1, 2, 3)),
        "b": ("x", i64(2, 1, 1)),
        "c": ("x", i64(1, 1, 1)),
        "d": ("x", i64(2, 0, 1)),   # a zero repeat: empty output
        "e": ("r", i64(3,)),        # rank 1
        "f": ("o", i64(4, 1)),      # size-1 dims
        "g": ("o", i64(2, 3)),
    }
    nodes = [helper.make_node("Tile", [src, f"reps_{o}"], [o], name=f"tile_{o}") for o, (src, _) in cases.items()]
    inputs = {"x": (dtype, (2, 3, 4)), "r": (dtype, (5,)), "o": (dtype, (1, 1))}
    model = model_of(nodes, inputs, list(cases), {f"reps_{o}": r for o, (_, r) in cases.items()})
    check(model, {n: data(shape, dt, i) for i, (n, (dt, shape)) in enumerate(inputs.items())})


def test_tile_errors_name_the_node() -> None:
    bad = model_of([helper.make_node("Tile", ["x", "r"], ["y"], name="tl")], {"x": ("float32", (3, 2))}, ["y"], {"r": i64(2)})
    with pytest.raises(ShapeError, match="Tile node 'tl'.*rank 2"):
        from_onnx(bad)
    computed = model_of([helper.make_node("Tile", ["x", "r"], ["y"], name="tl")],
                        {"x": ("float32", (3, 2)), "r": ("int64", (2,))}, ["y"])
    with pytest.raises(ShapeError, match="Tile node 'tl'.*compile-time constant"):
        from_onnx(computed)


# -- Trilu and EyeLike -----------------------------------------------------------------------

KS = [None, 0, 1, 2, -1, -3, 7, -7]  # 7 / -7: beyond the 4x5 matrix (all or nothing kept)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [1, 0])
def test_trilu(dtype: str, upper: int) -> None:
    nodes, inits, outs = [], {}, []
    for j, kk in enumerate(KS):
        ins = ["x"] if kk is None else ["x", f"k{j}"]
        if kk is not None:
            inits[f"k{j}"] = np.array(kk, np.int64)
        nodes.append(helper.make_node("Trilu", ins, [f"y{j}"], upper=upper))
        outs.append(f"y{j}")
    for j, src in enumerate(("b", "r", "c")):  # batch dims; one row; one column
        nodes.append(helper.make_node("Trilu", [src, "kb"], [f"z{j}"], upper=upper))
        outs.append(f"z{j}")
    inits["kb"] = np.array(1, np.int64)
    inputs = {"x": (dtype, (4, 5)), "b": (dtype, (2, 3, 3, 4)), "r": (dtype, (3, 1, 5)), "c": (dtype, (5, 1))}
    model = model_of(nodes, inputs, outs, inits)
    check(model, {n: data(shape, dt, i) for i, (n, (dt, shape)) in enumerate(inputs.items())})


def test_trilu_errors() -> None:
    vec = model_of([helper.make_node("Trilu", ["x"], ["y"], name="tr")], {"x": ("float32", (5,))}, ["y"])
    with pytest.raises(ShapeError, match="Trilu node 'tr'.*rank < 2"):
        from_onnx(vec)
    computed = model_of([helper.make_node("Trilu", ["x", "k"], ["y"], name="tr")],
                        {"x": ("float32", (3, 3)), "k": ("int64", ())}, ["y"])
    with pytest.raises(ShapeError, match="Trilu node 'tr'.*compile-time constant"):
        from_onnx(computed)


@pytest.mark.parametrize("dtype", DTYPES)
def test_eyelike(dtype: str) -> None:
    """Shapes wide, tall and 1x1, offsets on and beyond the matrix; the dtype attribute or not."""
    nodes, outs = [], []
    for j, (src, kk, to) in enumerate([("w", 0, None), ("w", 2, None), ("t", -1, None), ("t", 9, None),
                                       ("o", 0, None), ("w", 1, "float32"), ("t", -2, "int64"), ("w", 0, "int32")]):
        attrs = {"k": kk} | ({"dtype": ELEM[to]} if to else {})
        nodes.append(helper.make_node("EyeLike", [src], [f"y{j}"], **attrs))
        outs.append(f"y{j}")
    inputs = {"w": (dtype, (3, 5)), "t": (dtype, (4, 2)), "o": (dtype, (1, 1))}
    model = model_of(nodes, inputs, outs, opset=22)
    check(model, {n: data(shape, dt, i) for i, (n, (dt, shape)) in enumerate(inputs.items())})


# -- CumSum ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "int64", "int32"])
def test_cumsum(dtype: str) -> None:
    """Each axis of a 3-D tensor (negative too, int32 and int64 axis), exclusive × reverse;
    rank 1 and size-1 axes."""
    nodes, inits, outs = [], {}, []
    cases = [("x", a) for a in (0, 1, 2, -1, -3)] + [("v", 0), ("v", -1), ("s", 1), ("s", 0)]
    for j, (src, axis) in enumerate(cases):
        inits[f"a{j}"] = np.array(axis, np.int32 if j % 2 else np.int64)
        for excl in (0, 1):
            for rev in (0, 1):
                o = f"y{j}_{excl}{rev}"
                nodes.append(helper.make_node("CumSum", [src, f"a{j}"], [o], exclusive=excl, reverse=rev))
                outs.append(o)
    inputs = {"x": (dtype, (3, 4, 5)), "v": (dtype, (7,)), "s": (dtype, (2, 1))}
    model = model_of(nodes, inputs, outs, inits)
    check(model, {n: data(shape, dt, i) for i, (n, (dt, shape)) in enumerate(inputs.items())},
          rtol=1e-6 if dtype == "float32" else 0.0)


def test_cumsum_large_parallel() -> None:
    """Big enough for the outer dims to be split over threads; 1-element axis input."""
    model = model_of([helper.make_node("CumSum", ["x", "a"], ["y"]), helper.make_node("CumSum", ["x", "b"], ["z"], reverse=1)],
                     {"x": ("float32", (64, 9, 600))}, ["y", "z"], {"a": i64(1), "b": i64(-1)})
    check(model, {"x": data((64, 9, 600), "float32")}, rtol=1e-5)


def test_cumsum_refusals() -> None:
    b = model_of([helper.make_node("CumSum", ["x", "a"], ["y"], name="cs")], {"x": ("bool", (3,))}, ["y"], {"a": i64(0)})
    with pytest.raises(UnsupportedError, match="cs.*bool"):
        from_onnx(b)
    computed = model_of([helper.make_node("CumSum", ["x", "a"], ["y"], name="cs")],
                        {"x": ("float32", (3, 2)), "a": ("int64", ())}, ["y"])
    with pytest.raises(ShapeError, match="CumSum node 'cs'.*compile-time constant"):
        from_onnx(computed)


# -- OneHot ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "index_dtype, depth_dtype, value_dtype",
    [
        # combinations onnxruntime implements
        ("int64", "int64", "float32"),
        ("int64", "int64", "int64"),
        ("int64", "int32", "float32"),
        ("int64", "float32", "int32"),
        ("int32", "float32", "float32"),
        ("float32", "int64", "int64"),
        ("float32", "float32", "float32"),
        # the rest against onnx's reference evaluator
        ("int64", "int64", "int32"),
        ("int32", "int32", "int64"),
        ("int32", "int64", "bool"),
        ("float32", "int64", "bool"),
    ],
)
def test_onehot(index_dtype: str, depth_dtype: str, value_dtype: str) -> None:
    """Every axis (negative too); indices in range, negative, and out of range both ways."""
    depth = 6
    nodes, outs = [], []
    for j, axis in enumerate([None, 0, 1, 2, -1, -2, -3]):
        attrs = {} if axis is None else {"axis": axis}
        nodes.append(helper.make_node("OneHot", ["i", "depth", "values"], [f"y{j}"], **attrs))
        outs.append(f"y{j}")
    nodes.append(helper.make_node("OneHot", ["r", "depth", "values"], ["z"], axis=0))  # rank 1
    outs.append("z")
    idx = np.array([[0, 5, -1, -6, 6], [-7, 3, 100, -100, 2]])
    feeds = {"i": idx.astype(index_dtype), "r": np.arange(-8, 10, 2).astype(index_dtype)}

    def model(vdt: str, values: list[int]) -> onnx.ModelProto:
        inits = {"depth": np.array(depth, depth_dtype), "values": np.array(values, dtype=vdt)}
        return model_of(nodes, {"i": (index_dtype, (2, 5)), "r": (index_dtype, (9,))}, outs, inits)

    if value_dtype != "bool":
        check(model(value_dtype, [-3, 7]), feeds)
        return
    # neither onnxruntime nor the reference evaluator has bool values: expect int32's 0/1 as bool
    got = compile_graph(from_onnx(model("bool", [0, 1]))).run(feeds)
    _, ref = expected(model("int32", [0, 1]), feeds)
    for k, want in ref.items():
        assert got[k].dtype == np.bool_
        np.testing.assert_array_equal(got[k], want.astype(bool), err_msg=k)


def test_onehot_truncates_float_indices() -> None:
    model = model_of([helper.make_node("OneHot", ["i", "d", "v"], ["y"])], {"i": ("float32", (6,))}, ["y"],
                     {"d": np.array(4.0, np.float32), "v": np.array([0.5, 2.5], np.float32)})
    check(model, {"i": np.array([0.0, 1.9, 3.99, -0.5, -1.2, 4.5], np.float32)})


def test_onehot_refusals() -> None:
    computed = model_of([helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="oh")],
                        {"i": ("int64", (3,)), "d": ("int64", ())}, ["y"], {"v": np.array([0, 1], np.float32)})
    with pytest.raises(ShapeError, match="OneHot node 'oh'.*depth.*compile-time constant"):
        from_onnx(computed)
    bool_idx = model_of([helper.make_node("OneHot", ["i", "d", "v"], ["y"], name="oh")],
                        {"i": ("bool", (3,))}, ["y"], {"d": i64(3), "v": np.array([0, 1], np.float32)})
    with pytest.raises(UnsupportedError, match="oh.*bool"):
        from_onnx(bool_idx)


# -- DepthToSpace / SpaceToDepth -------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_depth_to_space(dtype: str) -> None:
    nodes, outs = [], []
    for j, (src, b, mode) in enumerate([("x", 2, "DCR"), ("x", 2, "CRD"), ("x", 1, "DCR"), ("t", 3, "DCR"),
                                        ("t", 3, "CRD"), ("o", 2, None)]):
        attrs = {"blocksize": b} | ({"mode": mode} if mode else {})
        nodes.append(helper.make_node("DepthToSpace", [src], [f"y{j}"], **attrs))
        outs.append(f"y{j}")
    inputs = {"x": (dtype, (2, 8, 3, 4)), "t": (dtype, (1, 18, 2, 1)), "o": (dtype, (1, 4, 1, 1))}
    model = model_of(nodes, inputs, outs)
    check(model, {n: data(shape, dt, i) for i, (n, (dt, shape)) in enumerate(inputs.items())})


@pytest.mark.parametrize("dtype", DTYPES)
def test_space_to_depth(dtype: str) -> None:
    """Both modes (opset 28 gives SpaceToDepth its ``mode``)."""
    nodes, outs = [], []
    for j, (src, b, mode) in enumerate([("x", 2, "DCR"), ("x", 2, "CRD"), ("x", 1, None), ("t", 3, "DCR"),
                                        ("t", 3, "CRD"), ("o", 2, None)]):
        attrs = {"blocksize": b} | ({"mode": mode} if mode else {})
        nodes.append(helper.make_node("SpaceToDepth", [src], [f"y{j}"], **attrs))
        outs.append(f"y{j}")
    inputs = {"x": (dtype, (2, 3, 4, 6)), "t": (dtype, (1, 2, 6, 3)), "o": (dtype, (1, 1, 2, 2))}
    model = model_of(nodes, inputs, outs, opset=28)
    check(model, {n: data(shape, dt, i) for i, (n, (dt, shape)) in enumerate(inputs.items())})


def test_space_round_trip_of_computed_tensors() -> None:
    """SpaceToDepth → DepthToSpace in the same mode is the identity, between other nests."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("SpaceToDepth", ["r"], ["s"], blocksize=2, mode="CRD"),
             helper.make_node("DepthToSpace", ["s"], ["d"], blocksize=2, mode="CRD"),
             helper.make_node("Sub", ["d", "r"], ["y"])]
    model = model_of(nodes, {"x": ("float32", (1, 3, 4, 8))}, ["y", "s"], opset=28)
    check(model, {"x": data((1, 3, 4, 8), "float32")})


def test_space_errors() -> None:
    odd = model_of([helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, name="d2s")], {"x": ("float32", (1, 6, 2, 2))}, ["y"])
    with pytest.raises(ShapeError, match="DepthToSpace node 'd2s'.*multiple"):
        from_onnx(odd)
    odd = model_of([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, name="s2d")], {"x": ("float32", (1, 1, 3, 2))}, ["y"])
    with pytest.raises(ShapeError, match="SpaceToDepth node 's2d'.*multiple"):
        from_onnx(odd)
    rank3 = model_of([helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=2, name="s2d")], {"x": ("float32", (1, 4, 4))}, ["y"])
    with pytest.raises(ShapeError, match="not 4-D"):
        from_onnx(rank3)


# -- large outputs: outer loops split over threads ------------------------------------------

def test_large_outputs_parallel() -> None:
    """Outputs of ≥ 2^15 elements, whose nests' outer loops run on OpenMP threads."""
    nodes = [helper.make_node("Expand", ["x", "s"], ["e"]),
             helper.make_node("Tile", ["x", "r"], ["t"]),
             helper.make_node("Trilu", ["m"], ["tr"], upper=0),
             helper.make_node("OneHot", ["i", "d", "v"], ["oh"], axis=1),
             helper.make_node("DepthToSpace", ["c"], ["d2s"], blocksize=2),
             helper.make_node("SpaceToDepth", ["c"], ["s2d"], blocksize=2)]
    inputs = {"x": ("float32", (64, 1)), "m": ("int32", (8, 70, 90)), "i": ("int64", (40, 30)), "c": ("float32", (2, 64, 24, 20))}
    inits = {"s": i64(9, 64, 80), "r": i64(40, 30), "d": i64(50), "v": np.array([0, 1], np.int64)}
    model = model_of(nodes, inputs, ["e", "t", "tr", "oh", "d2s", "s2d"], inits)
    feeds = {n: data(shape, dt, j) for j, (n, (dt, shape)) in enumerate(inputs.items())}
    feeds["i"] = np.random.default_rng(5).integers(-60, 60, size=(40, 30))
    check(model, feeds)


# -- Range -----------------------------------------------------------------------------------

def test_range_of_constants_folds() -> None:
    """Constant operands (literal or from Shape) fold at compile time; the result feeds a nest."""
    nodes = [helper.make_node("Shape", ["x"], ["shp"], start=1),
             helper.make_node("Squeeze", ["shp"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "rf"], ["y"])]
    model = model_of(nodes, {"x": ("float32", (2, 5))}, ["y"], {"zero": i64(0).reshape(()), "one": i64(1).reshape(())})
    check(model, {"x": data((2, 5), "float32")})


def test_range_of_computed_operands_is_refused_clearly() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["lim"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["zero", "lim", "one"], ["y"], name="rng")]
    model = model_of(nodes, {"x": ("int32", ())}, ["y"],
                     {"zero": np.array(0, np.float32), "one": np.array(1, np.float32)})
    with pytest.raises(UnsupportedError, match=r"Range node 'rng': limit \('lim'\) is computed at run time.*data-dependent"):
        from_onnx(model)


@pytest.mark.parametrize("dtype, start, limit, delta", [("float32", 1.5, -2.0, -0.75), ("int64", -3, 10, 4), ("int32", 9, 0, -2)])
def test_range_kernel_on_constants(dtype: str, start: float, limit: float, delta: float) -> None:
    """The kernel itself (reached by graphs a frontend did not fold): ``y[i] = start + i·delta``."""
    vals = {k: np.array(v, dtype) for k, v in (("s", start), ("l", limit), ("d", delta))}
    n = int(np.ceil((limit - start) / delta))
    graph = Graph("range", [Node("rng", "Range", ["s", "l", "d"], ["y"])],
                  {**{k: TensorType((), dtype) for k in vals}, "y": TensorType((n,), dtype)}, vals, [], ["y"])
    got = compile_graph(graph).run({})["y"]
    want = np.arange(start, limit, delta, dtype=dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)
