"""Integer products (MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv) against onnxruntime
and onnx.reference on seeded random data, exactly (integer results, and requantized ones
bit for bit: polyml computes the multiplier and rounding as onnxruntime does).

Every path: the integer GEMM (:mod:`polyml.codegen.igemm`) with each micro-kernel forced
(``POLYML_IGEMM``: ``vnni`` where the host has it, ``madd`` on 16 lanes with VNNI switched off,
``madd8`` the AVX2 tile), the plain nests (few rows, batched B) and the direct convolution
(depthwise, nonzero weight zero points, 1-D); operand signedness combinations (the VNNI
top-bit flips), zero points per tensor and per channel, odd shapes (K not a multiple of 4,
fewer rows than a tile, ragged N), groups, strides, pads, dilations, saturation at both ends
of the output range, polyml's bias input and fused clamp (``polyml_clip``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from polyml.compiler import compile as polyml_compile
from polyml.errors import PolymlError
from polyml.testing import onnxruntime_run


def _host_has(feature: str) -> bool:
    """Whether this host's CPU has the LLVM target feature (``avx512vnni``, ``avx512bw``)."""
    from polyml.driver.toolchain import host_target

    return f"+{feature}" in host_target().features.split(",")


def _host_has_vnni() -> bool:
    return _host_has("avx512vnni")


def integer_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The op's exact result: onnxruntime's on hosts with VNNI, else onnx.reference's (integer
    arithmetic throughout).  Without VNNI onnxruntime multiplies u8 activations by s8 weights
    with ``vpmaddubsw``, whose int16 pair sums saturate: on an AVX2 host its
    QGemm was up to 8 steps off the exact product on a 72-long reduction, polyml's exact."""
    if _host_has_vnni():
        return onnxruntime_run(model, feeds)["y"]
    return ReferenceEvaluator(model).run(None, feeds)[0]


#: how far :func:`integer_reference` may be at a requantization tie: onnx.reference scales the
#: exact int32 sums in float64, onnxruntime and polyml in float32 (1 step on 1 of 377 seen)
REFERENCE_TIES = 0 if _host_has_vnni() else 1


VARIANTS = [pytest.param("vnni", marks=pytest.mark.skipif(not _host_has_vnni(), reason="no AVX-512 VNNI")), "madd",
            "madd8"]
#: each micro-kernel with a reduction block of 32: several blocks accumulate in an int32 C array
MULTI_BLOCK = [pytest.param("vnni,kc=32", marks=pytest.mark.skipif(not _host_has_vnni(), reason="no AVX-512 VNNI")),
               "madd8,kc=32"]


def _t(dtype: type) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _ints(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _model(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray], order: list[str], out_dtype: int,
           domain: str = "", **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, order, ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info(k, _t(v.dtype), list(v.shape)) for k, v in inputs.items()],
                              [helper.make_tensor_value_info("y", out_dtype, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])
    opsets = [helper.make_opsetid("", 13)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets)


def _polyml(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options) -> np.ndarray:
    with tempfile.TemporaryDirectory(prefix="polyml-int-") as tmp:
        onnx.save(model, f"{tmp}/m.onnx")
        return polyml_compile(Path(tmp) / "m.onnx", Path(tmp) / "b", cache=False, threads=2, **options).run(feeds)["y"]


def _built_with_ir(model: onnx.ModelProto, tmp_path: Path) -> tuple:
    """The compiled model and the text of its op modules' LLVM IR (before opt)."""
    onnx.save(model, str(tmp_path / "m.onnx"))
    built = polyml_compile(tmp_path / "m.onnx", tmp_path / "b", cache=False, emit=["ll"])
    return built, "".join(p.read_text() for p in (tmp_path / "b").glob("ops.*.ll") if ".opt." not in p.name)


def _exact(got: np.ndarray, ref: np.ndarray, ties: int = 0) -> None:
    """``got == ref``; with ``ties``, at most that far apart on under 1 % of the elements."""
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.dtype, ref.shape)
    diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
    assert diff.max(initial=0) <= ties, f"{int((diff > 0).sum())} of {diff.size} differ, max {diff.max()}"
    assert np.mean(diff > 0) < (0.01 if ties else 1e-12), f"{int((diff > 0).sum())} of {diff.size} differ"


# -- MatMulInteger ------------------------------------------------------------------------------

