"""The emitted IR and the artifact: golden IR, manifest contents, memory plan, Polly policy."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import polyml
from polyml.codegen.lower import lower_graph
from polyml.driver.toolchain import host_target
from polyml.frontends.onnx import from_onnx
from tests.conftest import filecheck


def add_relu_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3, 4])
    nodes = [helper.make_node("Add", ["x", "y"], ["s"], name="add0"), helper.make_node("Relu", ["s"], ["z"], name="relu0")]
    return helper.make_model(helper.make_graph(nodes, "g", [x, y], [z]), opset_imports=[helper.make_opsetid("", 13)])


def test_golden_ir_add_relu(golden) -> None:
    lowered = lower_graph(from_onnx(add_relu_model()), host_target())
    filecheck(str(lowered.modules["off.0"]), golden / "add_relu.ll.check")


def test_artifact_manifest_and_emit_ll(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(path))
    m = polyml.compile(path, tmp_path / "out", emit=["ll"])
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["versions"]["opt"].startswith("19.")
    assert man["model"]["sha256"] == polyml.compiler.file_sha256(path)
    assert man["options"]["polly"] is True
    assert all(f["policy"] in man["opt_flags"] for f in man["functions"])
    for stage in ("frontend", "lower", "opt+llc", "link"):
        assert man["seconds"][stage] >= 0
    for f in ("entry.ll", "entry.opt.ll", "model.so", "weights.bin"):
        assert (tmp_path / "out" / f).is_file(), f
    assert list((tmp_path / "out").glob("ops.*.ll")) and list((tmp_path / "out").glob("ops.*.opt.ll"))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3, 4), np.float32), rng.standard_normal((3, 4), np.float32)
    np.testing.assert_allclose(m.run({"x": x, "y": y})["z"], np.maximum(x + y, 0), rtol=1e-6)
    again = polyml.load(tmp_path / "out").run({"x": x, "y": y})["z"]
    np.testing.assert_array_equal(again, np.maximum(x + y, 0))


def test_no_polly_baseline_has_no_polly_flags(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(path))
    m = polyml.compile(path, tmp_path / "out", polly=False)
    assert not any("-polly" in f for flags in m.manifest["opt_flags"].values() for f in flags)


def test_arena_reuses_dead_intermediates() -> None:
    """A chain of 6 Relus needs two live intermediates at a time, not five."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])
    names = ["x", "a", "b", "c", "d", "e", "y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]], name=f"r{i}") for i in range(6)]
    model = helper.make_model(helper.make_graph(nodes, "chain", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    lowered = lower_graph(from_onnx(model), host_target())
    assert lowered.intermediate_bytes == 5 * 64 * 64 * 4
    assert lowered.arena_bytes == 2 * 64 * 64 * 4


@pytest.mark.parametrize("polly", [True, False])
def test_graph_output_that_is_a_view_or_input(tmp_path, polly) -> None:
    """Outputs that alias an input, a constant or a view are copied into their own buffers."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x_out", "flat", "c", "r")]
    c = helper.make_tensor("c", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [12])
    nodes = [
        helper.make_node("Identity", ["x"], ["x_out"], name="id"),
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),
    ]
    graph = helper.make_graph(nodes, "g", [x], outs, initializer=[c, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    xv = np.arange(12, dtype=np.float32).reshape(2, 6) - 6
    got = polyml.compile(path, tmp_path / "o", polly=polly).run({"x": xv})
    np.testing.assert_array_equal(got["x_out"], xv)
    np.testing.assert_array_equal(got["flat"], np.maximum(xv, 0).reshape(12))
    np.testing.assert_array_equal(got["r"], np.maximum(xv, 0))
    np.testing.assert_array_equal(got["c"], [1, 2, 3])


def test_rebuild_into_same_folder_runs_new_code(tmp_path) -> None:
    """The loader caches libraries by path: a rebuilt model must not keep the old code."""
    from polyml.testing import single_node_model

    x = np.array([-1, 2, -3, 4], np.float32)
    expected = {"Relu": np.maximum(x, 0), "Neg": -x}
    for op in ("Relu", "Neg"):
        onnx.save(single_node_model(op, {"x": (4,)}, ["y"], opset=13), str(tmp_path / "m.onnx"))
        got = polyml.compile(tmp_path / "m.onnx", tmp_path / "out").run({"x": x})["y"]
        np.testing.assert_array_equal(got, expected[op])


def test_parallel_loops_split_only_dependence_free_dims(tmp_path) -> None:
    """Conv's register-blocked nests run on OpenMP threads over output blocks, never over the
    reduction (here the column tail has one block, so its nest must stay sequential)."""
    import re

    from polyml.testing import compile_and_compare, single_node_model

    rng = np.random.default_rng(0)
    w = rng.standard_normal((10, 16, 1, 1)).astype(np.float32)
    model = single_node_model("Conv", {"x": (1, 16, 8, 70)}, initializers={"w": w})
    for threads in (1, 2):
        errs = compile_and_compare(model, None, output_dir=tmp_path / f"t{threads}", emit=["ll"], threads=threads)
        assert errs["y"] <= 1e-5, errs
    ir_text = "".join(p.read_text() for p in (tmp_path / "t2").glob("ops.*.ll") if not p.name.endswith(".opt.ll"))
    assert "GOMP_parallel" in ir_text
    outer = re.findall(r'define void @"[^"]+\.par\d+"\(.*?\n\{\n[^:]+:\n  br label %"[^"]*\.L0\.([a-z0-9]+)\.header"', ir_text, re.S)
    assert outer and all(v in ("n", "g", "mb", "ob") or v.startswith("o") for v in outer), outer
    serial = "".join(p.read_text() for p in (tmp_path / "t1").glob("ops.*.ll") if not p.name.endswith(".opt.ll"))
    assert "GOMP_parallel" not in serial
