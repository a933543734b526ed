"""Acceptance: the nine light CNNs of the onnx wheel, random weights, through `polyml run` with
Polly, match onnxruntime to max|Δ|/max|ref| ≤ 1e-3."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from polyml import cli
from polyml.testing import LIGHT_MODELS, onnxruntime_run, random_inputs, rel_error, seeded_light_model

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_cnn_matches_onnxruntime(name: str, tmp_path) -> None:
    model = seeded_light_model(name)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    feeds = random_inputs(model, seed=1)
    np.savez(tmp_path / "in.npz", **feeds)

    rc = cli.main(["run", str(path), "--polly", "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz")])
    assert rc == 0

    ref = onnxruntime_run(model, feeds)
    if any(n.op_type == "Softmax" for n in model.graph.node):
        assert len(ref) == 2, "the logits before the final softmax are compared too"
    with np.load(tmp_path / "out.npz") as got:
        assert set(got.files) == set(ref)
        for k in ref:
            assert got[k].shape == ref[k].shape
            err = rel_error(got[k], ref[k])
            assert err <= 1e-3, f"{name} output {k}: max|Δ|/max|ref| = {err:.2e}"
            # a constant output would make the comparison meaningless
            assert np.std(ref[k]) > 0
