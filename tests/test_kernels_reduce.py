"""Reductions (kernels/reduce.py) and ArgMax/ArgMin (kernels/argmax.py) against onnxruntime.

Most tests build one model holding many nodes over the same input (one compile, every output
compared), so each op meets many axes/keepdims combinations cheaply.  Large shapes run the
parallel row loops (threads=2) and are also checked single-threaded.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from polyml.compiler import compile as polyml_compile
from polyml.errors import UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.kernels.reduce import REDUCE_OPS, merged_view
from polyml.testing import compile_and_compare, onnxruntime_run, single_node_model

TOL = 1e-5
FLOAT_OPS = sorted(REDUCE_OPS)
INT_OPS = sorted(op for op, spec in REDUCE_OPS.items() if "int64" in spec.dtypes)


def graph_model(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], opset: int = 18,
                initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model of ``nodes`` whose every node output is a graph output."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)) for n, a in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(o) for n in nodes for o in n.output if o]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "reduce_test", vis, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tol: float = TOL, **options) -> dict[str, float]:
    errs = compile_and_compare(model, feeds, **options)
    assert errs and max(errs.values()) <= tol, {k: v for k, v in errs.items() if not v <= tol}
    return errs


def data(op: str, shape: tuple[int, ...], dtype: str = "float32", seed: int = 0) -> np.ndarray:
    """Inputs that keep each op well conditioned: positive for ReduceLogSum, near 1 for
    ReduceProd, small integers (with ties) for integer types."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype != "float32":
        lo, hi = (-2, 3) if op == "ReduceProd" else (-50, 50)
        return rng.integers(lo, hi, shape).astype(dtype)
    x = rng.standard_normal(shape).astype(np.float32)
    if op == "ReduceLogSum":
        return np.abs(x) + np.float32(0.1)
    if op == "ReduceProd":
        return (1.0 + 0.1 * x).astype(np.float32)
    return x


# (axes or None for the default, keepdims, noop_with_empty_axes) on a (3, 4, 5, 6) input
AXES_CASES = [([1], 1, 0), ([-1], 0, 0), ([0, 2], 1, 0), ([2, 3], 0, 0), ([1, 2, 3], 1, 0), ([0, 1, 2, 3], 0, 0),
              (None, 1, 0), (None, 0, 1), ([3, 0], 1, 0)]


def reduce_nodes(op: str, cases=AXES_CASES, opset: int = 18) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """One node per case, axes as constant inputs (opset ≥ 18) or attributes."""
    nodes, inits = [], {}
    for j, (axes, keepdims, noop) in enumerate(cases):
        attrs = {"keepdims": keepdims, **({"noop_with_empty_axes": noop} if noop else {})}
        ins = ["x"]
        if axes is not None and (opset >= 18 or op == "ReduceSum" and opset >= 13):
            inits[f"axes{j}"] = np.array(axes, np.int64)
            ins.append(f"axes{j}")
        elif axes is not None:
            attrs["axes"] = axes
        nodes.append(helper.make_node(op, ins, [f"y{j}"], name=f"{op}{j}", **attrs))
    return nodes, inits


@pytest.mark.parametrize("op", FLOAT_OPS)
def test_reduce_float32(op: str) -> None:
    """Every op over single, several, non-adjacent, trailing, all and no axes."""
    nodes, inits = reduce_nodes(op)
    x = data(op, (3, 4, 5, 6))
    check(graph_model(nodes, {"x": x}, initializers=inits), {"x": x})


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceL2", "ReduceLogSumExp", "ReduceMax"])
def test_reduce_axes_attribute(op: str) -> None:
    """opset 13: axes as an attribute (ReduceSum already took them as an input)."""
    nodes, inits = reduce_nodes(op, AXES_CASES[:7], opset=13)
    x = data(op, (3, 4, 5, 6))
    check(graph_model(nodes, {"x": x}, opset=13, initializers=inits), {"x": x})


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_reduce_integers(dtype: str) -> None:
    """Integer reductions are exact (mean and L2 truncate, as onnxruntime)."""
    nodes, inits = [], {}
    feeds = {}
    for op in INT_OPS:
        ns, its = reduce_nodes(op, [([1], 1, 0), ([0, 2], 0, 0), ([-1], 0, 0), (None, 1, 0)])
        for n in ns:
            n.input[0] = f"x_{op}"
            n.output[0] = f"{op}_{n.output[0]}"
            for i, a in enumerate(n.input[1:], 1):
                n.input[i] = f"{op}_{a}"
        nodes += ns
        inits.update({f"{op}_{k}": v for k, v in its.items()})
        feeds[f"x_{op}"] = data(op, (3, 4, 5), dtype, seed=len(feeds))
    check(graph_model(nodes, feeds, initializers=inits), feeds, tol=0.0)


