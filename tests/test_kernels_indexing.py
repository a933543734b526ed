"""Indexing ops against onnxruntime: Gather, GatherElements, GatherND, ScatterND,
ScatterElements (and Scatter), Slice and Split on computed data, in every dtype.

Moving data is exact, so every comparison is bit-for-bit (dtype and shape included).  Indices
are random in ``[-d, d)`` (negative ones count from the end); out-of-range indices in the input
data must give polyml's InputError naming the node, never a crash.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyml.compiler import compile_graph
from polyml.errors import GraphError, InputError, PolymlError, ShapeError
from polyml.frontends.onnx import from_onnx
from polyml.testing import onnxruntime_run

DTYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32, "bool": TensorProto.BOOL}


def make_model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[str, tuple[int, ...]]], outputs: list[str],
               opset: int = 18, initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model from nodes; ``inputs`` maps names to ``(dtype name, shape)``."""
    vis = [helper.make_tensor_value_info(n, DTYPES[d], list(s)) for n, (d, s) in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "g", vis, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def data(shape: tuple[int, ...], dtype: str = "float32", seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return rng.standard_normal(shape).astype(np.float32)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(-50, 50, shape).astype(dtype)


def indices(shape: tuple[int, ...], extent: int, dtype: str = "int64", seed: int = 1) -> np.ndarray:
    """Random valid indices in ``[-extent, extent)``."""
    return np.random.default_rng(seed).integers(-extent, extent, shape).astype(dtype)


def run_polyml(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    compiled = compile_graph(from_onnx(model))
    return compiled.run({k: v for k, v in feeds.items() if k in compiled.inputs})


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """polyml's outputs equal onnxruntime's exactly (values, dtype, shape)."""
    got = run_polyml(model, feeds)
    ref = onnxruntime_run(model, feeds)
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, (k, got[k].shape, ref[k].shape)
        np.testing.assert_array_equal(got[k], ref[k], err_msg=k)
    return got


def node(op: str, ins: list[str], outs: list[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op, ins, outs, name=f"{op.lower()}_{outs[0]}", **attrs)


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


# -- Gather ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, ishape, axis",
    [
        ((5,), (), 0),  # scalar index of a vector: a scalar
        ((5, 4), (), 0),  # scalar index: drops the axis
        ((5, 4), (3,), 0),
        ((5, 4), (2, 3), 1),
        ((5, 4), (2, 3), -1),  # axis = last
        ((3, 4, 5), (2,), 1),
        ((3, 4, 5), (2, 1, 3), -2),
        ((3, 4, 5), (), 2),
        ((1, 4, 1), (3,), 0),  # size-1 dims, every index is 0 or -1
        ((2, 3, 4, 5), (1, 2), 3),
        ((6, 3), (0,), 0),  # no indices: an empty output
    ],
)
def test_gather(shape: tuple[int, ...], ishape: tuple[int, ...], axis: int) -> None:
    model = make_model([node("Gather", ["x", "i"], ["y"], axis=axis)], {"x": ("float32", shape), "i": ("int64", ishape)}, ["y"])
    check(model, {"x": data(shape), "i": indices(ishape, shape[axis])})


@pytest.mark.parametrize("dtype", ["float32", "int64", "int32", "bool"])
def test_gather_dtypes(dtype: str) -> None:
    """Every data dtype, with int64 and int32 indices, on axes 0 and last, in one model."""
    nodes = [
        node("Gather", ["x", "i64"], ["a"], axis=0),
        node("Gather", ["x", "i32"], ["b"], axis=-1),
        node("Gather", ["x", "s32"], ["c"], axis=1),
    ]
    model = make_model(nodes, {"x": (dtype, (4, 3, 5)), "i64": ("int64", (2, 2)), "i32": ("int32", (3,)), "s32": ("int32", ())},
                       ["a", "b", "c"])
    check(model, {"x": data((4, 3, 5), dtype), "i64": indices((2, 2), 4), "i32": indices((3,), 5, "int32"),
                  "s32": np.array(-1, np.int32)})


def test_gather_embedding_lookup() -> None:
    """The transformer idiom: a constant table indexed by int64 token ids (parallel-sized)."""
    table = data((1000, 64), seed=3)
    model = make_model([node("Gather", ["table", "ids"], ["e"], axis=0), node("Relu", ["e"], ["y"])],
                       {"ids": ("int64", (2, 300))}, ["y", "e"], initializers={"table": table})
    check(model, {"ids": indices((2, 300), 1000)})


def test_gather_of_computed_data_feeding_ops() -> None:
    nodes = [node("Neg", ["x"], ["n"]), node("Gather", ["n", "i"], ["g"], axis=1), node("Abs", ["g"], ["y"])]
    model = make_model(nodes, {"x": ("float32", (3, 6, 2)), "i": ("int64", (4,))}, ["y", "g"])
    check(model, {"x": data((3, 6, 2)), "i": indices((4,), 6)})


# -- GatherElements --------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, ishape, axis",
    [
        ((5,), (7,), 0),
        ((3, 4), (3, 4), 0),
        ((3, 4), (3, 6), 1),
        ((3, 4), (2, 3), -1),  # indices smaller than data outside the axis
        ((2, 3, 4), (2, 3, 4), 1),
        ((2, 3, 4), (1, 2, 5), 2),
        ((1, 1, 4), (1, 1, 2), -3),
        ((3, 4), (3, 0), 1),  # empty
    ],
)
def test_gather_elements(shape: tuple[int, ...], ishape: tuple[int, ...], axis: int) -> None:
    model = make_model([node("GatherElements", ["x", "i"], ["y"], axis=axis)],
                       {"x": ("float32", shape), "i": ("int64", ishape)}, ["y"])
    check(model, {"x": data(shape), "i": indices(ishape, shape[axis])})


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_gather_elements_dtypes(dtype: str) -> None:
    nodes = [node("GatherElements", ["x", "i"], ["a"], axis=1), node("GatherElements", ["x", "j"], ["b"], axis=0)]
    model = make_model(nodes, {"x": (dtype, (3, 4)), "i": ("int32", (3, 2)), "j": ("int64", (5, 4))}, ["a", "b"])
    check(model, {"x": data((3, 4), dtype), "i": indices((3, 2), 4, "int32"), "j": indices((5, 4), 3)})


def test_gather_elements_large() -> None:
    """Large enough for the parallel nest."""
    model = make_model([node("GatherElements", ["x", "i"], ["y"], axis=-1)],
                       {"x": ("float32", (64, 600)), "i": ("int64", (64, 600))}, ["y"])
    check(model, {"x": data((64, 600)), "i": indices((64, 600), 600)})


# -- GatherND --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, ishape, batch_dims",
    [
        ((2, 2), (2, 2), 0),  # element rows
        ((2, 2), (2, 1), 0),  # slice rows
        ((2, 2, 2), (2, 1, 2), 0),
        ((2, 2, 2), (2, 1), 1),
        ((3, 4, 5), (3, 2, 2), 1),
        ((3, 4, 5, 2), (3, 4, 1), 2),
        ((4, 3), (1,), 0),  # rank-1 indices: one row
        ((4, 3), (2,), 0),  # a scalar output
        ((1, 5, 1), (6, 3), 0),
        ((2, 3, 4), (2, 5, 0), 1),  # rows of length 0: whole batch slices
    ],
)
def test_gather_nd(shape: tuple[int, ...], ishape: tuple[int, ...], batch_dims: int) -> None:
    rng = np.random.default_rng(2)
    idx = np.zeros(ishape, np.int64)
    for t in range(ishape[-1]):  # column t indexes data dim batch_dims + t
        d = shape[batch_dims + t]
        idx[..., t] = rng.integers(-d, d, ishape[:-1])
    model = make_model([node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)],
                       {"x": ("float32", shape), "i": ("int64", ishape)}, ["y"])
    check(model, {"x": data(shape), "i": idx})


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_gather_nd_dtypes(dtype: str) -> None:
    model = make_model([node("GatherND", ["x", "i"], ["y"])], {"x": (dtype, (3, 4, 2)), "i": ("int64", (5, 2))}, ["y"])
    idx = np.stack([indices((5,), 3, seed=4), indices((5,), 4, seed=5)], axis=-1)
    check(model, {"x": data((3, 4, 2), dtype), "i": idx})


