"""Elementwise ops: unary activations and math, broadcasting binary ops (BiasAdd included), AddN.

Each works in the layout of its highest-rank operand computed at run time (constants are permuted
at compile time to match) and is evaluated with numpy where all its inputs are constants.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from polyml.errors import ShapeError
from polyml.frontends.tensorflow.convert import attr, converter
from polyml.frontends.tensorflow.values import TFValues, Val, Value, tag

#: TF op → (IR op, None where the converter writes it with other ops; numpy for constant inputs)
UNARY: dict[str, tuple[str | None, Callable[[np.ndarray], np.ndarray]]] = {
    "Relu": ("Relu", lambda x: np.maximum(x, 0)),
    "Sigmoid": ("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    "Tanh": ("Tanh", np.tanh),
    "Sqrt": ("Sqrt", np.sqrt),
    "Exp": ("Exp", np.exp),
    "Neg": ("Neg", np.negative),
    "Abs": ("Abs", np.abs),
    "Reciprocal": ("Reciprocal", lambda x: 1 / x),
    "Inv": ("Reciprocal", lambda x: 1 / x),
    "Rsqrt": (None, lambda x: 1 / np.sqrt(x)),
    "Square": (None, lambda x: x * x),
    "Relu6": (None, lambda x: np.clip(x, 0, 6)),
    "LeakyRelu": (None, None),
    "Log": ("Log", np.log),
    "Floor": ("Floor", np.floor),
    "Ceil": ("Ceil", np.ceil),
    "Round": ("Round", np.round),  # half to even, as TensorFlow and ONNX round
    "Sign": ("Sign", np.sign),
    "Sin": ("Sin", np.sin),
    "Cos": ("Cos", np.cos),
    "Softplus": ("Softplus", lambda x: np.logaddexp(0, x)),
    "Softsign": ("Softsign", lambda x: x / (1 + np.abs(x))),
    "Elu": ("Elu", lambda x: np.where(x > 0, x, np.expm1(x))),
    "Selu": ("Selu", lambda x: 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x))),
}

#: TF op → (IR op, numpy for constant inputs); all broadcast as numpy does
BINARY: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "Add": ("Add", np.add),
    "AddV2": ("Add", np.add),
    "BiasAdd": ("Add", np.add),
    "BiasAddV1": ("Add", np.add),
    "Sub": ("Sub", np.subtract),
    "Mul": ("Mul", np.multiply),
    "RealDiv": ("Div", np.true_divide),
    "Div": ("Div", lambda a, b: np.floor_divide(a, b) if np.issubdtype(a.dtype, np.integer) else np.true_divide(a, b)),
    "Maximum": ("Max", np.maximum),
    "Minimum": ("Min", np.minimum),
    "Pow": ("Pow", np.power),
    "SquaredDifference": ("Sub", lambda a, b: np.square(a - b)),
}


def _same_dtype(x: np.ndarray, r) -> np.ndarray:
    r = np.asarray(r)
    return r.astype(x.dtype) if r.dtype != x.dtype and x.dtype.kind == r.dtype.kind == "f" else r


def elementwise(imp: TFValues, op: str, ts: list[str], attrs: dict | None = None, *, main: bool = True) -> Val:
    """An n-ary broadcasting op in the layout of its highest-rank non-constant operand (the IR op
    ``op`` on TF tensors ``ts``; ``main``: it computes the TF node's output 0)."""
    rank = max(len(imp.tf_shape(t)) for t in ts)
    live = [t for t in ts if not imp.is_const(t)]
    target = next((imp.vals[t].perm for t in live if len(imp.tf_shape(t)) == rank and imp.vals[t].perm), None)
    names = []
    for t in ts:
        shape = imp.tf_shape(t)
        if imp.is_const(t):
            if target is None:
                names.append(imp.ir(t, None))
            else:
                full = imp.value(t).reshape((1,) * (rank - len(shape)) + shape)
                names.append(imp.const(np.transpose(full, target), f"{t}#{tag(target)}"))
        elif len(shape) == rank or target is None:
            names.append(imp.ir(t, target))
        else:
            flat = imp.tf_order(t)
            shaped = imp.emit("Reshape", [flat, imp.const(np.array((1,) * (rank - len(shape)) + shape, np.int64), "shape")],
                              what="rank")
            key = f"{t}#rank{rank}"
            imp.vals[key] = Val(shaped)
            names.append(imp.ir(key, target))
    return Val(imp.emit(op, names, attrs, main=main, perm=target), target)


@converter(*UNARY)
def _unary(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    op, fn = UNARY[n.op]
    x = ts[0]
    if n.op == "LeakyRelu":
        alpha = float(attr(n, "alpha", 0.2))
        if imp.is_const(x):
            v = imp.value(x)
            return [np.where(v >= 0, v, v * np.float32(alpha)).astype(v.dtype)]
        return [elementwise(imp, "LeakyRelu", [x], {"alpha": alpha})]
    if imp.is_const(x):
        v = imp.value(x)
        with np.errstate(all="ignore"):
            return [_same_dtype(v, fn(v))]
    if n.op == "Relu6":
        return [elementwise(imp, "Clip", [x], {"min": 0.0, "max": 6.0})]
    if n.op == "Rsqrt":
        key = f"{n.name}#sqrt"
        imp.vals[key] = elementwise(imp, "Sqrt", [x], main=False)
        return [elementwise(imp, "Reciprocal", [key])]
    if n.op == "Square":
        return [elementwise(imp, "Mul", [x, x])]
    return [elementwise(imp, op, [x])]


def _is_identity_factor(imp: TFValues, one: str, other: str) -> bool:
    """``one`` is a constant of ones that, multiplied into ``other``, changes neither its shape nor its dtype."""
    if not imp.is_const(one) or imp.is_const(other):
        return False
    v = imp.value(one)
    shape = imp.tf_shape(other)
    return (v.dtype.name == imp.dtype(other) and v.ndim <= len(shape) and bool(np.all(v == 1))
            and all(d == 1 or d == s for d, s in zip(v.shape[::-1], shape[::-1])))


@converter(*BINARY)
def _binary(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    op, fn = BINARY[n.op]
    a, b = ts[:2]
    if n.op.startswith("BiasAdd"):
        fmt = attr(n, "data_format", "NHWC")
        rank = len(imp.tf_shape(a))
        if len(imp.tf_shape(b)) != 1:
            raise ShapeError(f"bias of shape {list(imp.tf_shape(b))} is not a vector")
        if fmt.startswith("NC") and rank > 2:
            if imp.is_const(b):
                imp.vals[f"{b}#bias"] = imp.value(b).reshape((-1,) + (1,) * (rank - 2))
            else:
                shaped = imp.emit("Reshape", [imp.ir(b), imp.const(np.array([-1] + [1] * (rank - 2), np.int64), "shape")],
                                  what="bias")
                imp.vals[f"{b}#bias"] = Val(shaped)
            b = f"{b}#bias"
    if imp.is_const(a) and imp.is_const(b):
        x, y = imp.value(a), imp.value(b)
        with np.errstate(all="ignore"):
            return [_same_dtype(x, fn(x, y))]
    if n.op == "Mul":  # x * 1 is x (Keras' swish multiplies by beta = 1 first)
        for one, other in ((a, b), (b, a)):
            if _is_identity_factor(imp, one, other):
                return [imp.vals[other]]
    if n.op == "SquaredDifference":
        key = f"{n.name}#diff"
        imp.vals[key] = elementwise(imp, "Sub", [a, b], main=False)
        return [elementwise(imp, "Mul", [key, key])]
    return [elementwise(imp, op, [a, b])]


@converter("AddN")
def _addn(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    if all(imp.is_const(t) for t in ts):
        return [np.sum([imp.value(t) for t in ts], axis=0).astype(imp.value(ts[0]).dtype)]
    return [elementwise(imp, "Sum", ts)]
