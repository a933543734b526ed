"""Matrix products: MatMul (transpose flags) and BatchMatMul / V2 / V3 (adjoint flags).

A Keras ``Dense`` layer on a feature map held channels-first (ConvNeXt's pointwise layers after
a depthwise convolution) multiplies the channels, TF's last axis, by a constant matrix: Keras 3
writes it as ``Tensordot`` (``Reshape(MatMul(Reshape(x, [-1, C]), W), [N, H, W, M])``, matched
at the last Reshape) and ``EinsumDense`` as a BatchMatMulV2 of the 4-D tensor.  Both become a
1×1 ``Conv`` on the held layout (polyml's convolution kernel runs it as the packed GEMM where
that is faster), instead of a Transpose to TF's order, the product and a Transpose back.

A product of a few rows by a constant matrix (a classifier at batch 1) is a ``Gemm`` with the
matrix transposed at import and ``transB = 1`` (see ``GEMV_MAX_ROWS``).
"""

from __future__ import annotations

import numpy as np

from polyml.frontends.tensorflow.convert import attr, converter, pattern
from polyml.frontends.tensorflow.convert._match import match, source
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, Value

TENSORDOT = ("Reshape", ("MatMul", ("Reshape", "x", "$flat"), "$w"), "$shape")
#: a product of at most this many rows by a constant matrix (a batch-1 classifier) is a Gemm
#: with the matrix stored transposed (``transB``): the kernel then reads it in place, one dot
#: product per output, instead of running the packed GEMM on one row (1x1280 @ 1280x1000,
#: one thread: 0.27 vs 1.78 ms); from 16 rows on both forms measured the same, at 64 the
#: packed GEMM is far ahead.
GEMV_MAX_ROWS = 16


def channels_first(imp: TFValues, x: str) -> bool:
    """TF tensor ``x`` (rank ≥ 3) is held with its last axis first after the batch axis."""
    v = imp.vals[x]
    rank = len(imp.tf_shape(x))
    return isinstance(v, Val) and rank >= 3 and v.perm == (0, rank - 1, *range(1, rank - 1))


def pointwise_conv(imp: TFValues, x: str, w: np.ndarray) -> Val:
    """``x @ w`` along TF's last axis of channels-first-held ``x``, as a 1×1 Conv."""
    v = imp.vals[x]
    sp = len(imp.tf_shape(x)) - 2
    weight = np.ascontiguousarray(w.T.reshape(w.shape[1], w.shape[0], *([1] * sp)), dtype=np.float32)
    attrs = {"kernel_shape": [1] * sp, "strides": [1] * sp, "dilations": [1] * sp, "pads": [0] * (2 * sp), "group": 1}
    wname = imp.const(weight, f"{imp.cur.name}#oihw")
    return imp.finish(imp.emit("Conv", [v.name, wname], attrs, main=True, perm=v.perm), v.perm)


@pattern("Reshape")
def _tensordot(imp: TFValues, n, ts: list[str]) -> list[Value | None] | None:
    env = match(imp, n.name, TENSORDOT)
    if env is None or not channels_first(imp, env["x"]) or imp.dtype(env["x"]) != "float32":
        return None
    x = env["x"]
    mm = source(imp, ts[0])[0]
    w = imp.value(env["$w"])
    if attr(mm, "transpose_a", False) or w.ndim != 2:
        return None
    if attr(mm, "transpose_b", False):
        w = w.T
    shape = imp.tf_shape(x)
    c, m = w.shape
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    flat = [int(d) for d in imp.value(env["$flat"]).reshape(-1)]
    out = [int(d) for d in imp.value(env["$shape"]).reshape(-1)]
    if shape[-1] != c or flat not in ([rows, c], [-1, c]) or out != [*shape[:-1], m]:
        return None
    return [pointwise_conv(imp, x, w)]


@converter("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _matmul(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    a, b = ts
    batch = n.op != "MatMul"
    ta = bool(attr(n, "adj_x" if batch else "transpose_a", False))
    tb = bool(attr(n, "adj_y" if batch else "transpose_b", False))
    if batch and not ta and imp.is_const(b) and not imp.is_const(a) and imp.value(b).ndim == 2 \
            and channels_first(imp, a) and imp.dtype(a) == "float32":
        w = imp.value(b)
        return [pointwise_conv(imp, a, w.T if tb else w)]

    def operand(t: str, trans: bool) -> tuple[str, bool]:
        if imp.is_const(t) and trans:
            key = f"{t}#T"
            imp.vals[key] = np.swapaxes(imp.value(t), -1, -2)
            return key, False
        return t, trans

    if imp.is_const(a) and imp.is_const(b):
        x, y = imp.value(a), imp.value(b)
        return [np.matmul(np.swapaxes(x, -1, -2) if ta else x, np.swapaxes(y, -1, -2) if tb else y)]
    if not batch and not ta and imp.is_const(b) and len(imp.tf_shape(a)) == 2 and imp.tf_shape(a)[0] <= GEMV_MAX_ROWS:
        w = imp.value(b)
        wt = imp.const(np.ascontiguousarray(w if tb else w.T), f"{b}#T" if not tb else b)
        return [Val(imp.emit("Gemm", [imp.tf_order(a), wt], {"transB": 1}, main=True))]
    a, ta = operand(a, ta)
    b, tb = operand(b, tb)
    ra, rb = len(imp.tf_shape(a)), len(imp.tf_shape(b))
    if ta or tb:
        if ra != 2 or rb != 2:
            raise Unsupported("adjoint batch matrix products computed at run time")
        return [Val(imp.emit("Gemm", [imp.tf_order(a), imp.tf_order(b)], {"transA": int(ta), "transB": int(tb)}, main=True))]
    return [Val(imp.emit("MatMul", [imp.tf_order(a), imp.tf_order(b)], main=True))]
