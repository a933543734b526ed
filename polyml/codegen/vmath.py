"""exp, tanh and erf of float32 as straight-line arithmetic that LLVM's loop vectorizer takes.

libm's ``expf``/``tanhf``/``erff`` are scalar calls: a loop calling them is not vectorized (LLVM 19
maps only a few functions to glibc's vector library, and not these), so a GELU over BERT's
feed-forward activations ran one call per element.  These versions use only ``fmul``/``fadd``,
selects and integer bit operations, so the nest around them vectorizes at the full vector width.

* ``exp``: Cody–Waite reduction ``x = n·ln2 + r`` (``|r| ≤ ln2/2``, ln2 split in a high and a
  low part), degree-7 Taylor polynomial of ``eʳ`` (truncation ≤ 2e-9 relative), ``2ⁿ`` by
  adding ``n`` to the exponent bits; results below 2⁻¹²⁶ flushed to 0, above the float range +inf.
* ``tanh``: ``x - x³/3 + 2x⁵/15 - 17x⁷/315 + 62x⁹/2835`` for ``|x| < 0.25``, else
  ``sign(x)·(1 - 2/(e^{2|x|} + 1))``.
* ``logistic``: Eigen's rational approximation (onnxruntime's MLAS uses the same), see
  :func:`logistic`.
* ``erf``: ``(2/√π)(x - x³/3 + x⁵/10 - x⁷/42 + x⁹/216 - x¹¹/1320)`` for ``|x| < 0.5``, else
  Abramowitz–Stegun 7.1.26 (absolute error ≤ 1.5e-7).

Measured against numpy's float64 functions on 2²⁰ points in tests/test_vmath.py: relative
errors ≤ 4e-7 (exp), absolute ≤ 3e-7 (tanh, erf).
"""

from __future__ import annotations

import math

import llvmlite.ir as ir

F32 = ir.FloatType()
I32 = ir.IntType(32)


def _c(v: float) -> ir.Constant:
    return ir.Constant(F32, float(v))


