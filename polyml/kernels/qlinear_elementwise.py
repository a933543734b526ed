"""onnxruntime's quantized elementwise ops (domain ``com.microsoft``): QLinearAdd, QLinearMul,
QLinearGlobalAveragePool, QLinearConcat.

They are what onnxruntime's quantization tool emits in its QOperator format and what
:mod:`polyml.passes.quantize` makes of ``DequantizeLinear → Add/Mul/GlobalAveragePool/Concat →
QuantizeLinear``.  Scales and zero points are per tensor (scalars); they are loaded once per
element (LLVM hoists the loads), so they may be computed.  The arithmetic is onnxruntime's MLAS
(these ops have no ONNX spec; ``rint`` is round half to even, saturation in float first):

* QLinearAdd: ``c = sat(rint((A_s/C_s)(a - A_zp) + (B_s/C_s)(b - B_zp) + C_zp))`` (numpy
  broadcasting); the spec-like ``Q(DQ(a) + DQ(b))`` divides by ``C_s`` after the sum, which
  differs at rounding ties;
* QLinearMul: ``c = sat(rint((a - A_zp)(b - B_zp) · (A_s B_s / C_s)) + C_zp)``;
  both clamp to ``polyml_clip = [lo, hi]`` when the QDQ pass folded a Relu/Clip into them;
* QLinearGlobalAveragePool (NCHW, or NHWC with ``channels_last=1``): the int32 sum of the
  window minus ``N·x_zp``, times ``x_s / (y_s · N)``, rounded, plus ``y_zp``;
* QLinearConcat: each input requantized as onnxruntime's lookup table does,
  ``sat(rint((x - x_zp) x_s / y_s) + y_zp)``, into its slice of the output along ``axis``.
"""

from __future__ import annotations

import llvmlite.ir as ir

from polyml.codegen import quant
from polyml.codegen.builder import Buffer, KernelBuilder
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, broadcast_shapes, normalize_axis, register, unsupported_dtype
from polyml.kernels._scalar import outer_parallel_dims

DOMAIN = "com.microsoft"
QTYPES = quant.QTYPES


def _scalar(k: KernelBuilder, buf: Buffer | None, default: float = 0.0) -> ir.Value:
    """A per-tensor scale or zero point as float32 (``default`` when the input is omitted)."""
    if buf is None:
        return k.f32(default)
    return quant.to_float(k.b, buf.load([0] * buf.rank), buf.type.dtype)


def _check_params(node: Node, ins: list[Operand | None], scales: tuple[int, ...], zps: tuple[int, ...],
                  data: tuple[int, ...]) -> str | None:
    """Scalars for scales (float32) and zero points (the data's dtype); data int8/uint8."""
    for i in data:
        if ins[i] is None:
            return f"input {i} is required"
        if ins[i].type.dtype not in QTYPES:
            return unsupported_dtype(i, ins[i], QTYPES)
    for i in scales + zps:
        op = ins[i] if i < len(ins) else None
        if op is None:
            if i in scales:
                return f"scale input {i} is required"
            continue
        if op.type.size != 1:
            return f"input {i} ({op.name!r}) has shape {op.type.shape}: only per-tensor (scalar) parameters"
        if i in scales and op.type.dtype != "float32":
            return unsupported_dtype(i, op, frozenset({"float32"}))
        if i in zps and op.type.dtype not in QTYPES:
            return unsupported_dtype(i, op, QTYPES)
    return None


def _get(k: KernelBuilder, i: int) -> Buffer | None:
    return k.inputs[i] if i < len(k.inputs) else None