def test_reduce_bool() -> None:
    """ReduceMax/ReduceMin of bool (opset 20): any / all."""
    nodes = []
    for op in ("ReduceMax", "ReduceMin"):
        ns, inits = reduce_nodes(op, [([1], 1, 0), ([0, 2], 0, 0), (None, 0, 0)])
        for n in ns:
            n.output[0] = f"{op}_{n.output[0]}"
        nodes += ns
    x = data("", (3, 4, 5), "bool")
    x[0] = True  # some groups all true, some all false
    x[1] = False
    check(graph_model(nodes, {"x": x}, opset=20, initializers=inits), {"x": x}, tol=0.0)


@pytest.mark.parametrize("op", FLOAT_OPS)
def test_reduce_empty_input(op: str) -> None:
    """A zero-size input: reducing the empty axis gives the reduction of nothing (0, 1, ±inf,
    NaN for the mean); reducing another axis gives an empty output."""
    x = np.zeros((2, 0, 3), np.float32)
    nodes, inits = reduce_nodes(op, [([1], 1, 0), ([1], 0, 0), ([2], 1, 0)])
    model = graph_model(nodes, {"x": x}, initializers=inits)
    with tempfile.TemporaryDirectory() as tmp:
        onnx.save(model, Path(tmp) / "m.onnx")
        got = polyml_compile(Path(tmp) / "m.onnx", Path(tmp) / "b").run({"x": x})
    ref = onnxruntime_run(model, {"x": x})
    for name in ref:
        assert got[name].shape == ref[name].shape, name
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)


@pytest.mark.parametrize("shape,axes", [((7,), [0]), ((1, 5, 1, 7), [0, 2]), ((1, 5, 1, 7), [1]), ((2, 3, 1, 4, 5), [2, 4]),
                                        ((2, 3, 1, 4, 5), [0, 3]), ((1, 1, 1), [1])],
                         ids=["rank1", "size1-axes", "size1-kept", "rank5-a", "rank5-b", "all-ones"])
def test_reduce_edge_shapes(shape: tuple[int, ...], axes: list[int]) -> None:
    nodes = []
    inits = {"axes": np.array(axes, np.int64)}
    for op in FLOAT_OPS:
        nodes.append(helper.make_node(op, ["x", "axes"], [f"{op}_y"], keepdims=1))
        nodes.append(helper.make_node(op, ["x", "axes"], [f"{op}_z"], keepdims=0))
    x = (np.abs(data("", shape)) + np.float32(0.5)).astype(np.float32)
    check(graph_model(nodes, {"x": x}, initializers=inits), {"x": x})


@pytest.mark.parametrize("threads", [2, 1])
def test_reduce_large_rows(threads: int) -> None:
    """Shapes over the parallel threshold: the leading kept dim is the parallel row loop;
    inner (attention-like), middle and outer axes, the numerically stable log-sum-exp."""
    x = np.random.default_rng(3).standard_normal((64, 96, 40)).astype(np.float32) * 30
    nodes, inits = [], {}
    for j, (op, axes) in enumerate([("ReduceSum", [2]), ("ReduceMean", [1]), ("ReduceMax", [-1]), ("ReduceMin", [1, 2]),
                                    ("ReduceLogSumExp", [2]), ("ReduceLogSumExp", [1]), ("ReduceL2", [2]),
                                    ("ReduceSumSquare", [0]), ("ReduceL1", [0, 2])]):
        inits[f"a{j}"] = np.array(axes, np.int64)
        nodes.append(helper.make_node(op, ["x", f"a{j}"], [f"y{j}"], keepdims=j % 2))
    check(graph_model(nodes, {"x": x}, initializers=inits), {"x": x}, tol=2e-5, threads=threads)


