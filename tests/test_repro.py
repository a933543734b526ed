"""Deterministic builds: two builds give byte-identical files and the same artifact_sha256;
``polyml build --from-manifest`` rebuilds and reports every difference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

import polyml
from polyml import cache, cli
from polyml.driver import artifact
from polyml.repro import rebuild
from polyml.testing import light_model_path, randomize_weights
from tests.test_codegen import add_relu_model

POLYML = [sys.executable, "-m", "polyml.cli"]


@pytest.fixture(scope="module")
def squeezenet(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "squeezenet.onnx"
    onnx.save(randomize_weights(onnx.load(str(light_model_path("squeezenet")))), str(path))
    return path


def _emit_choices() -> list[str]:
    """What ``polyml build --emit`` offers (``ll``, and ``jscop`` once the SCoP layer emits it)."""
    import argparse

    parser = argparse.ArgumentParser()
    cli._build_parser(parser)
    return next(sorted(a.choices) for a in parser._actions if "--emit" in a.option_strings)


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def test_two_builds_are_byte_identical(squeezenet, tmp_path) -> None:
    """Two --no-cache builds in processes with different hash seeds (set and dict order): the same
    bytes in every file, model.so included, and the same artifact_sha256. (One test, so that
    pytest-xdist runs the two squeezenet builds once.)"""
    a, b = tmp_path / "b1", tmp_path / "b2"
    emit = [w for kind in _emit_choices() for w in ("--emit", kind)]
    sources = cache.source_hash.__wrapped__()
    for seed, out in ((1, a), (2, b)):
        proc = subprocess.run([*POLYML, "build", str(squeezenet), "-o", str(out), *emit, "--no-cache"],
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    if cache.source_hash.__wrapped__() != sources:
        pytest.skip("polyml's sources were edited between the two builds")
    files = artifact.artifact_files(a)
    assert files == artifact.artifact_files(b)
    assert {"model.so", "weights.bin", "entry.ll", "entry.opt.ll"} <= set(files)
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
        if f.endswith((".ll", ".jscop")):
            assert str(a) not in (a / f).read_text() and "/tmp/" not in (a / f).read_text(), f"{f} names a folder"
    ma, mb = _manifest(a), _manifest(b)
    assert ma["artifact_sha256"] == mb["artifact_sha256"] == artifact.artifact_sha256(ma)
    assert artifact.deterministic_fields(ma) == artifact.deterministic_fields(mb)
    assert ma["seconds"]["opt+llc"] > 0  # timings stay in the manifest, outside the hash
    assert artifact.verify(a) == []
    # the manifest records what a rebuild needs
    assert ma["model"]["path"] == str(squeezenet.resolve())
    assert ma["model"]["sha256"] == polyml.compiler.file_sha256(squeezenet)
    assert {"polyml", "opt", "llc", "clang", "llvmlite", "islpy", "numpy", "python"} <= set(ma["versions"])
    assert ma["options"]["polly"] is True
    assert ma["build"]["chunks"] >= 1 and ma["build"]["emit"] == _emit_choices()
    if "jscop" in _emit_choices():
        assert ma["jscop"], "--emit jscop wrote no JSCoP file"
    assert isinstance(ma["passes"], list)
    assert [p["name"] for p in ma["graph_passes"]] == ["quantize", "fuse-operators"]
    assert ma["graph_passes"][1]["options"]["attention"] is True
    assert ma["fusion"]["passes"][0] == "fuse-operators"
    assert ma["llc_flags"] and ma["link_flags"] and ma["opt_flags"]
    assert set(ma["files"]) == set(files)
    assert ma["jscop"] == {f: h for f, h in ma["files"].items() if f.endswith(".jscop")}


@pytest.fixture
def small_artifact(tmp_path) -> Path:
    model = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(model))
    polyml.compile(model, tmp_path / "art", emit=["ll"], cache=False)
    return tmp_path / "art"


def test_from_manifest_rebuild_reports_no_difference(small_artifact, tmp_path, capsys) -> None:
    sha = _manifest(small_artifact)["artifact_sha256"]
    assert cli.main(["build", "--from-manifest", str(small_artifact / "manifest.json"), "-o", str(tmp_path / "re")]) == 0
    err = capsys.readouterr().err
    assert "no difference" in err and sha in err
    assert _manifest(tmp_path / "re")["artifact_sha256"] == sha
    assert (tmp_path / "re" / "entry.ll").read_bytes() == (small_artifact / "entry.ll").read_bytes()


def test_tampered_file_is_reported(small_artifact, tmp_path, capsys) -> None:
    with open(small_artifact / "entry.opt.ll", "a") as f:
        f.write("; edited by hand\n")
    assert artifact.verify(small_artifact) == ["entry.opt.ll: sha256 differs"]
    assert cli.main(["build", "--from-manifest", str(small_artifact / "manifest.json"), "-o", str(tmp_path / "re")]) == 1
    err = capsys.readouterr().err
    assert "tampered" in err and "entry.opt.ll" in err and "1 difference" in err


def test_edited_manifest_is_reported(small_artifact, tmp_path, capsys) -> None:
    man = _manifest(small_artifact)
    man["files"]["model.so"] = "0" * 64
    (small_artifact / "manifest.json").write_text(json.dumps(man))
    assert cli.main(["build", "--from-manifest", str(small_artifact), "-o", str(tmp_path / "re")]) == 1
    assert "2 difference(s)" in capsys.readouterr().err
    report = rebuild(small_artifact, tmp_path / "re2")
    assert [(d.what, d.detail) for d in report.differences] == [
        ("model.so", "tampered: differs from its manifest hash; rebuilt file differs"),
        ("artifact_sha256", "the recorded manifest was edited: its artifact_sha256 does not match its contents"),
    ]


def test_from_manifest_checks_the_model(small_artifact, tmp_path, capsys) -> None:
    other = tmp_path / "other.onnx"
    m = add_relu_model()
    m.graph.name = "changed"
    onnx.save(m, str(other))
    assert cli.main(["build", "--from-manifest", str(small_artifact / "manifest.json"), str(other)]) == 2
    assert "is not the" in capsys.readouterr().err
    (tmp_path / "m.onnx").unlink()
    assert cli.main(["build", "--from-manifest", str(small_artifact / "manifest.json")]) == 2
    assert "is not there" in capsys.readouterr().err


def test_artifact_sha256_definition() -> None:
    m = {"format": 1, "model": {"name": "g", "sha256": "ab", "path": "/x/m.onnx"}, "seconds": {"lower": 0.1},
         "files": {"model.so": "00"}, "artifact_sha256": ""}
    h = artifact.artifact_sha256(m)
    assert artifact.artifact_sha256({**m, "seconds": {"lower": 9.0}, "model": {**m["model"], "path": "/y"}}) == h
    assert artifact.artifact_sha256({**m, "files": {"model.so": "01"}}) != h
    assert artifact.artifact_sha256({**m, "options": {"threads": 1}}) != h


def _matmul_model(path: Path) -> Path:
    """y = x @ W, 64x256 @ 256x96: a product the packed GEMM takes, blocked by ``POLYML_GEMM_BLOCKING``."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 96)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 96])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_from_manifest_rebuilds_with_the_recorded_settings(tmp_path, monkeypatch, capsys) -> None:
    """A build made with a code-changing setting in the environment records it in its manifest;
    ``--from-manifest`` without the variable rebuilds the same bytes from the record, and they
    differ from a default build's (so the setting did change the code)."""
    model = _matmul_model(tmp_path / "mm.onnx")
    monkeypatch.setenv("POLYML_GEMM_BLOCKING", "kc=32")
    polyml.compile(model, tmp_path / "set", cache=False)
    monkeypatch.delenv("POLYML_GEMM_BLOCKING")
    recorded = _manifest(tmp_path / "set")
    assert recorded["options"]["settings"] == {"POLYML_GEMM_BLOCKING": "kc=32"}
    assert recorded["gemm_blocking"]["kc"] == 32
    assert cli.main(["build", "--from-manifest", str(tmp_path / "set" / "manifest.json"), "-o", str(tmp_path / "re")]) == 0
    assert "no difference" in capsys.readouterr().err
    assert (tmp_path / "re" / "model.so").read_bytes() == (tmp_path / "set" / "model.so").read_bytes()
    polyml.compile(model, tmp_path / "default", cache=False)
    assert _manifest(tmp_path / "default")["options"]["settings"] == {}
    assert (tmp_path / "default" / "model.so").read_bytes() != (tmp_path / "set" / "model.so").read_bytes()