def test_gather_nd_int32_indices() -> None:
    """int32 indices (the ONNX type is int64; onnxruntime has no int32 kernel): numpy reference."""
    model = make_model([node("GatherND", ["x", "i"], ["y"], batch_dims=1)], {"x": ("float32", (2, 3, 4)), "i": ("int32", (2, 2, 1))}, ["y"])
    x, i = data((2, 3, 4)), np.array([[[1], [-1]], [[0], [2]]], np.int32)
    got = run_polyml(model, {"x": x, "i": i})["y"]
    np.testing.assert_array_equal(got, np.stack([x[b][i[b, :, 0]] for b in range(2)]))


# -- ScatterND -------------------------------------------------------------------------------

def scatter_nd_reference(x: np.ndarray, idx: np.ndarray, upd: np.ndarray, reduction: str) -> np.ndarray:
    """ONNX's sequential semantics: updates applied in index order."""
    out = x.copy()
    m = idx.shape[-1]
    for j in np.ndindex(idx.shape[:-1]):
        at = tuple(int(v) for v in idx[j])
        at = tuple(a % x.shape[d] for d, a in enumerate(at))
        u = upd[j]
        if reduction == "none":
            out[at] = u
        elif reduction == "add":
            out[at] = out[at] + u if x.dtype != bool else out[at] | u
        elif reduction == "mul":
            out[at] = out[at] * u if x.dtype != bool else out[at] & u
        elif reduction == "max":
            out[at] = np.maximum(out[at], u)
        else:
            out[at] = np.minimum(out[at], u)
    assert m <= x.ndim
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_reductions(reduction: str) -> None:
    """Slices of a 3-D tensor, with a duplicate row for the reductions, and negative indices."""
    idx = i64(0, -2, 3, 0 if reduction != "none" else 1).reshape(4, 1)
    model = make_model([node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)],
                       {"x": ("float32", (4, 3, 2)), "i": ("int64", (4, 1)), "u": ("float32", (4, 3, 2))}, ["y"])
    check(model, {"x": data((4, 3, 2)), "i": idx, "u": data((4, 3, 2), seed=7)})


