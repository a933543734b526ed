"""The CUDA emulator (``--target cuda-emulated``, :mod:`polyml.gpu.emulate`): CUDA builds run on an
emulated grid and match onnxruntime; broken mappings are caught (out-of-bounds accesses named by
kernel, thread, block and array; barriers not every thread reaches), not hung on.

The nine light CNNs: squeezenet (with and without shared memory) in the slow suite of ``make
test``; the other eight opt-in (``make test-emulator`` / ``POLYML_EMULATOR_FULL=1``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import llvmlite.ir as ir
import numpy as np
import onnx
import pytest

import polyml
from polyml import cli, testing
from polyml.compiler import read_graph
from polyml.errors import EmulationError, InputError, ModelFormatError, PolymlError
from polyml.gpu import lower as gpu_lower
from polyml.gpu.build import build_cuda_artifact
from polyml.gpu.builder import GpuKernelBuilder
from polyml.gpu.emulate import EmulatedModel
from polyml.gpu.emulate.rewrite import rewrite_module
from polyml.gpu.runtime import CudaPlan

FULL = os.environ.get("POLYML_EMULATOR_FULL") == "1"
TOLERANCE = 1e-3


def _save(tmp_path: Path, model: onnx.ModelProto, name: str = "m") -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return path


def _emulate(tmp_path: Path, model: onnx.ModelProto, shared_memory: bool = False, name: str = "a"):
    """Build ``model`` for CUDA (kernel IR only) and run it on the emulator; (outputs, reference)."""
    path = _save(tmp_path, model, name)
    build_cuda_artifact(read_graph(path), tmp_path / name, shared_memory=shared_memory, ptx=False)
    feeds = testing.random_inputs(model)
    got = EmulatedModel(tmp_path / name).run(feeds)
    return got, testing.onnxruntime_run(model, feeds)


def _conv() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 4, 3, 3)).astype(np.float32)
    b = rng.normal(size=(8,)).astype(np.float32)
    return testing.single_node_model("Conv", {"x": (1, 4, 10, 10)}, initializers={"w": w, "b": b}, pads=[1, 1, 1, 1])


def _gemm() -> onnx.ModelProto:
    b = np.random.default_rng(0).normal(size=(50, 70)).astype(np.float32)
    return testing.single_node_model("Gemm", {"a": (37, 50)}, initializers={"b": b})


def _relu_neg(n: int = 1000) -> onnx.ModelProto:
    """``y = -relu(x)``: the intermediate lives in the device arena."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])], "rn",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# -- correct kernels: the same numbers as onnxruntime ----------------------------------------------

@pytest.mark.parametrize("shared_memory", [False, True])
@pytest.mark.parametrize("model", ["conv", "gemm", "batched_matmul"])
def test_kernels_match_onnxruntime(tmp_path, model, shared_memory):
    m = {"conv": _conv, "gemm": _gemm,
         "batched_matmul": lambda: testing.single_node_model("MatMul", {"a": (3, 20, 30), "b": (3, 30, 40)})}[model]()
    got, ref = _emulate(tmp_path, m, shared_memory)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert (manifest["shared_memory_kernels"] > 0) == shared_memory
    for k in ref:
        assert testing.rel_error(got[k], ref[k]) < TOLERANCE


