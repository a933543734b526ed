"""Elementwise arithmetic: broadcasting binary ops, variadic Sum/Max/Min/Mean, Clip, unary math.

Each op is a scalar function registered with :func:`polyml.kernels._scalar.scalar_op`; the
shared kernel lowers it to one perfect nest over the output with broadcast reads (still affine,
so Polly sees one statement with one write and one read per operand).  Integer ops follow
numpy/onnxruntime: ``Div`` truncates toward zero (a zero divisor gives 0 instead of a trap),
``Mod`` takes the divisor's sign unless ``fmod=1``; int8/uint8 wrap (uint8 divides unsigned).
"""

from __future__ import annotations

import llvmlite.ir as ir

from polyml.codegen.builder import is_float, llvm_type
from polyml.kernels._scalar import (
    BYTES,
    ELEMENTWISE_KERNEL,
    NUMERIC,
    SCALAR_OPS,
    UNSIGNED,
    Scalar,
    scalar,
    scalar_op,
)

__all__ = ["ELEMENTWISE_KERNEL", "SCALAR_OPS", "elementwise_ops", "scalar"]


def elementwise_ops() -> frozenset[str]:
    """Every op type computed by a scalar function (what fusion may chain)."""
    from polyml.kernels import registry

    registry()
    return frozenset(SCALAR_OPS)