@pytest.mark.parametrize(
    "shape, ishape",
    [
        ((8,), (4, 1)),  # elements of a vector
        ((4, 5), (3, 2)),  # elements of a matrix
        ((4, 5), (2, 2, 1)),  # rows, from rank-3 indices
        ((2, 3, 4), (2, 2)),
        ((2, 3, 4), (3,)),  # rank-1 indices: one element
        ((2, 3, 4), (0, 1)),  # no updates: a copy
        ((1, 3, 1), (2, 2)),
    ],
)
def test_scatter_nd_shapes(shape: tuple[int, ...], ishape: tuple[int, ...]) -> None:
    """Distinct index rows (ONNX leaves duplicates undefined without a reduction)."""
    rng = np.random.default_rng(3)
    m, rows = ishape[-1], int(np.prod(ishape[:-1], dtype=np.int64))
    flat = rng.permutation(int(np.prod(shape[:m], dtype=np.int64)))[:rows]
    idx = np.stack(np.unravel_index(flat, shape[:m]), axis=-1).reshape(ishape).astype(np.int64) if m else np.zeros(ishape, np.int64)
    idx[idx % 2 == 1] -= np.broadcast_to(np.array(shape[:m]), idx.shape)[idx % 2 == 1]  # odd ones negative
    ushape = (*ishape[:-1], *shape[m:])
    model = make_model([node("ScatterND", ["x", "i", "u"], ["y"])],
                       {"x": ("float32", shape), "i": ("int64", ishape), "u": ("float32", ushape)}, ["y"])
    check(model, {"x": data(shape), "i": idx, "u": data(ushape, seed=9)})


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_scatter_nd_dtypes(dtype: str) -> None:
    nodes = [node("ScatterND", ["x", "i", "u"], ["y"]), node("ScatterND", ["x", "i", "u"], ["z"], reduction="add")]
    if dtype != "bool":
        nodes += [node("ScatterND", ["x", "j", "v"], [r], reduction=r) for r in ("mul", "max", "min")]
    model = make_model(nodes, {"x": (dtype, (5, 3)), "i": ("int64", (2, 1)), "u": (dtype, (2, 3)),
                               "j": ("int64", (4, 2)), "v": (dtype, (4,))}, [n.output[0] for n in nodes])
    feeds = {"x": data((5, 3), dtype), "i": i64(4, -5).reshape(2, 1), "u": data((2, 3), dtype, seed=5),
             "j": i64(0, 0, 0, 0, -1, 2, 1, 1).reshape(4, 2), "v": data((4,), dtype, seed=6)}
    if dtype == "bool":  # onnxruntime has no bool ScatterND with a reduction: the numpy reference
        got = run_polyml(model, feeds)
        np.testing.assert_array_equal(got["y"], scatter_nd_reference(feeds["x"], feeds["i"], feeds["u"], "none"))
        np.testing.assert_array_equal(got["z"], scatter_nd_reference(feeds["x"], feeds["i"], feeds["u"], "add"))
        return
    check(model, feeds)


