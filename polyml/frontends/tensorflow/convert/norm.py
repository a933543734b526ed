"""Normalization: FusedBatchNorm, Softmax and LogSoftmax.

FusedBatchNorm with ``is_training=true`` normalizes by the statistics of its own input (over
every axis but the channels'): tf-keras' LayerNormalization freezes to one on the input reshaped
to ``(1, rows, D, 1)`` NCHW with scale 1 and offset 0.  With one sample it is a
LayerNormalization over the axes after the channels (where the kernel registry has it), else
ReduceMean / Sub / Mul / Sqrt / Reciprocal; the scale and offset follow as a per-channel
multiply-add (none when they are 1 and 0).  Only output 0 (``y``) is computed: the batch
statistics outputs feed training updates.
"""

from __future__ import annotations

import numpy as np

from polyml.errors import ShapeError
from polyml.frontends.tensorflow.convert import attr, converter
from polyml.frontends.tensorflow.convert.conv import layout_of
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, Value


@converter("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_bn(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    if attr(n, "is_training", True):
        return [_batch_statistics(imp, n, ts)]
    x, *params = ts[:5]
    rank = len(imp.tf_shape(x))
    need, _, ch = layout_of(n, rank)
    live = [t for t in params if not imp.is_const(t)]
    if live:
        raise Unsupported(f"the batch-norm parameter {live[0]!r} is computed at run time")
    c = imp.tf_shape(x)[ch]
    if any(imp.value(t).size != c for t in params):
        raise ShapeError(f"parameters {[list(imp.tf_shape(t)) for t in params]} for {c} channels")
    names = [imp.const(imp.value(t).reshape(c).astype(np.float32), t) for t in params]
    eps = float(attr(n, "epsilon", 1e-4))
    y = imp.emit("BatchNormalization", [imp.ir(x, need), *names], {"epsilon": eps}, main=True, perm=need)
    return [imp.finish(y, need)]



def _batch_statistics(imp: TFValues, n, ts: list[str]) -> Val:
    x, scale, offset = ts[:3]
    rank = len(imp.tf_shape(x))
    need, _, ch = layout_of(n, rank)
    if imp.dtype(x) != "float32" or rank < 2:
        raise Unsupported(f"batch statistics of a rank-{rank} {imp.dtype(x)} tensor")
    live = [t for t in (scale, offset) if not imp.is_const(t)]
    if live:
        raise Unsupported(f"the batch-norm parameter {live[0]!r} is computed at run time")
    c = imp.tf_shape(x)[ch]
    sc, off = (imp.value(t).astype(np.float32).reshape(-1) for t in (scale, offset))
    if sc.size != c or off.size != c:
        raise ShapeError(f"scale {list(imp.tf_shape(scale))} and offset {list(imp.tf_shape(offset))} for {c} channels")
    eps = float(attr(n, "epsilon", 1e-4))
    xi = imp.ir(x, need)  # channels at IR axis 1
    shape = imp.types[xi].shape
    per_channel = (1, c) + (1,) * (rank - 2)
    if shape[0] == 1 and rank > 2 and "LayerNormalization" in imp.kernels:
        norm = shape[2:]
        y = imp.emit("LayerNormalization", [xi, imp.const(np.ones(norm, np.float32), "ones"),
                                            imp.const(np.zeros(norm, np.float32), "zeros")],
                     {"axis": 2, "epsilon": eps}, what="normalize")
    else:
        axes = [0, *range(2, rank)]
        mean = imp.emit("ReduceMean", [xi], {"axes": axes, "keepdims": 1}, what="mean")
        d = imp.emit("Sub", [xi, mean], what="centered")
        var = imp.emit("ReduceMean", [imp.emit("Mul", [d, d], what="square")], {"axes": axes, "keepdims": 1}, what="var")
        std = imp.emit("Sqrt", [imp.emit("Add", [var, imp.const(np.float32(eps), "eps")], what="var_eps")], what="std")
        y = imp.emit("Div", [d, std], what="normalize")
    if not np.all(sc == 1):
        y = imp.emit("Mul", [y, imp.const(sc.reshape(per_channel), f"{scale}#c")], what="scale")
    if np.any(off != 0):
        y = imp.emit("Add", [y, imp.const(off.reshape(per_channel), f"{offset}#c")], what="offset")
    return imp.finish(y, need)


@converter("Softmax", "LogSoftmax")
def _softmax(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    v = imp.vals[x]
    if isinstance(v, np.ndarray):
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        s = e / e.sum(axis=-1, keepdims=True)
        return [(np.log(s) if n.op == "LogSoftmax" else s).astype(v.dtype)]
    rank = len(imp.tf_shape(x))
    axis = v.perm.index(rank - 1) if v.perm else rank - 1
    return [Val(imp.emit(n.op, [v.name], {"axis": axis}, main=True, perm=v.perm), v.perm)]