#: (A shape, B shape, A dtype, B dtype, B constant, a zero point, b zero point(s) or None)
MMI_CASES = [
    ((64, 96), (96, 128), np.uint8, np.int8, True, 3, 0),          # the common case: igemm
    ((37, 50), (50, 29), np.uint8, np.int8, True, 255, 0),         # K % 4 != 0, ragged M and N
    ((33, 70), (70, 41), np.int8, np.int8, True, -128, 127),       # s8 activations: the flip
    ((40, 64), (64, 48), np.uint8, np.uint8, False, 200, "col"),   # u8 weights computed, per-column zp
    ((24, 40), (40, 36), np.int8, np.uint8, True, 5, "col"),
    ((3, 40), (40, 20), np.uint8, np.int8, True, 7, 1),            # fewer rows than a tile: nests
    ((2, 9, 16), (2, 16, 12), np.uint8, np.int8, False, 1, 2),     # batched B: nests
    ((2, 5, 64), (64, 40), np.uint8, np.int8, True, 9, 0),         # A's batch stacks into rows
]


def _mmi_model(a: np.ndarray, b: np.ndarray, b_const: bool, za, zb) -> tuple[onnx.ModelProto, dict]:  # noqa: ANN001
    consts = {"za": np.array(za, a.dtype), "zb": np.asarray(zb, b.dtype)}
    inputs = {"a": a}
    (consts if b_const else inputs)["b"] = b
    return _mmi_graph(inputs, consts), inputs


def _mmi_graph(inputs: dict, consts: dict) -> onnx.ModelProto:
    order = ["a", "b", "za", "zb"]
    return _model("MatMulInteger", inputs, consts, order, TensorProto.INT32)


@pytest.mark.parametrize("case", MMI_CASES, ids=[f"{c[0]}x{c[1]}-{c[2].__name__}x{c[3].__name__}" for c in MMI_CASES])
def test_matmul_integer(case: tuple) -> None:
    sa, sb, adt, bdt, b_const, za, zb = case
    rng = np.random.default_rng(0)
    a, b = _ints(rng, sa, adt), _ints(rng, sb, bdt)
    if zb == "col":
        zb = _ints(rng, (sb[-1],), bdt)
    model, feeds = _mmi_model(a, b, b_const, za, zb)
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    _exact(_polyml(model, feeds), ref)


@pytest.mark.parametrize("variant", VARIANTS + MULTI_BLOCK)
def test_matmul_integer_micro_kernels(variant: str, monkeypatch) -> None:
    """Each micro-kernel forced, with the zero point of A computed at run time (as
    DynamicQuantizeLinear gives it), on the activation signedness that needs a flip."""
    monkeypatch.setenv("POLYML_IGEMM", variant)
    rng = np.random.default_rng(1)
    for adt, bdt in ((np.uint8, np.int8), (np.int8, np.uint8)):
        a, b = _ints(rng, (45, 83), adt), _ints(rng, (83, 70), bdt)
        feeds = {"a": a, "za": np.array(17, adt)}
        model = _model("MatMulInteger", feeds, {"b": b, "zb": np.array(3, bdt)}, ["a", "b", "za", "zb"], TensorProto.INT32)
        _exact(_polyml(model, feeds), ReferenceEvaluator(model).run(None, feeds)[0])


# -- QLinearMatMul ------------------------------------------------------------------------------

def _qlmm(a: np.ndarray, b: np.ndarray, b_scale: np.ndarray, b_zp: np.ndarray, y_scale: float, y_zp: int,
          out_dtype: type) -> tuple[onnx.ModelProto, dict]:
    consts = {"a_s": np.array(0.03, np.float32), "a_zp": np.array(9 if a.dtype == np.uint8 else -4, a.dtype), "b": b,
              "b_s": b_scale, "b_zp": b_zp, "y_s": np.array(y_scale, np.float32), "y_zp": np.array(y_zp, out_dtype)}
    order = ["a", "a_s", "a_zp", "b", "b_s", "b_zp", "y_s", "y_zp"]
    return _model("QLinearMatMul", {"a": a}, consts, order, _t(out_dtype)), {"a": a}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", [(64, 96, 80), (13, 37, 29)], ids=["igemm", "ragged"])
def test_qlinear_matmul(variant: str, shape: tuple[int, int, int], monkeypatch) -> None:
    """Against onnxruntime, bit for bit, with a y_scale that saturates at both ends."""
    monkeypatch.setenv("POLYML_IGEMM", variant)
    m, k, n = shape
    rng = np.random.default_rng(2)
    a, b = _ints(rng, (m, k), np.uint8), _ints(rng, (k, n), np.int8)
    model, feeds = _qlmm(a, b, np.array(0.002, np.float32), np.array(0, np.int8), 0.03, 128, np.uint8)
    ref = integer_reference(model, feeds)
    assert (ref == 0).any() and (ref == 255).any(), "the case should saturate at both ends"
    _exact(_polyml(model, feeds), ref, REFERENCE_TIES)


