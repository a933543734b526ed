"""Reductions over constant axes: ReduceMean, ReduceSum, ReduceMax, ReduceMin.

The axes come from the ``axes`` attribute (opset < 18; ReduceSum from opset 13) or a constant
input; ``keepdims`` (default 1) keeps the reduced dimensions as 1s, and empty axes reduce
everything unless ``noop_with_empty_axes``.  The input is seen with runs of adjacent kept or
reduced dimensions merged (a view: NCHW over (H, W) becomes (N·C, H·W)), then:

1. ``y[k] = x[k, r = 0]`` — the first element of each reduced group (no identity value);
2. ``y[k] op= x[k, r]`` over the whole input in its own row-major order, ``r ≠ 0`` (unit-stride
   reads; reassociation is allowed so a reduction along the innermost dimension vectorizes, and
   one along an outer dimension vectorizes across the kept inner one);
3. ReduceMean: ``y *= 1/count``.

Policy ``off``: a streaming pass, as the other memory-bound kernels.
"""

from __future__ import annotations

import math

import numpy as np
from polyml.kernels import Kernel, Operand, const_ints, normalize_axis, register
from polyml.kernels.matmul import view

from polyml.codegen.builder import REASSOC, KernelBuilder
from polyml.errors import GraphError
from polyml.graph import Node, TensorType


def reduce_axes(node: Node, ins: list[Operand | None]) -> list[int]:
    """The sorted, normalized reduced axes of ``node`` (all axes where none are given)."""
    rank = len(ins[0].type.shape)
    if len(ins) > 1 and ins[1] is not None:
        axes = const_ints(node, ins[1], "axes")
    else:
        axes = [int(a) for a in node.attrs.get("axes", []) or []]
    if not axes:
        return [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    norm = sorted({normalize_axis(node, a, rank) for a in axes})
    if len(norm) != len(axes):
        raise GraphError(f"{node.op_type} node {node.label!r}: repeated axes {axes}")
    return norm


def merged_view(shape: tuple[int, ...], axes: list[int]) -> tuple[list[int], list[bool]]:
    """``shape`` with size-1 dims dropped and adjacent dims of the same role merged:
    (extents, reduced?) per merged dimension."""
    dims: list[int] = []
    roles: list[bool] = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        red = d in axes
        if roles and roles[-1] == red:
            dims[-1] *= n
        else:
            dims.append(n)
            roles.append(red)
    return dims, roles


@register
class Reduce(Kernel):
    """ReduceMean / ReduceSum / ReduceMax / ReduceMin with constant axes."""

    op_types = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
    static_inputs = (1,)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        why = super().supports(node, ins)
        if why:
            return why
        if ins[0].type.size == 0:
            return "reduction of an empty tensor"
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        axes = reduce_axes(node, ins)
        if node.attrs.get("keepdims", 1):
            out = tuple(1 if d in axes else n for d, n in enumerate(shape))
        else:
            out = tuple(n for d, n in enumerate(shape) if d not in axes)
        return [TensorType(out, ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        ins = [Operand("", t, v) if t is not None else None for t, v in zip(k.in_types, k.values)]
        axes = reduce_axes(k.node, ins)
        dims, roles = merged_view(x.shape, axes)
        kept = [n for n, r in zip(dims, roles) if not r]
        xv = view(k, x, dims or [1])
        yv = view(k, y, kept or [1])
        op = k.node.op_type
        count = math.prod(n for n, r in zip(dims, roles) if r)

        def out_index(ix: list) -> list:
            return [i for i, r in zip(ix, roles) if not r] or [0]

        # 1. y[k] = x[k, r = 0]
        with k.loops(kept, names=[f"i{d}" for d in range(len(kept))]) as ks:
            it = iter(ks)
            y0 = [0 if r else next(it) for r in roles] or [0]
            yv.store(out_index(y0) if roles else [0], xv.load(y0))
        if count > 1:
            # 2. y[k] op= x[k, r] for r != 0: the first reduced dim starts at 1 in one nest,
            # the later reduced dims cover everything behind a leading r = 0 in others
            red = [d for d, r in enumerate(roles) if r]
            for j, d0 in enumerate(red):
                extents = []
                for d, n in enumerate(dims):
                    if d in red[:j]:
                        extents.append((0, 1))
                    elif d == d0:
                        extents.append((1, n))
                    else:
                        extents.append(n)
                if any(hi - lo <= 0 for lo, hi in (e if isinstance(e, tuple) else (0, e) for e in extents)):
                    continue
                with k.loops(extents, names=[f"r{d}" for d in range(len(dims))]) as ix:
                    yi = out_index(ix)
                    acc, v = yv.load(yi), xv.load(ix)
                    if op in ("ReduceMean", "ReduceSum"):
                        r = k.b.fadd(acc, v, flags=REASSOC)
                    elif op == "ReduceMax":
                        r = k.maxf(acc, v)
                    else:
                        r = k.minf(acc, v)
                    yv.store(yi, r)
        if op == "ReduceMean" and count > 1:
            with k.loops(kept, names=[f"m{d}" for d in range(len(kept))]) as ks:
                yi = list(ks) or [0]
                yv.store(yi, k.b.fmul(yv.load(yi), k.f32(1.0 / count)))


def reference(op: str, x: np.ndarray, axes: list[int], keepdims: bool) -> np.ndarray:
    """numpy's result of the reduction (for constant folding in the frontends)."""
    fn = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}[op]
    return np.asarray(fn(x, axis=tuple(axes), keepdims=keepdims)).astype(x.dtype)
