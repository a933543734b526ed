"""Normalizations: BatchNormalization (inference), Softmax and LogSoftmax.

BatchNormalization folds its four per-channel parameters into a scale and a shift in a small
prologue nest (``a = scale / sqrt(var + eps)``, ``b = B - mean * a``, into scratch buffers),
then one elementwise nest ``y[n][c][s] = x[n][c][s] * a[c] + b[c]`` over the input seen as
(N, C, spatial).

Softmax and LogSoftmax see the tensor as (outer, D, inner) and normalize along D: opset < 13
coerces to 2-D at ``axis`` (D is the flattened tail, inner = 1), opset ≥ 13 normalizes along
the single dimension ``axis``.  They are numerically stable (the row maximum is subtracted
before ``exp``); the maxima and sums live in (outer, inner) scratch buffers, each computed by
an init nest (from element 0) and an accumulating nest over the rest of D, loops ordered
(o, d, i) so the innermost loop is unit-stride.
"""

from __future__ import annotations

import numpy as np
from polyml.kernels import Kernel, Operand, normalize_axis, register
from polyml.kernels.matmul import view

from polyml.codegen.builder import Buffer, KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType


def _prod(dims: tuple[int, ...]) -> int:
    return int(np.prod(dims, dtype=np.int64))


@register
class BatchNormalization(Kernel):
    """y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + B[c], channels along dim 1."""

    op_types = ("BatchNormalization",)
    #: one streaming pass: Polly's tiling and OpenMP measured no faster than -O3 (slower on
    #: small tensors: 1x256x14x14 took 16 us with Polly, 8 us without)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if node.attrs.get("training_mode", 0):
            return "training_mode=1 (batch statistics) is not supported; polyml compiles inference"
        if any(o for o in node.outputs[1:]):
            return "only output Y is supported (mean/var/saved statistics outputs are training-mode)"
        return super().supports(node, ins)

    @staticmethod
    def _dims(node: Node, ins: list[Operand | None]) -> tuple[int, int, int, tuple[int, ...]]:
        """(N, C, spatial size, parameter view shape): parameters are (C,) or, with
        ``spatial=0`` (opset < 9), (C, D1, ..., Dk) seen as (C, spatial)."""
        shape = ins[0].type.shape
        if len(shape) < 2:
            raise ShapeError(f"BatchNormalization node {node.label!r}: input {shape} needs a channel dimension")
        n, c, s = shape[0], shape[1], _prod(shape[2:])
        params = [op.type.shape for op in ins[1:5] if op is not None]
        if len(params) != 4:
            raise GraphError(f"BatchNormalization node {node.label!r}: needs X, scale, B, mean and var")
        sizes = {_prod(p) for p in params}
        if sizes == {c}:
            return n, c, s, (c,)
        if sizes == {c * s} and all(p in ((c, *shape[2:]), (1, c, *shape[2:])) for p in params):
            return n, c, s, (c, s)
        raise ShapeError(f"BatchNormalization node {node.label!r}: parameter shapes {params} do not match input {shape}")

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        self._dims(node, ins)
        return [ins[0].type]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """The folded per-channel scale ``a`` and shift ``b``."""
        *_, pshape = self._dims(node, ins)
        return [TensorType(pshape), TensorType(pshape)]

    def lower(self, k: KernelBuilder) -> None:
        n, c, s, pshape = self._dims(k.node, [Operand("", t) if t else None for t in k.in_types])
        x, y = view(k, k.inputs[0], (n, c, s)), view(k, k.outputs[0], (n, c, s))
        scale, bias, mean, var = (view(k, p, pshape) for p in k.inputs[1:5])
        a, b = k.temps
        eps = k.f32(k.attr("epsilon", 1e-5))
        with k.loops(pshape, names=["pc", "ps"][: len(pshape)]) as ix:
            av = k.b.fdiv(scale.load(ix), k.sqrt(k.b.fadd(var.load(ix), eps)))
            a.store(ix, av)
            b.store(ix, k.b.fsub(bias.load(ix), k.b.fmul(mean.load(ix), av)))
        with k.loops([n, c, s], names=["n", "c", "s"]) as (i, j, r):
            p = [j] if len(pshape) == 1 else [j, r]
            y.store([i, j, r], k.b.fadd(k.b.fmul(x.load([i, j, r]), a.load(p)), b.load(p)))


