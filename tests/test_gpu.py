"""GPU offload (polyml.gpu): grid mappings checked with isl, PTX checked with ptxas, device runs.

Without a GPU only the compile side runs; tests that launch kernels skip when no CUDA device
(driver and device) is present.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from polyml import testing
from polyml.compiler import read_graph
from polyml.gpu import mapping
from polyml.gpu.build import build_cuda_artifact
from polyml.gpu.builder import AccessRecord, LoopRecord, NestRecord
from polyml.gpu.lower import lower_graph_cuda
from polyml.gpu.runtime import NoCudaDevice, device_available

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not installed")
needs_device = pytest.mark.skipif(not device_available(), reason="no CUDA device (driver + GPU) on this machine")


def _graph(tmp_path: Path, model: onnx.ModelProto):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return read_graph(path), path


def _conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 3, 3, 3)).astype(np.float32)
    b = rng.normal(size=(6,)).astype(np.float32)
    return testing.single_node_model("Conv", {"x": (1, 3, 9, 11)}, initializers={"w": w, "b": b}, pads=[1, 1, 1, 1],
                                     strides=[2, 1])


def _nest(loops: list[tuple[int, int]], accesses: list[tuple[str, dict | None]]) -> NestRecord:
    """A perfect nest of ``loops`` whose innermost body makes ``accesses`` to array 0."""
    rec = NestRecord(0)
    keys = []
    for d, (lo, hi) in enumerate(loops):
        key = (*(keys[-1] if keys else ()), 0)
        rec.loops[key] = LoopRecord(key, lo, hi, d, f"i{d}")
        (rec.loops[keys[-1]].children if keys else rec.roots).append(key)
        keys.append(key)
    rec.loops[keys[-1]].direct_access = True
    for n, (kind, off) in enumerate(accesses):
        offset = None if off is None else {(keys[int(k[1:])] if k != 1 else 1): v for k, v in off.items()}
        rec.accesses.append(AccessRecord(kind, 0, keys, [0] * len(keys) + [n], offset))
    return rec


# -- isl: dependences decide the parallel band loops ------------------------------------------

def test_independent_nest_maps_every_loop():
    # a[i, j] = a[i, j] * 2 over [0, 37) x [0, 300)
    rec = _nest([(0, 37), (0, 300)], [("read", {"i0": 300, "i1": 1}), ("write", {"i0": 300, "i1": 1})])
    m = mapping.map_nest(rec, [37 * 300])
    assert m.coincident == m.band and len(m.axes) == 2
    assert m.axes[m.band[-1]] == 0  # innermost loop on threadIdx.x (coalesced)
    mapping.check_bijective(m)


def test_carried_dependence_is_not_mapped():
    # a[i, j] = a[i - 1, j] + 1: loop i carries a flow dependence, j does not
    rec = _nest([(1, 40), (0, 16)], [("read", {"i0": 16, "i1": 1, 1: -16}), ("write", {"i0": 16, "i1": 1})])
    m = mapping.map_nest(rec, [40 * 16])
    assert m.coincident == [m.band[1]]
    assert m.axis_of(m.band[0]) is None and m.axis_of(m.band[1]) == 0
    deps = mapping.dependences(rec, [40 * 16])
    assert not deps.is_empty()
    mapping.check_bijective(m)


def test_reduction_loop_stays_sequential():
    # y[i] += x[i, r]: the reduction loop r keeps its order inside the thread
    rec = _nest([(0, 10), (0, 50)], [("read", {"i0": 1}), ("write", {"i0": 1})])
    m = mapping.map_nest(rec, [10])
    assert m.coincident == [m.band[0]] and list(m.axes) == [m.band[0]]


def test_unknown_subscript_is_conservative():
    rec = _nest([(0, 8), (0, 8)], [("read", None), ("write", {"i0": 8, "i1": 1})])
    m = mapping.map_nest(rec, [64])
    assert m.axes == {} and m.grid == (1, 1, 1) and m.why_serial


@pytest.mark.parametrize("extents", [[(0, 1000)], [(3, 40), (0, 1000)], [(0, 5), (0, 70), (0, 33)], [(0, 2), (0, 3), (0, 4), (0, 513)]])
def test_grid_executes_each_domain_point_once(extents):
    rec = _nest(extents, [("write", {f"i{d}": int(np.prod([h - lo for lo, h in extents[d + 1:]])) for d in range(len(extents))})])
    m = mapping.map_nest(rec, [int(np.prod([h - lo for lo, h in extents]))])
    mapping.check_bijective(m)
    # the same, spelled out: the relation (blockIdx, threadIdx, loops) -> domain is a bijection
    rel = mapping.grid_relation(m)
    assert rel.range().is_equal(mapping.band_domain(m))
    assert rel.is_injective() and rel.is_single_valued()


def test_check_rejects_a_grid_that_misses_points():
    rec = _nest([(0, 100)], [("write", {"i0": 1})])
    m = mapping.map_nest(rec, [100])
    key = m.band[0]
    m.tiles[key] = 32
    m.extents[key] = (0, 100)
    # shrink the grid by pretending the loop is shorter, then check against the real domain
    short = mapping.NestMapping(m.band, m.coincident, {key: (0, 60)}, dict(m.axes), dict(m.tiles))
    rel = mapping.grid_relation(short)
    assert not rel.range().is_equal(mapping.band_domain(m))


# -- whole ops: record, map, emit ---------------------------------------------------------------

def test_conv_relu_pool_softmax_kernels(tmp_path):
    g, _ = _graph(tmp_path, _conv_model())
    low = lower_graph_cuda(g)
    assert low.launches
    conv = [launch for launch in low.launches if launch.op_type == "Conv"]
    # the accumulation nest: output-channel/row/column blocks parallel, the taps stay loops
    acc = [launch for launch in conv if any(not d["parallel"] for d in launch.mapping.describe()["band"])]
    assert acc and all(launch.mapping.axes for launch in acc)
    for launch in low.launches:
        mapping.check_bijective(launch.mapping)
    sm = testing.single_node_model("Softmax", {"x": (2, 7, 5)}, axis=1)
    low = lower_graph_cuda(_graph(tmp_path, sm)[0])
    assert any(launch.mapping.why_serial == "" for launch in low.launches)


@needs_ptxas
def test_small_models_assemble_with_ptxas(tmp_path):
    for i, model in enumerate([_conv_model(),
                               testing.single_node_model("MaxPool", {"x": (1, 4, 9, 9)}, kernel_shape=[3, 3], strides=[2, 2]),
                               testing.single_node_model("GlobalAveragePool", {"x": (1, 5, 6, 6)}),
                               testing.single_node_model("Softmax", {"x": (1, 1000)}, axis=1),
                               testing.single_node_model("Tanh", {"x": (2, 3, 4)}),
                               testing.single_node_model("Concat", {"a": (1, 2, 3), "b": (1, 4, 3)}, axis=1)]):
        g, path = _graph(tmp_path, model)
        out = tmp_path / f"a{i}"
        m = build_cuda_artifact(g, out, check_ptxas=True)
        assert m["target"] == "cuda" and m["ptxas_checked"] and m["files"]
        for k in m["kernels"]:
            assert (out / k["ptx"]).is_file() and f".entry {k['name']}" in (out / k["ptx"]).read_text()
            assert all(1 <= b <= 1024 for b in k["block"]) and np.prod(k["block"]) <= 1024
        assert json.loads((out / "manifest.json").read_text())["sm"] == "sm_90"


# squeezenet's whole build (PTX, ptxas) with and without shared memory: tests/test_gpu_emulator.py,
# which also runs it on the emulator


# -- host side ------------------------------------------------------------------------------------

@pytest.mark.skipif(device_available(), reason="a CUDA device is present")
def test_run_without_device_says_so(tmp_path):
    from polyml.gpu.load import load_artifact

    g, _ = _graph(tmp_path, testing.single_node_model("Relu", {"x": (2, 3)}))
    build_cuda_artifact(g, tmp_path / "a", check_ptxas=False)
    with pytest.raises(NoCudaDevice, match="no CUDA device"):
        load_artifact(tmp_path / "a")


@needs_device
@pytest.mark.skipif(os.environ.get("POLYML_SKIP_GPU") == "1", reason="POLYML_SKIP_GPU=1")
def test_conv_runs_on_device_and_matches_onnxruntime(tmp_path):
    from polyml.gpu.runtime import CudaModel

    model = _conv_model()
    g, path = _graph(tmp_path, model)
    build_cuda_artifact(g, tmp_path / "a")
    feeds = testing.random_inputs(model)
    got = CudaModel(tmp_path / "a").run(feeds)
    ref = testing.onnxruntime_run(model, feeds)
    for name in ref:
        assert testing.rel_error(got[name], ref[name]) < 1e-4


def test_device_backend_reads_and_clears_the_status_words(monkeypatch):
    """A kernel that met an out-of-range index leaves 1 + its step in its module's status word:
    the device back end reads every module's word after a run, names the op and clears it
    (a fake driver: no GPU here)."""
    import ctypes

    from polyml.gpu import runtime
    from polyml.gpu.runtime import DeviceBackend

    def check(result, what):  # noqa: ANN001, ANN202 - the driver's (CUresult, *values), success assumed
        assert result[0] == 0, what
        return result[1] if len(result) == 2 else None

    monkeypatch.setattr(runtime, "_check", check)

    words = {0x1000: ctypes.c_int32(0), 0x2000: ctypes.c_int32(0)}

    class FakeDriver:
        def cuMemcpyDtoH(self, dst, src, n):  # noqa: ANN001, ANN202, N802
            ctypes.memmove(dst, ctypes.addressof(words[src]), n)
            return (0,)

        def cuMemsetD32(self, ptr, value, count):  # noqa: ANN001, ANN202, N802
            words[ptr].value = value
            return (0,)

    be = object.__new__(DeviceBackend)
    be._d = FakeDriver()
    be._status_words = [(0x1000, "Gather", "emb"), (0x2000, "GatherND", "g")]
    assert be.take_status() is None
    words[0x2000].value = 7
    assert be.take_status() == ("GatherND", "g") and words[0x2000].value == 0
    assert be.take_status() is None


def test_cuda_model_raises_what_the_backend_reports(tmp_path):
    """CudaModel.run turns a back end's status into the CPU build's InputError."""
    from polyml.errors import InputError
    from polyml.gpu.emulate.launch import EmulatorBackend
    from polyml.gpu.runtime import CudaModel

    class Reporting(EmulatorBackend):
        def take_status(self):  # noqa: ANN202
            return ("Gather", "y")

    model = _conv_model()
    g, path = _graph(tmp_path, model)
    build_cuda_artifact(g, tmp_path / "a", ptx=False)
    m = CudaModel(tmp_path / "a", backend=Reporting())
    with pytest.raises(InputError, match="Gather node 'y': an index in the input data is out of range"):
        m.run(testing.random_inputs(model))


@needs_ptxas
def test_index_checked_modules_define_their_status_word(tmp_path):
    """Every PTX module whose kernels check indices defines its own (weak) status word, so a
    device loads it without an unresolved extern; ptxas accepts it."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]),
                               helper.make_tensor_value_info("i", TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])])
    g, _ = _graph(tmp_path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    build_cuda_artifact(g, tmp_path / "a", check_ptxas=True)
    ptx = "\n".join(p.read_text() for p in (tmp_path / "a" / "ptx").glob("*.ptx"))
    assert ".weak .global .align 4 .u32 polyml_status" in ptx and ".extern .global .align 4 .u32 polyml_status" not in ptx
