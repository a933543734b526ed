"""ArgMax and ArgMin: the int64 index of the first (``select_last_index``: last) extreme
element along ``axis``; ``keepdims`` (default 1) keeps the axis as a 1.

The input is viewed as (outer, D, inner) and split into independent rows as Softmax's
(:class:`polyml.kernels.norm.AxisRows`: one parallel loop over rows when large).  Per row, two
vectorizable reductions instead of one (value, index) recurrence, which LLVM does not vectorize:

1. ``m[r, i] = max_d x[r, d, i]`` (min for ArgMin);
2. ``y[r, i] = min {d : x[r, d, i] = m[r, i]}`` — an integer min over ``select(x = m, d, D)``
   (``select_last_index``: max over ``select(x = m, d, -1)``).

Float32, int32 and int64 inputs (compared signed).
"""

from __future__ import annotations

import math

from polyml.codegen.builder import KernelBuilder
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, normalize_axis, register
from polyml.kernels._scalar import NUMERIC
from polyml.kernels.matmul import view
from polyml.kernels.norm import AxisRows
from polyml.kernels.reduce import vmax, vmin


def _dims(node: Node, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(axis, outer, D, inner)."""
    axis = normalize_axis(node, int(node.attrs.get("axis", 0)), len(shape))
    return axis, math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


@register
class ArgExtreme(Kernel):
    """ArgMax / ArgMin along one axis."""

    op_types = ("ArgMax", "ArgMin")
    polly = "off"
    dtypes = NUMERIC

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        why = super().supports(node, ins)
        if why:
            return why
        if ins[0].type.size == 0:
            return "ArgMax/ArgMin of an empty tensor"
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        if not shape:
            raise ShapeError(f"{node.op_type} node {node.label!r}: the input is a scalar")
        axis, *_ = _dims(node, shape)
        if node.attrs.get("keepdims", 1):
            out = tuple(1 if d == axis else n for d, n in enumerate(shape))
        else:
            out = tuple(n for d, n in enumerate(shape) if d != axis)
        return [TensorType(out, "int64")]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """Each row's extreme value."""
        _, outer, _, inner = _dims(node, ins[0].type.shape)
        return [TensorType((outer * inner,), ins[0].type.dtype)]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        _, outer, d, inner = _dims(node, ins[0].type.shape)
        return f"{outer}x{d}x{inner}"

    def lower(self, k: KernelBuilder) -> None:
        x = k.inputs[0]
        _, outer, d, inner = _dims(k.node, x.shape)
        rows = AxisRows.make(outer, d, inner)
        dt = x.type.dtype
        xv = view(k, x, rows.shape)
        yv = view(k, k.outputs[0], rows.scratch)
        m = view(k, k.temps[0], rows.scratch)
        last = bool(k.attr("select_last_index", 0))
        with rows.loop(k) as (r,):
            rows.row_max(k, xv, m, r, dt, vmax if k.node.op_type == "ArgMax" else vmin)
            rows.first_index(k, xv, m, yv, r, last)
