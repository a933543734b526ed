"""Data movement and view ops against onnxruntime: Concat, Transpose, Pad, Reshape, Flatten,
Squeeze, Unsqueeze, Identity, Dropout, and the frontend's constant folding (Shape chains,
ConstantOfShape, Constant) including graph outputs that are constants, inputs or views.

Movement is exact, so every comparison is bit-for-bit.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyml.compiler import compile_graph
from polyml.errors import PolymlError, ShapeError, UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.testing import compile_and_compare, onnxruntime_run, random_inputs, single_node_model


def rng_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random data for every graph input (normal floats, small ints)."""
    return random_inputs(model, seed)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray] | None = None) -> None:
    """Compile with polyml.compile and require every output to equal onnxruntime's exactly."""
    errs = compile_and_compare(model, feeds if feeds is not None else rng_feeds(model))
    assert errs and all(e == 0.0 for e in errs.values()), errs


def check_specialized(model: onnx.ModelProto, values: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> None:
    """The backend's path: shape-like graph inputs become constants via ``input_values``."""
    compiled = compile_graph(from_onnx(model, input_values=values))
    got = compiled.run({k: v for k, v in feeds.items() if k in compiled.inputs})
    ref = onnxruntime_run(model, {**feeds, **values})
    assert set(got) == set(ref)
    for k in ref:
        assert got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape, k
        np.testing.assert_array_equal(got[k], ref[k])


def make_model(nodes: list[onnx.NodeProto], inputs: dict[str, list[int] | tuple[int, list[int]]], outputs: list[str],
               opset: int = 18, initializers: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model from nodes; ``inputs`` maps names to a shape list (float32) or ``(elem_type, shape)``."""
    vis = []
    for name, spec in inputs.items():
        dtype, shape = spec if isinstance(spec, tuple) else (TensorProto.FLOAT, spec)
        vis.append(helper.make_tensor_value_info(name, dtype, list(shape)))
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(nodes, "g", vis, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


# -- Concat ----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shapes, axis",
    [
        ([(5,), (3,)], 0),
        ([(2, 3), (4, 3)], 0),
        ([(2, 3), (2, 5), (2, 1)], 1),
        ([(2, 3), (2, 5)], -1),
        ([(2, 3, 4), (2, 1, 4), (2, 2, 4), (2, 5, 4)], 1),
        ([(2, 3, 4), (1, 3, 4)], -3),
        ([(2, 3, 4, 5), (2, 3, 4, 2)], 3),
        ([(2, 3, 4)], 2),
        ([(2, 0, 4), (2, 3, 4)], 1),
    ],
)
def test_concat(shapes: list[tuple[int, ...]], axis: int) -> None:
    names = [f"x{i}" for i in range(len(shapes))]
    check(single_node_model("Concat", dict(zip(names, shapes)), ["y"], axis=axis))


def test_concat_with_constant_input() -> None:
    w = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    check(single_node_model("Concat", {"x": (2, 5, 4)}, ["y"], initializers={"w": w}, axis=1))


def test_concat_int64_data() -> None:
    model = make_model([helper.make_node("Concat", ["a", "b"], ["y"], axis=0)],
                       {"a": (TensorProto.INT64, [2, 3]), "b": (TensorProto.INT64, [1, 3])}, ["y"])
    check(model)


def test_concat_of_computed_tensors() -> None:
    """Concat between two nests: inputs are intermediates, the output feeds another op."""
    nodes = [
        helper.make_node("Relu", ["a"], ["ra"]),
        helper.make_node("Neg", ["b"], ["nb"]),
        helper.make_node("Concat", ["ra", "nb", "ra"], ["c"], axis=-2),
        helper.make_node("Abs", ["c"], ["y"]),
    ]
    check(make_model(nodes, {"a": [2, 3, 4], "b": [2, 2, 4]}, ["y", "c"]))


def test_movement_of_non_float_dtypes() -> None:
    """Movement ops copy any dtype with an LLVM type: bool Transpose, int32 Concat, int64 Pad."""
    nodes = [
        helper.make_node("Transpose", ["b"], ["t"], perm=[1, 0]),
        helper.make_node("Concat", ["i", "i"], ["c"], axis=1),
        helper.make_node("Pad", ["l", "pads", "v"], ["q"]),
    ]
    model = make_model(nodes, {"b": (TensorProto.BOOL, [3, 4]), "i": (TensorProto.INT32, [2, 3]), "l": (TensorProto.INT64, [2, 3])},
                       ["t", "c", "q"], initializers={"pads": i64(1, -1, 0, 2), "v": np.array(-7, np.int64)})
    feeds = rng_feeds(model)
    feeds["b"] = feeds["b"] > 0
    check(model, feeds)


# -- Transpose -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, perm",
    [
        ((7,), None),
        ((3, 5), None),
        ((3, 5), [1, 0]),
        ((2, 3, 4), None),
        ((2, 3, 4, 5), [0, 2, 3, 1]),
        ((2, 3, 4, 5), [0, 3, 1, 2]),
        ((2, 3, 4, 5, 2), [4, 0, 3, 1, 2]),
        ((33, 65), [1, 0]),
    ],
)
def test_transpose(shape: tuple[int, ...], perm: list[int] | None) -> None:
    attrs = {} if perm is None else {"perm": perm}
    check(single_node_model("Transpose", {"x": shape}, ["y"], **attrs))


def test_transpose_all_3d_permutations() -> None:
    """All six permutations of a 3-D tensor in one model (one compile)."""
    perms = list(itertools.permutations(range(3)))
    nodes = [helper.make_node("Transpose", ["x"], [f"y{i}"], perm=list(p)) for i, p in enumerate(perms)]
    check(make_model(nodes, {"x": [2, 3, 4]}, [f"y{i}" for i in range(len(perms))]))


def test_transpose_rejects_bad_perm() -> None:
    with pytest.raises(PolymlError, match="perm"):
        compile_graph(from_onnx(single_node_model("Transpose", {"x": (2, 3, 4)}, ["y"], perm=[0, 0, 1])))


# -- Pad -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, pads, value",
    [
        ((3, 4), [1, 2, 0, 3], 0.0),
        ((2, 3, 4, 5), [0, 0, 1, 1, 0, 0, 1, 1], 1.5),
        ((2, 3, 4, 5), [0, 1, 2, 0, 1, 0, 0, 3], -2.0),
        ((4, 6), [-1, 2, 1, -3], 0.0),  # crop and pad in the same dimension pair
        ((4, 6), [-1, -2, -1, -3], 0.0),  # pure crop
        ((5,), [0, 0], 0.0),
    ],
)
def test_pad_attribute_form(shape: tuple[int, ...], pads: list[int], value: float) -> None:
    """Opset 10: pads and value are attributes."""
    check(single_node_model("Pad", {"x": shape}, ["y"], opset=10, pads=pads, value=value))


@pytest.mark.parametrize(
    "shape, pads",
    [
        ((2, 3, 4, 5), [0, 0, 2, 1, 0, 0, 1, 2]),
        ((3, 4, 5), [1, -1, 2, -1, 0, -2]),
        ((3, 4), [2, 0, 0, 0]),
    ],
)
def test_pad_constant_inputs(shape: tuple[int, ...], pads: list[int]) -> None:
    """Opset 13: pads and constant_value are initializers."""
    inits = {"pads": i64(*pads), "cv": np.array(0.25, dtype=np.float32)}
    check(single_node_model("Pad", {"x": shape}, ["y"], opset=13, initializers=inits))


def test_pad_without_constant_value_input() -> None:
    check(single_node_model("Pad", {"x": (3, 4)}, ["y"], opset=13, initializers={"pads": i64(1, 1, 1, 1)}))


def test_pad_constant_value_is_graph_input() -> None:
    """A computed fill value: constant_value is a float scalar graph input (a buffer)."""
    node = helper.make_node("Pad", ["x", "pads", "cv"], ["y"], mode="constant")
    model = make_model([node], {"x": [2, 3, 4], "cv": []}, ["y"], opset=13,
                       initializers={"pads": i64(1, 0, -1, 0, 2, 1)})
    check(model)


@pytest.mark.parametrize("axes, pads", [([1, 3], [1, 2, 3, 0]), ([-1, 0], [2, -1, 0, 1]), ([2], [1, 1])])
def test_pad_axes_input(axes: list[int], pads: list[int]) -> None:
    """Opset 18: pads apply to ``axes`` only."""
    node = helper.make_node("Pad", ["x", "pads", "cv", "axes"], ["y"])
    inits = {"pads": i64(*pads), "cv": np.array(-1.0, dtype=np.float32), "axes": i64(*axes)}
    check(make_model([node], {"x": [2, 3, 4, 5]}, ["y"], initializers=inits))


def test_pad_crop_removes_whole_interior() -> None:
    """Cropping away all input elements leaves only fill (no copy nest)."""
    node = helper.make_node("Pad", ["x", "pads", "cv"], ["y"])
    model = make_model([node], {"x": [2, 3]}, ["y"], initializers={"pads": i64(-2, 0, 3, 0), "cv": np.float32(7.0).reshape(())})
    feeds = rng_feeds(model)
    got = compile_graph(from_onnx(model)).run(feeds)["y"]
    np.testing.assert_array_equal(got, np.full((3, 3), 7.0, np.float32))


def test_pad_specialized_inputs() -> None:
    """Pads and axes given as graph inputs, specialized by input_values (the node suite's form)."""
    node = helper.make_node("Pad", ["x", "pads", "cv", "axes"], ["y"])
    model = make_model([node], {"x": [1, 3, 4, 5], "pads": (TensorProto.INT64, [4]), "cv": [],
                                "axes": (TensorProto.INT64, [2])}, ["y"])
    feeds = rng_feeds(model)
    check_specialized(model, {"pads": i64(0, 3, 0, 4), "axes": i64(1, 3)}, {"x": feeds["x"], "cv": feeds["cv"]})


def test_pad_opset1_paddings_attribute() -> None:
    """Pad-1 names its attribute ``paddings`` (onnxruntime has no Pad-1: compare with numpy)."""
    model = single_node_model("Pad", {"x": (3, 4)}, ["y"], opset=1, paddings=[1, 0, 2, 1], value=3.0)
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    got = compile_graph(from_onnx(model)).run({"x": x})["y"]
    np.testing.assert_array_equal(got, np.pad(x, ((1, 2), (0, 1)), constant_values=3.0))


@pytest.mark.parametrize("mode", ["edge", "reflect"])
def test_pad_other_modes_are_unsupported(mode: str) -> None:
    model = single_node_model("Pad", {"x": (3, 4)}, ["y"], opset=13, initializers={"pads": i64(1, 1, 1, 1)}, mode=mode)
    with pytest.raises(UnsupportedError, match=f"mode '{mode}'"):
        from_onnx(model)


def test_pad_pads_must_be_constant() -> None:
    node = helper.make_node("Pad", ["x", "pads"], ["y"])
    model = make_model([node], {"x": [3, 4], "pads": (TensorProto.INT64, [4])}, ["y"], opset=13)
    with pytest.raises(ShapeError, match="compile-time constant"):
        from_onnx(model)


# -- views -----------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "shape, target, allowzero",
    [
        ((2, 3, 4), [4, 6], 0),
        ((2, 3, 4), [-1], 0),
        ((2, 3, 4), [0, -1], 0),
        ((2, 3, 4), [0, 0, 2, 2], 0),
        ((2, 3, 4), [3, -1, 2], 0),
        ((0, 3, 4), [3, 4, 0], 1),
        ((2, 3, 4), [2, 12], 1),
    ],
)
def test_reshape(shape: tuple[int, ...], target: list[int], allowzero: int) -> None:
    """Reshape as the graph output (a copy) and inside a chain (an alias)."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=allowzero),
        helper.make_node("Neg", ["r"], ["y"]),
    ]
    check(make_model(nodes, {"x": list(shape)}, ["y", "r"], initializers={"shape": i64(*target)}))


def test_reshape_specialized_shape_input() -> None:
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = make_model([node], {"x": [2, 3, 4], "shape": (TensorProto.INT64, [3])}, ["y"])
    check_specialized(model, {"shape": i64(4, 0, -1)}, rng_feeds(model))


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -4])
def test_flatten(axis: int) -> None:
    nodes = [helper.make_node("Flatten", ["x"], ["f"], axis=axis), helper.make_node("Relu", ["f"], ["y"])]
    check(make_model(nodes, {"x": [2, 3, 4, 5]}, ["y", "f"], opset=13))


def test_flatten_default_axis() -> None:
    check(single_node_model("Flatten", {"x": (2, 3, 4)}, ["y"]))


@pytest.mark.parametrize("axes", [None, [0], [0, 2], [-1, 0]])
def test_squeeze_attribute_form(axes: list[int] | None) -> None:
    attrs = {} if axes is None else {"axes": axes}
    check(single_node_model("Squeeze", {"x": (1, 3, 1, 1)}, ["y"], opset=11, **attrs))


@pytest.mark.parametrize("axes", [None, [2], [-1, 0]])
def test_squeeze_input_form(axes: list[int] | None) -> None:
    inits = {} if axes is None else {"axes": i64(*axes)}
    check(single_node_model("Squeeze", {"x": (1, 3, 1, 1)}, ["y"], opset=13, initializers=inits))


@pytest.mark.parametrize("axes", [[0], [1, 3], [-1], [3, 0]])
def test_unsqueeze_attribute_form(axes: list[int]) -> None:
    check(single_node_model("Unsqueeze", {"x": (3, 4)}, ["y"], opset=11, axes=axes))


@pytest.mark.parametrize("axes", [[0], [2, 0], [-1, -4]])
def test_unsqueeze_input_form(axes: list[int]) -> None:
    check(single_node_model("Unsqueeze", {"x": (3, 4)}, ["y"], opset=13, initializers={"axes": i64(*axes)}))


def test_squeeze_unsqueeze_specialized_axes() -> None:
    nodes = [helper.make_node("Squeeze", ["x", "a"], ["s"]), helper.make_node("Unsqueeze", ["s", "b"], ["y"])]
    model = make_model(nodes, {"x": [3, 1, 4], "a": (TensorProto.INT64, [1]), "b": (TensorProto.INT64, [2])}, ["y"])
    check_specialized(model, {"a": i64(1), "b": i64(0, -1)}, rng_feeds(model))


def test_identity() -> None:
    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Identity", ["i"], ["y"])]
    check(make_model(nodes, {"x": [3, 4]}, ["y"]))


@pytest.mark.parametrize("opset", [7, 10, 12, 13])
def test_dropout_inference(opset: int) -> None:
    nodes = [helper.make_node("Dropout", ["x"], ["d"], ratio=0.3) if opset < 12 else
             helper.make_node("Dropout", ["x", "ratio", "train"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    inits = {} if opset < 12 else {"ratio": np.array(0.3, np.float32), "train": np.array(False)}
    check(make_model(nodes, {"x": [2, 5]}, ["y"], opset=opset, initializers=inits))


def test_dropout_training_mode_is_unsupported() -> None:
    node = helper.make_node("Dropout", ["x", "ratio", "train"], ["y"])
    model = make_model([node], {"x": [2, 5]}, ["y"], opset=13,
                       initializers={"ratio": np.array(0.3, np.float32), "train": np.array(True)})
    with pytest.raises(UnsupportedError, match="training"):
        from_onnx(model)


# -- constant folding in the frontend --------------------------------------------------------

def test_shape_gather_concat_reshape_chain() -> None:
    """The exporter idiom ``x.view(x.size(0), -1)`` folds away: only Relu is compiled."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 3, 4]}, ["y"], initializers={"zero": i64(0).reshape(()), "ax0": i64(0), "minus1": i64(-1)})
    graph = from_onnx(model)
    assert [n.op_type for n in graph.nodes] == ["Reshape", "Relu"]
    assert graph.types["y"].shape == (2, 12)
    check(model)


def test_constant_of_shape_and_constant_nodes() -> None:
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(i64(2, 3))),
        helper.make_node("ConstantOfShape", ["shape"], ["ones"], value=numpy_helper.from_array(np.array([1.5], np.float32))),
        helper.make_node("Constant", [], ["half"], value_float=0.5),
        helper.make_node("Constant", [], ["row"], value_floats=[1.0, -2.0, 3.0]),
        helper.make_node("Add", ["x", "ones"], ["a"]),
        helper.make_node("Mul", ["a", "half"], ["b"]),
        helper.make_node("Sub", ["b", "row"], ["y"]),
    ]
    model = make_model(nodes, {"x": [2, 3]}, ["y"])
    graph = from_onnx(model)
    assert [n.op_type for n in graph.nodes] == ["Add", "Mul", "Sub"]
    check(model)


