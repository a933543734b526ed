"""`polyml bench`: alternating runs against onnxruntime, JSON report, clear errors."""

from __future__ import annotations

import json

import onnx
import pytest

from polyml import cli
from polyml.testing import single_node_model


def test_bench_against_onnxruntime_writes_json(tmp_path) -> None:
    import numpy as np

    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    model = single_node_model("MatMul", {"x": (16, 64)}, initializers={"w": w})
    onnx.save(model, str(tmp_path / "mm.onnx"))
    rc = cli.main(["bench", str(tmp_path / "mm.onnx"), "--compare", "onnxruntime", "--repeat", "3",
                   "--threads", "1", "--json", str(tmp_path / "b.json")])
    assert rc == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["gflop"] == pytest.approx(2 * 16 * 64 * 32 / 1e9)
    for runner in ("polyml", "onnxruntime"):
        r = report["results"][runner]
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["gflops"] > 0
    assert report["results"]["polyml"]["ratio_to_polyml"] == 1.0


def test_bench_unknown_peer_is_an_error(tmp_path, capsys) -> None:
    onnx.save(single_node_model("Relu", {"x": (4,)}), str(tmp_path / "r.onnx"))
    assert cli.main(["bench", str(tmp_path / "r.onnx"), "--compare", "pytorch"]) == 2
    assert "unknown peer" in capsys.readouterr().err
