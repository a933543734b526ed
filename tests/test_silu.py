"""The SiLU rewrite (passes/silu.py): ``Mul(x, Sigmoid(x))`` becomes ``Swish(x)`` and then a
conv epilogue; a Sigmoid read elsewhere, or a broadcast Mul, keeps the two ops. Numerics
against onnxruntime."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from polyml.graph import Graph, Node, TensorType
from polyml.passes.silu import fold_silu
from polyml.testing import compile_and_compare


def _graph(extra_reader: bool = False, broadcast: bool = False) -> Graph:
    t = TensorType((1, 4, 5, 5))
    types = {"x": t, "s": TensorType((1, 4, 1, 1)) if broadcast else t, "y": t, "z": t}
    nodes = [Node("sig", "Sigmoid", ["x"], ["s"]), Node("mul", "Mul", ["s", "x"], ["y"])]
    outputs = ["y"]
    if extra_reader:
        nodes.append(Node("neg", "Neg", ["s"], ["z"]))
        outputs.append("z")
    return Graph("g", nodes, types, {}, ["x"], outputs)


def test_fold_silu_rewrites_only_private_sigmoids() -> None:
    g = _graph()
    assert len(fold_silu(g)) == 1
    assert [(n.op_type, n.inputs, n.outputs, n.attrs) for n in g.nodes] == [("Swish", ["x"], ["y"], {"alpha": 1.0})]
    g = _graph(extra_reader=True)
    assert fold_silu(g) == [] and [n.op_type for n in g.nodes] == ["Sigmoid", "Mul", "Neg"]
    g = _graph(broadcast=True)
    assert fold_silu(g) == [] and [n.op_type for n in g.nodes] == ["Sigmoid", "Mul"]


def test_silu_after_conv_is_an_epilogue(tmp_path) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((24, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Sigmoid", ["c"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["y"])]
    graph = helper.make_graph(nodes, "silu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
                              [helper.make_empty_tensor_value_info("y")],
                              [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    errs = compile_and_compare(model, output_dir=tmp_path / "b", cache=False)
    assert max(errs.values()) <= 1e-5, errs
    import json

    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert [f["op_type"] for f in manifest["functions"]] == ["Conv"]
    assert any(g["kind"] == "epilogue" for g in manifest["fusion"]["groups"])