#: one-row products on the VNNI matrix-vector kernel: whole 64-column blocks, a partial last
#: vector (N = 1000, a classifier), fewer columns than a block, int8 activations (the flip),
#: per-column scales, a clipped bias (polyml's quantized Gemm), and a 3-D row
GEMV_CASES = [((1, 128), (128, 192), np.uint8, False), ((1, 512), (512, 1000), np.uint8, True),
              ((1, 1, 36), (36, 21), np.int8, True), ((1, 64), (64, 45), np.int8, False)]


@pytest.mark.parametrize("case", GEMV_CASES, ids=[f"{c[0]}x{c[1]}-{c[2].__name__}" for c in GEMV_CASES])
def test_qlinear_matmul_one_row(case: tuple, tmp_path: Path) -> None:
    sa, sb, adt, per_column = case
    rng = np.random.default_rng(12)
    a, b = _ints(rng, sa, adt), _ints(rng, sb, np.int8)
    n = sb[-1]
    scale = (rng.uniform(0.5, 1.5, n) * 2e-3).astype(np.float32) if per_column else np.array(0.002, np.float32)
    zp = np.zeros(n if per_column else (), np.int8)
    model, feeds = _qlmm(a, b, scale, zp, 0.02 * np.sqrt(sb[0] / 64), 120 if adt == np.uint8 else 3, adt)
    built, text = _built_with_ir(model, tmp_path)
    assert ("llvm.x86.avx512.vpdpbusd.512" in text) == _host_has_vnni()
    ref = integer_reference(model, feeds)
    lo, hi = np.iinfo(adt).min, np.iinfo(adt).max
    assert (ref == lo).any() and (ref == hi).any(), "the case should saturate at both ends"
    _exact(built.run(feeds)["y"], ref, REFERENCE_TIES)


def test_matmul_integer_one_row() -> None:
    """MatMulInteger (int32 out) with one row on the matrix-vector kernel: a constant A zero
    point folded per column, int8 activations, a partial last vector."""
    rng = np.random.default_rng(13)
    a, b = _ints(rng, (1, 72), np.int8), _ints(rng, (72, 50), np.int8)
    model, feeds = _mmi_model(a, b, True, np.array(-5, np.int8), np.array(0, np.int8))
    _exact(_polyml(model, feeds), ReferenceEvaluator(model).run(None, feeds)[0])


def test_qlinear_matmul_int8_output_nonzero_b_zero_point() -> None:
    rng = np.random.default_rng(3)
    a, b = _ints(rng, (40, 52), np.int8), _ints(rng, (52, 33), np.int8)
    model, feeds = _qlmm(a, b, np.array(0.004, np.float32), np.array(-7, np.int8), 0.03, -3, np.int8)
    ref = integer_reference(model, feeds)
    assert (ref == -128).any() and (ref == 127).any()
    _exact(_polyml(model, feeds), ref, REFERENCE_TIES)


def test_qlinear_matmul_bias_and_clip_match_qgemm() -> None:
    """polyml's bias input (9th) and ``polyml_clip`` against onnxruntime's com.microsoft.QGemm
    with the same int32 bias, clamped in the output domain (Q(relu(v)) = max(Q(v), y_zp))."""
    rng = np.random.default_rng(4)
    m, k, n = 48, 72, 40
    a, b = _ints(rng, (m, k), np.uint8), _ints(rng, (k, n), np.int8)
    bias = rng.integers(-20000, 20000, n).astype(np.int32)
    consts = {"a_s": np.array(0.02, np.float32), "a_zp": np.array(100, np.uint8), "b": b,
              "b_s": np.array(0.003, np.float32), "b_zp": np.array(0, np.int8), "bias": bias,
              "y_s": np.array(0.3, np.float32), "y_zp": np.array(90, np.uint8)}
    qgemm = _model("QGemm", {"a": a}, consts, ["a", "a_s", "a_zp", "b", "b_s", "b_zp", "bias", "y_s", "y_zp"],
                   TensorProto.UINT8, domain="com.microsoft")
    if _host_has_vnni():
        ref = np.maximum(onnxruntime_run(qgemm, {"a": a})["y"], 90)
    else:  # QGemm saturates there (integer_reference): its exact result, requantized as it does
        acc = (a.astype(np.int64) - 100) @ b.astype(np.int64) + bias
        scale = float(np.float32(0.02) * np.float32(0.003) / np.float32(0.3))
        ref = np.clip(np.rint(acc * scale) + 90, 90, 255).astype(np.uint8)
    ours = _model("QLinearMatMul", {"a": a}, consts, ["a", "a_s", "a_zp", "b", "b_s", "b_zp", "y_s", "y_zp", "bias"],
                  TensorProto.UINT8, polyml_clip=[90, 255])
    _exact(_polyml(ours, {"a": a}), ref)


