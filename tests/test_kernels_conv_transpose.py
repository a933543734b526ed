"""ConvTranspose against onnxruntime on seeded data, through both lowerings (the direct scatter
nest and the packed GEMM + col2im): strides (also larger than the kernel), pads, dilations,
output_padding, output_shape (cropping and extending), auto_pad, groups (incl. depthwise),
optional bias, batch > 1, 1-3 spatial dims, weights as constants or graph inputs.
Errors are max|Δ| / max|ref| ≤ 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

from polyml.errors import UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.graph import Node, TensorType
from polyml.kernels.conv_transpose import _plan, geometry
from polyml.options import CodegenConfig
from polyml.testing import compile_and_compare
from polyml.testing import single_node_model as node_model

TOL = 1e-5


def params(ws: tuple[int, ...], group: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(ws).astype(np.float32), rng.standard_normal(ws[1] * group).astype(np.float32)


def x_feed(xs: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(xs).astype(np.float32)}


# (x shape, w shape (C, M/group, k...), attributes)
CASES = [
    ((1, 3, 5, 6), (3, 4, 3, 3), {}),
    ((1, 3, 5, 6), (3, 4, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 3, 3, 3), (3, 2, 3, 3), {"strides": [3, 2], "dilations": [2, 2], "pads": [1, 2, 0, 3], "output_padding": [1, 1]}),
    ((1, 3, 4, 4), (3, 2, 2, 2), {"strides": [3, 3]}),  # stride > kernel: gaps get the bias only
    ((1, 3, 4, 5), (3, 2, 1, 1), {"strides": [3, 2]}),
    ((1, 3, 3, 3), (3, 2, 3, 3), {"strides": [3, 2], "output_shape": [7, 5]}),  # cropped
    ((1, 3, 3, 3), (3, 2, 3, 3), {"strides": [3, 2], "output_shape": [8, 6]}),  # odd total padding
    ((1, 3, 3, 3), (3, 2, 3, 3), {"strides": [3, 2], "output_shape": [10, 8]}),  # extended
    ((1, 3, 3, 3), (3, 2, 3, 3), {"strides": [3, 2], "output_shape": [8, 6], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 3, 3), (3, 2, 3, 3), {"strides": [3, 2], "output_shape": [8, 6], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2], "dilations": [2, 1]}),
    ((1, 2, 4, 4), (2, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 1, 1, 1), (1, 2, 3, 3), {"pads": [1, 1, 1, 1]}),  # a 1x1 output
    ((2, 4, 5, 5), (4, 3, 3, 3), {"group": 2, "strides": [2, 1], "pads": [1, 0, 0, 1]}),
    ((2, 4, 5, 5), (4, 1, 4, 4), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 6, 5, 7), (6, 2, 3, 3), {"group": 3, "strides": [2, 2], "output_padding": [1, 0]}),
    ((1, 16, 8, 8), (16, 8, 4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 32, 9, 7), (32, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}),
    ((1, 32, 9, 7), (32, 16, 2, 2), {"strides": [2, 2]}),
    ((1, 32, 9, 7), (32, 16, 1, 1), {"strides": [3, 3]}),
    ((3, 24, 6, 5), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 0]}),
    ((1, 3, 7), (3, 4, 3), {"strides": [2], "pads": [1, 0]}),
    ((1, 32, 9), (32, 16, 5), {"strides": [3], "pads": [2, 1], "dilations": [2]}),
    ((2, 32, 9), (32, 16, 4), {"strides": [2], "pads": [1, 1]}),
    ((1, 2, 3, 4, 3), (2, 3, 2, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1]}),
    ((1, 8, 4, 5, 3), (8, 4, 3, 3, 2), {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 0]}),
]


def _id(case) -> str:
    x, w, a = case
    return f"x{'x'.join(map(str, x))}-w{'x'.join(map(str, w))}-" + "-".join(f"{k}{v}" for k, v in a.items()).replace(" ", "")


def _mode(xs, ws, attrs, conv: str) -> str:
    return _plan(CodegenConfig(packed=True, conv=conv), Node("t", "ConvTranspose", ["x", "w"], ["y"], dict(attrs)), TensorType(xs), TensorType(ws)).mode


@pytest.mark.parametrize("conv", ["direct", "gemm"])
@pytest.mark.parametrize("xs,ws,attrs", CASES, ids=[_id(c) for c in CASES])
def test_conv_transpose_constant_weights(xs, ws, attrs, conv) -> None:
    w, b = params(ws, attrs.get("group", 1))
    model = node_model("ConvTranspose", {"x": xs}, initializers={"w": w, "b": b}, **attrs)
    errs = compile_and_compare(model, x_feed(xs), conv=conv)
    assert errs["y"] <= TOL, errs


GRAPH_INPUT_CASES = [CASES[1], CASES[15], CASES[18], CASES[21]]


@pytest.mark.parametrize("conv", ["direct", "gemm"])
@pytest.mark.parametrize("xs,ws,attrs", GRAPH_INPUT_CASES, ids=[_id(c) for c in GRAPH_INPUT_CASES])
def test_conv_transpose_weights_as_graph_inputs_no_bias(xs, ws, attrs, conv) -> None:
    w, _ = params(ws, attrs.get("group", 1))
    model = node_model("ConvTranspose", {"x": xs, "w": w}, **attrs)
    errs = compile_and_compare(model, {**x_feed(xs), "w": w}, conv=conv)
    assert errs["y"] <= TOL, errs


@pytest.mark.parametrize("xs,ws,attrs", [CASES[2], CASES[16], CASES[18]], ids=[_id(c) for c in (CASES[2], CASES[16], CASES[18])])
def test_conv_transpose_no_polly_one_thread(xs, ws, attrs) -> None:
    w, b = params(ws, attrs.get("group", 1))
    model = node_model("ConvTranspose", {"x": xs}, initializers={"w": w, "b": b}, **attrs)
    errs = compile_and_compare(model, x_feed(xs), polly=False, threads=1)
    assert errs["y"] <= TOL, errs


def test_conv_transpose_choice() -> None:
    """The packed GEMM wherever it takes the product (one group); groups, ``--conv direct``,
    builds without the packed GEMM and tiny products take the direct nest."""
    big = ((1, 32, 9, 7), (32, 16, 3, 3), {"strides": [2, 2]})
    assert _mode(*big, "auto") == "gemm" and _mode(*big, "gemm") == "gemm"
    assert _mode(*big, "direct") == "direct"
    assert _mode((1, 32, 9, 7), (32, 1, 3, 3), {"group": 32, "strides": [2, 2]}, "auto") == "direct"
    assert _mode((1, 1, 2, 2), (1, 1, 2, 2), {}, "auto") == "direct"
    assert _plan(CodegenConfig(packed=False), Node("t", "ConvTranspose", ["x", "w"], ["y"], {}), TensorType(big[0]), TensorType(big[1])).mode == "direct"


def test_conv_transpose_geometry() -> None:
    """ONNX's output rules: pads, output_padding, output_shape and auto_pad's split of the total
    padding (SAME_UPPER: the odd element at the end)."""
    x, w = TensorType((1, 1, 3, 3)), TensorType((1, 2, 3, 3))

    def geo(**attrs):
        return geometry(Node("t", "ConvTranspose", ["x", "w"], ["y"], attrs), x, w)

    g = geo(strides=[3, 2], pads=[1, 2, 1, 2], output_padding=[1, 0])
    assert g.full == (9, 7) and g.begin == (1, 2) and g.out == (8, 3)
    assert geo(strides=[2, 2], auto_pad="SAME_UPPER").begin == (0, 0)
    assert geo(strides=[2, 2], auto_pad="SAME_LOWER").begin == (1, 1)
    g = geo(strides=[3, 2], output_shape=[10, 8])
    assert g.out == (10, 8) and g.begin == (0, 0) and g.extent == (10, 8)
    g = geo(strides=[3, 2], output_shape=[1, 2, 7, 5])  # N and C may lead
    assert g.out == (7, 5) and g.begin == (1, 1)
    assert g.tap_range(0, 0) == (1, 3) and g.tap_range(0, 2) == (0, 2)


def test_conv_transpose_rejects_negative_pads() -> None:
    w, _ = params((3, 2, 3, 3), 1)
    model = node_model("ConvTranspose", {"x": (1, 3, 5, 5)}, initializers={"w": w}, pads=[-1, 0, 0, 0])
    with pytest.raises(UnsupportedError, match="negative pads"):
        from_onnx(model)