def test_scatter_nd_duplicates_last_wins() -> None:
    """reduction none with duplicate rows: sequential, the last update wins."""
    model = make_model([node("ScatterND", ["x", "i", "u"], ["y"])],
                       {"x": ("float32", (4, 3)), "i": ("int64", (5, 1)), "u": ("float32", (5, 3))}, ["y"])
    feeds = {"x": data((4, 3)), "i": i64(1, 3, -3, 0, 3).reshape(5, 1), "u": data((5, 3), seed=8)}
    got = run_polyml(model, feeds)["y"]
    np.testing.assert_array_equal(got, scatter_nd_reference(feeds["x"], feeds["i"], feeds["u"], "none"))


def test_scatter_nd_bool_reductions() -> None:
    """bool data: add/max are or, mul/min are and (numpy reference)."""
    nodes = [node("ScatterND", ["x", "i", "u"], [r], reduction=r) for r in ("add", "mul", "max", "min")]
    model = make_model(nodes, {"x": ("bool", (6,)), "i": ("int64", (4, 1)), "u": ("bool", (4,))}, ["add", "mul", "max", "min"])
    x, i, u = np.array([0, 0, 1, 1, 0, 1], bool), i64(0, 1, 2, 3).reshape(4, 1), np.array([1, 0, 1, 0], bool)
    got = run_polyml(model, {"x": x, "i": i, "u": u})
    np.testing.assert_array_equal(got["add"], [1, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(got["max"], [1, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(got["mul"], [0, 0, 1, 0, 0, 1])
    np.testing.assert_array_equal(got["min"], [0, 0, 1, 0, 0, 1])


# -- ScatterElements -------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, ishape, axis",
    [
        ((6,), (4,), 0),
        ((3, 4), (2, 4), 0),
        ((3, 4), (3, 2), 1),
        ((3, 4), (2, 3), -1),  # axis = last, indices smaller than data
        ((2, 3, 4), (2, 2, 4), 1),
        ((2, 3, 4), (1, 3, 2), -1),
        ((1, 5, 1), (1, 2, 1), 1),
        ((3, 4), (0, 4), 0),
    ],
)
def test_scatter_elements_shapes(shape: tuple[int, ...], ishape: tuple[int, ...], axis: int) -> None:
    """Distinct targets per line along the axis, half of them negative."""
    rng = np.random.default_rng(4)
    a = axis % len(shape)
    idx = np.zeros(ishape, np.int64)
    for line in np.ndindex(*ishape[:a], *ishape[a + 1 :]):
        targets = rng.permutation(shape[a])[: ishape[a]]
        targets = np.where(rng.integers(0, 2, targets.shape) == 1, targets - shape[a], targets)
        idx[(*line[:a], slice(None), *line[a:])] = targets
    model = make_model([node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis)],
                       {"x": ("float32", shape), "i": ("int64", ishape), "u": ("float32", ishape)}, ["y"])
    check(model, {"x": data(shape), "i": idx, "u": data(ishape, seed=9)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "int64", "int32"])
def test_scatter_elements_reductions(reduction: str, dtype: str) -> None:
    """Duplicate indices combine in order (with none: distinct targets)."""
    idx = i64(1, -1, 1, 0, 2, 0).reshape(2, 3) if reduction != "none" else i64(1, -1, 0, 0, 2, 1).reshape(2, 3)
    model = make_model([node("ScatterElements", ["x", "i", "u"], ["y"], axis=-1, reduction=reduction)],
                       {"x": (dtype, (2, 4)), "i": ("int64", (2, 3)), "u": (dtype, (2, 3))}, ["y"])
    check(model, {"x": data((2, 4), dtype), "i": idx, "u": data((2, 3), dtype, seed=3)})


def test_scatter_elements_bool_and_int32_indices() -> None:
    model = make_model([node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)],
                       {"x": ("bool", (3, 2)), "i": ("int32", (2, 2)), "u": ("bool", (2, 2))}, ["y"])
    check(model, {"x": data((3, 2), "bool"), "i": np.array([[0, -1], [2, 1]], np.int32), "u": data((2, 2), "bool", seed=2)})


def test_scatter_elements_duplicates_last_wins() -> None:
    model = make_model([node("ScatterElements", ["x", "i", "u"], ["y"], axis=0)],
                       {"x": ("float32", (5,)), "i": ("int64", (4,)), "u": ("float32", (4,))}, ["y"])
    x, u = data((5,)), np.array([1, 2, 3, 4], np.float32)
    got = run_polyml(model, {"x": x, "i": i64(2, -3, 0, 2), "u": u})["y"]
    np.testing.assert_array_equal(got, [3, x[1], 4, x[3], x[4]])


def test_scatter_opset10() -> None:
    """Scatter, ScatterElements' name before opset 11."""
    model = make_model([node("Scatter", ["x", "i", "u"], ["y"], axis=1)],
                       {"x": ("float32", (3, 3)), "i": ("int64", (2, 2)), "u": ("float32", (2, 2))}, ["y"], opset=10)
    check(model, {"x": data((3, 3)), "i": i64(2, 0, 1, 2).reshape(2, 2), "u": data((2, 2), seed=1)})


# -- out-of-range indices --------------------------------------------------------------------

@pytest.mark.parametrize(
    "op, shapes, bad",
    [
        ("Gather", {"x": (4, 3), "i": (2,)}, i64(1, 4)),
        ("Gather", {"x": (4, 3), "i": (2,)}, i64(-5, 0)),
        ("GatherElements", {"x": (4, 3), "i": (4, 3)}, np.full((4, 3), 7, np.int64)),
        ("GatherND", {"x": (4, 3), "i": (1, 2)}, i64(0, 3).reshape(1, 2)),
        ("ScatterND", {"x": (4, 3), "i": (1, 1), "u": (1, 3)}, i64(-9).reshape(1, 1)),
        ("ScatterElements", {"x": (4, 3), "i": (1, 3), "u": (1, 3)}, i64(0, 4, 1).reshape(1, 3)),
    ],
)
def test_out_of_range_index_is_an_input_error(op: str, shapes: dict[str, tuple[int, ...]], bad: np.ndarray) -> None:
    """An index outside the data gives an error naming the node; valid data still runs after."""
    inputs = {n: ("int64" if n == "i" else "float32", s) for n, s in shapes.items()}
    model = make_model([helper.make_node(op, list(shapes), ["y"], name="lookup")], inputs, ["y"])
    compiled = compile_graph(from_onnx(model))
    feeds = {n: data(s) for n, s in shapes.items() if n != "i"}
    with pytest.raises(InputError, match=f"{op} node 'lookup'.*out of range"):
        compiled.run({**feeds, "i": bad})
    good = np.zeros_like(bad)
    got = compiled.run({**feeds, "i": good})["y"]
    np.testing.assert_array_equal(got, onnxruntime_run(model, {**feeds, "i": good})["y"])


@pytest.mark.parametrize(
    "op, shapes",
    [
        ("Gather", {"x": (0, 3), "i": (2,)}),
        ("GatherElements", {"x": (0, 2), "i": (1, 2)}),
        ("GatherND", {"x": (3, 0, 2), "i": (1, 2)}),
        ("ScatterND", {"x": (0, 3), "i": (1, 1), "u": (1, 3)}),
    ],
)
def test_indexing_an_empty_dimension_is_refused(op: str, shapes: dict[str, tuple[int, ...]]) -> None:
    """Every index into a dimension of extent 0 is out of range: refused at compile time."""
    inputs = {n: ("int64" if n == "i" else "float32", s) for n, s in shapes.items()}
    model = make_model([helper.make_node(op, list(shapes), ["y"], name="lookup")], inputs, ["y"])
    with pytest.raises(ShapeError, match=f"{op} node 'lookup'.*extent 0"):
        from_onnx(model)


# -- Slice -----------------------------------------------------------------------------------

BIG = 2**63 - 1


@pytest.mark.parametrize(
    "shape, starts, ends, axes, steps",
    [
        ((20, 10, 5), [0, 0], [3, 10], [0, 1], [1, 1]),
        ((20, 10, 5), [1], [1000], [1], [1]),  # end clamped
        ((20, 10, 5), [-3], [-1], [0], None),
        ((20, 10, 5), [20], [BIG], [1], [1]),  # start clamped: empty
        ((20, 10, 5), [5], [2], [0], [1]),  # start after end: empty
        ((20, 10, 5), [0, 0, 3], [20, 10, 4], None, None),  # default axes and steps
        ((20, 10, 5), [0, 1], [-1, 9], [-1, -2], [2, 3]),  # negative axes
        ((20, 10, 5), [20, 10, 4], [0, 0, 1], [0, 1, 2], [-1, -3, -2]),  # negative steps
        ((20, 10, 5), [-1], [-BIG - 1], [1], [-1]),  # reverse a whole axis
        ((20, 10, 5), [BIG], [-BIG - 1], [2], [-2]),
        ((20, 10, 5), [2], [7], [-1], [BIG]),
        ((1, 6, 1), [0, 1], [1, 6], [0, 1], [1, 2]),
        ((7,), [-100], [100], None, [3]),
        ((3, 4), [0], [0], [1], [-1]),  # empty along a negative step
    ],
)
def test_slice(shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int] | None, steps: list[int] | None) -> None:
    ins, inits = ["x", "s", "e"], {"s": i64(*starts), "e": i64(*ends)}
    if axes is not None or steps is not None:
        ins.append("a" if axes is not None else "")
        if axes is not None:
            inits["a"] = i64(*axes)
    if steps is not None:
        ins.append("p")
        inits["p"] = i64(*steps)
    model = make_model([node("Slice", ins, ["y"])], {"x": ("float32", shape)}, ["y"], initializers=inits)
    check(model, {"x": data(shape)})


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_slice_dtypes(dtype: str) -> None:
    """Every data dtype, with int64 and int32 starts/ends."""
    nodes = [node("Slice", ["x", "s", "e", "a", "p"], ["y"]), node("Slice", ["x", "s32", "e32"], ["z"])]
    inits = {"s": i64(-1, 1), "e": i64(0, 4), "a": i64(1, 0), "p": i64(-2, 2),
             "s32": np.array([1], np.int32), "e32": np.array([3], np.int32)}
    model = make_model(nodes, {"x": (dtype, (5, 6))}, ["y", "z"], initializers=inits)
    check(model, {"x": data((5, 6), dtype)})


