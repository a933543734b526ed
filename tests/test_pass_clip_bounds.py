"""passes/clip_bounds.py: a Clip's constant scalar bounds become its attributes; computed or
non-scalar bounds stay inputs; the rewritten graph computes what onnxruntime does."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from polyml.graph import Graph, Node, TensorType
from polyml.passes.clip_bounds import fold_clip_bounds
from polyml.testing import compile_and_compare


def _graph(bounds: list[str], constants: dict[str, np.ndarray]) -> Graph:
    t = TensorType((2, 3))
    types = {"x": t, "y": t, **{k: TensorType(v.shape) for k, v in constants.items()}, "b": TensorType(())}
    return Graph("g", [Node("c", "Clip", ["x", *bounds], ["y"], opset=17)], types, constants, ["x", "b"], ["y"])


def test_constant_bounds_become_attributes() -> None:
    lo, hi = np.array(0.0, np.float32), np.array(6.0, np.float32)
    g = _graph(["lo", "hi"], {"lo": lo, "hi": hi})
    assert fold_clip_bounds(g) and g.nodes[0].inputs == ["x"] and g.nodes[0].attrs == {"min": 0.0, "max": 6.0}
    g = _graph(["", "hi"], {"hi": hi})  # no lower bound
    fold_clip_bounds(g)
    assert g.nodes[0].inputs == ["x"] and g.nodes[0].attrs == {"max": 6.0}
    g = _graph(["b", "hi"], {"hi": hi})  # a computed lower bound stays an input
    fold_clip_bounds(g)
    assert g.nodes[0].inputs == ["x", "b"] and g.nodes[0].attrs == {"max": 6.0}
    g = _graph(["lo", "hi"], {"lo": np.zeros(3, np.float32), "hi": hi})  # not a scalar
    fold_clip_bounds(g)
    assert g.nodes[0].inputs == ["x", "lo"] and g.nodes[0].attrs == {"max": 6.0}
    g = _graph([], {})
    assert not fold_clip_bounds(g) and g.nodes[0].inputs == ["x"]


def test_clip_chain_matches_onnxruntime() -> None:
    """Clip bounds moved into attributes in a fused chain (Add → Clip → Mul) and alone, with
    values on the bounds."""
    inits = [helper.make_tensor("lo", TensorProto.FLOAT, [], [-1.5]), helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0]),
             helper.make_tensor("k", TensorProto.FLOAT, [], [2.0])]
    nodes = [helper.make_node("Add", ["x", "k"], ["a"]), helper.make_node("Clip", ["a", "lo", "hi"], ["c"]),
             helper.make_node("Mul", ["c", "k"], ["y"]), helper.make_node("Clip", ["x", "", "hi"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 5])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32) * 5
    x[0, :3] = [6.0, -1.5, 4.5]  # on the bounds (y: after the Add)
    errs = compile_and_compare(model, {"x": x}, cache=False)
    assert max(errs.values()) <= 1e-6, errs