class _Binary(Kernel):
    """QLinearAdd / QLinearMul: ``(A, A_s, A_zp, B, B_s, B_zp, C_s, C_zp)``."""

    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        ins = list(ins) + [None] * (8 - len(ins))
        why = _check_params(node, ins, (1, 4, 6), (2, 5, 7), (0, 3))
        if why is None and ins[0].type.dtype != ins[3].type.dtype:
            return f"A is {ins[0].type.dtype}, B is {ins[3].type.dtype}"
        return why

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = broadcast_shapes(node, ins[0].type.shape, ins[3].type.shape)
        return [TensorType(shape, ins[0].type.dtype)]

    def combine(self, k: KernelBuilder, a: ir.Value, b: ir.Value, s: list[ir.Value]) -> ir.Value:
        raise NotImplementedError

    def lower(self, k: KernelBuilder) -> None:
        a, b_, y = k.inputs[0], k.inputs[3], k.outputs[0]
        clip = k.attr("polyml_clip") or (None, None)  # a fused Relu/Clip (polyml.passes.quantize)
        with k.loops(y.shape, parallel=outer_parallel_dims(y.shape)) as ix:
            params = [_scalar(k, _get(k, i), 1.0 if i in (1, 4, 6) else 0.0) for i in (1, 2, 4, 5, 6, 7)]
            av = k.b.fsub(quant.to_float(k.b, a.load(a.broadcast_index(ix)), a.type.dtype), params[1])
            bv = k.b.fsub(quant.to_float(k.b, b_.load(b_.broadcast_index(ix)), b_.type.dtype), params[3])
            v = self.combine(k, av, bv, params)
            y.store(ix, quant.saturate(k.b, quant.rint(k.b, v), y.type.dtype, *clip))


@register
class QLinearAdd(_Binary):
    op_types = (f"{DOMAIN}.QLinearAdd",)

    def combine(self, k: KernelBuilder, a: ir.Value, b: ir.Value, s: list[ir.Value]) -> ir.Value:
        sa, sb, sc, zc = s[0], s[2], s[4], s[5]
        ra, rb = k.b.fdiv(sa, sc), k.b.fdiv(sb, sc)
        return k.b.fadd(k.b.fadd(k.b.fmul(ra, a), k.b.fmul(rb, b)), zc)


@register
class QLinearMul(_Binary):
    op_types = (f"{DOMAIN}.QLinearMul",)

    def combine(self, k: KernelBuilder, a: ir.Value, b: ir.Value, s: list[ir.Value]) -> ir.Value:
        sa, sb, sc, zc = s[0], s[2], s[4], s[5]
        m = k.b.fdiv(k.b.fmul(sa, sb), sc)
        # (a - A_zp)(b - B_zp) is an exact integer in float32 (|.| <= 255^2)
        return k.b.fadd(quant.rint(k.b, k.b.fmul(k.b.fmul(a, b), m)), zc)


