"""The compile cache: a hit takes under a second, any change of input misses, concurrent builds
of one model are safe, `polyml cache ls|clear`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

import polyml
import polyml.compiler
from polyml import cache, cli
from polyml.driver import artifact
from polyml.testing import light_model_path, random_inputs, randomize_weights
from tests.test_codegen import add_relu_model

POLYML = [sys.executable, "-m", "polyml.cli"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("POLYML_CACHE_DIR", str(d))
    monkeypatch.delenv("POLYML_NO_CACHE", raising=False)
    return d


@pytest.fixture
def small(tmp_path) -> Path:
    path = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(path))
    return path


def _entries() -> list[dict]:
    return cache.CompileCache().entries()


def _must_not_run(*args, **kwargs) -> None:
    raise AssertionError("a cache hit must not read the model's graph or compile it")


def test_concurrent_builds_then_hit_without_compiling(cache_dir, tmp_path, monkeypatch) -> None:
    model = randomize_weights(onnx.load(str(light_model_path("squeezenet"))))
    path = tmp_path / "squeezenet.onnx"
    onnx.save(model, str(path))
    sources = cache.source_hash.__wrapped__()
    # two processes build the same model at once: one builds, the other waits and gets the hit
    procs = [subprocess.Popen([*POLYML, "build", str(path), "-o", str(tmp_path / f"p{i}")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    if sum("cache hit" in e for e in errs) != 1 and cache.source_hash.__wrapped__() != sources:
        pytest.skip("polyml's sources were edited during the test (new cache keys)")
    assert sum("cache hit" in e for e in errs) == 1, errs
    assert len(_entries()) == 1
    assert not list((cache_dir / "tmp").iterdir())
    sha = {json.loads((tmp_path / f"p{i}" / "manifest.json").read_text())["artifact_sha256"] for i in (0, 1)}
    assert len(sha) == 1
    assert artifact.verify(tmp_path / "p1") == []

    polyml.compile(path, tmp_path / "warm")  # a hit too, unless polyml's sources were edited meanwhile
    with monkeypatch.context() as m:  # a hit reads no graph and compiles nothing
        m.setattr(polyml.compiler, "compile_graph", _must_not_run)
        m.setattr(polyml.compiler, "read_graph", _must_not_run)
        t0 = time.perf_counter()
        hit = polyml.compile(path, tmp_path / "again")
        seconds = time.perf_counter() - t0
    assert hit.cache["hit"]
    feeds = random_inputs(model)
    ref = polyml.load(tmp_path / "p0").run(feeds)
    for k, v in hit.run(feeds).items():
        np.testing.assert_array_equal(v, ref[k])

    for _ in range(2):
        t0 = time.perf_counter()
        proc = subprocess.run([*POLYML, "build", str(path), "-o", str(tmp_path / "cli")], capture_output=True, text=True)
        cli_seconds = time.perf_counter() - t0
        if "cache hit" in proc.stderr or cache.source_hash.__wrapped__() == cache.source_hash():
            break  # else someone edited polyml meanwhile (a new key): the second run hits
    assert proc.returncode == 0 and "cache hit" in proc.stderr, proc.stderr
    print(f"cached rebuild: compile() {seconds:.3f} s, `polyml build` process {cli_seconds:.3f} s")


def test_any_input_change_misses(cache_dir, small, tmp_path) -> None:
    assert not polyml.compile(small, tmp_path / "a", threads=1).cache["hit"]
    assert polyml.compile(small, tmp_path / "b", threads=1).cache["hit"]
    assert polyml.compile(small, threads=1).cache["hit"]  # into a temporary folder
    assert not polyml.compile(small, tmp_path / "c", threads=2).cache["hit"]
    assert not polyml.compile(small, tmp_path / "d", threads=1, polly=False).cache["hit"]
    assert not polyml.compile(small, tmp_path / "e", threads=1, emit=["ll"]).cache["hit"]
    assert not polyml.compile(small, tmp_path / "f", threads=1, chunks=3).cache["hit"]
    m = add_relu_model()
    m.graph.node[1].op_type = "Sigmoid"
    onnx.save(m, str(small))
    assert not polyml.compile(small, tmp_path / "g", threads=1).cache["hit"]
    assert len(_entries()) == 6


def test_polyml_source_change_misses(cache_dir, small, tmp_path, monkeypatch) -> None:
    polyml.compile(small, tmp_path / "a")
    assert polyml.compile(small, tmp_path / "b").cache["hit"]
    monkeypatch.setattr(cache, "source_hash", lambda: "edited")
    assert not polyml.compile(small, tmp_path / "c").cache["hit"]


def test_codegen_switch_misses(cache_dir, small, tmp_path, monkeypatch) -> None:
    """A kernel-path switch (``POLYML_DW_PRODUCT``...) is part of the key: an A/B build in one
    process must not get the other variant's artifact."""
    polyml.compile(small, tmp_path / "a")
    monkeypatch.setenv("POLYML_DW_PRODUCT", "0")
    assert not polyml.compile(small, tmp_path / "b").cache["hit"]
    assert polyml.compile(small, tmp_path / "c").cache["hit"]


