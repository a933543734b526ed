"""Activations and transcendental functions of float32 elements (scalar functions of one input,
except PRelu's broadcast slope), shared by standalone nests and fused chains.

Attribute defaults are the ONNX spec's.  Functions with no LLVM intrinsic call libm's ``f``
variants, declared ``readnone`` so Polly still sees a static control part.
"""

from __future__ import annotations

import math

import llvmlite.ir as ir

from polyml.kernels._scalar import Scalar, scalar_op


def _exp(s: Scalar, x: ir.Value) -> ir.Value:
    return s.k.exp(x)


def _expm1(s: Scalar, x: ir.Value) -> ir.Value:
    return s.libm("expm1f", x)


def softplus(s: Scalar, x: ir.Value) -> ir.Value:
    """log(1 + eˣ) without overflow: max(x, 0) + log1p(e^-|x|)."""
    ax = s.intrinsic("llvm.fabs", x)
    return s.b.fadd(s.max(x, s.f(0.0)), s.libm("log1pf", _exp(s, s.b.fneg(ax))))


def sigmoid(s: Scalar, x: ir.Value) -> ir.Value:
    one = s.f(1.0)
    return s.b.fdiv(one, s.b.fadd(one, _exp(s, s.b.fneg(x))))


def hard_sigmoid(s: Scalar, x: ir.Value, alpha: float, beta: float) -> ir.Value:
    y = s.b.fadd(s.b.fmul(x, s.f(alpha)), s.f(beta))
    return s.min(s.max(y, s.f(0.0)), s.f(1.0))


@scalar_op("Relu")
def _relu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.max(v[0], s.f(0.0))


@scalar_op("LeakyRelu")
def _leaky_relu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x = v[0]
    return s.select(s.compare(">=", x, s.f(0.0)), x, s.b.fmul(x, s.f(s.attr("alpha", 0.01))))


@scalar_op("PRelu")
def _prelu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x, slope = v
    return s.select(s.compare("<", x, s.f(0.0)), s.b.fmul(x, slope), x)


@scalar_op("ThresholdedRelu")
def _thresholded_relu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x = v[0]
    return s.select(s.compare(">", x, s.f(s.attr("alpha", 1.0))), x, s.f(0.0))


@scalar_op("Sigmoid")
def _sigmoid(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return sigmoid(s, v[0])


@scalar_op("Swish")
def _swish(s: Scalar, v: list[ir.Value]) -> ir.Value:
    """x·sigmoid(αx) (ONNX opset 24; the TF frontend's SiLU/swish), read once so it fuses as an
    epilogue.  The logistic factor is the rational approximation onnxruntime uses too
    (:func:`polyml.codegen.vmath.logistic`, absolute error ≤ 3e-7): a third of the exp-based
    form's work, where SiLU is an epilogue on every conv of an EfficientNet; a standalone
    Sigmoid keeps the exp-based form (its relative error matters near 0)."""
    return s.b.fmul(v[0], s.k.logistic(s.b.fmul(v[0], s.f(s.attr("alpha", 1.0)))))


@scalar_op("HardSigmoid")
def _hard_sigmoid(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return hard_sigmoid(s, v[0], s.attr("alpha", 0.2), s.attr("beta", 0.5))


@scalar_op("HardSwish")
def _hard_swish(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fmul(v[0], hard_sigmoid(s, v[0], 1.0 / 6.0, 0.5))


@scalar_op("Tanh")
def _tanh(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.k.tanh(v[0])


@scalar_op("Softplus")
def _softplus(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return softplus(s, v[0])


@scalar_op("Softsign")
def _softsign(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fdiv(v[0], s.b.fadd(s.f(1.0), s.intrinsic("llvm.fabs", v[0])))


@scalar_op("Mish")
def _mish(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.fmul(v[0], s.k.tanh(softplus(s, v[0])))


@scalar_op("Elu")
def _elu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x = v[0]
    neg = s.b.fmul(s.f(s.attr("alpha", 1.0)), _expm1(s, x))
    return s.select(s.compare("<", x, s.f(0.0)), neg, x)


@scalar_op("Selu")
def _selu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x = v[0]
    alpha = s.attr("alpha", 1.67326319217681884765625)
    gamma = s.attr("gamma", 1.05070102214813232421875)
    neg = s.b.fmul(s.f(alpha), _expm1(s, x))
    return s.b.fmul(s.f(gamma), s.select(s.compare("<=", x, s.f(0.0)), neg, x))


@scalar_op("Celu")
def _celu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x = v[0]
    alpha = float(s.attr("alpha", 1.0))
    neg = s.b.fmul(s.f(alpha), _expm1(s, s.b.fdiv(x, s.f(alpha))))
    return s.b.fadd(s.max(x, s.f(0.0)), s.min(neg, s.f(0.0)))


@scalar_op("Shrink")
def _shrink(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x = v[0]
    lambd, bias = float(s.attr("lambd", 0.5)), float(s.attr("bias", 0.0))
    low = s.select(s.compare("<", x, s.f(-lambd)), s.b.fadd(x, s.f(bias)), s.f(0.0))
    return s.select(s.compare(">", x, s.f(lambd)), s.b.fsub(x, s.f(bias)), low)


@scalar_op("Erf")
def _erf(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.k.erf(v[0])


@scalar_op("Gelu")
def _gelu(s: Scalar, v: list[ir.Value]) -> ir.Value:
    """``approximate="none"``: x·Φ(x) = ½x(1 + erf(x/√2)); ``"tanh"``: ½x(1 + tanh(√(2/π)(x + 0.044715x³)))."""
    x, half, one = v[0], s.f(0.5), s.f(1.0)
    if s.attr("approximate", "none") == "tanh":
        x3 = s.b.fmul(s.b.fmul(x, x), x)
        inner = s.b.fmul(s.f(math.sqrt(2.0 / math.pi)), s.b.fadd(x, s.b.fmul(s.f(0.044715), x3)))
        t = s.k.tanh(inner)
    else:
        t = s.k.erf(s.b.fmul(x, s.f(1.0 / math.sqrt(2.0))))
    return s.b.fmul(s.b.fmul(half, x), s.b.fadd(one, t))


@scalar_op("Sin", "Cos")
def _sin_cos(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.intrinsic(f"llvm.{s.node.op_type.lower()}", v[0])


LIBM_UNARY = {op: f"{op.lower()}f" for op in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")}


@scalar_op(*LIBM_UNARY)
def _libm_unary(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.libm(LIBM_UNARY[s.node.op_type], v[0])