@scalar_op("Add", dtypes=NUMERIC | BYTES)
def _add(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fadd(v[0], v[1]) if s.is_float else s.b.add(v[0], v[1])


@scalar_op("Sub", dtypes=NUMERIC | BYTES)
def _sub(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fsub(v[0], v[1]) if s.is_float else s.b.sub(v[0], v[1])


@scalar_op("Mul", dtypes=NUMERIC | BYTES)
def _mul(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fmul(v[0], v[1]) if s.is_float else s.b.mul(v[0], v[1])


def _int_divisor(s: Scalar, d: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """(divisor safe for sdiv/srem, d == 0, d == -1): x86 traps on /0 and on INT_MIN / -1."""
    zero, minus1 = s.const(0), s.const(-1)
    is0 = s.b.icmp_signed("==", d, zero)
    ism1 = s.b.icmp_signed("==", d, minus1)
    return s.select(s.b.or_(is0, ism1), s.const(1), d), is0, ism1


@scalar_op("Div", dtypes=NUMERIC | BYTES)
def _div(s: Scalar, v: list[ir.Value]) -> ir.Value:
    if s.is_float:
        return s.b.fdiv(v[0], v[1])
    if s.dtype in UNSIGNED:
        is0 = s.b.icmp_unsigned("==", v[1], s.const(0))
        return s.select(is0, s.const(0), s.b.udiv(v[0], s.select(is0, s.const(1), v[1])))
    safe, is0, ism1 = _int_divisor(s, v[1])
    q = s.select(ism1, s.b.sub(s.const(0), v[0]), s.b.sdiv(v[0], safe))
    return s.select(is0, s.const(0), q)


@scalar_op("Mod", dtypes=NUMERIC | BYTES)
def _mod(s: Scalar, v: list[ir.Value]) -> ir.Value:
    a, d = v
    zero = s.const(0)
    if s.is_float:
        r = s.b.frem(a, d)  # C's fmod
        if s.attr("fmod", 0):
            return r
        # numpy's mod: a non-zero remainder takes the divisor's sign, a zero one its sign bit
        fix = s.b.and_(s.b.fcmp_ordered("!=", r, zero),
                       s.b.xor(s.b.fcmp_ordered("<", r, zero), s.b.fcmp_ordered("<", d, zero)))
        r = s.select(fix, s.b.fadd(r, d), r)
        return s.select(s.b.fcmp_ordered("==", r, zero), s.intrinsic("llvm.copysign", zero, d), r)
    if s.dtype in UNSIGNED:  # no signs to fix
        is0 = s.b.icmp_unsigned("==", d, zero)
        return s.select(is0, zero, s.b.urem(a, s.select(is0, s.const(1), d)))
    safe, is0, ism1 = _int_divisor(s, d)
    r = s.select(s.b.or_(is0, ism1), zero, s.b.srem(a, safe))
    if s.attr("fmod", 0):
        return r
    # Python's %: a non-zero remainder takes the divisor's sign
    fix = s.b.and_(s.b.icmp_signed("!=", r, zero),
                   s.b.xor(s.b.icmp_signed("<", r, zero), s.b.icmp_signed("<", d, zero)))
    return s.select(fix, s.b.add(r, d), r)


@scalar_op("Pow", dtypes=NUMERIC, same_dtype=False)
def _pow(s: Scalar, v: list[ir.Value]) -> ir.Value:
    base_t, exp_t = s.dtypes[0], s.dtypes[1]
    if is_float(base_t):
        e = s.convert(v[1], exp_t, "float32")
        return s.intrinsic("llvm.pow", v[0], e)
    # integer base: compute in double, truncate (onnxruntime's integer Pow)
    dbl = ir.DoubleType()
    x = s.b.sitofp(v[0], dbl)
    e = s.b.fpext(v[1], dbl) if is_float(exp_t) else s.b.sitofp(v[1], dbl)
    return s.b.fptosi(s.intrinsic("llvm.pow", x, e), llvm_type(base_t))


@scalar_op("Sum", "Mean")  # float types only in ONNX
def _sum(s: Scalar, v: list[ir.Value]) -> ir.Value:
    acc = v[0]
    for x in v[1:]:
        acc = s.b.fadd(acc, x) if s.is_float else s.b.add(acc, x)
    if s.node.op_type == "Mean":
        acc = s.b.fdiv(acc, s.f(len(v))) if s.is_float else s.b.sdiv(acc, s.const(len(v)))
    return acc


@scalar_op("Max", "Min", dtypes=NUMERIC | BYTES)
def _max_min(s: Scalar, v: list[ir.Value]) -> ir.Value:
    pick = s.max if s.node.op_type == "Max" else s.min
    acc = v[0]
    for x in v[1:]:
        acc = pick(acc, x)
    return acc


@scalar_op("Clip", dtypes=NUMERIC | BYTES)
def _clip(s: Scalar, v: list[ir.Value]) -> ir.Value:
    """Bounds from optional inputs 1 and 2 (opset ≥ 11) or the min/max attributes."""
    present = [i for i, t in enumerate(s.node.inputs) if t]
    by_pos = dict(zip(present, v))
    lo = by_pos.get(1, s.const(s.attr("min")) if "min" in s.node.attrs else None)
    hi = by_pos.get(2, s.const(s.attr("max")) if "max" in s.node.attrs else None)
    x = v[0]
    if lo is not None:
        x = s.select(s.compare("<", x, lo), lo, x)
    if hi is not None:
        x = s.select(s.compare(">", x, hi), hi, x)
    return x


@scalar_op("Neg", dtypes=NUMERIC)
def _neg(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fneg(v[0]) if s.is_float else s.b.sub(s.const(0), v[0])


@scalar_op("Abs", dtypes=NUMERIC)
def _abs(s: Scalar, v: list[ir.Value]) -> ir.Value:
    if s.is_float:
        return s.intrinsic("llvm.fabs", v[0])
    return s.select(s.compare("<", v[0], s.const(0)), s.b.sub(s.const(0), v[0]), v[0])


@scalar_op("Sign", dtypes=NUMERIC)
def _sign(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x, zero = v[0], s.const(0)
    pos = s.select(s.compare(">", x, zero), s.const(1), zero)
    out = s.select(s.compare("<", x, zero), s.const(-1), pos)
    if s.is_float:  # NaN stays NaN (numpy)
        out = s.select(s.b.fcmp_unordered("uno", x, x), x, out)
    return out


@scalar_op("Reciprocal")
def _reciprocal(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fdiv(s.f(1.0), v[0])


@scalar_op("Sqrt")
def _sqrt(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.intrinsic("llvm.sqrt", v[0])


@scalar_op("Exp")
def _exp(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.k.exp(v[0])


@scalar_op("Log")
def _log(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.intrinsic("llvm.log", v[0])


@scalar_op("Floor")
def _floor(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.intrinsic("llvm.floor", v[0])


@scalar_op("Ceil")
def _ceil(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.intrinsic("llvm.ceil", v[0])


@scalar_op("Round")
def _round(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.intrinsic("llvm.roundeven", v[0])  # halves to even, as ONNX and numpy