def test_qlinear_matmul_needs_constant_scales() -> None:
    rng = np.random.default_rng(5)
    a, b = _ints(rng, (16, 16), np.uint8), _ints(rng, (16, 16), np.int8)
    consts = {"a_zp": np.array(0, np.uint8), "b": b, "b_s": np.array(0.1, np.float32), "b_zp": np.array(0, np.int8),
              "y_s": np.array(0.1, np.float32), "y_zp": np.array(0, np.uint8)}
    feeds = {"a": a, "a_s": np.array(0.1, np.float32)}
    model = _model("QLinearMatMul", feeds, consts, ["a", "a_s", "a_zp", "b", "b_s", "b_zp", "y_s", "y_zp"], TensorProto.UINT8)
    with pytest.raises(PolymlError, match="compile-time constant"):
        _polyml(model, feeds)


# -- QLinearConv and ConvInteger ------------------------------------------------------------

def _qconv(rng: np.random.Generator, xs: tuple, ws: tuple, xdt: type = np.uint8, per_channel: bool = True,
           w_zp: int = 0, bias: bool = True, **attrs) -> tuple[onnx.ModelProto, dict]:
    x, w = _ints(rng, xs, xdt), _ints(rng, ws, np.int8)
    m = ws[0]
    y_scale = 0.0042 * float(np.sqrt(np.prod(ws[1:])))  # saturates a few % of outputs at both ends
    w_scale = (rng.uniform(0.5, 1.5, m) * 2e-3).astype(np.float32) if per_channel else np.array(1.5e-3, np.float32)
    consts = {"x_s": np.array(0.02, np.float32), "x_zp": np.array(7 if xdt == np.uint8 else -3, xdt), "w": w,
              "w_s": w_scale, "w_zp": np.full(m if per_channel else (), w_zp, np.int8),
              "y_s": np.array(y_scale, np.float32), "y_zp": np.array(100 if xdt == np.uint8 else 5, xdt)}
    order = ["x", "x_s", "x_zp", "w", "w_s", "w_zp", "y_s", "y_zp"]
    if bias:
        consts["B"] = rng.integers(-5000, 5000, m).astype(np.int32)
        order.append("B")
    return _model("QLinearConv", {"x": x}, consts, order, _t(xdt), **attrs), {"x": x}


#: (x shape, w shape, attributes): GEMM path (strided, padded, grouped, dilated, the stem's
#: three channels, batch 2) and direct path (depthwise, thin groups, 1-D)
QCONV_CASES = [
    ((1, 16, 15, 17), (40, 16, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}),
    ((1, 64, 14, 14), (64, 64, 1, 1), {}),
    ((2, 32, 10, 10), (48, 16, 3, 3), {"group": 2, "pads": [1, 0, 1, 2]}),
    ((1, 3, 32, 32), (24, 3, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
    ((1, 24, 13, 11), (32, 24, 3, 3), {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 32, 9, 9), (64, 32, 1, 1), {"strides": [2, 2]}),
    ((1, 32, 12, 12), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1]}),
    ((1, 32, 12, 13), (32, 1, 3, 3), {"group": 32, "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 8, 10, 10), (16, 2, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    pytest.param(((2, 6, 20), (10, 6, 5), {"pads": [2, 1]}), marks=pytest.mark.skipif(
        not _host_has_vnni(), reason="1-D: onnx.reference's QLinearConv fails to broadcast (and onnxruntime saturates)")),
    ((1, 256, 5, 5), (512, 256, 1, 1), {}),  # one column tile: the threads split the rows
]


@pytest.mark.parametrize("case", QCONV_CASES, ids=[f"{c[0]}-{c[1]}-{i}" if isinstance(c, tuple) else
                                                   f"{c.values[0][0]}-{c.values[0][1]}-{i}" for i, c in enumerate(QCONV_CASES)])
def test_qlinear_conv(case: tuple) -> None:
    xs, ws, attrs = case
    model, feeds = _qconv(np.random.default_rng(6), xs, ws, **attrs)
    ref = integer_reference(model, feeds)
    assert (ref == 0).any() and (ref == 255).any(), "the case should saturate at both ends"
    _exact(_polyml(model, feeds), ref, REFERENCE_TIES)


