"""Einsum of one or two operands, as Transpose / ReduceSum / Reshape / MatMul.

The labels of ``A,B->out`` (``...`` expanded, implicit outputs as numpy writes them) fall into
batch labels (in A, B and the output), contracted ones (A and B, not the output), free ones of
A or of B (one operand and the output) and summed ones (one operand only, summed first).  A is
brought to ``batch, free A, contracted`` and viewed as ``(batch..., M, K)``, B to ``batch,
contracted, free B`` as ``(batch..., K, N)``; one MatMul (the packed GEMM, batched where both
have batch labels) computes ``(batch..., M, N)``, which holds the output in the permutation
``batch, free A, free B`` of its labels (a Transpose only where a reader needs TF's order).
Keras' ``MultiHeadAttention`` writes ``BTNH,BSNH->BNTS`` and ``BNTS,BSNH->BTNH``: each is
one transposed operand and one batched product.

One operand: a permutation and a ReduceSum.  Not supported: a label repeated within one operand
(a diagonal), more than two operands.
"""

from __future__ import annotations

import numpy as np

from polyml.errors import GraphError
from polyml.frontends.tensorflow.convert import attr, converter
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, Value, compose, norm_perm

LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Operand label strings and the output's, ``...`` replaced by fresh labels."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise GraphError(f"equation {equation!r} names {len(terms)} operands, the node has {len(ranks)}")
    used = set(eq) - set(",->.")
    fresh = [c for c in LETTERS if c not in used]
    ell = max((r - (len(t) - 3) for t, r in zip(terms, ranks) if "..." in t), default=0)
    dots = "".join(fresh[:ell])
    expanded = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            k = r - (len(t) - 3)
            t = t.replace("...", dots[ell - k :] if k else "")
        if len(t) != r:
            raise GraphError(f"equation {equation!r}: operand labels {t!r} for a rank-{r} operand")
        expanded.append(t)
    if arrow:
        out = out.replace("...", dots)
    else:
        labels = "".join(expanded)
        out = dots + "".join(sorted(c for c in set(labels) if labels.count(c) == 1 and c not in dots))
    for t in expanded:
        if len(set(t)) != len(t):
            raise Unsupported(f"equation {equation!r}: a label repeated within one operand (a diagonal)")
    if len(set(out)) != len(out) or any(c not in "".join(expanded) for c in out):
        raise GraphError(f"equation {equation!r}: bad output labels {out!r}")
    return expanded, out


def _prod(vals) -> int:
    return int(np.prod(list(vals), dtype=np.int64))


class Operand:
    """An Einsum operand being brought into shape: TF tensor ``t`` with labels ``labels``."""

    def __init__(self, imp: TFValues, t: str, labels: str, n):
        self.imp, self.t, self.labels, self.n = imp, t, labels, n
        self.sizes = dict(zip(labels, imp.tf_shape(t)))

    def sum_out(self, keep: str) -> None:
        """Sum over the labels not in ``keep``."""
        gone = [c for c in self.labels if c not in keep]
        if not gone:
            return
        imp = self.imp
        axes = [self.labels.index(c) for c in gone]
        if imp.is_const(self.t):
            v = np.sum(imp.value(self.t), axis=tuple(axes)).astype(imp.value(self.t).dtype)
            key = f"{self.n.name}#{self.t}#sum"
            imp.vals[key] = v
        else:
            y = imp.emit("ReduceSum", [imp.ir(self.t, None)], {"axes": axes, "keepdims": 0}, what="sum")
            key = y
            imp.vals[key] = Val(y)
        self.t = key
        self.labels = "".join(c for c in self.labels if c in keep)

    def arranged(self, order: str, shape: list[int]) -> str:
        """The IR tensor of the operand with its labels in ``order``, viewed as ``shape``."""
        imp = self.imp
        perm = [self.labels.index(c) for c in order]
        if imp.is_const(self.t):
            arr = np.transpose(imp.value(self.t), perm).reshape(shape)
            return imp.const(np.ascontiguousarray(arr), f"{self.t}#einsum")
        name = imp.ir(self.t, norm_perm(perm))
        if tuple(imp.types[name].shape) != tuple(shape):
            name = imp.emit("Reshape", [name, imp.const(np.array(shape, np.int64), "shape")], what="view")
        return name


@converter("Einsum")
def _einsum(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    equation = attr(n, "equation", "")
    if isinstance(equation, bytes):
        equation = equation.decode()
    if len(ts) not in (1, 2):
        raise Unsupported(f"Einsum of {len(ts)} operands (1 or 2 are supported)")
    terms, out = parse(equation, [len(imp.tf_shape(t)) for t in ts])
    if all(imp.is_const(t) for t in ts):
        return [np.asarray(np.einsum(f"{','.join(terms)}->{out}", *[imp.value(t) for t in ts]))]
    if len(ts) == 1:  # a sum and a permutation (absorbed into the layout, as a TF Transpose)
        a = Operand(imp, ts[0], terms[0], n)
        a.sum_out(out)
        v = imp.vals[a.t]
        rank = len(out)
        q = [a.labels.index(c) for c in out]
        qinv = [q.index(i) for i in range(rank)]
        return [Val(v.name, norm_perm([qinv[d] for d in compose(v.perm, rank)]))]
    a, b = Operand(imp, ts[0], terms[0], n), Operand(imp, ts[1], terms[1], n)
    a.sum_out(out + b.labels)
    b.sum_out(out + a.labels)
    batch = [c for c in out if c in a.labels and c in b.labels]
    contracted = [c for c in a.labels if c in b.labels and c not in out]
    free_a = [c for c in out if c in a.labels and c not in b.labels]
    free_b = [c for c in out if c in b.labels and c not in a.labels]
    for c in batch + contracted:
        if a.sizes[c] != b.sizes[c] and 1 not in (a.sizes[c], b.sizes[c]):
            raise GraphError(f"equation {equation!r}: label {c!r} is {a.sizes[c]} in one operand, {b.sizes[c]} in the other")
        if c in contracted and a.sizes[c] != b.sizes[c]:
            raise Unsupported(f"equation {equation!r}: contracted label {c!r} broadcast ({a.sizes[c]} vs {b.sizes[c]})")
    k = _prod(a.sizes[c] for c in contracted)
    m = _prod(a.sizes[c] for c in free_a)
    nn = _prod(b.sizes[c] for c in free_b)
    xa = a.arranged("".join(batch + free_a + contracted), [a.sizes[c] for c in batch] + [m, k])
    xb = b.arranged("".join(batch + contracted + free_b), [b.sizes[c] for c in batch] + [k, nn])
    labels = "".join(batch + free_a + free_b)
    shape = [max(a.sizes[c], b.sizes[c]) for c in batch] + [a.sizes[c] for c in free_a] + [b.sizes[c] for c in free_b]
    perm = norm_perm([out.index(c) for c in labels])
    flat = [max(a.sizes[c], b.sizes[c]) for c in batch] + [m, nn]
    if flat == shape:
        return [Val(imp.emit("MatMul", [xa, xb], main=True, perm=perm), perm)]
    y = imp.emit("MatMul", [xa, xb], what="matmul")
    return [Val(imp.emit("Reshape", [y, imp.const(np.array(shape, np.int64), "shape")], main=True, perm=perm), perm)]