def _poly(b: ir.IRBuilder, x: ir.Value, coeffs: list[float], flags: tuple[str, ...] = ()) -> ir.Value:
    """Horner: ``coeffs[0] + coeffs[1]·x + ...`` (``flags`` on each step, e.g. ``contract``)."""
    acc = _c(coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = b.fadd(b.fmul(acc, x, flags=flags), _c(c), flags=flags)
    return acc


def _clamp(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    x = b.select(b.fcmp_ordered("<", x, _c(lo)), _c(lo), x)
    return b.select(b.fcmp_ordered(">", x, _c(hi)), _c(hi), x)


def _abs(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    bits = b.and_(b.bitcast(x, I32), ir.Constant(I32, 0x7FFFFFFF))
    return b.bitcast(bits, F32)


def _copysign(b: ir.IRBuilder, mag: ir.Value, sign_of: ir.Value) -> ir.Value:
    sign = b.and_(b.bitcast(sign_of, I32), ir.Constant(I32, -0x80000000))
    return b.bitcast(b.or_(b.bitcast(mag, I32), sign), F32)


LN2_HI = 0.693145751953125  # ln 2 with the low 12 mantissa bits zero: n·LN2_HI is exact
LN2_LO = 1.428606765330187e-06
EXP_TAYLOR = [1.0 / math.factorial(i) for i in range(8)]


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``eˣ`` (NaN propagates: every step is an fmul/fadd of it)."""
    nan = b.fcmp_unordered("uno", x, x)
    xc = _clamp(b, x, -87.3, 88.7)
    n = b.call(_intrinsic(b, "llvm.rint"), [b.fmul(xc, _c(1.0 / math.log(2.0)))])
    r = b.fsub(b.fsub(xc, b.fmul(n, _c(LN2_HI))), b.fmul(n, _c(LN2_LO)))
    p = _poly(b, r, EXP_TAYLOR)
    # 2^n: n + 127 into the exponent field (n in [-126, 128]: split in two factors for the top)
    ni = b.fptosi(n, I32)
    half = b.ashr(ni, ir.Constant(I32, 1))
    scale1 = b.bitcast(b.shl(b.add(half, ir.Constant(I32, 127)), ir.Constant(I32, 23)), F32)
    scale2 = b.bitcast(b.shl(b.add(b.sub(ni, half), ir.Constant(I32, 127)), ir.Constant(I32, 23)), F32)
    y = b.fmul(b.fmul(p, scale1), scale2)
    y = b.select(b.fcmp_ordered(">", x, _c(88.72283)), _c(math.inf), y)
    y = b.select(b.fcmp_ordered("<", x, _c(-87.3)), _c(0.0), y)  # flush what would be subnormal
    return b.select(nan, x, y)


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    ax = _abs(b, x)
    x2 = b.fmul(x, x)
    small = b.fmul(x, _poly(b, x2, [1.0, -1.0 / 3, 2.0 / 15, -17.0 / 315, 62.0 / 2835]))
    e = exp(b, b.fmul(_clamp(b, ax, 0.0, 10.0), _c(2.0)))
    large = b.fsub(_c(1.0), b.fdiv(_c(2.0), b.fadd(e, _c(1.0))))
    y = b.select(b.fcmp_ordered("<", ax, _c(0.25)), small, _copysign(b, large, x))
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


AS_P = 0.3275911
AS_A = [0.0, 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429]
ERF_TAYLOR = [1.0, -1.0 / 3, 1.0 / 10, -1.0 / 42, 1.0 / 216, -1.0 / 1320]


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    ax = _clamp(b, _abs(b, x), 0.0, 6.0)
    x2 = b.fmul(x, x)
    small = b.fmul(b.fmul(x, _c(2.0 / math.sqrt(math.pi))), _poly(b, x2, ERF_TAYLOR))
    t = b.fdiv(_c(1.0), b.fadd(_c(1.0), b.fmul(_c(AS_P), ax)))
    tail = b.fmul(_poly(b, t, AS_A), exp(b, b.fneg(b.fmul(ax, ax))))
    large = _copysign(b, b.fsub(_c(1.0), tail), x)
    y = b.select(b.fcmp_ordered("<", _abs(b, x), _c(0.5)), small, large)
    return b.select(b.fcmp_unordered("uno", x, x), x, y)


#: the logistic function's rational approximation (Eigen's, as onnxruntime's MLAS uses it):
#: odd numerator and even denominator in x², x clamped to ±18
LOGISTIC_P = [2.48287947061529e-01, 8.51377133304701e-03, 6.08574864600143e-05, 1.15627324459942e-07,
              4.37031012579801e-11]
LOGISTIC_Q = [9.93151921023180e-01, 1.16817656904453e-01, 1.70198817374094e-03, 6.29106785017040e-06,
              5.76102136993427e-09, 6.10247389755681e-13]
CONTRACT = ("contract",)


def logistic(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """``1/(1 + e⁻ˣ)`` as ``x·P(x²)/Q(x²) + ½`` (degree 9/10, fused multiply-adds, one
    division), clamped to [0, 1]: absolute error ≤ 3e-7, and a fraction of the exp-based form's
    work (an EfficientNet SiLU epilogue cost 0.36 ms on the stem's 401k outputs that way)."""
    xc = _clamp(b, x, -18.0, 18.0)  # NaN passes (ordered compares)
    x2 = b.fmul(xc, xc)
    p, q = _poly(b, x2, LOGISTIC_P, CONTRACT), _poly(b, x2, LOGISTIC_Q, CONTRACT)
    y = b.fadd(b.fdiv(b.fmul(xc, p), q), _c(0.5))
    return _clamp(b, y, 0.0, 1.0)


def _intrinsic(b: ir.IRBuilder, name: str) -> ir.Function:
    module = b.module
    fnty = ir.FunctionType(F32, [F32])
    return module.declare_intrinsic(name, [F32], fnty)
