"""Range: registered only to refuse it clearly.

``Range(start, limit, delta)`` has ``max(0, ⌈(limit - start) / delta⌉)`` elements: its output
shape is a function of its input *values*.  When all three are compile-time constants (literal,
or folded from ``Shape``/``Size`` chains) the frontend evaluates the node before any kernel is
consulted, so this kernel is reached only when one of them is computed at run time, which a
static-shape compiler cannot lower: :meth:`Range.supports` says so, and the frontend reports it
with the other unsupported nodes.  (A frontend that does not fold gets one nest,
``y[i] = start + i·delta``.)  The inputs are ``static_inputs``, so the ONNX backend
(:mod:`polyml.backend`) compiles a specialization for graph inputs that feed Range directly.
"""

from __future__ import annotations

import math

import numpy as np

from polyml.codegen.builder import KernelBuilder, constant, is_float, llvm_type
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register, unsupported_dtype
from polyml.kernels.conv import affine

OPERANDS = ("start", "limit", "delta")


@register
class Range(Kernel):
    """Range of float32, int32 or int64; operands that are not compile-time constants are refused
    (data-dependent shape)."""

    op_types = ("Range",)
    polly = "off"
    static_inputs = (0, 1, 2)
    dtypes = frozenset({"float32", "int32", "int64"})

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        computed = [f"{what} ({op.name!r})" for what, op in zip(OPERANDS, ins) if op is not None and op.value is None]
        if computed:
            return (
                f"{', '.join(computed)} {'is' if len(computed) == 1 else 'are'} computed at run time, so the "
                "output length is data-dependent; polyml compiles static shapes, so start, limit and delta "
                "must be compile-time constants"
            )
        if ins[0] is not None and ins[0].type.dtype not in self.dtypes:
            return unsupported_dtype(0, ins[0], self.dtypes)
        return None

    @staticmethod
    def operands(node: Node, values: list[np.ndarray | None]) -> list[float | int]:
        if len(values) != 3 or any(v is None or np.asarray(v).size != 1 for v in values):
            raise ShapeError(f"Range node {node.label!r}: start, limit and delta must be constant scalars")
        return [np.asarray(v).reshape(-1)[0].item() for v in values]

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        start, limit, delta = self.operands(node, [op.value if op is not None else None for op in ins])
        if delta == 0:
            raise ShapeError(f"Range node {node.label!r}: delta is 0")
        n = max(0, math.ceil((limit - start) / delta))
        return [TensorType((n,), ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        y = k.outputs[0]
        start, _, delta = self.operands(k.node, k.values)
        dtype = y.type.dtype
        with k.loops(y.shape, names=["r"]) as (i,):
            if is_float(dtype):
                v = k.b.fadd(constant(dtype, start), k.b.fmul(k.b.sitofp(i, llvm_type(dtype)), constant(dtype, delta)))
            else:
                v = affine(k, [(int(delta), i)], int(start))
                v = v if dtype == "int64" else k.b.trunc(v, llvm_type(dtype))
            y.store([i], v)