def test_slice_opset9_attributes() -> None:
    model = make_model([node("Slice", ["x"], ["y"], starts=[1, -3], ends=[1000, -1], axes=[0, 2])],
                       {"x": ("float32", (4, 3, 5))}, ["y"], opset=9)
    check(model, {"x": data((4, 3, 5))})


def test_slice_of_computed_data_in_a_chain() -> None:
    """Slice between two nests, large enough for the parallel nest, plus a rotary-style half split."""
    nodes = [
        node("Relu", ["x"], ["r"]),
        node("Slice", ["r", "s", "e", "a"], ["lo"]),
        node("Slice", ["r", "e", "big", "a"], ["hi"]),
        node("Sub", ["lo", "hi"], ["y"]),
    ]
    inits = {"s": i64(0), "e": i64(32), "big": i64(BIG), "a": i64(-1)}
    model = make_model(nodes, {"x": ("float32", (8, 128, 64))}, ["y", "lo"], initializers=inits)
    check(model, {"x": data((8, 128, 64))})


def test_slice_specialized_starts_input() -> None:
    """starts/ends as int64 graph inputs, specialized to constants (the node suite's form)."""
    model = make_model([node("Slice", ["x", "s", "e"], ["y"])],
                       {"x": ("float32", (6, 4)), "s": ("int64", (2,)), "e": ("int64", (2,))}, ["y"])
    values = {"s": i64(1, -3), "e": i64(5, 4)}
    x = data((6, 4))
    got = compile_graph(from_onnx(model, input_values=values)).run({"x": x})["y"]
    np.testing.assert_array_equal(got, x[1:5, -3:4])


