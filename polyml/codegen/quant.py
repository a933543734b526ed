"""Scalar quantization arithmetic shared by the quantized kernels (ONNX numerics).

ONNX's ``QuantizeLinear`` is ``y = saturate(round(x / scale) + zero_point)`` with ``round``
half to even; ``DequantizeLinear`` is ``y = (x - zero_point) * scale`` computed in float32.
``round`` is ``llvm.rint`` (the default floating-point environment rounds to nearest even,
as C's ``nearbyintf`` that onnxruntime's MLAS kernels use); saturation clamps in float before
the conversion, so no value outside ``[qmin, qmax]`` ever reaches ``fptosi``/``fptoui``.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import F32, is_float, like, llvm_type

#: dtypes quantized tensors may have
QTYPES = frozenset({"int8", "uint8"})


def qrange(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _call(b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    """The float32 intrinsic ``name`` on scalars or vectors (``llvm.rint.f32``, ``.v16f32``)."""
    module = b.block.function.module
    ty = args[0].type
    full = f"{name}.v{ty.count}f32" if isinstance(ty, ir.VectorType) else f"{name}.f32"
    fn = module.globals.get(full) or ir.Function(module, ir.FunctionType(ty, [ty] * len(args)), full)
    return b.call(fn, list(args))


def rint(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """Round half to even (``llvm.rint``, vectorizable; scalars or float32 vectors)."""
    return _call(b, "llvm.rint", v)


def to_float(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """An element of an integer tensor of ``dtype`` (or float32) as float32."""
    if is_float(dtype):
        return v
    return b.uitofp(v, F32) if dtype in ("uint8", "bool") else b.sitofp(v, F32)


def to_i32(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """An element of an 8/32-bit integer tensor widened to i32 (zero-extended for uint8)."""
    i32 = ir.IntType(32)
    if v.type == i32:
        return v
    return b.zext(v, i32) if dtype == "uint8" else b.sext(v, i32)


def saturate(b: ir.IRBuilder, v: ir.Value, dtype: str, lo: int | None = None, hi: int | None = None) -> ir.Value:
    """A float holding an integral value, clamped to ``dtype``'s range (and ``[lo, hi]`` when
    given, the fused activation's range) and converted to ``dtype`` (lane by lane for vectors)."""
    qmin, qmax = qrange(dtype)
    lo = qmin if lo is None else max(qmin, lo)
    hi = qmax if hi is None else min(qmax, hi)
    flo, fhi = like(v.type, float(lo)), like(v.type, float(hi))
    v = b.select(b.fcmp_ordered("<", v, flo), flo, v)
    v = b.select(b.fcmp_ordered(">", v, fhi), fhi, v)
    t = llvm_type(dtype)
    if isinstance(v.type, ir.VectorType):
        t = ir.VectorType(t, v.type.count)
    return b.fptoui(v, t) if dtype == "uint8" else b.fptosi(v, t)


def quantize_value(b: ir.IRBuilder, scaled: ir.Value, zp: ir.Value, dtype: str, lo: int | None = None,
                   hi: int | None = None) -> ir.Value:
    """``saturate(rint(scaled) + zp)`` for a float ``scaled`` (already divided by the scale) and
    a float zero point ``zp``."""
    return saturate(b, b.fadd(rint(b, scaled), zp), dtype, lo, hi)


def dequantize_value(b: ir.IRBuilder, x: ir.Value, dtype: str, zp: ir.Value, scale: ir.Value) -> ir.Value:
    """``(float(x) - float(zp)) * scale`` (ONNX's reference order; exact subtraction for 8-bit)."""
    return b.fmul(b.fsub(to_float(b, x, dtype), zp), scale)