def test_pool_softmax_concat_match_onnxruntime(tmp_path):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["x"], ["g"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Softmax", ["f"], ["s"], axis=1),
             helper.make_node("Flatten", ["g"], ["h"]),
             helper.make_node("Concat", ["s", "h"], ["y"], axis=1)]
    g = helper.make_graph(nodes, "mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 68])])
    got, ref = _emulate(tmp_path, helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert testing.rel_error(got["y"], ref["y"]) < TOLERANCE


def test_compile_target_and_cli(tmp_path, capsys):
    path = _save(tmp_path, _gemm())
    feeds = testing.random_inputs(_gemm())
    model = polyml.compile(path, tmp_path / "c", target="cuda-emulated", shared_memory=True)
    assert isinstance(model, EmulatedModel) and not (tmp_path / "c" / "ptx").exists()
    ref = testing.onnxruntime_run(_gemm(), feeds)
    assert testing.rel_error(model.run(feeds)["y"], ref["y"]) < TOLERANCE
    with pytest.raises(PolymlError, match="apply to CPU builds only"):
        polyml.compile(path, target="cuda-emulated", polly=False)
    np.savez(tmp_path / "in.npz", **feeds)
    assert cli.main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--target", "cuda-emulated",
                     "--outputs", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as z:
        assert testing.rel_error(z["y"], ref["y"]) < TOLERANCE
    # a CUDA artifact folder written by polyml build --target cuda runs on the emulator as well
    assert cli.main(["build", str(path), "--target", "cuda", "-o", str(tmp_path / "b")]) == 0
    assert cli.main(["run", str(tmp_path / "b"), "--inputs", str(tmp_path / "in.npz"), "--target", "cuda-emulated"]) == 0
    capsys.readouterr()
    assert cli.main(["bench", str(path), "--target", "cuda-emulated"]) == 2
    assert "correctness tool" in capsys.readouterr().err
    assert cli.main(["bench", str(tmp_path / "b")]) == 2
    assert "bench times CPU builds" in capsys.readouterr().err


def test_plan_reads_the_manifest(tmp_path):
    path = _save(tmp_path, _relu_neg())
    build_cuda_artifact(read_graph(path), tmp_path / "a", ptx=False, fuse=False)
    plan = CudaPlan(tmp_path / "a")
    assert [k.name for k in plan.launches] == [k["name"] for k in plan.manifest["kernels"]]
    assert all(k.ir.startswith("kernels/") and (tmp_path / "a" / k.ir).is_file() for k in plan.launches)
    arena = [s for s in plan.slots if s.kind == "arena"]
    assert arena and all(s.offset + s.nbytes <= plan.arena_bytes for s in arena)
    ptrs = plan.pointers(1 << 20, 1 << 30, lambda n: 0)
    assert all(ptrs[i] == (1 << 30) + s.offset for i, s in enumerate(plan.slots) if s.kind == "arena")
    # the kernel IR is kept exactly as built: rebuilding gives the same text
    build_cuda_artifact(read_graph(path), tmp_path / "b", ptx=False, fuse=False)
    assert all((tmp_path / "a" / f).read_text() == (tmp_path / "b" / f).read_text()
               for f in plan.manifest["kernel_ir"])
    m = plan.manifest
    m["slots"][-1]["offset"] = plan.arena_bytes  # an arena slot past the arena's end
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelFormatError, match="outside its storage"):
        CudaPlan(tmp_path / "a")


def test_rewrite_replaces_every_device_construct(tmp_path):
    path = _save(tmp_path, _gemm())
    build_cuda_artifact(read_graph(path), tmp_path / "a", shared_memory=True, ptx=False)
    text = next((tmp_path / "a" / "kernels").glob("*.ll")).read_text()
    rw = rewrite_module(text, "gemm")
    assert "llvm.nvvm" not in rw.text and "addrspace(3)" not in rw.text and "nvptx" not in rw.text
    shared = [k for k in rw.kernels.values() if k.barriers]
    assert len(shared) == 1 and shared[0].barriers == 2 and shared[0].shared_bytes == 2 * 16 * 32 * 4
    accesses = text.count(" load ") + text.count("  store ")
    checked = sum(1 for s in rw.sites if s.kind in ("load", "store"))
    assert 0 < checked <= accesses and {s.array for s in rw.sites if s.kind != "barrier"} >= {"arg0", "arg1", "arg2"}


# -- broken mappings are caught -----------------------------------------------------------------------

def test_removed_guard_is_reported_with_kernel_thread_block_and_array(tmp_path, monkeypatch):
    """The bound guard ``i < hi`` of the mapped loops of Neg dropped: the threads past the end of
    the last block read past the intermediate ``t`` — inside the arena, outside its slot."""
    original = GpuKernelBuilder._mapped

    def unguarded(self, lo, hi, name, axis, tile, predicated=False):  # noqa: ANN001, ANN202
        return original(self, lo, 1 << 40 if self.node.op_type == "Neg" else hi, name, axis, tile, predicated)

    monkeypatch.setattr(GpuKernelBuilder, "_mapped", unguarded)
    path = _save(tmp_path, _relu_neg())
    m = build_cuda_artifact(read_graph(path), tmp_path / "a", ptx=False, fuse=False)
    neg = next(k for k in m["kernels"] if k["op_type"] == "Neg")
    assert neg["grid"][0] * neg["block"][0] > 1000  # some threads lie past the end
    t = next(s for s in m["slots"] if s["name"] == "t")
    assert t["kind"] == "arena" and m["arena_bytes"] >= t["offset"] + 1024 * 4  # the stray reads stay in the arena
    first = 1000 - (neg["grid"][0] - 1) * neg["block"][0]  # the first thread past the end, in the last block
    with pytest.raises(EmulationError) as info:
        EmulatedModel(tmp_path / "a").run(testing.random_inputs(_relu_neg()))
    msg = str(info.value)
    assert f"out-of-bounds read in kernel {neg['name']} (Neg node" in msg
    assert f"thread ({first}, 0, 0) of block ({neg['grid'][0] - 1}, 0, 0)" in msg
    assert "byte offset 4000 of arena tensor 't'" in msg and "kernels/" in msg


def test_barrier_skipped_by_some_threads_is_reported_not_hung(tmp_path, monkeypatch):
    """The threads with x = 0 (16 of a 16x16 block) skip the shared-memory barriers: the others
    wait at the first one while they exit."""
    original = GpuKernelBuilder._barrier

    def skipped_by_thread_0(self):  # noqa: ANN001, ANN202
        b = self.b
        tid = ir.IRBuilder.call(b, self.module.globals.get("llvm.nvvm.read.ptx.sreg.tid.x") or ir.Function(
            self.module, ir.FunctionType(ir.IntType(32), []), "llvm.nvvm.read.ptx.sreg.tid.x"), [])
        with b.if_then(ir.IRBuilder.icmp_unsigned(b, "!=", tid, ir.Constant(ir.IntType(32), 0))):
            original(self)

    monkeypatch.setattr(GpuKernelBuilder, "_barrier", skipped_by_thread_0)
    path = _save(tmp_path, _gemm())
    m = build_cuda_artifact(read_graph(path), tmp_path / "a", shared_memory=True, ptx=False)
    k = next(k for k in m["kernels"] if "shared" in k["mapping"])
    t0 = time.perf_counter()
    with pytest.raises(EmulationError) as info:
        EmulatedModel(tmp_path / "a").run(testing.random_inputs(_gemm()))
    assert time.perf_counter() - t0 < 60
    msg = str(info.value)
    assert f"barrier not reached by every thread in kernel {k['name']}" in msg
    assert "in block (0, 0, 0), after 0 completed barrier(s)" in msg
    assert "thread (1, 0, 0) and 239 other(s) wait at the barrier of kernels/" in msg
    assert "thread (0, 0, 0) exited without reaching it (16 thread(s) exited)" in msg


def test_diverging_barrier_counts_are_reported(tmp_path, monkeypatch):
    """Thread (0, 0, 0) waits at one extra barrier each time: the block's threads meet at
    different barriers."""
    original = GpuKernelBuilder._barrier

    def extra_for_thread_0(self):  # noqa: ANN001, ANN202
        b = self.b
        first = ir.IRBuilder.and_(b, ir.IRBuilder.icmp_unsigned(b, "==", self.sreg("tid", 0), self.i64(0)),
                                  ir.IRBuilder.icmp_unsigned(b, "==", self.sreg("tid", 1), self.i64(0)))
        with b.if_then(first):
            original(self)
        original(self)

    monkeypatch.setattr(GpuKernelBuilder, "_barrier", extra_for_thread_0)
    path = _save(tmp_path, _gemm())
    build_cuda_artifact(read_graph(path), tmp_path / "a", shared_memory=True, ptx=False)
    with pytest.raises(EmulationError) as info:
        EmulatedModel(tmp_path / "a").run(testing.random_inputs(_gemm()))
    msg = str(info.value)
    assert "barrier not reached by every thread" in msg and "in block (0, 0, 0), after 0 completed barrier(s)" in msg
    assert "the threads wait at different barriers: thread (0, 0, 0) at kernels/" in msg
    assert ", thread (1, 0, 0) at kernels/" in msg


def test_wrong_tile_size_in_a_shared_copy_is_caught(tmp_path, monkeypatch):
    """The reduction tile doubled after the boxes were sized for it (and the isl cover check
    skipped): the tile's iterations read past the copied box of the shared array."""
    original = gpu_lower.map_nest_shared

    def doubled_tile(*args, **kwargs):  # noqa: ANN202
        m = original(*args, **kwargs)
        if m.shared is not None:
            m.shared.tile *= 2
        return m

    monkeypatch.setattr(gpu_lower, "map_nest_shared", doubled_tile)
    monkeypatch.setattr(gpu_lower, "check_cover", lambda plan, m: None)
    path = _save(tmp_path, _gemm())
    m = build_cuda_artifact(read_graph(path), tmp_path / "a", shared_memory=True, ptx=False)
    k = next(k for k in m["kernels"] if "shared" in k["mapping"])
    with pytest.raises(EmulationError) as info:
        EmulatedModel(tmp_path / "a").run(testing.random_inputs(_gemm()))
    msg = str(info.value)
    assert f"out-of-bounds read in kernel {k['name']}" in msg and "of shared array" in msg


def test_out_of_range_index_is_reported_as_on_the_cpu(tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])])
    path = _save(tmp_path, helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    build_cuda_artifact(read_graph(path), tmp_path / "a", ptx=False)
    em = EmulatedModel(tmp_path / "a")
    x = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(em.run({"x": x, "i": np.array([0, 4, -1, 2])})["y"], x[[0, 4, -1, 2]])
    with pytest.raises(InputError, match="Gather node 'y': an index in the input data is out of range"):
        em.run({"x": x, "i": np.array([0, 9, 1, 2])})
    np.testing.assert_array_equal(em.run({"x": x, "i": np.array([1, 1, 1, 1])})["y"], x[[1, 1, 1, 1]])


def test_an_artifact_without_kernel_ir_is_refused(tmp_path):
    path = _save(tmp_path, _relu_neg(64))
    build_cuda_artifact(read_graph(path), tmp_path / "a", ptx=False)
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    for k in m["kernels"]:
        del k["ir"]
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ModelFormatError, match="rebuild it with polyml build --target cuda"):
        EmulatedModel(tmp_path / "a")
    shutil.rmtree(tmp_path / "a")
    with pytest.raises(ModelFormatError):
        EmulatedModel(tmp_path / "a")