@pytest.mark.parametrize("variant", VARIANTS + MULTI_BLOCK)
def test_qlinear_conv_micro_kernels(variant: str, monkeypatch) -> None:
    """Each micro-kernel forced: uint8 and int8 activations (the flip), per-tensor weights."""
    monkeypatch.setenv("POLYML_IGEMM", variant)
    for xdt in (np.uint8, np.int8):
        model, feeds = _qconv(np.random.default_rng(7), (1, 20, 11, 13), (36, 20, 3, 3), xdt=xdt, per_channel=xdt == np.int8,
                              pads=[1, 1, 1, 1], strides=[1, 2])
        _exact(_polyml(model, feeds), integer_reference(model, feeds), REFERENCE_TIES)


#: the in-place X of the VNNI GEMM (channel-interleaved flat copy): both column-copy forms
#: (16-column vector steps, one and two column phases, and the element loop) with uint8 and
#: int8 activations, one and several reduction blocks, two groups of 12 channels
IN_PLACE_CASES = [
    ((1, 12, 9, 37), (20, 12, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 8, 6, 40), (16, 8, 3, 3), {"pads": [1, 2, 0, 1], "strides": [1, 2]}),
    ((2, 16, 7, 18), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 11, 7), (16, 12, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((1, 32, 5, 33), (40, 32, 1, 1), {"pads": [0, 1, 0, 1]}),
    ((1, 4, 3, 140), (16, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # border runs over MAX_SPLAT bytes
]


@pytest.mark.parametrize("variant", ["", *MULTI_BLOCK[:1]])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8])
@pytest.mark.parametrize("case", IN_PLACE_CASES, ids=[f"{c[0]}-{c[1]}" for c in IN_PLACE_CASES])
def test_qlinear_conv_in_place(case: tuple, xdt: type, variant: str, monkeypatch, tmp_path: Path) -> None:
    if not _host_has_vnni():
        pytest.skip("in-place X is the VNNI GEMM's")
    if variant:
        monkeypatch.setenv("POLYML_IGEMM", variant)
    xs, ws, attrs = case
    model, feeds = _qconv(np.random.default_rng(11), xs, ws, xdt=xdt, **attrs)
    built, text = _built_with_ir(model, tmp_path)
    assert ".inplace" in text and "pack_x" not in text
    _exact(built.run(feeds)["y"], integer_reference(model, feeds), REFERENCE_TIES)


#: the positions-as-rows product (exact output positions as register-tile rows, channels as
#: the vector columns): 7-, 8- and 12-row tiles with a partial last tile, stride 2, batch 2,
#: two groups, 1x1/2, many channels, uint8/int8 activations, one and several reduction blocks
ROWS_CASES = [
    ((1, 16, 7, 7), (64, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 8, 9, 11), (32, 8, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 16, 6, 6), (64, 8, 3, 3), {"group": 2, "pads": [1, 0, 1, 2]}),
    ((1, 32, 10, 9), (96, 32, 1, 1), {"strides": [2, 2]}),
    ((1, 20, 5, 13), (32, 20, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 7, 7), (64, 24, 1, 1), {}),  # unpadded: interleaved for the rows alone
]


@pytest.mark.parametrize("variant", ["", *MULTI_BLOCK[:1]])
@pytest.mark.parametrize("xdt", [np.uint8, np.int8])
@pytest.mark.parametrize("case", ROWS_CASES, ids=[f"{c[0]}-{c[1]}" for c in ROWS_CASES])
def test_qlinear_conv_positions_as_rows(case: tuple, xdt: type, variant: str, monkeypatch, tmp_path: Path) -> None:
    if not _host_has_vnni():
        pytest.skip("the positions-as-rows product is the VNNI GEMM's")
    monkeypatch.setenv("POLYML_IGEMM_ROWS", "1")  # also for reductions shorter than the default's minimum
    if variant:
        monkeypatch.setenv("POLYML_IGEMM", variant)
    xs, ws, attrs = case
    model, feeds = _qconv(np.random.default_rng(14), xs, ws, xdt=xdt, **attrs)
    built, text = _built_with_ir(model, tmp_path)
    assert ".rows" in text
    _exact(built.run(feeds)["y"], integer_reference(model, feeds), REFERENCE_TIES)


def test_conv_integer_positions_as_rows(tmp_path: Path) -> None:
    """ConvInteger (int32 out) on the positions-as-rows product by default (a 7x6 map, K = 576),
    a run-time x zero point."""
    rng = np.random.default_rng(15)
    x, w = _ints(rng, (1, 64, 7, 6), np.uint8), _ints(rng, (32, 64, 3, 3), np.int8)
    feeds = {"x": x, "x_zp": np.array(131, np.uint8)}
    model = _model("ConvInteger", feeds, {"w": w, "w_zp": np.array(0, np.int8)}, ["x", "w", "x_zp", "w_zp"],
                   TensorProto.INT32, pads=[1, 1, 1, 1])
    built, text = _built_with_ir(model, tmp_path)
    assert ".rows" in text
    _exact(built.run(feeds)["y"], ReferenceEvaluator(model).run(None, feeds)[0])


@pytest.mark.parametrize("size,kernel,strides,pads", [((56, 56), (3, 3), (1, 1), (1, 1, 1, 1)),
                                                      ((9, 37), (3, 3), (2, 2), (1, 1, 1, 1)),
                                                      ((6, 40), (3, 3), (1, 2), (1, 2, 0, 1)),
                                                      ((7, 7), (5, 5), (3, 3), (4, 0, 0, 4)),
                                                      ((4, 4), (1, 1), (2, 2), (0, 0, 0, 0))])
def test_flat_border_and_copies_tile_the_planes(size: tuple, kernel: tuple, strides: tuple, pads: tuple) -> None:
    """Every element of a channel's phase planes is set exactly once: by the border fill
    (folded into strided runs as emitted) or by the copy of an input element."""
    from polyml.kernels.conv import Window
    from polyml.kernels.qlinear_conv import _Flat, _strided

    out = tuple((n + pads[d] + pads[d + 2] - kernel[d]) // strides[d] + 1 for d, n in enumerate(size))
    flat = _Flat.of(Window(size, kernel, strides, (1, 1), pads[:2], pads[2:], out))
    hits = np.zeros(flat.plane_set, np.int64)
    for off, length, count, stride in _strided(flat.border(*size)):
        for i in range(count):
            hits[off + i * stride: off + i * stride + length] += 1
    for a, bbs, (r0, r1), (c0, c1) in flat.copies(*size):
        for bb in bbs:
            plane = (a * flat.strides[1] + bb) * flat.rows * flat.pitch
            for r in range(r0, r1):
                hits[plane + r * flat.pitch + c0: plane + r * flat.pitch + c1] += 1
    assert (hits == 1).all()


def test_qlinear_conv_clip_and_weight_zero_point() -> None:
    """``polyml_clip`` (a fused Relu: y ≥ y_zp) on the GEMM path, and nonzero weight zero points
    (the direct path), against onnxruntime's QLinearConv."""
    rng = np.random.default_rng(8)
    model, feeds = _qconv(rng, (1, 16, 12, 12), (32, 16, 3, 3), pads=[1, 1, 1, 1])
    ref = np.maximum(integer_reference(model, feeds), 100)
    helper_attr = helper.make_attribute("polyml_clip", [100, 255])
    model.graph.node[0].attribute.append(helper_attr)
    _exact(_polyml(model, feeds), ref, REFERENCE_TIES)
    model, feeds = _qconv(rng, (1, 16, 12, 12), (32, 16, 3, 3), per_channel=False, w_zp=3, pads=[1, 1, 1, 1])
    _exact(_polyml(model, feeds), integer_reference(model, feeds), REFERENCE_TIES)


#: depthwise convolutions (one channel per group: the grouped-tap kernels), (x shape, kernel, attributes)
DEPTHWISE_CASES = [
    ((1, 24, 9, 7), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 16, 13, 11), (3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 2]}),  # batch 2, odd sizes, asymmetric pads
    ((1, 8, 12, 12), (5, 5), {"pads": [2, 2, 2, 2]}),  # 5 taps a row: a group of 4 and a single tap
    ((1, 8, 11, 11), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),  # taps 2 apart
    ((1, 32, 3, 3), (3, 3), {"pads": [1, 1, 1, 1]}),  # fewer outputs than one vector block
    ((1, 16, 20, 70), (3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}),  # rows longer than a block
]


