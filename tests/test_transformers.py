"""Models as PyTorch exports them: small variants of Hugging Face BERT and GPT-2 and
torchvision ViT-B/16, ConvNeXt-Tiny and MobileNetV3-Large, exported by ``torch.onnx.export``
(dynamo) with random weights by ``scripts/make_models.py --small`` and committed with their
inputs and onnxruntime's outputs.  Each compiles with the default build (fusion on, attention
fused) and matches onnxruntime, live and as recorded.  The full-size models are made by the
same script (torch needed) and checked by the slow test at the end when present.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

import polyml
from polyml.testing import onnxruntime_run, rel_error

FIXTURES = Path(__file__).parent / "fixtures" / "onnx"
SMALL = sorted(json.loads((FIXTURES / "manifest.json").read_text()))
#: the issue's bound on max|Δ|/max|ref| against the framework
TOLERANCE = 1e-3


def _check(path: Path, tmp_path: Path, inputs: dict[str, np.ndarray], recorded: dict[str, np.ndarray] | None) -> polyml.runtime.model.CompiledModel:
    compiled = polyml.compile(path, tmp_path / "out")
    got = compiled.run(inputs)
    ref = onnxruntime_run(onnx.load(str(path)), inputs)
    for name, want in ref.items():
        assert got[name].shape == want.shape and got[name].dtype == want.dtype, name
        err = rel_error(got[name], want)
        assert err <= TOLERANCE, (name, err)
        if recorded is not None and name in recorded:
            assert rel_error(got[name], recorded[name]) <= TOLERANCE
    return compiled


@pytest.mark.parametrize("name", SMALL)
def test_small_export_matches_onnxruntime(name: str, tmp_path: Path) -> None:
    path = FIXTURES / f"{name}.onnx"
    inputs = dict(np.load(FIXTURES / f"{name}.inputs.npz"))
    recorded = dict(np.load(FIXTURES / f"{name}.ref.npz"))
    compiled = _check(path, tmp_path, inputs, recorded)
    kinds = {g["kind"] for g in compiled.manifest["fusion"]["groups"]}
    model_ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    if "Softmax" in model_ops:
        assert "attention" in kinds, compiled.manifest["fusion"]


MODELS = Path(os.environ.get("POLYML_MODELS", "/work/models"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "vit_b_16", "convnext_tiny", "mobilenet_v3_large"])
def test_full_size_export(name: str, tmp_path: Path) -> None:
    """The issue's acceptance models (``scripts/make_models.py --out $POLYML_MODELS``)."""
    path = MODELS / f"{name}.onnx"
    if not path.is_file():
        pytest.skip(f"{path} not made (scripts/make_models.py needs torch)")
    inputs = dict(np.load(MODELS / f"{name}.inputs.npz"))
    _check(path, tmp_path, inputs, None)
