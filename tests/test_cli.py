"""The command line: build writes an artifact, run reads npz and writes npz, errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from polyml import cli
from tests.test_codegen import add_relu_model

POLYML = [sys.executable, "-m", "polyml.cli"]


def _inputs(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3, 4), np.float32), "y": rng.standard_normal((3, 4), np.float32)}
    np.savez(tmp_path / "in.npz", **feeds)
    return tmp_path / "in.npz", feeds


def test_build_then_run_subprocess(tmp_path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(model))
    inp, feeds = _inputs(tmp_path)
    b = subprocess.run([*POLYML, "build", str(model), "-o", str(tmp_path / "art"), "--emit", "ll", "--threads", "1"],
                       capture_output=True, text=True)
    assert b.returncode == 0, b.stderr
    assert "opt+llc" in b.stderr
    man = json.loads((tmp_path / "art" / "manifest.json").read_text())
    assert man["options"]["threads"] == 1
    r = subprocess.run([*POLYML, "run", str(tmp_path / "art"), "--inputs", str(inp), "--outputs", str(tmp_path / "o.npz")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "z: float32[2, 3, 4]" in r.stdout
    with np.load(tmp_path / "o.npz") as z:
        np.testing.assert_allclose(z["z"], np.maximum(feeds["x"] + feeds["y"], 0), rtol=1e-6)


def test_run_model_file_compiles_first(tmp_path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(model))
    inp, feeds = _inputs(tmp_path)
    assert cli.main(["run", str(model), "--no-polly", "--inputs", str(inp), "--outputs", str(tmp_path / "o.npz")]) == 0
    with np.load(tmp_path / "o.npz") as z:
        np.testing.assert_allclose(z["z"], np.maximum(feeds["x"] + feeds["y"], 0), rtol=1e-6)


def test_errors_exit_2_with_message(tmp_path, capsys) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(model))
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((2, 3, 4), np.float64), y=np.zeros((3, 4), np.float32))
    assert cli.main(["run", str(model), "--inputs", str(bad)]) == 2
    assert "dtype float64" in capsys.readouterr().err
    assert cli.main(["run", str(model), "--inputs", str(tmp_path / "missing.npz")]) == 2
    assert "no such inputs file" in capsys.readouterr().err
    assert cli.main(["build", str(tmp_path / "nope.onnx"), "-o", str(tmp_path / "x")]) == 2
    assert "no such model file" in capsys.readouterr().err
    assert cli.main(["build", str(model), "-o", str(tmp_path / "x"), "--input-shape", "x=2xq"]) == 2
    assert "expected NAME=D0xD1" in capsys.readouterr().err
