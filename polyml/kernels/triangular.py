"""Diagonal masks of matrices: Trilu (keep a triangle) and EyeLike (ones on a diagonal).

Both are one nest over the output whose statement selects on an affine constraint between the
last two indices ``(i, j)`` and the constant diagonal offset ``k``:

* Trilu — ``y[b, i, j] = j - i ≥ k ? x[b, i, j] : 0`` (upper) or ``j - i ≤ k`` (lower), over
  any number of leading batch dimensions ``b``; an offset beyond the matrix keeps all or nothing;
* EyeLike — ``y[i, j] = j - i = k ? 1 : 0`` (the input gives only the shape and default dtype).

The condition depends on the loop counters alone, so the nest stays one SCoP statement (a
``select``, no branch) and vectorizes along ``j``.  Any dtype the code generator knows.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from onnx import helper

from polyml.codegen.builder import LLVM_TYPES, KernelBuilder, constant
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, const_ints, register
from polyml.kernels._scalar import outer_parallel_dims
from polyml.kernels.expand import movable


def diagonal_offset(k: KernelBuilder, i: ir.Value, j: ir.Value) -> ir.Value:
    """``j - i`` as an i64 (the diagonal a position lies on)."""
    return k.b.sub(j, i, flags=["nsw"])


@register
class Trilu(Kernel):
    """Trilu: ``upper`` (default 1) triangle with diagonal offset ``k`` (a constant input, 0 if omitted)."""

    op_types = ("Trilu",)
    polly = "off"  # a streaming masked copy
    static_inputs = (1,)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return movable(ins[0], 0)

    @staticmethod
    def offset(node: Node, ins: list[Operand | None]) -> int:
        if len(ins) < 2 or ins[1] is None:
            return 0
        k = const_ints(node, ins[1], "k")
        if len(k) != 1:
            raise ShapeError(f"Trilu node {node.label!r}: k must be a scalar, got {len(k)} values")
        return k[0]

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        if len(ins[0].type.shape) < 2:
            raise ShapeError(f"Trilu node {node.label!r}: input of shape {ins[0].type.shape} has rank < 2")
        self.offset(node, ins)
        return [ins[0].type]

    def lower(self, k: KernelBuilder) -> None:
        x, out = k.inputs[0], k.outputs[0]
        if not out.type.size:
            return
        ins = [Operand("", t, v) if t is not None else None for t, v in zip(k.in_types, k.values)]
        diag = k.i64(self.offset(k.node, ins))
        upper = bool(k.attr("upper", 1))
        zero = constant(out.type.dtype, 0)
        with k.loops(out.shape, names=[f"t{d}" for d in range(out.rank)], parallel=outer_parallel_dims(out.shape)) as ix:
            off = diagonal_offset(k, ix[-2], ix[-1])
            keep = k.b.icmp_signed(">=" if upper else "<=", off, diag)
            out.store(ix, k.b.select(keep, x.load(ix), zero))


@register
class EyeLike(Kernel):
    """EyeLike: a 2-D tensor of the input's shape, ones on diagonal ``k``, of ``dtype`` (default:
    the input's)."""

    op_types = ("EyeLike",)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        why = movable(ins[0], 0)
        if why:
            return why
        dt = node.attrs.get("dtype")
        if dt is not None:
            name = self._dtype_name(int(dt))
            if name not in LLVM_TYPES:
                return f"dtype {name} is not supported; supported dtypes are {', '.join(LLVM_TYPES)}"
        return None

    @staticmethod
    def _dtype_name(elem_type: int) -> str:
        try:
            return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
        except (KeyError, TypeError, ValueError):
            return f"type {elem_type}"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        if len(shape) != 2:
            raise ShapeError(f"EyeLike node {node.label!r}: input of shape {shape} is not 2-D")
        dt = node.attrs.get("dtype")
        dtype = ins[0].type.dtype if dt is None else self._dtype_name(int(dt))
        if dtype not in LLVM_TYPES:
            raise GraphError(f"EyeLike node {node.label!r}: unsupported dtype {dtype}")
        return [TensorType(shape, dtype)]

    def lower(self, k: KernelBuilder) -> None:
        out = k.outputs[0]
        if not out.type.size:
            return
        diag = k.i64(int(k.attr("k", 0)))
        one, zero = constant(out.type.dtype, 1), constant(out.type.dtype, 0)
        with k.loops(out.shape, names=["r", "c"]) as (i, j):
            on = k.b.icmp_signed("==", diagonal_offset(k, i, j), diag)
            out.store([i, j], k.b.select(on, one, zero))
