"""Matching the TF subgraph that computes a tensor, backwards from a node (for ``@pattern``
converters: GELU written with Erfc, ...).

A pattern is a small expression tree:

``"x"`` (a str)
    a variable: any tensor computed at run time; a second occurrence of the same variable must
    be the same TF tensor (looking through Identity, StopGradient, IdentityN, ...);
``"$w"`` (a str starting with ``$``)
    a variable bound to any compile-time constant (again: the same TF tensor);
a float
    a compile-time constant of one element with that value (relative tolerance 1e-6);
``("Op", p, ...)`` / ``("Op|Op2", p, ...)``
    output 0 of a node of that op type whose data inputs match ``p, ...`` (both orders for the
    commutative binary ops Add, AddV2, Mul).

:func:`match` returns the bound variables (TF tensor names) or None.
"""

from __future__ import annotations

import numpy as np

from polyml.frontends.tensorflow.convert.identity import PASS_THROUGH
from polyml.frontends.tensorflow.values import TFValues, split_name, tensor_name

COMMUTATIVE = {"Add", "AddV2", "Mul"}
Pattern = str | float | tuple


def data_inputs(node) -> list[str]:
    return [tensor_name(t) for t in node.input if not t.startswith("^")]


def source(imp: TFValues, t: str) -> tuple[object | None, str]:
    """(NodeDef computing ``t``, canonical tensor name), through pass-through ops and IdentityN."""
    while True:
        base, k = split_name(t)
        node = imp.by_name.get(base)
        if node is None:
            return None, t
        ins = data_inputs(node)
        if node.op in PASS_THROUGH and k == 0 and ins:
            t = ins[0]
        elif node.op == "IdentityN" and k < len(ins):
            t = ins[k]
        else:
            return node, tensor_name(t)


def scalar(imp: TFValues, t: str) -> float | None:
    """The value of ``t`` if it is a one-element constant."""
    v = imp.vals.get(t)
    if isinstance(v, np.ndarray) and v.size == 1 and v.dtype.kind == "f":
        return float(v.reshape(-1)[0])
    return None


def match(imp: TFValues, t: str, pat: Pattern, env: dict[str, str] | None = None) -> dict[str, str] | None:
    env = {} if env is None else env
    if isinstance(pat, str) and pat.startswith("$"):
        if t not in imp.vals or not imp.is_const(t):
            return None
        if pat in env:
            return env if source(imp, env[pat])[1] == source(imp, t)[1] else None
        return {**env, pat: t}
    if isinstance(pat, str):
        if t not in imp.vals or imp.is_const(t):
            return None
        src = source(imp, t)[1]
        if pat in env:
            return env if source(imp, env[pat])[1] == src else None
        return {**env, pat: t}
    if isinstance(pat, float):
        v = scalar(imp, t)
        return env if v is not None and abs(v - pat) <= 1e-6 * max(abs(pat), 1e-30) else None
    ops, *args = pat
    node, name = source(imp, t)
    if node is None or node.op not in ops.split("|") or split_name(name)[1] != 0:
        return None
    ins = data_inputs(node)
    if len(ins) != len(args):
        return None
    orders = [ins, ins[::-1]] if node.op in COMMUTATIVE and len(ins) == 2 else [ins]
    for order in orders:
        e = env
        for i, p in zip(order, args):
            e = match(imp, i, p, e)
            if e is None:
                break
        else:
            return e
    return None
