"""Broadcasting copies: Expand (to a constant shape) and Tile (by constant repeats).

Both are one affine copy statement per output element:

* Expand — one nest over the output, ``y[i] = x[bcast(i)]`` (numpy broadcasting: trailing
  dimensions aligned, index 0 along the input's size-1 dims; the target shape may have a lower
  rank or 1s where the input is larger, the result is the broadcast of both);
* Tile — each output dimension ``d`` of size ``r_d·n_d`` is strip-mined into a repeat loop
  ``t_d`` and a point loop ``j_d``, so ``y[.., t_d·n_d + j_d, ..] = x[.., j_d, ..]``: an affine
  access with no modulo, the loops ordered ``t_0, j_0, t_1, j_1, ...`` so writes are row-major.

They move elements of any dtype the code generator knows (float32, int64, int32, bool).
"""

from __future__ import annotations

from polyml.codegen.builder import LLVM_TYPES, KernelBuilder
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, broadcast_shapes, const_ints, register
from polyml.kernels._scalar import outer_parallel_dims
from polyml.kernels.conv import affine


def movable(op: Operand | None, i: int) -> str | None:
    """Why input ``i`` cannot be moved by generated code (a dtype with no LLVM type), or None."""
    if op is not None and op.type.dtype not in LLVM_TYPES:
        return f"input {i} ({op.name!r}) is {op.type.dtype}; supported dtypes are {', '.join(LLVM_TYPES)}"
    return None


@register
class Expand(Kernel):
    """Expand with a constant target shape (bidirectional numpy broadcasting)."""

    op_types = ("Expand",)
    polly = "off"  # a streaming copy, as the other movement ops
    static_inputs = (1,)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return movable(ins[0], 0)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        if len(ins) < 2 or ins[1] is None:
            raise ShapeError(f"Expand node {node.label!r}: the shape input is required")
        target = const_ints(node, ins[1], "the target shape")
        if any(d < 0 for d in target):
            raise ShapeError(f"Expand node {node.label!r}: negative dimension in the target shape {target}")
        shape = broadcast_shapes(node, ins[0].type.shape, tuple(target))
        return [TensorType(shape, ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, out = k.inputs[0], k.outputs[0]
        if not out.type.size:
            return
        with k.loops(out.shape, names=[f"e{d}" for d in range(out.rank)], parallel=outer_parallel_dims(out.shape)) as ix:
            out.store(ix, x.load(x.broadcast_index(ix)))


@register
class Tile(Kernel):
    """Tile by constant repeats (one per input dimension, each ≥ 0)."""

    op_types = ("Tile",)
    polly = "off"
    static_inputs = (1,)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return movable(ins[0], 0)

    @staticmethod
    def repeats(node: Node, ins: list[Operand | None]) -> list[int]:
        if len(ins) < 2 or ins[1] is None:
            raise ShapeError(f"Tile node {node.label!r}: the repeats input is required")
        reps = const_ints(node, ins[1], "repeats")
        rank = len(ins[0].type.shape)
        if len(reps) != rank:
            raise ShapeError(f"Tile node {node.label!r}: {len(reps)} repeats {reps} for an input of rank {rank}")
        if any(r < 0 for r in reps):
            raise ShapeError(f"Tile node {node.label!r}: negative repeats {reps}")
        return reps

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        reps = self.repeats(node, ins)
        return [TensorType(tuple(n * r for n, r in zip(ins[0].type.shape, reps)), ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, out = k.inputs[0], k.outputs[0]
        if not out.type.size:
            return
        reps = [n // m for n, m in zip(out.shape, x.shape)]
        extents: list[int] = []
        names: list[str] = []
        for d, (r, n) in enumerate(zip(reps, x.shape)):
            extents += [r, n]
            names += [f"t{d}", f"j{d}"]
        with k.loops(extents, names=names, parallel=outer_parallel_dims(tuple(extents))) as ivs:
            src = ivs[1::2]
            dst = [affine(k, [(n, t), (1, j)]) for n, t, j in zip(x.shape, ivs[0::2], src)]
            out.store(dst, x.load(src))