def _built(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    """polyml's output and its first function's description (which lowering ran)."""
    import json

    with tempfile.TemporaryDirectory(prefix="polyml-int-") as tmp:
        onnx.save(model, f"{tmp}/m.onnx")
        out = polyml_compile(Path(tmp) / "m.onnx", Path(tmp) / "b", cache=False, threads=2).run(feeds)["y"]
        detail = json.loads((Path(tmp) / "b" / "manifest.json").read_text())["functions"][0]["detail"]
    return out, detail


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(DEPTHWISE_CASES)])
def test_qlinear_conv_depthwise(case: tuple, variant: str, monkeypatch) -> None:
    """uint8 activations run 4 taps per ``vpdpbusd`` with VNNI, int8 activations (and every
    forced non-VNNI variant) int16 pairs; both exact against onnxruntime, saturating."""
    monkeypatch.setenv("POLYML_IGEMM", variant)
    xs, kernel, attrs = case
    c = xs[1]
    for xdt in (np.uint8, np.int8):
        model, feeds = _qconv(np.random.default_rng(11), xs, (c, 1, *kernel), xdt=xdt, group=c, **attrs)
        got, detail = _built(model, feeds)
        expect = "vnni quads" if variant == "vnni" and xdt == np.uint8 else "int16 pairs"
        assert detail.endswith(f"direct {expect}"), detail
        ref = integer_reference(model, feeds)
        _exact(got, ref, REFERENCE_TIES)