def test_slice_starts_must_be_constant() -> None:
    model = make_model([node("Slice", ["x", "s", "e"], ["y"])],
                       {"x": ("float32", (6, 4)), "s": ("int64", (1,)), "e": ("int64", (1,))}, ["y"])
    with pytest.raises(ShapeError, match="Slice node 'slice_y'.*starts.*compile-time constant"):
        from_onnx(model)


@pytest.mark.parametrize("axes, steps, what", [([0, 0], [1, 1], "repeated axes"), ([0], [0], "step 0"), ([2], [1], "axis 2 out of range")])
def test_slice_rejects_bad_operands(axes: list[int], steps: list[int], what: str) -> None:
    n = len(axes)
    inits = {"s": i64(*[0] * n), "e": i64(*[1] * n), "a": i64(*axes), "p": i64(*steps)}
    model = make_model([node("Slice", ["x", "s", "e", "a", "p"], ["y"])], {"x": ("float32", (3, 4))}, ["y"], initializers=inits)
    with pytest.raises(GraphError, match=what):
        from_onnx(model)


# -- Split -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, axis, split, n",
    [
        ((6,), 0, None, 3),
        ((6, 4), 1, [1, 3], 2),
        ((6, 4), -1, None, 2),  # axis = last
        ((2, 7, 3), 1, [2, 0, 5], 3),  # a zero-size part
        ((2, 7, 3), -2, [7], 1),
        ((1, 4, 1), 1, [1, 1, 2], 3),
    ],
)
def test_split(shape: tuple[int, ...], axis: int, split: list[int] | None, n: int) -> None:
    outs = [f"y{j}" for j in range(n)]
    ins, inits = (["x", "s"], {"s": i64(*split)}) if split is not None else (["x"], {})
    # opset 13: equal parts when there is no split input (opset 18 wants split or num_outputs)
    model = make_model([node("Split", ins, outs, axis=axis)], {"x": ("float32", shape)}, outs, opset=13, initializers=inits)
    check(model, {"x": data(shape)})


