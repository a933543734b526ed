"""Prefix sums: CumSum along a constant axis (``exclusive``, ``reverse``).

A cumulative sum is a first-order recurrence along the axis, computed in the output buffer (the
form Polly models: the dependence is carried by memory, distance 1 along the axis loop):

1. the boundary slice, ``a = a0`` (0, or ``n - 1`` for ``reverse``): ``y[.., a0, ..] = x[.., a0, ..]``
   (``exclusive``: 0);
2. one nest over the rest with the axis loop ``s ∈ [1, n)`` at its own depth, so only it is
   sequential (the outer dims are parallel, the inner ones vectorize):
   ``y[.., a, ..] = y[.., p, ..] + x[.., a, ..]`` (``exclusive``: ``+ x[.., p, ..]``) with
   ``a = s, p = s - 1``, or ``a = n - 1 - s, p = n - s`` when ``reverse`` — all affine.

Additions are in the data's dtype in the recurrence's order (no reassociation), as onnxruntime's.
"""

from __future__ import annotations

from polyml.codegen.builder import KernelBuilder, constant, is_float
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, const_ints, normalize_axis, register
from polyml.kernels._scalar import PARALLEL_MIN_ELEMENTS, outer_parallel_dims
from polyml.kernels.conv import affine


@register
class CumSum(Kernel):
    """CumSum of float32, int32 or int64 data; the axis (int32/int64 scalar) must be a constant."""

    op_types = ("CumSum",)
    polly = "off"  # a streaming recurrence: nothing for Polly to tile
    static_inputs = (1,)
    dtypes = frozenset({"float32", "int32", "int64"})

    @staticmethod
    def axis(node: Node, ins: list[Operand | None]) -> int:
        rank = len(ins[0].type.shape)
        if rank == 0:
            raise ShapeError(f"CumSum node {node.label!r}: the input is a scalar (rank ≥ 1 is required)")
        if len(ins) < 2 or ins[1] is None:
            raise ShapeError(f"CumSum node {node.label!r}: the axis input is required")
        axis = const_ints(node, ins[1], "axis")
        if len(axis) != 1:
            raise ShapeError(f"CumSum node {node.label!r}: axis must be a scalar, got {len(axis)} values")
        return normalize_axis(node, axis[0], rank)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        self.axis(node, ins)
        return [ins[0].type]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        flags = [f for f in ("exclusive", "reverse") if node.attrs.get(f, 0)]
        return f"axis {self.axis(node, ins)}" + "".join(f", {f}" for f in flags)

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        if not y.type.size:
            return
        ins = [Operand("", t, v) if t is not None else None for t, v in zip(k.in_types, k.values)]
        axis = self.axis(k.node, ins)
        exclusive, reverse = bool(k.attr("exclusive", 0)), bool(k.attr("reverse", 0))
        dtype = y.type.dtype
        n = y.shape[axis]
        a0 = n - 1 if reverse else 0

        # 1. the boundary slice
        first = [(a0, a0 + 1) if d == axis else e for d, e in enumerate(y.shape)]
        slice_shape = tuple(1 if d == axis else e for d, e in enumerate(y.shape))
        with k.loops(first, names=[f"b{d}" for d in range(y.rank)], parallel=outer_parallel_dims(slice_shape)) as ix:
            y.store(ix, constant(dtype, 0) if exclusive else x.load(ix))
        if n == 1:
            return

        # 2. the recurrence: dims before the axis carry no dependence
        rest = [(1, n) if d == axis else e for d, e in enumerate(y.shape)]
        par = axis if y.type.size >= PARALLEL_MIN_ELEMENTS else 0
        with k.loops(rest, names=[f"s{d}" if d == axis else f"c{d}" for d in range(y.rank)], parallel=par) as ix:
            s = ix[axis]
            a = affine(k, [(-1, s)], n - 1) if reverse else s
            p = affine(k, [(-1, s)], n) if reverse else affine(k, [(1, s)], -1)
            at, prev = list(ix), list(ix)
            at[axis], prev[axis] = a, p
            term = x.load(prev if exclusive else at)
            acc = y.load(prev)
            y.store(at, k.b.fadd(acc, term) if is_float(dtype) else k.b.add(acc, term))