def test_qlinear_conv_depthwise_weight_zero_points() -> None:
    """uint8 weights with per-channel zero points: w - w_zp within int8 takes the 4-byte groups,
    beyond it (zero point 0, weights up to 255) int16 pairs; a fused clamp; no bias."""
    rng = np.random.default_rng(12)
    x = _ints(rng, (1, 16, 10, 12), np.uint8)
    for w_zp, expect in ((np.full(16, 128, np.uint8), "vnni quads" if _host_has_vnni() else "int16 pairs"),
                         (np.zeros(16, np.uint8), "int16 pairs")):
        consts = {"x_s": np.array(0.02, np.float32), "x_zp": np.array(9, np.uint8), "w": _ints(rng, (16, 1, 3, 3), np.uint8),
                  "w_s": (rng.uniform(0.5, 1.5, 16) * 2e-3).astype(np.float32), "w_zp": w_zp,
                  "y_s": np.array(0.05, np.float32), "y_zp": np.array(120, np.uint8)}
        model = _model("QLinearConv", {"x": x}, consts, ["x", "x_s", "x_zp", "w", "w_s", "w_zp", "y_s", "y_zp"],
                       TensorProto.UINT8, group=16, pads=[1, 1, 1, 1])
        ref = integer_reference(model, {"x": x})
        got, detail = _built(model, {"x": x})
        assert detail.endswith(f"direct {expect}"), detail
        _exact(got, ref, REFERENCE_TIES)
        model.graph.node[0].attribute.append(helper.make_attribute("polyml_clip", [130, 240]))
        _exact(_built(model, {"x": x})[0], np.clip(ref, 130, 240), REFERENCE_TIES)


def test_conv_integer_depthwise() -> None:
    """ConvInteger (int32 out) through the grouped-tap kernel: the int32 row, corrected per element."""
    rng = np.random.default_rng(13)
    x, w = _ints(rng, (1, 12, 9, 10), np.uint8), _ints(rng, (12, 1, 3, 3), np.int8)
    feeds = {"x": x}
    model = _model("ConvInteger", feeds, {"w": w, "x_zp": np.array(131, np.uint8), "w_zp": np.array(0, np.int8)},
                   ["x", "w", "x_zp", "w_zp"], TensorProto.INT32, group=12, pads=[1, 1, 1, 1], strides=[2, 1])
    got, detail = _built(model, feeds)
    assert "direct" in detail and ("quads" in detail or "pairs" in detail), detail
    _exact(got, ReferenceEvaluator(model).run(None, feeds)[0])


@pytest.mark.parametrize("variant,xdt,intrinsic", [
    pytest.param("vnni", np.uint8, "llvm.x86.avx512.vpdpbusd.512",
                 marks=pytest.mark.skipif(not _host_has_vnni(), reason="no AVX-512 VNNI")),
    pytest.param("madd", np.uint8, "llvm.x86.avx512.pmaddw.d.512",
                 marks=pytest.mark.skipif(not _host_has("avx512bw"), reason="no AVX-512BW: madd is 8 lanes here")),
    ("madd8", np.int8, "llvm.x86.avx2.pmadd.wd")])
def test_depthwise_multiply_adds_in_the_ir(variant: str, xdt: type, intrinsic: str, tmp_path: Path, monkeypatch) -> None:
    """The grouped-tap kernel's multiply-add is the intrinsic of its span and width."""
    monkeypatch.setenv("POLYML_IGEMM", variant)
    model, _ = _qconv(np.random.default_rng(14), (1, 16, 12, 12), (16, 1, 3, 3), xdt=xdt, group=16, pads=[1, 1, 1, 1])
    _, text = _built_with_ir(model, tmp_path)
    lanes = 16 if "512" in intrinsic else 8
    assert f'call <{lanes} x i32> @"{intrinsic}"(' in text, [line for line in text.splitlines() if "llvm.x86" in line][:3]