@pytest.mark.parametrize("shape, n", [((7,), 3), ((2, 10), 4), ((2, 6), 3)])
def test_split_num_outputs_opset18(shape: tuple[int, ...], n: int) -> None:
    """num_outputs: chunks of ceil(d / n), the last one smaller."""
    outs = [f"y{j}" for j in range(n)]
    model = make_model([node("Split", ["x"], outs, axis=-1, num_outputs=n)], {"x": ("float32", shape)}, outs)
    check(model, {"x": data(shape)})


def test_split_attribute_form_opset11() -> None:
    model = make_model([node("Split", ["x"], ["a", "b", "c"], axis=0, split=[1, 2, 2])], {"x": ("float32", (5, 2))}, ["a", "b", "c"], opset=11)
    check(model, {"x": data((5, 2))})


@pytest.mark.parametrize("dtype", ["int64", "int32", "bool"])
def test_split_dtypes(dtype: str) -> None:
    model = make_model([node("Split", ["x", "s"], ["a", "b"], axis=0)], {"x": (dtype, (5, 3))}, ["a", "b"],
                       initializers={"s": i64(2, 3)})
    check(model, {"x": data((5, 3), dtype)})


def test_split_of_computed_data_with_unused_output() -> None:
    """An output nobody reads is dropped; the others feed ops (parallel-sized parts)."""
    nodes = [node("Neg", ["x"], ["n"]), node("Split", ["n"], ["a", "b", "c"], axis=1, num_outputs=3),
             node("Add", ["a", "c"], ["y"])]
    model = make_model(nodes, {"x": ("float32", (2, 3 * 128, 128))}, ["y"])
    check(model, {"x": data((2, 3 * 128, 128))})


@pytest.mark.parametrize(
    "attrs, inits, match",
    [
        ({}, {"s": i64(2, 2)}, "do not split"),
        ({}, {}, "equal parts"),
        ({"num_outputs": 3}, {}, "num_outputs 3"),
    ],
)
def test_split_rejects_bad_sizes(attrs: dict, inits: dict, match: str) -> None:
    model = make_model([node("Split", ["x", *inits], ["a", "b"], **attrs)], {"x": ("float32", (5,))}, ["a", "b"], initializers=inits)
    with pytest.raises(PolymlError, match=match):
        from_onnx(model)
