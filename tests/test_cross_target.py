"""Cross builds (POLYML_TARGET_CPU / POLYML_TARGET_CACHES): the named CPU's features and the
given caches decide the code and its blocks, the manifest records them, and the runtime refuses
to run the code on a CPU that lacks its vector extensions."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyml import testing
from polyml.codegen.gemm import blocking_for_host
from polyml.codegen.tiling import cache_sizes
from polyml.compiler import compile_graph, read_graph
from polyml.driver import toolchain
from polyml.errors import ModelFormatError, ToolchainError
from polyml.runtime import model as runtime_model


@pytest.fixture
def target_env(monkeypatch):
    """Set the cross-build variables for one test; the cached target is read again before and after."""

    def set_target(cpu: str | None = None, caches: str | None = None) -> None:
        for name, value in ((toolchain.TARGET_CPU_ENV, cpu), (toolchain.TARGET_CACHES_ENV, caches)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        toolchain.host_target.cache_clear()
        toolchain.target_data_caches.cache_clear()

    yield set_target
    monkeypatch.delenv(toolchain.TARGET_CPU_ENV, raising=False)
    monkeypatch.delenv(toolchain.TARGET_CACHES_ENV, raising=False)
    toolchain.host_target.cache_clear()
    toolchain.target_data_caches.cache_clear()


def _conv_model(path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(32, 16, 1, 1)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 14, 14])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 32, 14, 14])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_named_cpu_brings_its_features_and_tile(target_env) -> None:
    target_env(cpu="rocketlake", caches="48K,2M,32M")
    t = toolchain.host_target()
    assert t.cpu == "rocketlake" and t.triple.startswith("x86_64")
    assert {"+avx512f", "+avx512bw", "+fma"} <= set(t.features.split(","))
    blk = blocking_for_host()
    assert (blk.mr, blk.nr, blk.width, blk.fma) == (12, 32, 16, True)
    assert cache_sizes()[2] == 2 << 20 and toolchain.target_data_caches()[3] == (32 << 20, 16)
    target_env(cpu="haswell", caches="32K,256K")
    assert "+avx512f" not in toolchain.host_target().features.split(",")
    assert (blocking_for_host().mr, blocking_for_host().nr) == (6, 16)
    assert toolchain.target_data_caches() == {1: (32 << 10, 8), 2: (256 << 10, 16)}


@pytest.mark.parametrize("cpu, caches, message", [
    ("not-a-cpu", None, "clang-19 does not know this CPU"),
    (None, "48K,lots", "not a size: 'lots'"),
    (None, "1K,2K,3K,4K", "expected L1,L2[,L3]"),
])
def test_bad_target_settings_are_named(target_env, cpu, caches, message) -> None:
    target_env(cpu=cpu, caches=caches)
    with pytest.raises(ToolchainError, match=re.escape(message)):
        toolchain.host_target()
        toolchain.target_data_caches()


def test_missing_features_read_from_cpuinfo(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx avx2 fma avx512f\n")
    target = {"triple": "x86_64-pc-linux-gnu", "features": "+avx2,+fma,+avx512f,+avx512vl,-avx512bw,+avx512vnni,+bmi2"}
    # unknown names (bmi2) and features the target turns off (-avx512bw) are not asked for
    assert runtime_model.missing_cpu_features(target, cpuinfo) == ["avx512vl", "avx512vnni"]
    assert runtime_model.missing_cpu_features({**target, "triple": "aarch64-unknown-linux-gnu"}, cpuinfo) == []
    assert runtime_model.missing_cpu_features(target, tmp_path / "absent") == []


def test_cross_build_records_its_target_and_refuses_a_lesser_cpu(tmp_path, target_env, monkeypatch) -> None:
    path = tmp_path / "conv.onnx"
    _conv_model(path)
    target_env(cpu="rocketlake", caches="48K,2M,32M")
    model = compile_graph(read_graph(path), tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["target"]["cpu"] == "rocketlake" and "+avx512f" in manifest["target"]["features"]
    assert manifest["gemm_blocking"]["mr"] == 12
    # a CPU with AVX2 alone: loading works (nothing runs), running is refused before native code
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse sse2 pni ssse3 sse4_1 sse4_2 avx avx2 fma\n")
    monkeypatch.setattr(runtime_model, "CPUINFO", str(cpuinfo))
    lesser = runtime_model.CompiledModel(tmp_path / "a")
    feeds = testing.random_inputs(onnx.load(path))
    with pytest.raises(ModelFormatError, match=r"built for the CPU 'rocketlake'; this machine's CPU lacks avx512"):
        lesser.run(feeds)
    assert model.manifest["target"] == manifest["target"]


def test_doctor_names_the_cross_target(target_env) -> None:
    from polyml.commands import doctor

    target_env(cpu="znver4", caches="32K,1M,32M")
    cpu = doctor._cpu()
    assert cpu["ok"] and cpu["name"] == "znver4" and cpu["cross_target"] == "znver4"
    assert cpu["caches"] == {"L1": 32 << 10, "L2": 1 << 20, "L3": 32 << 20}
    assert "avx512f" in cpu["vector_features"]
    assert "builds for znver4" in doctor._details("cpu", cpu)


def test_cross_bench_rounds_only_the_product_weights(tmp_path) -> None:
    """scripts/cross_bench.py shrinks the payload by rounding Conv/Gemm/MatMul weights to 255
    levels; other initializers (batch-norm statistics) keep their values."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "cross_bench.py"
    spec = importlib.util.spec_from_file_location("cross_bench", path)
    cross_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cross_bench)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 32, 3, 3)).astype(np.float32)
    scale = rng.uniform(0.5, 1.5, size=64).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Mul", ["y", "s"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(scale.reshape(1, 64, 1, 1), "s")])
    rounded = cross_bench.round_weights(helper.make_model(graph))
    got = {i.name: numpy_helper.to_array(i) for i in rounded.graph.initializer}
    assert len(np.unique(got["w"])) <= 255 and np.abs(got["w"] - w).max() <= np.abs(w).max() / 127
    np.testing.assert_array_equal(got["s"].ravel(), scale)


def test_cross_build_for_a_lesser_cpu_runs_here_and_matches(tmp_path, target_env) -> None:
    """A cross build for a CPU this host covers (x86-64-v3: AVX2 and FMA, else x86-64-v2) runs here
    and matches onnxruntime: the named target's code, not only its refusal, is right."""
    path = tmp_path / "conv.onnx"
    _conv_model(path)
    host = set(toolchain.host_target().features.split(","))
    cpu = "x86-64-v3" if {"+avx2", "+fma"} <= host else "x86-64-v2"
    target_env(cpu=cpu, caches="32K,512K,8M")
    model = compile_graph(read_graph(path), tmp_path / "a")
    assert model.manifest["target"]["cpu"] == cpu
    proto = onnx.load(path)
    feeds = testing.random_inputs(proto)
    ref = testing.onnxruntime_run(proto, feeds)
    assert testing.rel_error(model.run(feeds)["z"], ref["z"]) < 1e-5
