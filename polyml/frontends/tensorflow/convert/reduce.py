"""Reductions over constant axes: Mean, Sum, Max, Min at run time; Prod, All, Any on constants."""

from __future__ import annotations

import numpy as np

from polyml.frontends.tensorflow.convert import attr, converter, norm_axis
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, Value, drop_dims


def _reduce_np(op: str):
    fn = {"Sum": np.sum, "Prod": np.prod, "Max": np.max, "Min": np.min, "Mean": np.mean, "All": np.all, "Any": np.any}[op]

    def f(n, x: np.ndarray, axes: np.ndarray) -> np.ndarray:
        ax = tuple(int(a) % max(x.ndim, 1) for a in np.asarray(axes).reshape(-1))
        r = fn(x, axis=ax, keepdims=bool(attr(n, "keep_dims", False)))
        return np.asarray(r).astype(x.dtype)

    return f


@converter("Mean", "Sum", "Max", "Min", "Prod", "All", "Any")
def _reduce(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, a = ts
    keep = bool(attr(n, "keep_dims", False))
    if imp.is_const(x):
        return [_reduce_np(n.op)(n, imp.value(x), imp.value(a))]
    if n.op in ("Prod", "All", "Any"):
        raise Unsupported(f"{n.op} at run time")
    rank = len(imp.tf_shape(x))
    axes = sorted({norm_axis(int(v), rank, n) for v in imp.value(a).reshape(-1)})
    v = imp.vals[x]
    if not axes:
        return [v]
    ir_axes = sorted(v.perm.index(d) for d in axes) if v.perm else axes
    perm = v.perm if keep else drop_dims(v.perm, ir_axes)
    op = {"Mean": "ReduceMean", "Sum": "ReduceSum", "Max": "ReduceMax", "Min": "ReduceMin"}[n.op]
    y = imp.emit(op, [v.name], {"axes": ir_axes, "keepdims": int(keep)}, main=True, perm=perm)
    return [Val(y, perm)]
