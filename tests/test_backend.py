"""polyml.backend: the ONNX backend API (specialization on shape-like inputs, input forms, errors)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from polyml.backend import PolymlBackend, shape_like_inputs
from polyml.errors import InputError, UnsupportedError


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[str]) -> onnx.ModelProto:
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outs), opset_imports=[helper.make_opsetid("", 18)])


def test_reshape_specializes_on_shape_values() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], [x, s], ["z", "x"])
    assert shape_like_inputs(model) == ["s"]
    rep = PolymlBackend.prepare(model)
    a = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    for shape in ([3, 2], [6, 1], [3, 2]):
        z, x_out = rep.run([a, np.array(shape, np.int64)])
        np.testing.assert_array_equal(z, np.maximum(a, 0).reshape(shape))
        np.testing.assert_array_equal(x_out, a)  # a graph input that is also a graph output
    assert len(rep._cache) == 2
    (z,) = rep.run({"x": a, "s": np.array([1, 6])})[:1]
    assert z.shape == (1, 6)


def test_constant_graph_output() -> None:
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, [2])
    fill = helper.make_tensor("v", TensorProto.FLOAT, [1], [2.5])
    model = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"], value=fill)], [shape], ["y"])
    (y,) = PolymlBackend.run_model(model, [np.array([2, 3])])
    np.testing.assert_array_equal(y, np.full((2, 3), 2.5, np.float32))


def test_run_node_and_symbolic_dims() -> None:
    (y,) = PolymlBackend.run_node(helper.make_node("Unsqueeze", ["x", "a"], ["y"]), [np.ones(3, np.float32), np.array([0])])
    assert y.shape == (1, 3)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])
    rep = PolymlBackend.prepare(_model([helper.make_node("Relu", ["x"], ["y"])], [x], ["y"]))
    assert rep.run([np.ones((4, 2), np.float32)])[0].shape == (4, 2)
    assert rep.run([np.ones((1, 2), np.float32)])[0].shape == (1, 2)


def test_errors() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    with pytest.raises(UnsupportedError, match="NonZero"):
        PolymlBackend.prepare(_model([helper.make_node("NonZero", ["x"], ["y"])], [x], ["y"]))
    rep = PolymlBackend.prepare(_model([helper.make_node("Relu", ["x"], ["y"])], [x], ["y"]))
    with pytest.raises(InputError, match="2 inputs"):
        rep.run([np.ones(2, np.float32)] * 2)
    with pytest.raises(InputError, match="float64"):
        rep.run([np.ones(2)])
    assert PolymlBackend.supports_device("CPU") and not PolymlBackend.supports_device("CUDA")