def test_tap_groups() -> None:
    """Taps within ``span`` consecutive elements share one multiply-add; positions are offsets
    from the group's first tap."""
    from polyml.kernels.qlinear_conv import _IntegerConv

    offsets = [0, 1, 2, 10, 11, 12]  # a 2x3 kernel on a pitch of 10
    assert _IntegerConv.tap_groups(offsets, 4) == [(0, [(0, 0), (1, 1), (2, 2)]), (10, [(0, 3), (1, 4), (2, 5)])]
    assert _IntegerConv.tap_groups(offsets, 2) == [(0, [(0, 0), (1, 1)]), (2, [(0, 2)]), (10, [(0, 3), (1, 4)]),
                                                   (12, [(0, 5)])]
    assert _IntegerConv.tap_groups([0, 2, 4], 4) == [(0, [(0, 0), (2, 1)]), (4, [(0, 2)])]


@pytest.mark.parametrize("wdt", [np.uint8, np.int8])
def test_conv_integer(wdt: type) -> None:
    """ConvInteger (int32 out) against onnx.reference: the GEMM path (uint8 weights under VNNI
    have zero points ≠ 0 after the flip, so they take the direct path) and a runtime x zero point."""
    rng = np.random.default_rng(9)
    x, w = _ints(rng, (1, 16, 10, 9), np.uint8), _ints(rng, (24, 16, 3, 3), wdt)
    feeds = {"x": x, "x_zp": np.array(131, np.uint8)}
    model = _model("ConvInteger", feeds, {"w": w, "w_zp": np.array(0, wdt)}, ["x", "w", "x_zp", "w_zp"], TensorProto.INT32,
                   pads=[1, 1, 1, 1])
    _exact(_polyml(model, feeds), ReferenceEvaluator(model).run(None, feeds)[0])


def test_conv_integer_single_plane() -> None:
    """One image, one channel, one filter (no loop of more than one iteration outside the
    reduction: the stack slots land in the entry block), a runtime weight zero point."""
    x = np.arange(9, dtype=np.uint8).reshape(1, 1, 3, 3)
    feeds = {"x": x, "x_zp": np.array(1, np.uint8), "w_zp": np.array(2, np.uint8)}
    model = _model("ConvInteger", feeds, {"w": np.full((1, 1, 2, 2), 5, np.uint8)}, ["x", "w", "x_zp", "w_zp"],
                   TensorProto.INT32)
    _exact(_polyml(model, feeds), ReferenceEvaluator(model).run(None, feeds)[0])


def test_integer_kernels_in_the_ir(tmp_path: Path) -> None:
    """The VNNI build calls vpdpbusd; the forced madd build multiplies int16 pairs instead."""
    rng = np.random.default_rng(10)
    model, _ = _qconv(rng, (1, 32, 14, 14), (64, 32, 3, 3), pads=[1, 1, 1, 1])
    _, text = _built_with_ir(model, tmp_path)
    assert "polyml.iukernel." in text
    assert ("llvm.x86.avx512.vpdpbusd.512" in text) == _host_has_vnni()


@pytest.mark.parametrize("features,expect", [("+avx512f,+avx512bw,+avx512vnni", ("vnni", 12, 32)),
                                             ("+avx512f,+avx512bw", ("madd", 12, 32)), ("+avx2", ("madd", 6, 16)),
                                             ("+sse2", ("madd", 4, 8))])
def test_integer_blocking_by_isa(features: str, expect: tuple) -> None:
    from polyml.codegen.igemm import host_iblocking

    blk = host_iblocking(features, 32 << 10, 1 << 20)
    assert (blk.variant, blk.mr, blk.nr) == expect
    assert blk.kc % 4 == 0 and blk.nr % blk.width == 0 and blk.mc % blk.mr == 0


def test_scratch_covers_the_block_layout() -> None:
    """A thread's scratch holds the block function's layout for any share: the W block is laid
    out for min(mc, M) rows whatever the share (row splits once overran the next slot)."""
    from polyml.codegen import igemm

    blk = igemm.host_iblocking("+avx512f,+avx512bw,+avx512vnni", 32 << 10, 1 << 20)
    spec = igemm.IGemmSpec(512, 25, 256, None, igemm.matrix_loader(1, 25), 2, True, False, lambda *a: None,
                           prepacked_w=True)
    kc = igemm.block_kc(spec, blk)
    layout = 64 * -(-4 * blk.mr * blk.nr // 64) + 64 * -(-min(blk.mc, 512) * kc // 64) + kc * blk.nr
    for share in (8, 96, 256, 512):
        assert igemm.scratch_bytes(spec, blk, share, 25) >= layout


def test_integer_blocking_override_errors() -> None:
    from polyml.codegen.igemm import blocking_for_host

    for bad in ("avx9", "madd,kc=6", "madd,nr=20", "madd,kc"):
        with pytest.raises(PolymlError, match="POLYML_IGEMM"):
            blocking_for_host(override=bad)
