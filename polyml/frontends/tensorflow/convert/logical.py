"""Comparisons, logical ops and selection (attention masks, ``tf.where``): Equal, NotEqual,
Less, LessEqual, Greater, GreaterEqual, LogicalAnd, LogicalOr, LogicalNot, IsNan, Select,
SelectV2 → Equal, ..., And, Or, Not, IsNaN, Where (bool results; numpy broadcasting, in the
layout of the operands as the other elementwise ops; folded on constants).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from polyml.errors import ShapeError
from polyml.frontends.tensorflow.convert import converter
from polyml.frontends.tensorflow.convert.elementwise import elementwise
from polyml.frontends.tensorflow.values import TFValues, Val, Value

#: TF op → (IR op, numpy)
OPS: dict[str, tuple[str, Callable[..., np.ndarray]]] = {
    "Equal": ("Equal", np.equal),
    "Less": ("Less", np.less),
    "LessEqual": ("LessOrEqual", np.less_equal),
    "Greater": ("Greater", np.greater),
    "GreaterEqual": ("GreaterOrEqual", np.greater_equal),
    "LogicalAnd": ("And", np.logical_and),
    "LogicalOr": ("Or", np.logical_or),
    "LogicalNot": ("Not", np.logical_not),
    "IsNan": ("IsNaN", np.isnan),
    "SelectV2": ("Where", np.where),
}


@converter(*OPS)
def _logical(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    op, fn = OPS[n.op]
    ts = ts[:3] if n.op == "SelectV2" else ts[:2] if op not in ("Not", "IsNaN") else ts[:1]
    if all(imp.is_const(t) for t in ts):
        return [np.asarray(fn(*[imp.value(t) for t in ts]))]
    return [elementwise(imp, op, ts)]


@converter("NotEqual")
def _not_equal(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    a, b = ts[:2]
    if imp.is_const(a) and imp.is_const(b):
        return [np.not_equal(imp.value(a), imp.value(b))]
    key = f"{n.name}#equal"
    imp.vals[key] = elementwise(imp, "Equal", [a, b], main=False)
    return [elementwise(imp, "Not", [key])]


@converter("Select")
def _select(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    """TF1's Select: ``cond`` has the shape of the branches, or is a vector along their first axis."""
    c, a, b = ts[:3]
    cs, shape = imp.tf_shape(c), imp.tf_shape(a)
    if imp.tf_shape(b) != shape or (cs != shape and (len(cs) != 1 or not shape or cs[0] != shape[0])):
        raise ShapeError(f"Select of {list(cs)} between {list(shape)} and {list(imp.tf_shape(b))}")
    if cs != shape and len(shape) > 1:  # the vector along the first axis
        key = f"{n.name}#cond"
        rows = (cs[0],) + (1,) * (len(shape) - 1)
        if imp.is_const(c):
            imp.vals[key] = imp.value(c).reshape(rows)
        else:
            imp.vals[key] = Val(imp.emit("Reshape", [imp.tf_order(c), imp.const(np.array(rows, np.int64), "shape")],
                                         what="cond"))
        c = key
    if all(imp.is_const(t) for t in (c, a, b)):
        return [np.where(imp.value(c), imp.value(a), imp.value(b))]
    return [elementwise(imp, "Where", [c, a, b])]
