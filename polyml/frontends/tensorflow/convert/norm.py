"""Normalization: FusedBatchNorm (inference mode), Softmax and LogSoftmax."""

from __future__ import annotations

import numpy as np

from polyml.errors import ShapeError
from polyml.frontends.tensorflow.convert import Unsupported, attr, converter
from polyml.frontends.tensorflow.convert.conv import layout_of
from polyml.frontends.tensorflow.importer import Importer, Val, Value


@converter("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_bn(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    if attr(n, "is_training", True):
        raise Unsupported("is_training=true (batch statistics); polyml compiles inference graphs")
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



@converter("Softmax", "LogSoftmax")
def _softmax(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    v = imp.vals[x]
    if isinstance(v, np.ndarray):
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        s = e / e.sum(axis=-1, keepdims=True)
        return [(np.log(s) if n.op == "LogSoftmax" else s).astype(v.dtype)]
    rank = len(imp.tf_shape(x))
    axis = v.perm.index(rank - 1) if v.perm else rank - 1
    return [Val(imp.emit(n.op, [v.name], {"axis": axis}, main=True, perm=v.perm), v.perm)]
