"""Identical ops share one function (:mod:`polyml.codegen.identical`): the same code compiled
once, each op still on its own weights and tensors."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import polyml
from polyml.codegen.lower import lower_graph
from polyml.driver.toolchain import host_target
from polyml.frontends.onnx import from_onnx
from polyml.runtime.model import CompiledModel
from polyml.testing import onnxruntime_run, rel_error


def conv_chain(clip_hi: tuple[float, float, float] = (6.0, 6.0, 6.0)) -> onnx.ModelProto:
    """Three 3x3 16->16 Conv + Clip blocks on their own random weights, then a 1x1 16->8 Conv;
    ``clip_hi``: each block's Clip bound (a constant the kernel bakes into its code)."""
    rng = np.random.default_rng(3)
    inits, nodes, src = [], [], "x"
    for i, hi in enumerate(clip_hi):
        inits += [numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2, f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), f"b{i}"),
                  numpy_helper.from_array(np.array(0.0, np.float32), f"lo{i}"),
                  numpy_helper.from_array(np.array(hi, np.float32), f"hi{i}")]
        nodes += [helper.make_node("Conv", [src, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Clip", [f"c{i}", f"lo{i}", f"hi{i}"], [f"r{i}"], name=f"clip{i}")]
        src = f"r{i}"
    inits.append(numpy_helper.from_array(rng.standard_normal((8, 16, 1, 1)).astype(np.float32), "wp"))
    nodes.append(helper.make_node("Conv", [src, "wp"], ["y"], name="proj"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 20, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 20, 20])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _functions(model: onnx.ModelProto, share: bool = True) -> dict[str, str]:
    lowered = lower_graph(from_onnx(model), host_target(), share_identical=share)
    return {s.node: s.function for s in lowered.steps}


def _compile(tmp_path, model: onnx.ModelProto, **options) -> tuple[CompiledModel, list[dict]]:  # noqa: ANN001
    """The compiled model and its manifest's ``functions``."""
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = polyml.compile(path, tmp_path / "out", **options)
    return compiled, json.loads((tmp_path / "out" / "manifest.json").read_text())["functions"]


def test_identical_ops_share_one_function_and_keep_their_own_weights(tmp_path) -> None:
    model = conv_chain()
    compiled, functions = _compile(tmp_path, model)
    convs = [f for f in functions if f["op_type"] == "Conv" and f["detail"].startswith("3x3")]
    assert len(convs) == 3
    assert len({f["function"] for f in convs}) == 1, [f["function"] for f in convs]
    assert [f.get("shared", False) for f in convs] == [False, True, True]
    proj = next(f for f in functions if f["node"] == "proj")
    assert proj["function"] != convs[0]["function"] and not proj.get("shared")
    x = np.random.default_rng(0).standard_normal((1, 16, 20, 20)).astype(np.float32)
    got = compiled.run({"x": x})["y"]
    ref = onnxruntime_run(model, {"x": x})["y"]
    assert rel_error(got, ref) < 1e-5


def test_sharing_compares_code_not_attributes(tmp_path) -> None:
    # a fused Clip's bound differs: the code differs, so the second block keeps a function of its own
    functions = {f["node"]: f["function"] for f in _compile(tmp_path, conv_chain((6.0, 4.0, 6.0)), emit=["ll"])[1]}
    convs = [functions[n] for n in ("conv0", "conv1", "conv2")]
    assert convs[0] == convs[2] and convs[1] != convs[0], functions
    ll = "\n".join(p.read_text() for p in (tmp_path / "out").rglob("ops.*.ll"))
    assert ll.count(f'define void @"{convs[0]}"') == 1 and ll.count(f'define void @"{convs[1]}"') == 1
    assert not re.search(r'define void @"op\d+_conv2"', ll)  # conv2 calls conv0's function
    # without sharing every op has its own function
    unshared = _functions(conv_chain(), share=False)
    assert len(set(unshared.values())) == len(unshared)
