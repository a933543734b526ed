"""Normalizations: BatchNormalization (inference), Softmax, LogSoftmax and Hardmax.

BatchNormalization folds its four per-channel parameters into a scale and a shift in a small
prologue nest (``a = scale / sqrt(var + eps)``, ``b = B - mean * a``, into scratch buffers),
then one elementwise nest ``y[n][c][s] = x[n][c][s] * a[c] + b[c]`` over the input seen as
(N, C, spatial).

Softmax, LogSoftmax and Hardmax see the tensor as (outer, D, inner) and work along D: opset < 13
coerces to 2-D at ``axis`` (D is the flattened tail, inner = 1), opset ≥ 13 uses the single
dimension ``axis``.  A *row* is one (o, ·) slice of D × inner elements; every statement of a row
reads and writes only that row and its (inner,) scratch (maximum, sum), so the rows are
independent and run as one parallel loop whose body holds the row's nests, each ordered
(d, i) so the innermost loop is unit-stride:

* Softmax: ``m = max_d x``; ``y = exp(x - m)`` and ``s = Σ_d y`` in one pass; ``y *= 1/s``;
* LogSoftmax: ``m``; ``s = Σ_d exp(x - m)``; ``y = x - (m + log s)``;
* Hardmax: ``m``; ``j = min {d : x = m}``; ``y = (d == j)``.

All are numerically stable (the maximum is subtracted before ``exp``, computed inline by
:meth:`KernelBuilder.exp`, :mod:`polyml.codegen.vmath`, so the row vectorizes).  Along the last axis (inner = 1, the
attention case) the maximum and sum are vectorized reductions; with one outer row and a large
inner extent, inner is split into chunks that are the parallel rows instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import REASSOC, Buffer, KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, normalize_axis, register
from polyml.kernels.matmul import view
from polyml.kernels.reduce import parallel_rows, vmax


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


def axis_dims(node: Node, shape: tuple[int, ...], legacy_coerce: bool = True) -> tuple[int, int, int]:
    """(outer, D, inner): the tensor as a 3-D array worked on along its middle dimension
    (``legacy_coerce``: opset < 13 flattens from ``axis`` on, as Softmax did)."""
    legacy = legacy_coerce and bool(node.opset) and node.opset < 13
    axis = normalize_axis(node, int(node.attrs.get("axis", 1 if legacy else -1)), len(shape))
    if legacy:
        return _prod(shape[:axis]), _prod(shape[axis:]), 1
    return _prod(shape[:axis]), _prod(shape[axis : axis + 1]), _prod(shape[axis + 1 :])


#: parallel chunks of the inner extent are at least this wide (a few vectors)
MIN_CHUNK = 64


@dataclass(frozen=True)
class AxisRows:
    """(outer, D, inner) split into parallel rows: the tensor is viewed as (outer, D, chunks,
    width) with inner = chunks · width, and row r is ``x[r, :, 0, :]`` (chunks = 1) or
    ``x[0, :, r, :]`` (outer = 1).  Per-row scratch is (outer, chunks, width)."""

    outer: int
    d: int
    chunks: int
    width: int

    @staticmethod
    def make(outer: int, d: int, inner: int) -> AxisRows:
        chunks = 1
        if outer == 1 and parallel_rows(d * inner):
            for c in range(64, 1, -1):
                if inner % c == 0 and inner // c >= MIN_CHUNK:
                    chunks = c
                    break
        return AxisRows(outer, d, chunks, inner // chunks)

    @property
    def rows(self) -> int:
        return self.outer * self.chunks

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.outer, self.d, self.chunks, self.width)

    @property
    def scratch(self) -> tuple[int, int, int]:
        return (self.outer, self.chunks, self.width)

    def x(self, r: ir.Value, e: ir.Value | int, i: ir.Value) -> list:
        return [r, e, 0, i] if self.chunks == 1 else [0, e, r, i]

    def t(self, r: ir.Value, i: ir.Value) -> list:
        return [r, 0, i] if self.chunks == 1 else [0, r, i]

    def loop(self, k: KernelBuilder):
        """The loop over rows: parallel when the tensor is large (yields ``[r]``)."""
        par = 1 if parallel_rows(self.outer * self.d * self.chunks * self.width) else 0
        return k.loops([self.rows], names=["row"], parallel=par)

    def row_max(self, k: KernelBuilder, x: Buffer, m: Buffer, r: ir.Value, dtype: str = "float32", pick=vmax) -> None:
        """``m[r, i] = max_d x[r, d, i]`` (``pick``: vmax or vmin; a vectorized reduction when
        width = 1): from element 0, then over all of D (max is idempotent, and a full trip
        count vectorizes cleanly)."""
        with k.loops([self.width], names=["mi"]) as (i,):
            m.store(self.t(r, i), x.load(self.x(r, 0, i)))
        if self.d > 1:
            with k.loops([self.d, self.width], names=["md", "mi"]) as (e, i):
                m.store(self.t(r, i), pick(k, m.load(self.t(r, i)), x.load(self.x(r, e, i)), dtype))

    def first_index(self, k: KernelBuilder, x: Buffer, m: Buffer, j: Buffer, r: ir.Value, last: bool = False) -> None:
        """``j[r, i] = min {d : x[r, d, i] = m[r, i]}`` (``last``: the max), an integer min/max
        reduction over a select, which vectorizes; i64 indices."""
        none = k.i64(-1 if last else self.d)
        with k.loops([self.width], names=["ji"]) as (i,):
            j.store(self.t(r, i), none)
        with k.loops([self.d, self.width], names=["jd", "ji"]) as (e, i):
            b = k.b
            xv = x.load(self.x(r, e, i))
            mv = m.load(self.t(r, i))
            hit = b.fcmp_ordered("==", xv, mv) if isinstance(xv.type, ir.FloatType) else b.icmp_signed("==", xv, mv)
            cand = b.select(hit, e if isinstance(e, ir.Value) else k.i64(e), none)
            cur = j.load(self.t(r, i))
            better = b.icmp_signed(">" if last else "<", cand, cur)
            j.store(self.t(r, i), b.select(better, cand, cur))
        # no element equal to the maximum (NaNs): index 0 rather than one out of range
        with k.loops([self.width], names=["ji"]) as (i,):
            cur = j.load(self.t(r, i))
            j.store(self.t(r, i), k.b.select(k.b.icmp_signed("==", cur, none), k.i64(0), cur))


@register
class Softmax(Kernel):
    """Softmax / LogSoftmax along ``axis`` (opset < 13: over the flattened dims from ``axis`` on)."""

    op_types = ("Softmax", "LogSoftmax")
    #: rows are parallelized by polyml (parallel_loop) and each row's nests are vectorized by
    #: LLVM; Polly's rescheduling of the fused row body measured no faster
    polly = "off"

    @staticmethod
    def _dims(node: Node, shape: tuple[int, ...]) -> tuple[int, int, int]:
        return axis_dims(node, shape)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        self._dims(node, ins[0].type.shape)
        return [ins[0].type]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """Per-row maximum and sum (of exponentials), one per (outer, inner) point."""
        outer, _, inner = self._dims(node, ins[0].type.shape)
        return [TensorType((outer * inner,)), TensorType((outer * inner,))]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        outer, d, inner = self._dims(node, ins[0].type.shape)
        return f"{outer}x{d}x{inner}"

    def lower(self, k: KernelBuilder) -> None:
        outer, d, inner = self._dims(k.node, k.inputs[0].shape)
        if outer * d * inner == 0:
            return
        rows = AxisRows.make(outer, d, inner)
        x, y = view(k, k.inputs[0], rows.shape), view(k, k.outputs[0], rows.shape)
        mx, sm = (view(k, t, rows.scratch) for t in k.temps)
        log = k.node.op_type == "LogSoftmax"
        w = rows.width
        with rows.loop(k) as (r,):
            rows.row_max(k, x, mx, r)
            with k.loops([w], names=["si"]) as (i,):
                sm.store(rows.t(r, i), k.f32(0.0))
            with k.loops([d, w], names=["sd", "si"]) as (e, i):
                t = rows.t(r, i)
                ex = k.exp(k.b.fsub(x.load(rows.x(r, e, i)), mx.load(t)))
                if not log:
                    y.store(rows.x(r, e, i), ex)
                sm.store(t, k.b.fadd(sm.load(t), ex, flags=REASSOC))
            if log:
                # y = x - (max + log(sum(exp(x - max))))
                with k.loops([w], names=["li"]) as (i,):
                    t = rows.t(r, i)
                    sm.store(t, k.b.fadd(mx.load(t), k.intrinsic("llvm.log", sm.load(t))))
                with k.loops([d, w], names=["yd", "yi"]) as (e, i):
                    y.store(rows.x(r, e, i), k.b.fsub(x.load(rows.x(r, e, i)), sm.load(rows.t(r, i))))
            else:
                with k.loops([w], names=["ri"]) as (i,):
                    t = rows.t(r, i)
                    sm.store(t, k.b.fdiv(k.f32(1.0), sm.load(t)))
                with k.loops([d, w], names=["yd", "yi"]) as (e, i):
                    y.store(rows.x(r, e, i), k.b.fmul(y.load(rows.x(r, e, i)), sm.load(rows.t(r, i))))


@register
class Hardmax(Kernel):
    """Hardmax: 1 at the first maximum along ``axis`` (opset < 13: of the flattened tail), else 0."""

    op_types = ("Hardmax",)
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        axis_dims(node, ins[0].type.shape)
        return [ins[0].type]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """Per-row maximum and its first index."""
        outer, _, inner = axis_dims(node, ins[0].type.shape)
        return [TensorType((outer * inner,)), TensorType((outer * inner,), "int64")]

    def lower(self, k: KernelBuilder) -> None:
        outer, d, inner = axis_dims(k.node, k.inputs[0].shape)
        if outer * d * inner == 0:
            return
        rows = AxisRows.make(outer, d, inner)
        x, y = view(k, k.inputs[0], rows.shape), view(k, k.outputs[0], rows.shape)
        mx, at = (view(k, t, rows.scratch) for t in k.temps)
        with rows.loop(k) as (r,):
            rows.row_max(k, x, mx, r)
            rows.first_index(k, x, mx, at, r)
            with k.loops([d, rows.width], names=["yd", "yi"]) as (e, i):
                e64 = e if isinstance(e, ir.Value) else k.i64(e)
                hit = k.b.icmp_signed("==", e64, at.load(rows.t(r, i)))
                y.store(rows.x(r, e, i), k.b.select(hit, k.f32(1.0), k.f32(0.0)))
