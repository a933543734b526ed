"""Elementwise ops: activations, broadcasting arithmetic and variadic Sum/Max/Min.

Each lowers to one perfect loop nest over the output shape; an input of lower rank or with
size-1 dimensions is read with the broadcast access ``x[0, j]`` (numpy broadcasting), which is
still affine, so Polly sees one statement with one write and one read per operand.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir
from polyml.kernels import Kernel, Operand, broadcast_shapes, register

from polyml.codegen.builder import KernelBuilder
from polyml.graph import Node, TensorType


def _elementwise(k: KernelBuilder, fn: Callable[[list[ir.Value]], ir.Value]) -> None:
    """out[i] = fn(in0[bcast(i)], in1[bcast(i)], ...) over the output's shape."""
    out = k.outputs[0]
    with k.loops(out.shape) as ix:
        vals = [buf.load(buf.broadcast_index(ix)) for buf in k.inputs if buf is not None]
        out.store(ix, fn(vals))


class _Broadcasting(Kernel):
    # Memory-bound single-statement nests: Polly's tiling buys nothing here and costs ~100 ms
    # of compile time per op (measured: 600 such ops took 70 s through -polly, 4 s without).
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shapes = [op.type.shape for op in ins if op is not None]
        return [TensorType(broadcast_shapes(node, *shapes), ins[0].type.dtype)]


@register
class Unary(_Broadcasting):
    """Relu, LeakyRelu, Sigmoid, Tanh, Sqrt, Exp, Neg, Abs, Reciprocal (one input, same shape)."""

    op_types = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Neg", "Abs", "Reciprocal")

    def lower(self, k: KernelBuilder) -> None:
        b = k.b
        op = k.node.op_type
        zero, one = k.f32(0.0), k.f32(1.0)

        def fn(v: list[ir.Value]) -> ir.Value:
            x = v[0]
            if op == "Relu":
                return k.maxf(x, zero)
            if op == "LeakyRelu":
                alpha = k.f32(k.attr("alpha", 0.01))
                return b.select(b.fcmp_ordered(">=", x, zero), x, b.fmul(x, alpha))
            if op == "Sigmoid":
                return b.fdiv(one, b.fadd(one, k.exp(b.fneg(x))))
            if op == "Tanh":
                return k.libm("tanhf", x)
            if op == "Sqrt":
                return k.sqrt(x)
            if op == "Exp":
                return k.exp(x)
            if op == "Neg":
                return b.fneg(x)
            if op == "Abs":
                return k.intrinsic("llvm.fabs", x)
            if op == "Reciprocal":
                return b.fdiv(one, x)
            raise AssertionError(op)

        _elementwise(k, fn)


@register
class Binary(_Broadcasting):
    """Add, Sub, Mul, Div, Pow with numpy broadcasting."""

    op_types = ("Add", "Sub", "Mul", "Div", "Pow")

    def lower(self, k: KernelBuilder) -> None:
        b = k.b
        op = k.node.op_type

        def fn(v: list[ir.Value]) -> ir.Value:
            x, y = v
            if op == "Add":
                return b.fadd(x, y)
            if op == "Sub":
                return b.fsub(x, y)
            if op == "Mul":
                return b.fmul(x, y)
            if op == "Div":
                return b.fdiv(x, y)
            if op == "Pow":
                return k.intrinsic("llvm.pow", x, y)
            raise AssertionError(op)

        _elementwise(k, fn)


@register
class Variadic(_Broadcasting):
    """Sum, Max, Min, Mean over any number of broadcast inputs."""

    op_types = ("Sum", "Max", "Min", "Mean")

    def lower(self, k: KernelBuilder) -> None:
        op = k.node.op_type

        def fn(v: list[ir.Value]) -> ir.Value:
            acc = v[0]
            for x in v[1:]:
                if op in ("Sum", "Mean"):
                    acc = k.b.fadd(acc, x)
                elif op == "Max":
                    acc = k.maxf(acc, x)
                else:
                    acc = k.minf(acc, x)
            if op == "Mean":
                acc = k.b.fdiv(acc, k.f32(len(v)))
            return acc

        _elementwise(k, fn)


@register
class Clip(Kernel):
    """Clip: bounds from attributes (opset < 11) or optional scalar inputs (opset ≥ 11)."""

    op_types = ("Clip",)
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        return [ins[0].type]

    def lower(self, k: KernelBuilder) -> None:
        x, out = k.inputs[0], k.outputs[0]
        lo_buf = k.inputs[1] if len(k.inputs) > 1 else None
        hi_buf = k.inputs[2] if len(k.inputs) > 2 else None
        lo = lo_buf.load([]) if lo_buf is not None else (k.f32(k.attr("min")) if "min" in k.attrs else None)
        hi = hi_buf.load([]) if hi_buf is not None else (k.f32(k.attr("max")) if "max" in k.attrs else None)
        with k.loops(out.shape) as ix:
            v = x.load(ix)
            if lo is not None:
                v = k.b.select(k.b.fcmp_ordered("<", v, lo), lo, v)
            if hi is not None:
                v = k.b.select(k.b.fcmp_ordered(">", v, hi), hi, v)
            out.store(ix, v)