# -- the light CNNs -------------------------------------------------------------------------------------

def _cnn(tmp_path: Path, name: str, shared_memory: bool, ptx: bool = False) -> tuple[float, dict, float]:
    model = testing.expose_logits(testing.randomize_weights(onnx.load(str(testing.light_model_path(name))), seed=0))
    path = _save(tmp_path, model, name)
    feeds = testing.random_inputs(model)
    ref = testing.onnxruntime_run(model, feeds)
    m = build_cuda_artifact(read_graph(path), tmp_path / "a", shared_memory=shared_memory, ptx=ptx,
                            check_ptxas=ptx and shutil.which("ptxas") is not None)
    em = EmulatedModel(tmp_path / "a")
    t0 = time.perf_counter()
    got = em.run(feeds)
    seconds = time.perf_counter() - t0
    return max(testing.rel_error(got[k], ref[k]) for k in ref), m, seconds


@pytest.mark.slow
@pytest.mark.parametrize("shared_memory", [False, True])
def test_squeezenet_builds_assembles_and_runs_on_the_emulator(tmp_path, shared_memory):
    """The whole CUDA build of squeezenet (PTX, ptxas when installed) and its kernels' IR on the
    emulator, matching onnxruntime."""
    err, m, _ = _cnn(tmp_path, "squeezenet", shared_memory, ptx=True)
    assert len(m["files"]) > 20 and len(m["kernel_ir"]) == len(m["files"])
    assert (m["shared_memory_kernels"] > 10) == shared_memory
    assert {"Conv", "MaxPool", "Concat", "GlobalAveragePool", "Softmax"} <= {k["op_type"] for k in m["kernels"]}
    assert err < TOLERANCE


@pytest.mark.emulator_full
@pytest.mark.skipif(not FULL, reason="the emulated CNNs are opt-in: POLYML_EMULATOR_FULL=1 (make test-emulator)")
@pytest.mark.parametrize("shared_memory", [False, True])
@pytest.mark.parametrize("name", [n for n in testing.LIGHT_MODELS if n != "squeezenet"])
def test_light_cnns_run_on_the_emulator(tmp_path, name, shared_memory):
    err, _, _ = _cnn(tmp_path, name, shared_memory)
    assert err < TOLERANCE
