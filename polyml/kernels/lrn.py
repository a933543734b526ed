"""Local response normalization across channels (ONNX LRN).

``y[n, c, s] = x[n, c, s] / (bias + alpha/size * sum_{c' in win(c)} x[n, c', s]^2) ** beta`` with
``win(c) = [c - floor((size-1)/2), c + ceil((size-1)/2)]`` clipped to ``[0, C)``.  Three nests
over the flattened spatial positions ``s``:

1. ``sq[n, c + lo, s] = x[n, c, s]^2`` into a temp zero-padded by ``lo``/``hi`` channels
   (``sq = 0`` first, so clipped channels contribute nothing);
2. ``y[n, c, s] = 0; y[n, c, s] += sq[n, c + j, s]`` over ``[n, c, j, s]`` (``j < size``);
3. ``y[n, c, s] = x[n, c, s] * (bias + alpha/size * y[n, c, s]) ** -beta``.

Polly policy ``off``: ``polly``/``tile`` measured the same (1x96x55x55, size 5: 1.6 ms).
"""

from __future__ import annotations

import math

from polyml.codegen.builder import KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register
from polyml.kernels.conv import affine, nest, view


def _halves(node: Node) -> tuple[int, int, int]:
    size = int(node.attrs.get("size", 0))
    if size < 1:
        raise GraphError(f"LRN node {node.label!r}: size must be a positive integer (got {size})")
    return size, (size - 1) // 2, size - 1 - (size - 1) // 2


@register
class LRN(Kernel):
    """ONNX LRN (``size`` required; ``alpha`` 1e-4, ``beta`` 0.75, ``bias`` 1 by default)."""

    op_types = ("LRN",)
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x = ins[0].type
        if len(x.shape) < 2:
            raise ShapeError(f"LRN node {node.label!r}: input {x.shape} needs a channel dimension")
        _halves(node)
        return [x]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        x = ins[0].type
        _, lo, hi = _halves(node)
        n, c = x.shape[:2]
        return [TensorType((n, c + lo + hi, math.prod(x.shape[2:])))]

    def lower(self, k: KernelBuilder) -> None:
        size, lo, _ = _halves(k.node)
        alpha = float(k.attr("alpha", 1e-4))
        beta = float(k.attr("beta", 0.75))
        bias = float(k.attr("bias", 1.0))
        n_, c_ = k.inputs[0].shape[:2]
        p_ = math.prod(k.inputs[0].shape[2:])
        x = view(k, k.inputs[0], (n_, c_, p_), "x_flat")
        y = view(k, k.outputs[0], (n_, c_, p_), "y_flat")
        sq = k.temps[0]
        with nest(k, sq.shape, names=["zn", "zc", "zs"]) as ix:
            sq.store(ix, k.f32(0.0))
        with nest(k, [n_, c_, p_], names=["qn", "qc", "qs"]) as (n, c, s):
            v = x.load([n, c, s])
            sq.store([n, affine(k, [(1, c)], lo), s], k.b.fmul(v, v))
        with nest(k, [n_, c_, p_], names=["in", "ic", "is"]) as ix:
            y.store(ix, k.f32(0.0))
        with nest(k, [n_, c_, size, p_], names=["n", "c", "j", "s"]) as (n, c, j, s):
            y.store([n, c, s], k.b.fadd(y.load([n, c, s]), sq.load([n, affine(k, [(1, c), (1, j)]), s])))
        with nest(k, [n_, c_, p_], names=["fn", "fc", "fs"]) as ix:
            base = k.b.fadd(k.f32(bias), k.b.fmul(k.f32(alpha / size), y.load(ix)))
            y.store(ix, k.b.fmul(x.load(ix), k.intrinsic("llvm.pow", base, k.f32(-beta))))
