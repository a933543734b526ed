"""Erf, Erfc (``1 - erf``) and the GELU subgraphs TensorFlow writes, matched into one ``Gelu``.

``tf.nn.gelu`` (Keras' ``activation="gelu"``) freezes to ``0.5 * x * erfc(-x * 0.7071…)``, its
``approximate=True`` form to ``0.5 * x * (1 + tanh(0.7978… * (x + 0.044715 * x**3)))``; the erf
form ``0.5 * x * (1 + erf(x * 0.7071…))`` (or ``x / 1.4142…``) is matched too.  Each becomes the
``Gelu`` op (``approximate`` ``"none"`` / ``"tanh"``), one nest instead of five to seven.
"""

from __future__ import annotations

import math

import numpy as np

from polyml.frontends.tensorflow.convert import converter, pattern
from polyml.frontends.tensorflow.convert._match import match
from polyml.frontends.tensorflow.convert.elementwise import elementwise
from polyml.frontends.tensorflow.values import TFValues, Value

SQRT1_2 = 1 / math.sqrt(2.0)
SQRT2 = math.sqrt(2.0)
SQRT_2_PI = math.sqrt(2.0 / math.pi)

HALF_X = ("Mul", 0.5, "x")
ADD = "Add|AddV2"
#: (pattern of the final Mul, Gelu's ``approximate``)
GELU_PATTERNS = [
    (("Mul", HALF_X, ("Erfc", ("Mul", ("Neg", "x"), SQRT1_2))), "none"),
    (("Mul", HALF_X, ("Erfc", ("Mul", "x", -SQRT1_2))), "none"),
    (("Mul", HALF_X, (ADD, 1.0, ("Erf", ("Mul", "x", SQRT1_2)))), "none"),
    (("Mul", HALF_X, (ADD, 1.0, ("Erf", ("RealDiv", "x", SQRT2)))), "none"),
    (("Mul", HALF_X, (ADD, 1.0, ("Tanh", ("Mul", SQRT_2_PI, (ADD, "x", ("Mul", 0.044715, ("Pow", "x", 3.0))))))), "tanh"),
]

_erf = np.vectorize(math.erf, otypes=[np.float64])


@converter("Erf", "Erfc")
def _erf_op(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    if imp.is_const(x):
        v = imp.value(x)
        r = _erf(v)
        return [np.asarray(r if n.op == "Erf" else 1.0 - r).astype(v.dtype)]
    if n.op == "Erf":
        return [elementwise(imp, "Erf", [x])]
    key = f"{n.name}#erf"
    imp.vals[key] = elementwise(imp, "Erf", [x], main=False)
    one = f"{n.name}#one"
    imp.vals[one] = np.ones((), np.dtype(imp.dtype(x)))
    return [elementwise(imp, "Sub", [one, key])]


@pattern("Mul")
def _gelu(imp: TFValues, n, ts: list[str]) -> list[Value | None] | None:
    if len(ts) != 2 or imp.dtype(ts[0]) != "float32":
        return None
    for pat, approximate in GELU_PATTERNS:
        env = match(imp, n.name, pat)
        if env is not None:
            return [elementwise(imp, "Gelu", [env["x"]], {"approximate": approximate})]
    return None