def test_constant_of_shape_specialized_shape_input() -> None:
    nodes = [
        helper.make_node("ConstantOfShape", ["shape"], ["z"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
        helper.make_node("Add", ["x", "z"], ["y"]),
    ]
    model = make_model(nodes, {"x": [3, 4], "shape": (TensorProto.INT64, [2])}, ["y"])
    check_specialized(model, {"shape": i64(3, 4)}, rng_feeds(model))


def test_constant_chain_feeding_concat_and_pad() -> None:
    """Folded constants feed movement ops as weight buffers."""
    nodes = [
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4))),
        helper.make_node("Transpose", ["c"], ["ct"]),  # folded: all inputs constant
        helper.make_node("Concat", ["x", "ct"], ["cat"], axis=1),
        helper.make_node("Pad", ["cat", "pads"], ["y"]),
    ]
    model = make_model(nodes, {"x": [4, 3]}, ["y"], initializers={"pads": i64(1, 0, 0, 2)})
    assert [n.op_type for n in from_onnx(model).nodes] == ["Concat", "Pad"]
    check(model)


def test_output_is_view_of_input_and_of_intermediate() -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["xv"]),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Flatten", ["r"], ["rv"], axis=0),
        helper.make_node("Squeeze", ["rv", "ax"], ["rvv"]),
        helper.make_node("Identity", ["x"], ["xi"]),
    ]
    model = make_model(nodes, {"x": [2, 3]}, ["xv", "r", "rv", "rvv", "xi"], initializers={"s": i64(3, 2), "ax": i64(0)})
    check(model)


def test_output_is_graph_input() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    check(make_model(nodes, {"x": [2, 3]}, ["y", "x"]))


def test_output_is_constant_node() -> None:
    c = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c)), helper.make_node("Relu", ["x"], ["y"])]
    check(make_model(nodes, {"x": [2, 3]}, ["y", "c"]))


def test_output_is_folded_constant_of_shape() -> None:
    """The node suite's test_constantofshape_* form: the only output is a folded constant."""
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], value=numpy_helper.from_array(np.array([1.0], np.float32)))
    model = make_model([node], {"shape": (TensorProto.INT64, [3])}, ["y"])
    check_specialized(model, {"shape": i64(4, 3, 2)}, {})


def test_output_is_view_of_constant() -> None:
    """Reshape of a constant folds, so the output is a constant named like the view."""
    c = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["c", "s"], ["cv"]), helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, {"x": [2, 3]}, ["y", "cv"], initializers={"c": c, "s": i64(-1)})
    check(model)