@register
class QLinearGlobalAveragePool(Kernel):
    """``(X, x_s, x_zp, y_s, y_zp)``, NCHW (or NHWC with ``channels_last``), any spatial rank."""

    op_types = (f"{DOMAIN}.QLinearGlobalAveragePool",)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        ins = list(ins) + [None] * (5 - len(ins))
        why = _check_params(node, ins, (1, 3), (2, 4), (0,))
        if why is None and len(ins[0].type.shape) < 3:
            return f"input {ins[0].type.shape} must be N-C-spatial"
        return why

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x = ins[0].type
        if node.attrs.get("channels_last", 0):
            return [TensorType((x.shape[0], *([1] * (len(x.shape) - 2)), x.shape[-1]), x.dtype)]
        return [TensorType((*x.shape[:2], *([1] * (len(x.shape) - 2))), x.dtype)]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        x = ins[0].type
        last = bool(node.attrs.get("channels_last", 0))
        return [TensorType((x.shape[0], x.shape[-1] if last else x.shape[1]), "int32")]

    def lower(self, k: KernelBuilder) -> None:
        x, y, acc = k.inputs[0], k.outputs[0], k.temps[0]
        last = bool(k.attr("channels_last", 0))
        n, c = acc.shape
        spatial = list(x.shape[1:-1] if last else x.shape[2:])
        size = 1
        for d in spatial:
            size *= d
        i32 = ir.IntType(32)
        par = 2 if n * c * size >= (1 << 15) else 0
        # acc[n, c] = sum_p x[n, c, p] (int32), then y[n, c] = requant(acc - size * x_zp)
        with k.loops([n, c], names=["zn", "zc"]) as ix:
            acc.store(ix, ir.Constant(i32, 0))
        with k.loops([n, c, *spatial], names=["n", "c", *[f"p{d}" for d in range(len(spatial))]], parallel=par) as ix:
            ni, ci, ps = ix[0], ix[1], ix[2:]
            v = x.load([ni, *ps, ci] if last else [ni, ci, *ps])
            acc.store([ni, ci], k.b.add(acc.load([ni, ci]), quant.to_i32(k.b, v, x.type.dtype)))
        with k.loops([n, c], names=["fn", "fc"]) as (ni, ci):
            xs, xzp = _scalar(k, k.inputs[1], 1.0), _scalar(k, _get(k, 2))
            ys, yzp = _scalar(k, k.inputs[3], 1.0), _scalar(k, _get(k, 4))
            total = k.b.fsub(k.b.sitofp(acc.load([ni, ci]), ir.FloatType()), k.b.fmul(xzp, k.f32(float(size))))
            scale = k.b.fdiv(xs, k.b.fmul(ys, k.f32(float(size))))
            v = k.b.fadd(quant.rint(k.b, k.b.fmul(total, scale)), yzp)
            ones = [0] * len(spatial)
            y.store([ni, *ones, ci] if last else [ni, ci, *ones], quant.saturate(k.b, v, y.type.dtype))


@register
class QLinearConcat(Kernel):
    """``(Y_s, Y_zp, X0, X0_s, X0_zp, X1, ...)`` concatenated along ``axis``."""

    op_types = (f"{DOMAIN}.QLinearConcat",)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if len(ins) < 5 or (len(ins) - 2) % 3:
            return f"{len(ins)} inputs: expected Y_scale, Y_zero_point and triples (X, X_scale, X_zero_point)"
        triples = range(2, len(ins), 3)
        return _check_params(node, ins, (0, *[i + 1 for i in triples]), (1, *[i + 2 for i in triples]), tuple(triples))

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        xs = [ins[i].type for i in range(2, len(ins), 3)]
        rank = len(xs[0].shape)
        axis = normalize_axis(node, int(node.attrs.get("axis", 0)), rank)
        for t in xs[1:]:
            if len(t.shape) != rank or any(a != b for d, (a, b) in enumerate(zip(t.shape, xs[0].shape)) if d != axis):
                raise ShapeError(f"QLinearConcat node {node.label!r}: inputs {[x.shape for x in xs]} differ outside axis {axis}")
        shape = list(xs[0].shape)
        shape[axis] = sum(t.shape[axis] for t in xs)
        dtype = ins[1].type.dtype if ins[1] is not None else xs[0].dtype
        return [TensorType(tuple(shape), dtype)]

    def lower(self, k: KernelBuilder) -> None:
        y = k.outputs[0]
        axis = normalize_axis(k.node, int(k.attr("axis", 0)), y.rank)
        offset = 0
        for i in range(2, len(k.inputs), 3):
            x = k.inputs[i]
            with k.loops(x.shape, names=[f"x{i}_{d}" for d in range(x.rank)], parallel=outer_parallel_dims(x.shape)) as ix:
                ys, yzp = _scalar(k, k.inputs[0], 1.0), _scalar(k, k.inputs[1])
                xs, xzp = _scalar(k, k.inputs[i + 1], 1.0), _scalar(k, _get(k, i + 2))
                v = k.b.fdiv(quant.dequantize_value(k.b, x.load(ix), x.type.dtype, xzp, xs), ys)
                dst = [k.b.add(k.i64(j), k.i64(offset)) if d == axis and offset else j for d, j in enumerate(ix)]
                y.store(dst, quant.quantize_value(k.b, v, yzp, y.type.dtype))
            offset += x.shape[axis]
