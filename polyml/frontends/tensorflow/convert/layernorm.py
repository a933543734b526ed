"""Keras 3's layer normalization and swish, matched into one op where polyml's kernel registry has
it (``LayerNormalization``, ``Swish`` as ONNX defines them); otherwise their ops convert one by
one (exact: Mean, SquaredDifference, Rsqrt, Mul, Neg, AddV2; Mul, Sigmoid).

Keras 3 (``keras.ops.layer_normalization``, TF backend) writes ``LayerNormalization(axis=-1)`` as

    mean = Mean(x, -1, keep_dims) ; var = Mean(SquaredDifference(x, StopGradient(mean)), -1, keep_dims)
    inv = Rsqrt(var + eps) * gamma ;  y = x * inv + (-mean * inv + beta)

(``* gamma`` without ``scale``, ``+ beta`` without ``center``), and ``activation="swish"`` as
``x * Sigmoid(beta * x)`` with ``beta`` a constant 1 (an IdentityN after it carries the custom
gradient).  ``LayerNormalization`` is emitted only where TF's normalized last axis is also the
IR tensor's last (a transformer's ``(batch, seq, dim)``; not a channels-first-held feature map,
where ONNX's layer normalization would normalize over C, H and W together).
"""

from __future__ import annotations

import numpy as np

from polyml.frontends.tensorflow.convert import attr, pattern
from polyml.frontends.tensorflow.convert._match import match, scalar, source
from polyml.frontends.tensorflow.convert.elementwise import elementwise
from polyml.frontends.tensorflow.values import TFValues, Val, Value, tensor_name

ADD = "Add|AddV2"
_VAR = ("Mean", ("SquaredDifference", "x", "mean"), "$axes")
_INV = ("Rsqrt", (ADD, _VAR, "$eps"))
_INV_SCALED = ("Mul", _INV, "$gamma")
#: the final Add with scale and center, scale only, center only, neither
LAYER_NORMS = [(ADD, ("Mul", "x", inv), (ADD, ("Mul", ("Neg", "mean"), inv), "$beta")) for inv in (_INV_SCALED, _INV)] \
    + [(ADD, ("Mul", "x", inv), ("Mul", ("Neg", "mean"), inv)) for inv in (_INV_SCALED, _INV)]
SWISH = [("Mul", "x", ("Sigmoid", "x")), ("Mul", "x", ("Sigmoid", ("Mul", "$alpha", "x")))]


def _vector(imp: TFValues, t: str, c: int) -> np.ndarray | None:
    """Constant ``t`` as a float32 vector of ``c`` values, if it broadcasts along the last axis only."""
    v = imp.value(t)
    if v.size not in (1, c) or any(d != 1 for d in v.shape[:-1]):
        return None
    return np.broadcast_to(v.reshape(-1), (c,)).astype(np.float32)


@pattern("Add", "AddV2")
def _layer_norm(imp: TFValues, n, ts: list[str]) -> list[Value | None] | None:
    if "LayerNormalization" not in imp.kernels or len(ts) != 2:
        return None
    for pat in LAYER_NORMS:
        env = match(imp, n.name, pat)
        if env is not None:
            break
    else:
        return None
    x = env["x"]
    shape = imp.tf_shape(x)
    rank, c = len(shape), shape[-1] if shape else 0
    v = imp.vals[x]
    if rank < 1 or imp.dtype(x) != "float32" or (v.perm is not None and v.perm[-1] != rank - 1):
        return None
    mean = source(imp, env["mean"])[0]
    if mean is None or mean.op != "Mean" or source(imp, mean.input[0])[1] != source(imp, x)[1]:
        return None
    axes = imp.vals.get(tensor_name(mean.input[1])) if len(mean.input) > 1 else None
    for a in (axes, imp.value(env["$axes"])):
        if not isinstance(a, np.ndarray) or sorted({int(i) % rank for i in a.reshape(-1)}) != [rank - 1]:
            return None
    if not attr(mean, "keep_dims", False):
        return None
    eps = scalar(imp, env["$eps"])
    gamma = _vector(imp, env["$gamma"], c) if "$gamma" in env else np.ones(c, np.float32)
    beta = _vector(imp, env["$beta"], c) if "$beta" in env else np.zeros(c, np.float32)
    if eps is None or gamma is None or beta is None:
        return None
    names = [v.name, imp.const(gamma, f"{n.name}#gamma"), imp.const(beta, f"{n.name}#beta")]
    y = imp.emit("LayerNormalization", names, {"axis": -1, "epsilon": eps}, main=True, perm=v.perm)
    return [Val(y, v.perm)]


@pattern("Mul")
def _swish(imp: TFValues, n, ts: list[str]) -> list[Value | None] | None:
    if "Swish" not in imp.kernels or len(ts) != 2 or imp.dtype(ts[0]) != "float32":
        return None
    for pat in SWISH:
        env = match(imp, n.name, pat)
        if env is None:
            continue
        alpha = scalar(imp, env["$alpha"]) if "$alpha" in env else 1.0
        if alpha is None:
            return None
        return [elementwise(imp, "Swish", [env["x"]], {"alpha": alpha})]
    return None
