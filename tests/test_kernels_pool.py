"""MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool and LRN against onnxruntime on seeded
data.

Pooling cases cover pads, auto_pad, strides, dilations, ceil_mode (including a last window
that onnxruntime drops because it would start in the end padding), count_include_pad, 1-3
spatial dims, windows small enough to unroll and large enough to loop, and a few opsets.  LRN
sizes onnxruntime does not implement (even sizes, non-4-D inputs) are checked against numpy.
Errors are max|Δ| / max|ref| ≤ 1e-4.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from polyml.compiler import compile as polyml_compile
from polyml.errors import UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.testing import compile_and_compare, rel_error
from polyml.testing import single_node_model as node_model

TOL = 1e-4




def x_feed(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options) -> None:
    errs = compile_and_compare(model, feeds, **options)
    assert errs and max(errs.values()) <= TOL, errs


# (x shape, attributes); every case runs as MaxPool and AveragePool
WINDOWS = [
    ((1, 2, 8, 8), {"kernel_shape": [2, 2]}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 2, 10, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 10, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 6, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 10, 11), {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 1], "ceil_mode": 1}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), {"kernel_shape": [4, 4], "strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9, 10), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    ((2, 3, 12), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
    ((1, 2, 14, 15), {"kernel_shape": [7, 7], "pads": [3, 3, 3, 3]}),
    ((1, 2, 14, 15), {"kernel_shape": [7, 5], "strides": [2, 3], "pads": [3, 2, 3, 2], "ceil_mode": 1}),
    ((1, 3, 7, 7), {"kernel_shape": [7, 7]}),
    ((1, 3, 40, 37), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


def _id(xs: tuple[int, ...], attrs: dict) -> str:
    return f"x{'x'.join(map(str, xs))}-" + "-".join(f"{k}{v}" for k, v in attrs.items())


def _opset(attrs: dict) -> int:
    return 19 if "dilations" in attrs else 18  # AveragePool has dilations from opset 19


@pytest.mark.parametrize("xs,attrs", WINDOWS, ids=[_id(*c) for c in WINDOWS])
def test_maxpool(xs, attrs) -> None:
    check(node_model("MaxPool", {"x": xs}, opset=_opset(attrs), **attrs), x_feed(xs))


AVG = [(xs, a) for xs, a in WINDOWS] + [
    (xs, {**a, "count_include_pad": 1}) for xs, a in WINDOWS if "pads" in a or "auto_pad" in a or a.get("ceil_mode")
]


@pytest.mark.parametrize("xs,attrs", AVG, ids=[_id(*c) for c in AVG])
def test_averagepool(xs, attrs) -> None:
    check(node_model("AveragePool", {"x": xs}, opset=_opset(attrs), **attrs), x_feed(xs))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("idx", [2, 5, 14])
def test_pool_no_polly(op, idx) -> None:
    xs, attrs = WINDOWS[idx]
    check(node_model(op, {"x": xs}, **attrs), x_feed(xs), polly=False)


@pytest.mark.parametrize("op,opset,attrs", [
    ("MaxPool", 8, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("MaxPool", 10, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", 12, {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("AveragePool", 7, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", 10, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ("AveragePool", 11, {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"}),
], ids=lambda v: str(v))
def test_pool_opsets(op, opset, attrs) -> None:
    check(node_model(op, {"x": (1, 3, 9, 10)}, opset=opset, **attrs), x_feed((1, 3, 9, 10)))


def test_maxpool_indices_unsupported() -> None:
    model = node_model("MaxPool", {"x": (1, 2, 4, 4)}, outputs=("y", "idx"), kernel_shape=[2, 2])
    with pytest.raises(UnsupportedError, match="Indices"):
        from_onnx(model)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("xs", [(2, 3, 5, 6), (1, 4, 7), (1, 2, 3, 4, 5), (1, 5, 1, 1), (1, 16, 7, 7)], ids=str)
def test_global_pool(op, xs) -> None:
    check(node_model(op, {"x": xs}), x_feed(xs))


def test_global_pool_no_polly() -> None:
    check(node_model("GlobalAveragePool", {"x": (2, 3, 5, 6)}), x_feed((2, 3, 5, 6)), polly=False)


# -- LRN ---------------------------------------------------------------------------------------

LRN_CASES = [
    ((1, 5, 4, 4), {"size": 3}),
    ((2, 7, 3, 5), {"size": 5, "alpha": 1e-3, "beta": 0.6, "bias": 2.0}),
    ((1, 3, 2, 2), {"size": 1}),
    ((1, 3, 2, 3), {"size": 7, "alpha": 0.5}),
    ((1, 16, 6, 6), {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 2.0}),
]


@pytest.mark.parametrize("xs,attrs", LRN_CASES, ids=[_id(*c) for c in LRN_CASES])
def test_lrn(xs, attrs) -> None:
    check(node_model("LRN", {"x": xs}, **attrs), x_feed(xs))


def test_lrn_no_polly() -> None:
    xs, attrs = LRN_CASES[1]
    check(node_model("LRN", {"x": xs}, **attrs), x_feed(xs), polly=False)


def numpy_lrn(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    """The ONNX definition, channel window [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    c = x.shape[1]
    sq = np.zeros_like(x, dtype=np.float64)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + math.ceil((size - 1) / 2))
        sq[:, i] = (x[:, lo : hi + 1].astype(np.float64) ** 2).sum(axis=1)
    return x / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("xs,attrs", [
    ((1, 6, 4, 4), {"size": 4, "alpha": 0.1}),
    ((2, 5, 7), {"size": 3, "alpha": 0.2, "beta": 0.5}),
    ((1, 4, 2, 3, 2), {"size": 2, "alpha": 0.3, "bias": 1.5}),
], ids=lambda v: str(v))
def test_lrn_numpy(xs, attrs, tmp_path) -> None:
    """Cases onnxruntime's LRN refuses (even size, inputs that are not 4-D)."""
    onnx.save(node_model("LRN", {"x": xs}, **attrs), str(tmp_path / "m.onnx"))
    feeds = x_feed(xs)
    got = polyml_compile(tmp_path / "m.onnx", tmp_path / "build").run(feeds)["y"]
    assert rel_error(got, numpy_lrn(feeds["x"], **attrs)) <= TOL