def test_no_cache_and_env(cache_dir, small, tmp_path, monkeypatch) -> None:
    assert cli.main(["build", str(small), "-o", str(tmp_path / "a"), "--no-cache"]) == 0
    assert _entries() == []
    monkeypatch.setenv("POLYML_NO_CACHE", "1")
    assert polyml.compile(small, tmp_path / "b").cache["key"] is None
    assert _entries() == []


def test_hit_replaces_an_older_artifact(cache_dir, small, tmp_path) -> None:
    out = tmp_path / "out"
    polyml.compile(small, tmp_path / "first")
    polyml.compile(small, out, emit=["ll"], cache=False)
    assert (out / "entry.ll").is_file()
    assert polyml.compile(small, out).cache["hit"]
    assert not (out / "entry.ll").exists()  # files of the earlier build are gone
    assert artifact.verify(out) == []
    assert json.loads((out / "manifest.json").read_text())["model"]["path"] == str(small.resolve())


def test_damaged_entry_is_rebuilt(cache_dir, small, tmp_path) -> None:
    polyml.compile(small, tmp_path / "a")
    (entry,) = _entries()
    Path(entry["path"], "weights.bin").write_bytes(b"garbage")
    again = polyml.compile(small, tmp_path / "b")
    assert not again.cache["hit"]
    assert artifact.verify(tmp_path / "b") == []
    assert polyml.compile(small, tmp_path / "c").cache["hit"]


def test_ls_and_clear(cache_dir, small, tmp_path, capsys) -> None:
    polyml.compile(small, tmp_path / "a", threads=1)
    polyml.compile(small, tmp_path / "b", emit=["ll"])
    assert cli.main(["cache", "ls", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["dir"] == str(cache_dir) and len(listed["entries"]) == 2
    assert {e["model"] for e in listed["entries"]} == {"g"}
    assert cli.main(["cache", "ls"]) == 0
    text = capsys.readouterr().out
    assert "threads=1" in text and "emit=ll" in text
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 2" in capsys.readouterr().err
    assert _entries() == []
    assert not polyml.compile(small, tmp_path / "c", threads=1).cache["hit"]


def test_cache_dir_default_is_the_user_cache(monkeypatch) -> None:
    import platformdirs

    monkeypatch.delenv("POLYML_CACHE_DIR", raising=False)
    assert cache.cache_dir() == Path(platformdirs.user_cache_dir("polyml", appauthor=False))
    monkeypatch.setenv("POLYML_CACHE_DIR", "/somewhere/else")
    assert cache.cache_dir() == Path("/somewhere/else")
    assert os.environ["POLYML_CACHE_DIR"] == "/somewhere/else"


def test_external_data_is_part_of_the_key(cache_dir, tmp_path) -> None:
    from onnx import numpy_helper

    from tests.test_errors import _external, relu_model, save

    model = relu_model()
    w = numpy_helper.to_array(model.graph.initializer[0])
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    path = save(_external(model, "w.bin"), tmp_path / "m.onnx")
    assert not polyml.compile(path, tmp_path / "a").cache["hit"]
    assert polyml.compile(path, tmp_path / "b").cache["hit"]
    (tmp_path / "w.bin").write_bytes((w + 1).tobytes())
    changed = polyml.compile(path, tmp_path / "c")
    assert not changed.cache["hit"]
    x = np.zeros(w.shape, np.float32)
    np.testing.assert_array_equal(changed.run({"x": x})["y"], np.maximum(w + 1, 0))
    assert cache.model_companions(path) == {"w.bin": artifact.sha256_file(tmp_path / "w.bin")}


def test_pruned_to_its_size_limit(cache_dir, small, tmp_path, monkeypatch) -> None:
    polyml.compile(small, tmp_path / "a", threads=1)
    (one,) = _entries()
    monkeypatch.setenv("POLYML_CACHE_MAX_MB", str(1.5 * one["bytes"] / 2**20))
    time.sleep(0.01)
    polyml.compile(small, tmp_path / "b", threads=2)  # the least recently used entry goes
    assert [e["options"]["threads"] for e in _entries()] == [2]
    monkeypatch.setenv("POLYML_CACHE_MAX_MB", "0")
    polyml.compile(small, tmp_path / "c", threads=3)  # the new entry always stays
    assert [e["options"]["threads"] for e in _entries()] == [3]


def test_every_codegen_setting_is_in_the_cache_key(small) -> None:
    """Each code-changing setting of polyml/options.py changes the key (through the build
    options, which carry them), so a cached build made with another setting is not returned."""
    from polyml import options as settings
    from polyml.driver.flags import Options

    def key(given: dict) -> str:
        return cache.cache_key(cache.cache_inputs("sha", Options(settings=given), {}, None, [], 1))

    values = {"POLYML_GEMM_BLOCKING": "kc=128", "POLYML_CONV_INPLACE": "1", "POLYML_WINOGRAD": "0",
              "POLYML_DW_PRODUCT": "0", "POLYML_IGEMM": "madd", "POLYML_IGEMM_ROWS": "1",
              "POLYML_TARGET_CPU": "znver4", "POLYML_TARGET_CACHES": "32K,1M"}
    assert set(values) == {s.name for s in settings.REGISTRY if s.codegen}, "a new code-changing setting: add a value"
    base = key({})
    assert all(key({name: v}) != base for name, v in values.items())