def test_reduce_large_integers() -> None:
    x = np.random.default_rng(4).integers(-1000, 1000, (64, 1024)).astype(np.int64)
    nodes = [helper.make_node(op, ["x", "a"], [f"{op}_y"], keepdims=0) for op in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceL1")]
    check(graph_model(nodes, {"x": x}, initializers={"a": np.array([1], np.int64)}), {"x": x}, tol=0.0, threads=2)


def test_log_sum_exp_is_stable() -> None:
    """Inputs around ±1e4: exp overflows without subtracting the maximum."""
    x = (np.random.default_rng(5).standard_normal((4, 33)) * 1e4).astype(np.float32)
    model = single_node_model("ReduceLogSumExp", {"x": x}, initializers={"a": np.array([1], np.int64)})
    check(model, {"x": x})


@pytest.mark.parametrize("op,dtype", [("ReduceLogSum", "int64"), ("ReduceLogSumExp", "int32"), ("ReduceSum", "bool")])
def test_reduce_unsupported_dtype(op: str, dtype: str) -> None:
    x = data(op, (2, 3), dtype)
    with pytest.raises(UnsupportedError, match=op):
        from_onnx(single_node_model(op, {"x": x}, opset=20))


def test_merged_view() -> None:
    assert merged_view((1, 64, 7, 7), [2, 3]) == ([64, 49], [False, True])
    assert merged_view((2, 7, 7, 64), [1, 2]) == ([2, 49, 64], [False, True, False])
    assert merged_view((1, 1, 1), [0]) == ([], [])


# -- ArgMax / ArgMin ----------------------------------------------------------------------------

def arg_nodes(axes: list[int]) -> list[onnx.NodeProto]:
    nodes = []
    for op in ("ArgMax", "ArgMin"):
        for axis in axes:
            for keepdims in (1, 0):
                for last in (0, 1):
                    nodes.append(helper.make_node(op, ["x"], [f"{op}_a{axis}_k{keepdims}_l{last}".replace("-", "m")],
                                                  axis=axis, keepdims=keepdims, select_last_index=last))
    return nodes


@pytest.mark.parametrize("dtype", ["float32", "int64", "int32"])
def test_argmax_argmin(dtype: str) -> None:
    """Every axis (negative too), keepdims, select_last_index; few distinct values, so ties."""
    x = np.random.default_rng(6).integers(-3, 3, (3, 4, 5)).astype(dtype)
    check(graph_model(arg_nodes([0, 1, 2, -1, -3]), {"x": x}, opset=13), {"x": x}, tol=0.0)


@pytest.mark.parametrize("shape", [(9,), (1, 6, 1), (2, 1, 3, 1, 4)], ids=["rank1", "size1", "rank5"])
def test_argmax_edge_shapes(shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    check(graph_model(arg_nodes(list(range(len(shape)))), {"x": x}, opset=13), {"x": x}, tol=0.0)


def test_argmax_default_axis_opset11() -> None:
    x = np.random.default_rng(8).standard_normal((4, 5)).astype(np.float32)
    nodes = [helper.make_node("ArgMax", ["x"], ["y"]), helper.make_node("ArgMin", ["x"], ["z"], keepdims=0)]
    check(graph_model(nodes, {"x": x}, opset=11), {"x": x}, tol=0.0)


@pytest.mark.parametrize("threads", [2, 1])
def test_argmax_large(threads: int) -> None:
    """Vocabulary-sized rows (greedy decoding) and one long row split into parallel chunks."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((32, 4099)).astype(np.float32)
    y = rng.integers(0, 50, (1, 8, 8192)).astype(np.float32)
    nodes = [helper.make_node("ArgMax", ["x"], ["xa"], axis=-1), helper.make_node("ArgMin", ["x"], ["xb"], axis=0),
             helper.make_node("ArgMax", ["y"], ["ya"], axis=1, select_last_index=1),
             helper.make_node("ArgMin", ["y"], ["yb"], axis=1)]
    check(graph_model(nodes, {"x": x, "y": y}, opset=13), {"x": x, "y": y}, tol=0.0, threads=threads)
