"""TF op converters: one module per op family, each registering functions by TF op name.

A converter is called once per TF node the outputs depend on, in topological order::

    @converter("Relu", "Tanh")
    def _unary(imp: TFValues, n: NodeDef, ts: list[str]) -> list[Value | None]:
        ...

``ts`` are the node's data inputs as canonical TF tensor names (``X`` for ``X:0``, ``X:k``;
control inputs dropped); ``imp.vals[t]`` is each one's value so far: a numpy array (a constant,
folded at import) or a :class:`~polyml.frontends.tensorflow.values.Val` (an IR tensor and the
permutation holding the TF tensor in it).  The converter returns the values of the node's
outputs 0, 1, ... (None for outputs it does not compute), emitting IR nodes with ``imp.emit``
(shape-inferred by their kernels) and reading operands in the layout it needs with ``imp.ir``
or ``imp.tf_order``.  It raises :class:`~polyml.frontends.tensorflow.values.Unsupported` for
a node polyml cannot lower (the importer collects these and reports them all at once, with TF
node names) and ``PolymlError``s (``ShapeError``, ``GraphError``) for a malformed graph.  ``imp``
is the :class:`~polyml.frontends.tensorflow.values.TFValues` of the translation (converters
import :mod:`~polyml.frontends.tensorflow.values`, never the importer that drives them).

A *pattern* is tried before the converter of its op type: registered with ``@pattern("Mul")``,
it looks back from the node over the NodeDefs that compute its inputs (``_match.py``) and returns
the node's output values where the subgraph ending there is one op polyml has (``0.5 * x *
erfc(-x / √2)`` → ``Gelu``), None otherwise.  The IR nodes already emitted for the subgraph's
inner nodes are pruned when nothing else reads them.

Every module in this package is imported on first use, so adding a file adds its ops.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING

from polyml.errors import GraphError
from polyml.frontends.tensorflow.loader import attr_value

if TYPE_CHECKING:
    from polyml.frontends.tensorflow.values import TFValues, Value

Converter = Callable[["TFValues", object, list[str]], "list[Value | None]"]
CONVERTERS: dict[str, Converter] = {}
#: TF op type → patterns tried, in registration order, before its converter
PATTERNS: dict[str, list[Converter]] = {}
_loaded = False


def converter(*ops: str):
    """Function decorator: register ``fn`` as the converter of each TF op type in ``ops``."""

    def wrap(fn: Converter) -> Converter:
        for op in ops:
            if op in CONVERTERS:
                raise RuntimeError(f"TF op {op} registered twice ({CONVERTERS[op].__module__}.{CONVERTERS[op].__name__}, "
                                   f"{fn.__module__}.{fn.__name__})")
            CONVERTERS[op] = fn
        return fn

    return wrap


def pattern(*ops: str):
    """Function decorator: try ``fn`` before the converter of each TF op type in ``ops``; it
    returns the node's output values, or None where its subgraph does not match."""

    def wrap(fn: Converter) -> Converter:
        for op in ops:
            PATTERNS.setdefault(op, []).append(fn)
        return fn

    return wrap


def patterns() -> dict[str, list[Converter]]:
    """All patterns by TF op type (after importing every module, as :func:`registry`)."""
    registry()
    return PATTERNS


def registry() -> dict[str, Converter]:
    """All converters by TF op type (imports every module of this package once)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in pkgutil.iter_modules(__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")
    return CONVERTERS


# -- helpers shared by converters ---------------------------------------------------------------

def attr(n, name: str, default=None):
    """Attribute ``name`` of NodeDef ``n`` as a Python value (``default`` where absent)."""
    return attr_value(n.attr[name]) if name in n.attr else default


def norm_axis(axis: int, rank: int, n) -> int:
    if not -rank <= axis < max(rank, 1):
        raise GraphError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0
