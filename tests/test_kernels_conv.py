"""Conv against onnxruntime on seeded data: groups (incl. depthwise), pads, auto_pad, strides,
dilations, optional bias, 1-3 spatial dims, weights as constants or graph inputs.

Shapes are small but chosen to reach every code path of the lowering: the padded and
phase-split (stride > 1 along the width) copies, the pointwise (1x1) flattening, the "flat"
mode (narrow outputs computed on the input's row pitch), and full and remainder register
blocks of output channels (8) and columns (32).  Errors are
max|Δ| / max|ref| ≤ 1e-4.  Where onnxruntime has no implementation (SAME padding with
dilations) the reference is a direct numpy convolution.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

from polyml.compiler import compile as polyml_compile
from polyml.errors import UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.graph import Node
from polyml.kernels.conv import make_window
from polyml.options import CodegenConfig
from polyml.testing import compile_and_compare, rel_error
from polyml.testing import single_node_model as node_model

TOL = 1e-4




def params(wshape: tuple[int, ...], seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(wshape).astype(np.float32), rng.standard_normal(wshape[0]).astype(np.float32)


def x_feed(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


# (x shape, w shape, attributes)
CASES = [
    ((1, 3, 8, 8), (4, 3, 3, 3), {}),
    ((1, 3, 8, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 4, 7, 9), (6, 2, 3, 2), {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ((1, 4, 9, 9), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1], "dilations": [2, 2]}),
    ((1, 12, 9, 70), (12, 1, 3, 3), {"group": 12, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 8, 6, 40), (16, 1, 3, 3), {"group": 8, "pads": [1, 1, 1, 1]}),
    ((2, 12, 5, 40), (18, 4, 3, 3), {"group": 3, "pads": [1, 1, 1, 1]}),
    ((1, 3, 10, 10), (5, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 11, 10), (5, 3, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [3, 2]}),
    ((1, 3, 11, 10), (5, 3, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [1, 3]}),
    ((1, 3, 11, 13), (5, 3, 2, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 3, 9, 20), (4, 3, 3, 5), {"strides": [1, 2], "dilations": [1, 2], "pads": [0, 1, 1, 2]}),
    ((1, 3, 9, 21), (4, 3, 3, 5), {"strides": [2, 3], "dilations": [2, 2], "pads": [1, 2, 1, 0]}),
    ((1, 3, 9, 21), (4, 3, 3, 4), {"strides": [1, 3], "dilations": [1, 3]}),
    ((1, 3, 9, 40), (19, 3, 3, 3), {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}),
    ((2, 4, 7, 7), (16, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 9, 12), (11, 3, 3, 3), {"dilations": [2, 1]}),
    ((1, 8, 6, 10), (24, 4, 3, 3), {"group": 2, "pads": [0, 2, 1, 1], "strides": [1, 1]}),
    ((1, 2, 4, 5, 6), (9, 2, 2, 3, 3), {"pads": [0, 1, 1, 1, 1, 0], "dilations": [2, 1, 1]}),
    ((1, 16, 8, 70), (10, 16, 1, 1), {}),
    ((1, 16, 8, 70), (10, 16, 1, 1), {"strides": [2, 2]}),
    ((1, 5, 1, 1), (7, 5, 1, 1), {}),
    ((1, 3, 10), (5, 3, 3), {"pads": [2, 1], "strides": [2]}),
    ((2, 4, 37), (6, 2, 5), {"group": 2, "dilations": [3], "pads": [4, 4]}),
    ((1, 2, 5, 6, 7), (3, 2, 2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1]}),
    ((1, 2, 6, 6, 9), (3, 2, 2, 3, 3), {"pads": [1, 0, 1, 0, 1, 1], "strides": [2, 1, 2], "dilations": [1, 2, 1]}),
]


def _id(case) -> str:
    x, w, a = case
    return f"x{'x'.join(map(str, x))}-w{'x'.join(map(str, w))}-" + "-".join(f"{k}{v}" for k, v in a.items())


@pytest.mark.parametrize("xs,ws,attrs", CASES, ids=[_id(c) for c in CASES])
def test_conv_constant_weights(xs, ws, attrs) -> None:
    w, b = params(ws)
    errs = compile_and_compare(node_model("Conv", {"x": xs}, initializers={"w": w, "b": b}, **attrs), x_feed(xs))
    assert errs["y"] <= TOL, errs


@pytest.mark.parametrize("xs,ws,attrs", CASES[:6:2] + CASES[15:17], ids=[_id(c) for c in CASES[:6:2] + CASES[15:17]])
def test_conv_no_bias_no_polly(xs, ws, attrs) -> None:
    w, _ = params(ws)
    errs = compile_and_compare(node_model("Conv", {"x": xs}, initializers={"w": w}, **attrs), x_feed(xs), polly=False)
    assert errs["y"] <= TOL, errs


@pytest.mark.parametrize("case", [CASES[2], CASES[12], CASES[20]], ids=[_id(c) for c in (CASES[2], CASES[12], CASES[20])])
def test_conv_weights_as_graph_inputs(case) -> None:
    xs, ws, attrs = case
    w, b = params(ws)
    feeds = {**x_feed(xs), "w": w, "b": b}
    errs = compile_and_compare(node_model("Conv", {"x": xs, "w": w, "b": b}, **attrs), feeds)
    assert errs["y"] <= TOL, errs


def numpy_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads: list[int], strides: list[int],
               dilations: list[int], group: int) -> np.ndarray:
    """Direct 2-D convolution in float64 (pads as ONNX: begins then ends)."""
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (xp.shape[2] - ((kh - 1) * dilations[0] + 1)) // strides[0] + 1
    ow = (xp.shape[3] - ((kw - 1) * dilations[1] + 1)) // strides[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for oc in range(m):
        g = oc // mg
        for i in range(kh):
            for j in range(kw):
                rows = xp[:, g * cg : (g + 1) * cg, i * dilations[0] :: strides[0], j * dilations[1] :: strides[1]][:, :, :oh, :ow]
                y[:, oc] += np.einsum("nchw,c->nhw", rows, w[oc, :, i, j])
        if b is not None:
            y[:, oc] += b[oc]
    return y


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_conv_same_with_dilations_numpy(mode, tmp_path) -> None:
    """auto_pad SAME with dilations (onnxruntime refuses it): total padding from the dilated kernel."""
    xs, ws, strides, dil = (1, 3, 11, 12), (4, 3, 3, 4), [2, 1], [2, 3]
    w, b = params(ws)
    model = node_model("Conv", {"x": xs}, initializers={"w": w, "b": b}, auto_pad=mode, strides=strides, dilations=dil)
    onnx.save(model, str(tmp_path / "m.onnx"))
    feeds = x_feed(xs)
    got = polyml_compile(tmp_path / "m.onnx", tmp_path / "build").run(feeds)["y"]
    pads = []
    for n, s, k, d in zip(xs[2:], strides, ws[2:], dil):
        out = -(-n // s)
        pads.append(max(0, (out - 1) * s + (k - 1) * d + 1 - n))
    head = [p // 2 if mode == "SAME_UPPER" else p - p // 2 for p in pads]
    ref = numpy_conv(feeds["x"], w, b, [head[0], head[1], pads[0] - head[0], pads[1] - head[1]], strides, dil, 1)
    assert got.shape == (1, 4, 6, 12)
    assert rel_error(got, ref) <= TOL


def test_conv_window_geometry() -> None:
    node = Node("c", "Conv", ["x", "w"], ["y"], {"pads": [1, 2, 0, 1], "strides": [2, 3], "dilations": [1, 2]})
    win = make_window(node, (9, 20), (3, 4))
    assert win.out == (4, 6) and win.pads_begin == (1, 2) and win.pads_end == (0, 1)
    assert win.extent == (3, 7) and win.required == (9, 22)
    same = Node("c", "Conv", ["x", "w"], ["y"], {"auto_pad": "SAME_LOWER", "strides": [2, 2]})
    win = make_window(same, (7, 8), (4, 3))
    assert win.out == (4, 4) and win.pads_begin == (2, 1) and win.pads_end == (1, 0)


def test_conv_rejects_negative_pads() -> None:
    w, _ = params((2, 3, 3, 3))
    model = node_model("Conv", {"x": (1, 3, 6, 6)}, initializers={"w": w}, pads=[-1, 0, 0, 0])
    with pytest.raises(UnsupportedError, match="negative pads"):
        from_onnx(model)


# -- convolution as a packed GEMM (kernels/conv.py gemm mode, polyml/codegen/gemm.py) ----------

GEMM_CASES = [
    ((1, 16, 20, 20), (32, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 16, 21, 19), (24, 16, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2]}),
    ((1, 8, 23, 25), (20, 8, 3, 2), {"dilations": [2, 3], "pads": [2, 1, 0, 3]}),
    ((1, 64, 14, 14), (130, 64, 1, 1), {}),  # 1x1: x read as the B matrix in place
    ((1, 64, 15, 15), (40, 64, 1, 1), {"strides": [2, 2]}),
    # 36 positions: the last column panel holds 4, computed by a narrow micro-kernel
    ((1, 64, 6, 6), (40, 64, 1, 1), {}),
    ((1, 3, 40, 40), (16, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
    # two kc blocks (64·9 > kc): the second adds into the remapped output; 20 rows: a partial tile
    ((1, 64, 9, 11), (20, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    # two kc blocks on 40-column rows: whole tiles inside a row go straight into C (the
    # second block adding), the rest through the stack tile
    ((1, 64, 12, 40), (20, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    # output rows of 4 columns: one 32-column tile spans 6 of them (pitch 6)
    ((1, 24, 6, 4), (36, 24, 3, 3), {"pads": [1, 1, 1, 1]}),
    # stride 3 and stride 2 with dilation 2: 9 / 4 phase planes, taps of one phase a row apart
    ((1, 12, 17, 16), (33, 12, 3, 3), {"strides": [3, 3], "pads": [0, 1, 2, 0]}),
    ((1, 12, 17, 16), (33, 12, 3, 3), {"strides": [2, 2], "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    # a stem with 32-column output rows: in place, the planes' rows aligned to the register
    # tile (every tile inside a row or skipped in its padding); 20 channels: the partial row
    # panel's tiles by the short kernel (M mod mr rows)
    ((1, 3, 66, 64), (20, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    # the same with two kc blocks (K = 360) on aligned rows of stride 1
    ((1, 40, 9, 32), (20, 40, 3, 3), {"pads": [1, 1, 1, 1]}),
    # a 7x7 map: 49 columns, the last column panel holds one (the narrowest micro-kernel)
    ((1, 32, 7, 7), (22, 32, 1, 1), {}),
    # at most 64 rows: B packed in L1-sized column blocks (gemm.block_nc): K = 400 in two kc
    # blocks of 200, 132 columns in blocks of 64, 64 and 4; K = 8: blocks of the L2 size
    ((1, 400, 12, 11), (40, 400, 1, 1), {}),
    ((1, 8, 30, 30), (24, 8, 1, 1), {}),
]


def _choice(xs: tuple[int, ...], ws: tuple[int, ...], attrs: dict, conv: str = "auto", constant: bool = False,
            threaded: bool = True, conv_inplace: str = "") -> str:
    """The plan's mode for a Conv of these shapes with the packed GEMM on (``conv`` choice), in a
    build for more than one thread (``threaded``) or for one, ``conv_inplace`` as set."""
    from polyml.graph import TensorType
    from polyml.kernels.conv import _plan

    return _plan(CodegenConfig(packed=True, conv=conv, threaded=threaded, conv_inplace=conv_inplace), Node("c", "Conv", ["x", "w"], ["y"], dict(attrs)), TensorType(xs), TensorType(ws), constant).mode


@pytest.mark.parametrize("xs,ws,attrs", GEMM_CASES, ids=[_id(c) for c in GEMM_CASES])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("in_place", [True, False], ids=["inplace", "packed"])
def test_conv_as_packed_gemm(xs, ws, attrs, threads, in_place, monkeypatch) -> None:
    """Eligible shapes take the gemm mode (``conv="gemm"``): B read in place from the
    stride-phase planes (``gemm_inplace``, ``POLYML_CONV_INPLACE=1``; stems' default) or
    im2col packed (``POLYML_CONV_INPLACE=0``; the default for the rest); unstrided 1x1 convolutions
    read x itself either way, strided ones without padding are packed either way.  Both match
    onnxruntime with bias, 1 and 2 threads."""
    monkeypatch.setenv("POLYML_CONV_INPLACE", "1" if in_place else "0")
    unpadded_1x1 = ws[2:] == (1, 1) and "pads" not in attrs
    assert _choice(xs, ws, attrs, "gemm", conv_inplace="1" if in_place else "0") == (
        "gemm_inplace" if in_place and not unpadded_1x1 else "gemm")
    w, b = params(ws)
    model = node_model("Conv", {"x": xs}, initializers={"w": w, "b": b}, **attrs)
    errs = compile_and_compare(model, x_feed(xs), threads=threads, conv="gemm")
    assert errs["y"] <= TOL, errs


#: grouped convolutions (not depthwise) with at least a register tile of rows per group
GROUPED_GEMM_CASES = [
    ((1, 48, 14, 14), (48, 16, 1, 1), {"group": 3}),  # ShuffleNet's grouped 1x1: x read in place
    ((1, 16, 13, 13), (40, 8, 5, 5), {"group": 2, "pads": [2, 2, 2, 2]}),  # AlexNet's grouped 5x5
    ((1, 24, 15, 17), (52, 6, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 0, 1, 1]}),  # 13 rows per group
    ((1, 48, 21, 21), (48, 16, 1, 1), {"group": 3, "strides": [2, 2]}),  # strided 1x1: columns packed
]


@pytest.mark.parametrize("xs,ws,attrs", GROUPED_GEMM_CASES, ids=[_id(c) for c in GROUPED_GEMM_CASES])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("weights", ["constant", "input"])
def test_grouped_conv_as_batched_gemm(xs, ws, attrs, threads, weights) -> None:
    """A grouped convolution under ``conv="gemm"`` is one packed product per group, batched
    over the groups (constant weights pre-packed group after group, computed ones packed per
    block), and matches onnxruntime with bias, 1 and 2 threads."""
    assert _choice(xs, ws, attrs, "gemm", constant=weights == "constant") == "gemm"
    w, b = params(ws)
    if weights == "constant":
        model, feeds = node_model("Conv", {"x": xs}, initializers={"w": w, "b": b}, **attrs), x_feed(xs)
    else:
        model, feeds = node_model("Conv", {"x": xs, "w": w, "b": b}, **attrs), {**x_feed(xs), "w": w, "b": b}
    errs = compile_and_compare(model, feeds, threads=threads, conv="gemm")
    assert errs["y"] <= TOL, errs


@pytest.mark.parametrize("size,out_w,qw", [(224, 112, 128), (221, 111, 112), (64, 32, 48)])
def test_phase_planes_rows_aligned_to_the_tile(size: int, out_w: int, qw: int) -> None:
    """A 3x3/2 stem whose output width the 16-column tile divides gets phase planes of rows
    aligned to 16 (every tile inside a row or in its padding); other widths keep the natural
    pitch (output width + 1)."""
    from polyml.kernels.conv import PhasePlanes, row_align

    win = make_window(Node("c", "Conv", ["x", "w"], ["y"], {"strides": [2, 2], "pads": [1, 1, 1, 1]}), (size, size),
                      (3, 3))
    assert win.out[1] == out_w
    planes = PhasePlanes(3, win, 16, row_align(win, 16))
    assert planes.qw == qw and planes.columns == (win.out[0] - 1) * qw + out_w


@pytest.mark.parametrize("case", [GEMM_CASES[1], GEMM_CASES[6]], ids=[_id(c) for c in (GEMM_CASES[1], GEMM_CASES[6])])
def test_conv_in_place_gemm_weights_as_inputs(case) -> None:
    """``gemm_inplace`` with computed weights: A is packed per block, not at compile time."""
    xs, ws, attrs = case
    w, b = params(ws)
    feeds = {**x_feed(xs), "w": w, "b": b}
    errs = compile_and_compare(node_model("Conv", {"x": xs, "w": w, "b": b}, **attrs), feeds, threads=2, conv="gemm")
    assert errs["y"] <= TOL, errs


# -- output rows as register tiles (kernels/conv.py rows mode, polyml/codegen/gemm_rows.py) ----

ROWS_CASES = [
    ((1, 128, 7, 7), (64, 128, 1, 1), {}),  # x read in place; 7 rows: 3 stacked pairs and one row
    ((1, 64, 8, 7), (32, 64, 1, 1), {}),  # 8 rows of 7: four stacked pairs
    ((1, 48, 13, 13), (40, 48, 3, 3), {"pads": [1, 1, 1, 1]}),  # 40 channels: a partial panel
    ((1, 24, 14, 14), (32, 24, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # 7 wide, 4 phases
    ((1, 16, 12, 14), (33, 16, 5, 3), {"pads": [2, 0, 2, 1]}),  # 12 x 13 outputs, asymmetric
    ((1, 96, 9, 9), (32, 96, 1, 1), {"strides": [1, 1], "pads": [1, 1, 1, 1]}),  # padded 1x1: a copy
    ((1, 16, 11, 11), (32, 16, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    # unstrided 1x1 to 32 channels on other maps of at most 256 positions: the flat run of
    # positions cut into rows
    ((1, 96, 6, 6), (32, 96, 1, 1), {}),  # 36 positions: 3 rows of 12
    ((1, 64, 9, 26), (32, 64, 1, 1), {}),  # 234 positions: 18 rows of 13, across the map's rows
]


@pytest.mark.parametrize("xs,ws,attrs", ROWS_CASES, ids=[_id(c) for c in ROWS_CASES])
@pytest.mark.parametrize("threads", [1, 2])
def test_conv_rows(xs, ws, attrs, threads) -> None:
    """Output maps 7-14 wide with 32+ channels take the rows mode (AVX-512 hosts) and match
    onnxruntime with bias, 1 and 2 threads."""
    from polyml.codegen import gemm as packed

    blk = packed.blocking_for_host()
    mode = _choice(xs, ws, attrs, constant=True)
    assert mode == ("rows" if (blk.nr, blk.width) == (32, 16) else mode)
    w, b = params(ws)
    model = node_model("Conv", {"x": xs}, initializers={"w": w, "b": b}, **attrs)
    errs = compile_and_compare(model, x_feed(xs), threads=threads)
    assert errs["y"] <= TOL, errs


def test_conv_rows_fused_epilogue(tmp_path) -> None:
    """Conv → BatchNorm → Add(residual) → Relu on a 7x7 map: the chain runs in the rows
    kernel's store (position-indexed residual), numerically as onnxruntime."""
    from polyml.codegen import gemm as packed

    model, feeds = _conv_bn_residual_relu(40, 48, 7, seed=5)
    errs = compile_and_compare(model, feeds, threads=2)
    assert errs["y"] <= TOL, errs
    if packed.blocking_for_host().nr == 32:
        path = tmp_path / "m.onnx"
        onnx.save(model, str(path))
        polyml_compile(path, tmp_path / "build", emit=["ll"], threads=2)
        ir_text = "".join(p.read_text() for p in (tmp_path / "build").glob("ops.off*.ll") if ".opt." not in p.name)
        assert "polyml.rows_ukernel.7x2." in ir_text  # output rows stacked in pairs (14 positions)
        assert "polyml.rows_ukernel.7\"" in ir_text  # and the seventh row alone
        # each reduction step prefetches the source run of a step PREFETCH_AHEAD ahead (a run
        # the other thread wrote arrives from its cache: MobileNetV2 at 2 threads 0.97-0.99x)
        # and the two lines of weights WEIGHTS_AHEAD ahead
        body = re.search(r'^define internal void @"polyml.rows_ukernel.7x2[^"]*"\(.*?^}', ir_text, re.M | re.S)
        assert body and body.group(0).count("i32 0, i32 3, i32 1)") == 4, "no read prefetches in the stacked kernel"


def test_conv_choice_by_shape(monkeypatch) -> None:
    """``auto`` takes the GEMM from 32 output channels on, the direct nests for narrower
    convolutions, unstrided ones of at most 16 input channels and stems of up to 4 input
    channels but 3x3 ones (scripts/bench_conv.py's measurements, re-measured after the
    packed GEMM's changes); 1x1 convolutions as the host's ISA says (next test: pinned to AVX-512
    here)."""
    from polyml.codegen import gemm as packed
    from polyml.graph import TensorType
    from polyml.kernels import _window, conv

    monkeypatch.setattr(_window, "_isa", lambda: "avx512")
    assert _choice((1, 256, 28, 28), (128, 256, 1, 1), {}) == "gemm"
    assert _choice((1, 64, 56, 56), (256, 64, 1, 1), {}) == "gemm"
    assert _choice((1, 144, 56, 56), (24, 144, 1, 1), {}) == "gemm"
    assert _choice((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}) == "gemm"
    assert _choice((1, 16, 56, 56), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}) == "direct"
    assert _choice((1, 16, 55, 55), (64, 16, 3, 3), {"pads": [1, 1, 1, 1]}) == "gemm"  # 16 input channels, 64 out
    assert _choice((1, 16, 27, 27), (32, 16, 5, 5), {"pads": [2, 2, 2, 2]}) == "flat"  # ... 32 out: direct
    assert _choice((1, 16, 56, 56), (64, 16, 3, 3), {"strides": [2, 2]}) == "gemm"  # ... strided
    assert _choice((1, 3, 224, 224), (64, 3, 3, 3), {"strides": [2, 2]}) == "gemm_inplace"  # a 3x3 stem
    assert _choice((1, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}) == "gemm_inplace"
    assert _choice((1, 8, 224, 224), (64, 8, 3, 3), {"strides": [2, 2]}) == "gemm"  # 8 channels: not a stem
    assert _choice((1, 1024, 14, 14), (2048, 1024, 1, 1), {"strides": [2, 2]}, conv="gemm") == "gemm"  # packed
    # constant weights on 7-14-wide maps: output rows as register tiles (AVX-512 hosts; the
    # packed GEMM elsewhere: the rows tile is 32 columns of AVX-512 registers)
    rows = "rows" if packed.blocking_for_host().nr == 32 else "gemm"
    assert _choice((1, 2048, 7, 7), (512, 2048, 1, 1), {}, constant=True) == rows
    assert _choice((1, 512, 7, 7), (2048, 512, 1, 1), {}, constant=True) == "gemm"  # 1x1 with K < 2M
    assert _choice((1, 384, 13, 13), (48, 384, 1, 1), {}, constant=True) == "gemm"  # 1x1, 48 channels
    # other maps: 1x1 to 32 channels only, when 7-14 divides the positions (FLAT_ROWS_MAX_CHANNELS),
    # on maps of at most FLAT_ROWS_MAX_POSITIONS
    assert _choice((1, 832, 6, 6), (32, 832, 1, 1), {}, constant=True) == rows
    assert _choice((1, 192, 28, 28), (32, 192, 1, 1), {}, constant=True) == "gemm"
    assert _choice((1, 256, 56, 56), (64, 256, 1, 1), {}, constant=True) == "gemm"
    assert _choice((1, 192, 17, 17), (32, 192, 1, 1), {}, constant=True) == "gemm"  # 289 = 17²: no row width
    assert _choice((1, 512, 7, 7), (16, 512, 1, 1), {}, constant=True) == "pointwise"  # 16 channels
    assert _choice((1, 512, 7, 7), (512, 512, 3, 3), {"pads": [1, 1, 1, 1]}, constant=True) == rows
    assert _choice((1, 2048, 7, 7), (512, 2048, 1, 1), {}, conv="gemm", constant=True) == "gemm"
    assert _choice((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, conv="direct") == "direct"
    assert _choice((1, 256, 28, 28), (128, 256, 1, 1), {}, conv="direct") == "pointwise"
    assert conv._plan(CodegenConfig(packed=False), Node("c", "Conv", ["x", "w"], ["y"], {}), TensorType((1, 256, 28, 28)),
                      TensorType((128, 256, 1, 1))).mode == "pointwise"


@pytest.mark.parametrize("isa", ["avx512", "avx"])
def test_pointwise_choice_by_isa(isa, monkeypatch) -> None:
    """1x1 convolutions without padding (``POINTWISE_GEMM``): AVX-512 keeps the direct nests
    below 24 output channels on maps of fewer than 512 positions or, in a one-thread build, with
    fewer than 128 input channels (below 16 on any), strided ones with outputs of fewer than 128
    positions, on maps of fewer than 32 positions and for strided ones; AVX2
    takes the GEMM from 16 channels on maps of 16 positions or more, strided ones with their
    columns packed.  Other GEMM convolutions pack their im2col rows but stems, which read them
    in place whatever their kernel size (``PACKED_IM2COL_ISAS``, ``STEM_GEMM_MAX_TAPS``: measured
    per ISA, on AVX2 and on AVX-512)."""
    from polyml.kernels import _window

    monkeypatch.setattr(_window, "_isa", lambda: isa)
    monkeypatch.delenv("POLYML_CONV_INPLACE", raising=False)
    gemm = "pointwise" if isa == "avx512" else "gemm"
    assert _choice((1, 64, 56, 56), (24, 64, 1, 1), {}) == "gemm"
    assert _choice((1, 32, 56, 56), (16, 32, 1, 1), {}) == "gemm"
    assert _choice((1, 480, 13, 13), (16, 480, 1, 1), {}) == gemm  # 169 positions: AVX-512 direct below 24
    assert _choice((1, 480, 13, 13), (24, 480, 1, 1), {}) == "gemm"
    assert _choice((1, 32, 56, 56), (16, 32, 1, 1), {}, threaded=False) == gemm  # one thread: K < 128
    assert _choice((1, 128, 56, 56), (16, 128, 1, 1), {}, threaded=False) == "gemm"
    assert _choice((1, 32, 56, 56), (24, 32, 1, 1), {}, threaded=False) == "gemm"
    assert _choice((1, 32, 56, 56), (12, 32, 1, 1), {}) == "pointwise"  # under 16 channels: direct on both
    assert _choice((1, 1152, 1, 1), (48, 1152, 1, 1), {}) == "pointwise"  # squeeze-excitation: 1 position
    assert _choice((1, 1152, 5, 5), (48, 1152, 1, 1), {}) == ("pointwise" if isa == "avx512" else "gemm")  # 25
    assert _choice((1, 1024, 14, 14), (256, 1024, 1, 1), {}) == "gemm"  # 196 positions
    assert _choice((1, 512, 7, 7), (160, 512, 1, 1), {}) == "gemm"  # 49 positions
    assert _choice((1, 272, 14, 14), (272, 68, 1, 1), {"group": 4}) == "gemm"  # per group: 68 channels
    assert _choice((1, 272, 28, 28), (272, 68, 1, 1), {"group": 4}) == "gemm"
    assert _choice((1, 48, 28, 28), (48, 12, 1, 1), {"group": 4}) == "pointwise"  # 12 channels a group
    assert _choice((1, 512, 7, 7), (2048, 512, 1, 1), {}, constant=True) == "gemm"  # K < 2M: not the rows tile
    assert _choice((1, 1024, 14, 14), (2048, 1024, 1, 1), {"strides": [2, 2]}) == gemm  # 7x7 out
    assert _choice((1, 512, 28, 28), (1024, 512, 1, 1), {"strides": [2, 2]}) == "gemm"  # 14x14 out: packed
    assert _choice((1, 64, 15, 15), (12, 64, 1, 1), {"strides": [2, 2]}) == "pointwise"
    # padded 1x1 (a window reading outside x): neither rule; the GEMM packs (PACKED_IM2COL_ISAS)
    # as for any other window but stems
    assert _choice((1, 64, 14, 14), (64, 64, 1, 1), {"pads": [1, 1, 1, 1]}) == "gemm"
    assert _choice((1, 64, 28, 28), (64, 64, 5, 5), {"pads": [2, 2, 2, 2]}) == "gemm"
    assert _choice((1, 64, 28, 28), (128, 64, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}) == "gemm"
    assert _choice((1, 3, 224, 224), (64, 3, 3, 3), {"strides": [2, 2]}) == "gemm_inplace"  # a 3x3 stem
    # larger stems (STEM_GEMM_MAX_TAPS): the in-place GEMM on both
    assert _choice((1, 3, 224, 224), (64, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}) == "gemm_inplace"
    assert _choice((1, 3, 224, 224), (96, 3, 11, 11), {"strides": [4, 4]}) == "gemm_inplace"


def _conv_bn_residual_relu(c: int, m: int, h: int, seed: int, group: int = 1) -> tuple[onnx.ModelProto,
                                                                                      dict[str, np.ndarray]]:
    """Conv 3x3 (c -> m, h x h) → BatchNormalization → Add(residual input r) → Relu, and feeds."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, c // group, 3, 3)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal(m).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, m).astype(np.float32)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel()) for n, a in
             (("w", w), ("s", scale), ("bb", bias), ("mu", mean), ("var", var))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], group=group),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["bn"]),
             helper.make_node("Add", ["bn", "r"], ["sum"]),
             helper.make_node("Relu", ["sum"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h]),
                                           helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, m, h, h])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, h, h])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": rng.standard_normal((1, c, h, h)).astype(np.float32), "r": rng.standard_normal((1, m, h, h)).astype(np.float32)}
    return model, feeds


@pytest.mark.parametrize("group,in_place", [(1, False), (2, False), (1, True)])
def test_conv_gemm_fused_epilogue(group, in_place, tmp_path, monkeypatch) -> None:
    """Conv → BatchNorm → Add(residual) → Relu: the chain runs as the packed GEMM's tile
    epilogue (no separate nest), numerically as onnxruntime; grouped, each group's product
    reads its own channels of the per-channel and full-size operands; in place, on tiles
    stored straight into C (inside one output row of 40) and on remapped ones."""
    monkeypatch.setenv("POLYML_CONV_INPLACE", "1" if in_place else "0")
    model, feeds = _conv_bn_residual_relu(16, 32, 40 if in_place else 18, seed=3, group=group)
    errs = compile_and_compare(model, feeds, conv="gemm")
    assert errs["y"] <= TOL, errs
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    compiled = polyml_compile(path, tmp_path / "build", emit=["ll"], conv="gemm")
    # the planes' zero fill and copy, the GEMM (2: packed, POLYML_CONV_INPLACE=0), nothing for the chain
    assert compiled.manifest["loop_nests"] <= 4
    ir_text = "".join(p.read_text() for p in (tmp_path / "build").glob("ops.off*.ll") if ".opt." not in p.name)
    assert "polyml.ukernel." in ir_text


@pytest.mark.parametrize("c", [3, 40], ids=["one-kc-block", "kc-blocks"])  # K = 27 or 360 (> kc)
@pytest.mark.parametrize("act", ["silu", "clip"])
def test_conv_in_place_gemm_per_channel_epilogue(c, act, monkeypatch) -> None:
    """A per-channel chain (bias, SiLU or Clip) on the in-place GEMM: with one kc block it
    runs on the stack tile's whole rows before the remap (GemmSpec.epilogue_per_row), with
    several after the last block's remap; both as onnxruntime, strided with a pitch."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(11)
    m, h = 24, 37
    w = rng.standard_normal((m, c, 3, 3)).astype(np.float32) * 0.3
    bias = rng.standard_normal(m).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()), helper.make_tensor("b", TensorProto.FLOAT, [m], bias)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2])]
    if act == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    else:
        inits += [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                              [helper.make_empty_tensor_value_info("y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setenv("POLYML_CONV_INPLACE", "1")  # in place on every ISA
    assert _choice((1, c, h, h), (m, c, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "gemm", conv_inplace="1") == "gemm_inplace"
    for threads in (1, 2):
        errs = compile_and_compare(model, {"x": rng.standard_normal((1, c, h, h)).astype(np.float32)},
                                   threads=threads, conv="gemm", cache=False)
        assert errs["y"] <= TOL, errs


def test_pointwise_gemm_prefetches_packed_rows(tmp_path) -> None:
    """A 1x1 convolution packs its input row by row with the rows 8 ahead prefetched: the
    optimized IR of its GEMM block function keeps an ``llvm.prefetch``; the result is as before."""
    w, b = params((24, 96, 1, 1))
    model = node_model("Conv", {"x": (1, 96, 20, 20)}, initializers={"w": w, "b": b})
    path = tmp_path / "pw.onnx"
    onnx.save(model, str(path))
    polyml_compile(path, tmp_path / "build", emit=["ll"], conv="gemm", gemm="packed", cache=False, threads=1)
    opt = "".join(p.read_text() for p in (tmp_path / "build").glob("ops.off*.opt.ll"))
    bodies = re.findall(r"^define [^@]*@\"?[\w.]*\.gemm\d+\"?\(.*?^}", opt, re.M | re.S)
    assert len(bodies) == 1 and "@llvm.prefetch" in bodies[0]
    errs = compile_and_compare(model, x_feed((1, 96, 20, 20)), conv="gemm", cache=False)
    assert errs["y"] <= TOL, errs


def test_in_place_gemm_tile_epilogue_stays_vectorized_along_rows(tmp_path) -> None:
    """The per-channel epilogue on the stack tile (bias + ReLU: a body cheap enough to unroll)
    keeps its column loop rolled (``llvm.loop.unroll.disable``, a distinct self-referential
    loop ID made by ``module_text``): unrolled, LLVM vectorized the loop over the tile's rows
    with gathers and scatters, and SqueezeNet's stem ran 3x slower. The optimized IR of the
    GEMM block function has no gather or scatter."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 3, 3, 3)).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
             helper.make_tensor("b", TensorProto.FLOAT, [64], rng.standard_normal(64).astype(np.float32))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 224, 224])],
                              [helper.make_empty_tensor_value_info("y")], inits)
    path = tmp_path / "stem.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    compiled = polyml_compile(path, tmp_path / "build", emit=["ll"], conv="gemm", cache=False, threads=1)
    assert [f["detail"].split()[-1] for f in compiled.manifest["functions"]] == ["gemm_inplace"]
    ll = "".join(p.read_text() for p in (tmp_path / "build").glob("ops.off*.ll") if ".opt." not in p.name)
    assert re.search(r'^(!\d+) = distinct !\{\1, !\d+ ?\}', ll, re.M) and '!"llvm.loop.unroll.disable"' in ll
    opt = "".join(p.read_text() for p in (tmp_path / "build").glob("ops.off*.opt.ll"))
    bodies = re.findall(r"^define [^@]*@\"?[\w.]*\.gemm\d+\"?\(.*?^}", opt, re.M | re.S)
    assert len(bodies) == 1, "one GEMM block function"
    assert "masked.gather" not in bodies[0] and "masked.scatter" not in bodies[0]
    errs = compile_and_compare(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                               {"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}, conv="gemm", cache=False)
    assert errs["y"] <= TOL, errs
