"""OneHot: ``y[.., d, ..] = (index == d) ? on : off`` with the depth axis ``d`` inserted at ``axis``.

One nest over the output.  The indices are data, but OneHot never addresses memory with them:
each output element compares its own (affine) depth counter ``d`` with the index read at the
affine position ``indices[.., ..]`` (the output index without ``d``), so the statement is a
``select`` and the nest a SCoP.  A negative index counts from the end (``index + depth``); an
index outside ``[-depth, depth)`` matches no ``d`` and gives an all-``off`` row, as the spec and
onnxruntime say.  Float indices are truncated toward zero (compared as floats, so NaN matches
nothing).
"""

from __future__ import annotations

import llvmlite.ir as ir

from polyml.codegen.builder import I64, KernelBuilder, constant, is_float
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, const_ints, normalize_axis, register, unsupported_dtype
from polyml.kernels._scalar import outer_parallel_dims
from polyml.kernels.expand import movable

INDEX_DTYPES = frozenset({"float32", "int32", "int64"})


@register
class OneHot(Kernel):
    """OneHot with a constant ``depth`` and a 2-element ``values`` tensor ``[off, on]`` of any dtype."""

    op_types = ("OneHot",)
    polly = "off"
    static_inputs = (1,)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if len(ins) < 3 or any(op is None for op in ins[:3]):
            return "OneHot needs its indices, depth and values inputs"
        if ins[0].type.dtype not in INDEX_DTYPES:
            return unsupported_dtype(0, ins[0], INDEX_DTYPES)
        return movable(ins[2], 2)

    @staticmethod
    def depth(node: Node, ins: list[Operand | None]) -> int:
        depth = const_ints(node, ins[1], "depth")
        if len(depth) != 1:
            raise ShapeError(f"OneHot node {node.label!r}: depth must be a scalar, got {len(depth)} values")
        if depth[0] < 1:
            raise ShapeError(f"OneHot node {node.label!r}: depth {depth[0]} is not positive")
        return depth[0]

    @staticmethod
    def axis(node: Node, rank: int) -> int:
        return normalize_axis(node, int(node.attrs.get("axis", -1)), rank + 1)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        depth = self.depth(node, ins)
        if ins[2].type.shape != (2,):
            raise ShapeError(f"OneHot node {node.label!r}: values {ins[2].name!r} has shape {ins[2].type.shape}; [off, on] is expected")
        shape = list(ins[0].type.shape)
        shape.insert(self.axis(node, len(shape)), depth)
        return [TensorType(tuple(shape), ins[2].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        indices, values, out = k.inputs[0], k.inputs[2], k.outputs[0]
        if not out.type.size:
            return
        axis = self.axis(k.node, indices.rank)
        depth = out.shape[axis]
        with k.loops(out.shape, names=[f"o{d}" for d in range(out.rank)], parallel=outer_parallel_dims(out.shape)) as ix:
            b = k.b  # inside the nest: a parallel loop's body is emitted by another builder
            d = ix[axis]
            raw = indices.load([*ix[:axis], *ix[axis + 1 :]])
            if is_float(indices.type.dtype):
                v = k.intrinsic("llvm.trunc", raw)
                v = b.select(b.fcmp_ordered("<", v, constant("float32", 0)), b.fadd(v, constant("float32", depth)), v)
                hit = b.fcmp_ordered("==", v, b.sitofp(d, v.type))
            else:
                v = raw if raw.type == I64 else b.sext(raw, I64)
                v = b.select(b.icmp_signed("<", v, ir.Constant(I64, 0)), b.add(v, ir.Constant(I64, depth)), v)
                hit = b.icmp_signed("==", v, d)
            out.store(ix, b.select(hit, values.load([1]), values.load([0])))
