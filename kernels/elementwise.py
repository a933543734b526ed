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


def scalar(k: KernelBuilder, node: Node, vals: list[ir.Value]) -> ir.Value:
    """The value one output element of elementwise ``node`` takes, given its input elements
    (omitted optional inputs excluded). Fused nests compose these expressions in registers."""
    b = k.b
    op = node.op_type
    zero, one = k.f32(0.0), k.f32(1.0)
    x = vals[0]
    if op == "Relu":
        return k.maxf(x, zero)
    if op == "LeakyRelu":
        return b.select(b.fcmp_ordered(">=", x, zero), x, b.fmul(x, k.f32(node.attrs.get("alpha", 0.01))))
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
    if op in BINARY:
        return BINARY[op](k, x, vals[1])
    if op in ("Sum", "Max", "Min", "Mean"):
        acc = x
        for v in vals[1:]:
            acc = b.fadd(acc, v) if op in ("Sum", "Mean") else (k.maxf(acc, v) if op == "Max" else k.minf(acc, v))
        return b.fdiv(acc, k.f32(len(vals))) if op == "Mean" else acc
    if op == "Clip":
        lo, hi = _clip_bounds(k, node, vals)
        if lo is not None:
            x = b.select(b.fcmp_ordered("<", x, lo), lo, x)
        if hi is not None:
            x = b.select(b.fcmp_ordered(">", x, hi), hi, x)
        return x
    raise AssertionError(op)


BINARY: dict[str, Callable[[KernelBuilder, ir.Value, ir.Value], ir.Value]] = {
    "Add": lambda k, x, y: k.b.fadd(x, y),
    "Sub": lambda k, x, y: k.b.fsub(x, y),
    "Mul": lambda k, x, y: k.b.fmul(x, y),
    "Div": lambda k, x, y: k.b.fdiv(x, y),
    "Pow": lambda k, x, y: k.intrinsic("llvm.pow", x, y),
}


def _clip_bounds(k: KernelBuilder, node: Node, vals: list[ir.Value]) -> tuple[ir.Value | None, ir.Value | None]:
    """Clip's bounds: optional inputs 1 and 2 (opset ≥ 11) or the min/max attributes."""
    present = [i for i, t in enumerate(node.inputs) if t]
    by_pos = dict(zip(present, vals))
    lo = by_pos.get(1, k.f32(node.attrs["min"]) if "min" in node.attrs else None)
    hi = by_pos.get(2, k.f32(node.attrs["max"]) if "max" in node.attrs else None)
    return lo, hi


#: op types :func:`scalar` computes (all of them one output element from input elements)
ELEMENTWISE = frozenset(["Relu", "LeakyRelu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Neg", "Abs", "Reciprocal",
                         *BINARY, "Sum", "Max", "Min", "Mean", "Clip"])


class _Broadcasting(Kernel):
    """out[i] = f(in0[bcast(i)], in1[bcast(i)], ...): one perfect nest over the output."""

    # Memory-bound single-statement nests: Polly's tiling buys nothing here and costs ~100 ms
    # of compile time per op (measured: 600 such ops took 70 s through -polly, 4 s without).
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shapes = [op.type.shape for op in ins if op is not None]
        return [TensorType(broadcast_shapes(node, *shapes), ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        out = k.outputs[0]
        with k.loops(out.shape) as ix:
            vals = [buf.load(buf.broadcast_index(ix)) for buf in k.inputs if buf is not None]
            out.store(ix, scalar(k, k.node, vals))


@register
class Unary(_Broadcasting):
    """Relu, LeakyRelu, Sigmoid, Tanh, Sqrt, Exp, Neg, Abs, Reciprocal (one input, same shape)."""

    op_types = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Neg", "Abs", "Reciprocal")


@register
class Binary(_Broadcasting):
    """Add, Sub, Mul, Div, Pow with numpy broadcasting."""

    op_types = tuple(BINARY)


@register
class Variadic(_Broadcasting):
    """Sum, Max, Min, Mean over any number of broadcast inputs."""

    op_types = ("Sum", "Max", "Min", "Mean")


@register
class Clip(_Broadcasting):
    """Clip: bounds from attributes (opset < 11) or optional scalar inputs (opset ≥ 11)."""

    op_types = ("Clip",)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        return [ins[0].type]
