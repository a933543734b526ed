"""BatchNormalization (inference), Softmax and LogSoftmax against onnxruntime on seeded data.

Softmax axes follow the opset: before 13 the input is coerced to 2-D at ``axis`` (default 1),
from 13 on the op normalizes along ``axis`` (default -1).  Errors are max|Δ| / max|ref| ≤ 1e-4.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from polyml.errors import GraphError, UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.testing import compile_and_compare
from polyml.testing import single_node_model as node_model

TOL = 1e-4




def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options) -> None:
    errs = compile_and_compare(model, feeds, **options)
    assert errs and max(errs.values()) <= TOL, errs


def bn_params(pshape: tuple[int, ...], seed: int = 1) -> dict[str, np.ndarray]:
    """scale, B, mean, var (positive) of ``pshape``."""
    rng = np.random.default_rng(seed)
    return {
        "scale": rng.standard_normal(pshape).astype(np.float32),
        "bias": rng.standard_normal(pshape).astype(np.float32),
        "mean": rng.standard_normal(pshape).astype(np.float32),
        "var": rng.uniform(0.1, 2.0, pshape).astype(np.float32),
    }


def x_feed(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    return {"x": (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)}


BN_CASES = [
    ((2, 3, 4, 5), 15, {}),
    ((2, 3, 4, 5), 9, {"epsilon": 1e-2}),
    ((4, 6), 14, {}),
    ((1, 2, 3, 4, 5), 15, {"momentum": 0.5}),
    ((3, 4, 7), 7, {}),
]


@pytest.mark.parametrize("shape,opset,attrs", BN_CASES, ids=[f"{s}-op{o}-{a}" for s, o, a in BN_CASES])
def test_batchnorm(shape: tuple[int, ...], opset: int, attrs: dict) -> None:
    model = node_model("BatchNormalization", {"x": shape}, opset=opset, initializers=bn_params((shape[1],)), **attrs)
    check(model, x_feed(shape))


def test_batchnorm_parameters_as_inputs() -> None:
    """Parameters computed at run time (graph inputs), not weights."""
    shape = (2, 4, 3, 3)
    params = bn_params((4,))
    model = node_model("BatchNormalization", {"x": shape, **{k: v.shape for k, v in params.items()}})
    check(model, {**x_feed(shape), **params})


def test_batchnorm_spatial_0() -> None:
    """opset 7's ``spatial=0``: one set of parameters per (channel, position)."""
    shape = (2, 3, 4, 5)
    model = node_model("BatchNormalization", {"x": shape}, opset=7, initializers=bn_params(shape[1:]), spatial=0)
    check(model, x_feed(shape))


def test_batchnorm_without_polly() -> None:
    shape = (2, 3, 4, 5)
    model = node_model("BatchNormalization", {"x": shape}, initializers=bn_params((3,)))
    check(model, x_feed(shape), polly=False)


@pytest.mark.parametrize(
    "outputs,attrs",
    [(("y", "rm", "rv"), {"training_mode": 1}), (("y",), {"training_mode": 1}), (("y", "m", "v"), {})],
    ids=["training", "training-y-only", "opset9-stat-outputs"],
)
def test_batchnorm_training_is_rejected(outputs: tuple[str, ...], attrs: dict) -> None:
    opset = 15 if "training_mode" in attrs else 9
    model = node_model("BatchNormalization", {"x": (2, 3, 4)}, outputs, opset=opset, initializers=bn_params((3,)), **attrs)
    with pytest.raises(UnsupportedError, match="BatchNormalization"):
        from_onnx(model)


# (shape, opset, attributes)
SOFTMAX_CASES = [
    ((3, 5), 18, {}),
    ((2, 3, 4), 18, {}),
    ((2, 3, 4), 18, {"axis": 1}),
    ((2, 3, 4), 13, {"axis": 0}),
    ((2, 3, 4, 5), 13, {"axis": -2}),
    ((7,), 13, {}),
    ((2, 3, 4), 11, {}),  # coerced to (2, 12)
    ((2, 3, 4), 11, {"axis": 0}),  # coerced to (1, 24)
    ((2, 3, 4), 11, {"axis": -1}),
    ((2, 3, 4, 5), 1, {"axis": 2}),
]


def _sm_id(case: tuple) -> str:
    shape, opset, attrs = case
    return f"{shape}-op{opset}" + "".join(f"-{k}{v}" for k, v in attrs.items())


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("case", SOFTMAX_CASES, ids=[_sm_id(c) for c in SOFTMAX_CASES])
def test_softmax(op: str, case: tuple) -> None:
    shape, opset, attrs = case
    check(node_model(op, {"x": shape}, opset=opset, **attrs), x_feed(shape))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_large_inputs(op: str) -> None:
    """Inputs around ±1e4: exp would overflow without subtracting the row maximum."""
    shape = (4, 33)
    check(node_model(op, {"x": shape}), x_feed(shape, scale=1e4))  # a NaN error fails the bound


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("case", [SOFTMAX_CASES[2], SOFTMAX_CASES[6]], ids=_sm_id)
def test_softmax_without_polly(op: str, case: tuple) -> None:
    shape, opset, attrs = case
    check(node_model(op, {"x": shape}, opset=opset, **attrs), x_feed(shape), polly=False)


@pytest.mark.parametrize("opset,axis", [(13, 3), (13, -4), (11, 3)])
def test_softmax_axis_out_of_range(opset: int, axis: int) -> None:
    with pytest.raises(GraphError, match="axis"):
        from_onnx(node_model("Softmax", {"x": (2, 3, 4)}, opset=opset, axis=axis))
