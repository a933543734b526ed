"""Slicing ops on computed data: Slice and Split.

Both are pure copies with affine read accesses, one nest per output:

* Slice — domain ``{o : 0 ≤ o_d < count_d}``, ``out[o] = data[start + step · o]`` (per dimension,
  ``step`` may be negative); ``starts``/``ends``/``axes``/``steps`` are compile-time constants,
  clamped as ONNX specifies, and a dimension may come out empty;
* Split — for output ``j``, domain ``{o}`` over its shape,
  ``out_j[..., o_axis, ...] = data[..., off_j + o_axis, ...]`` (sizes from the ``split`` input
  or attribute, opset 18's ``num_outputs``, or equal parts).

They move bytes of any dtype with an LLVM type (float32, int64, int32, bool).
"""

from __future__ import annotations

from polyml.codegen.builder import Index, KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, const_ints, normalize_axis, register
from polyml.kernels.gather import check_dtypes, names, parallel_dims


def _operands(k: KernelBuilder) -> list[Operand | None]:
    """What ``infer`` saw, rebuilt from the builder (types and constant values)."""
    return [Operand(t, tt, v) if tt is not None else None for t, tt, v in zip(k.node.inputs, k.in_types, k.values)]


def _affine(k: KernelBuilder, i: Index, scale: int, offset: int) -> Index:
    """``offset + scale · i`` (folded when ``i`` is a constant)."""
    if isinstance(i, int):
        return offset + scale * i
    v = i if scale == 1 else k.b.mul(i, k.i64(scale), flags=["nsw"])
    return k.b.add(v, k.i64(offset), flags=["nsw"]) if offset else v


@register
class Slice(Kernel):
    """Slice: starts/ends/axes/steps from constant inputs (opset ≥ 10) or attributes (before)."""

    op_types = ("Slice",)
    static_inputs = (1, 2, 3, 4)
    polly = "off"  # copies: -O3 vectorizes the unit-stride ones

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return check_dtypes(ins, (0,), ())

    @staticmethod
    def plan(node: Node, ins: list[Operand | None]) -> list[tuple[int, int, int]]:
        """Per data dimension ``(start, step, count)``: element ``o`` is read at ``start + step·o``."""
        shape = ins[0].type.shape
        rank = len(shape)

        def operand(i: int, what: str) -> list[int] | None:
            if len(ins) > i and ins[i] is not None:
                return const_ints(node, ins[i], what)
            return None

        if node.opset < 10 and len(ins) == 1:
            starts = [int(v) for v in node.attrs.get("starts", [])]
            ends = [int(v) for v in node.attrs.get("ends", [])]
            axes = node.attrs.get("axes")
            axes = [int(a) for a in axes] if axes is not None else None
            steps = None
        else:
            starts, ends = operand(1, "starts"), operand(2, "ends")
            if starts is None or ends is None:
                raise GraphError(f"Slice node {node.label!r}: the starts and ends inputs are required")
            axes, steps = operand(3, "axes"), operand(4, "steps")
        if len(starts) != len(ends):
            raise ShapeError(f"Slice node {node.label!r}: {len(starts)} starts for {len(ends)} ends")
        axes = list(range(len(starts))) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        if len(axes) != len(starts) or len(steps) != len(starts):
            raise ShapeError(f"Slice node {node.label!r}: starts, ends, axes and steps have lengths "
                             f"{len(starts)}, {len(ends)}, {len(axes)}, {len(steps)}")
        axes = [normalize_axis(node, a, rank) for a in axes]
        if len(set(axes)) != len(axes):
            raise GraphError(f"Slice node {node.label!r}: repeated axes {axes}")
        plan = [(0, 1, d) for d in shape]
        for a, start, end, step in zip(axes, starts, ends, steps):
            dim = shape[a]
            if step == 0:
                raise GraphError(f"Slice node {node.label!r}: step 0 on axis {a}")
            start = start + dim if start < 0 else start
            end = end + dim if end < 0 else end
            if step > 0:
                start, end = min(max(start, 0), dim), min(max(end, 0), dim)
                count = max(0, -(-(end - start) // step))
            else:
                start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
                count = max(0, -(-(start - end) // -step))
            plan[a] = (start if count else 0, step, count if dim else 0)
        return plan

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        return [TensorType(tuple(c for _, _, c in self.plan(node, ins)), ins[0].type.dtype)]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        parts = [f"{s}:{s + p * c}:{p}" for s, p, c in self.plan(node, ins)]
        return f"[{', '.join(parts)}]"

    def lower(self, k: KernelBuilder) -> None:
        data, out = k.inputs[0], k.outputs[0]
        if not out.type.size:
            return
        plan = self.plan(k.node, _operands(k))
        with k.loops(out.shape, names=names("o", out.rank), parallel=parallel_dims(out.shape, out.rank)) as ix:
            out.store(ix, data.load([_affine(k, i, step, start) for i, (start, step, _) in zip(ix, plan)]))


@register
class Split(Kernel):
    """Split along ``axis`` into ``split`` sizes (input from opset 13, attribute before),
    ``num_outputs`` chunks (opset 18; the last one smaller), or equal parts."""

    op_types = ("Split",)
    static_inputs = (1,)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return check_dtypes(ins, (0,), ())

    @staticmethod
    def sizes(node: Node, ins: list[Operand | None]) -> tuple[int, list[int]]:
        """``(axis, sizes)``: one size per output."""
        shape = ins[0].type.shape
        axis = normalize_axis(node, int(node.attrs.get("axis", 0)), len(shape))
        dim, n = shape[axis], len(node.outputs)
        if len(ins) > 1 and ins[1] is not None and ins[1].type.size:  # an empty split means none
            split = const_ints(node, ins[1], "split")
        elif node.attrs.get("split") is not None:
            split = [int(s) for s in node.attrs["split"]]
        elif node.attrs.get("num_outputs") is not None:
            parts = int(node.attrs["num_outputs"])
            if parts != n:
                raise GraphError(f"Split node {node.label!r}: num_outputs {parts} but {n} outputs")
            chunk = -(-dim // parts) if parts else 0
            split = [chunk] * (parts - 1) + [dim - chunk * (parts - 1)]
            if split and split[-1] < 0:
                raise ShapeError(f"Split node {node.label!r}: {dim} elements cannot make {parts} chunks of {chunk}")
        else:
            if not n or dim % n:
                raise ShapeError(f"Split node {node.label!r}: axis {axis} of {shape} does not split into {n} equal parts")
            split = [dim // n] * n
        if len(split) != n:
            raise ShapeError(f"Split node {node.label!r}: {len(split)} split sizes for {n} outputs")
        if any(s < 0 for s in split) or sum(split) != dim:
            raise ShapeError(f"Split node {node.label!r}: sizes {split} do not split axis {axis} of {shape}")
        return axis, split

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        axis, split = self.sizes(node, ins)
        return [TensorType((*shape[:axis], s, *shape[axis + 1 :]), ins[0].type.dtype) for s in split]

    def lower(self, k: KernelBuilder) -> None:
        data = k.inputs[0]
        axis, split = self.sizes(k.node, _operands(k))
        outs = iter(k.outputs)
        offset = 0
        for j, (t, size) in enumerate(zip(k.node.outputs, split)):
            out = next(outs) if t else None
            if out is not None and out.type.size:
                with k.loops(out.shape, names=names(f"p{j}_", out.rank), parallel=parallel_dims(out.shape, out.rank)) as ix:
                    src = list(ix)
                    src[axis] = _affine(k, ix[axis], 1, offset)
                    out.store(ix, data.load(src))
            offset += size