@register
class Softmax(Kernel):
    """Softmax / LogSoftmax along ``axis`` (opset < 13: over the flattened dims from ``axis`` on)."""

    op_types = ("Softmax", "LogSoftmax")
    #: Polly parallelizes the row loops: 8x12x128x128 took 2.5 ms with Polly, 4.7 ms without
    polly = "polly"

    @staticmethod
    def _dims(node: Node, shape: tuple[int, ...]) -> tuple[int, int, int]:
        """(outer, D, inner): the tensor as a 3-D array normalized along its middle dimension."""
        legacy = bool(node.opset) and node.opset < 13
        axis = normalize_axis(node, int(node.attrs.get("axis", 1 if legacy else -1)), len(shape))
        if legacy:
            return _prod(shape[:axis]), _prod(shape[axis:]), 1
        return _prod(shape[:axis]), _prod(shape[axis : axis + 1]), _prod(shape[axis + 1 :])

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        self._dims(node, ins[0].type.shape)
        return [ins[0].type]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """Per-row maximum and sum (of exponentials), shape (outer, inner)."""
        outer, _, inner = self._dims(node, ins[0].type.shape)
        return [TensorType((outer, inner)), TensorType((outer, inner))]

    def lower(self, k: KernelBuilder) -> None:
        outer, d, inner = self._dims(k.node, k.inputs[0].shape)
        if outer * d * inner == 0:
            return
        x, y = view(k, k.inputs[0], (outer, d, inner)), view(k, k.outputs[0], (outer, d, inner))
        mx, sm = k.temps
        b = k.b
        log = k.node.op_type == "LogSoftmax"

        def reduce(dst: Buffer, first, step) -> None:
            """dst[o][i] = first(o, i); then dst[o][i] = step(dst[o][i], o, e, i) for e in 1..D-1."""
            with k.loops([outer, inner], names=["o", "i"]) as (o, i):
                dst.store([o, i], first(o, i))
            with k.loops([outer, (1, d), inner], names=["o", "d", "i"]) as (o, e, i):
                dst.store([o, i], step(dst.load([o, i]), o, e, i))

        def shifted(o, e, i):
            return b.fsub(x.load([o, e, i]), mx.load([o, i]))

        reduce(mx, lambda o, i: x.load([o, 0, i]), lambda acc, o, e, i: k.maxf(x.load([o, e, i]), acc))
        if log:
            # y = (x - max) - log(sum(exp(x - max)))
            reduce(sm, lambda o, i: k.exp(shifted(o, 0, i)), lambda acc, o, e, i: b.fadd(acc, k.exp(shifted(o, e, i))))
            with k.loops([outer, inner], names=["o", "i"]) as (o, i):
                sm.store([o, i], k.intrinsic("llvm.log", sm.load([o, i])))
            with k.loops([outer, d, inner], names=["o", "d", "i"]) as (o, e, i):
                y.store([o, e, i], b.fsub(shifted(o, e, i), sm.load([o, i])))
            return
        # y = exp(x - max); y /= sum(y)
        with k.loops([outer, d, inner], names=["o", "d", "i"]) as (o, e, i):
            y.store([o, e, i], k.exp(shifted(o, e, i)))
        reduce(sm, lambda o, i: y.load([o, 0, i]), lambda acc, o, e, i: b.fadd(acc, y.load([o, e, i])))
        with k.loops([outer, inner], names=["o", "i"]) as (o, i):
            sm.store([o, i], b.fdiv(k.f32(1.0), sm.load([o, i])))
        with k.loops([outer, d, inner], names=["o", "d", "i"]) as (o, e, i):
            y.store([o, e, i], b.fmul(y.load([o, e, i]), sm.load([o, i])))
