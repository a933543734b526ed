"""Row normalizations: LayerNormalization, InstanceNormalization, GroupNormalization and
MeanVarianceNormalization.

The first three normalize *rows*: contiguous runs of the input (LayerNormalization: the dims
from ``axis`` on, one row per point of the dims before it; InstanceNormalization: one (n, c)
plane; GroupNormalization: the C/G channels of one (n, g) group).  Every statement of a row
reads the row and writes the row and its two statistics, so the rows are independent and run
as one parallel loop (``parallel_loop`` over the leading row dims) whose body is three
unit-stride nests over the row, as onnxruntime computes them (two-pass variance):

1. ``mean[r] = Σ_j x[r, j] / D``;
2. ``inv[r] = 1 / sqrt(Σ_j (x[r, j] - mean[r])² / D + ε)``;
3. ``y[r, j] = (x[r, j] - mean[r]) · inv[r] · scale[·] + bias[·]``.

The sums are reassociable, so 1 and 2 are vectorized reductions; a row stays in L1/L2 across
the three passes.  ``mean`` and ``inv`` are scratch buffers (LayerNormalization's optional
``Mean`` and ``InvStdDev`` outputs are copied from them).  Scale and bias index the row by
channel (Instance, Group opset 21), by group (Group opset 18), or by position in the normalized
dims (Layer); a LayerNormalization scale or bias that broadcasts over row dims too gets a
separate elementwise nest over the whole tensor after the statistics.

MeanVarianceNormalization reduces over arbitrary ``axes`` (default N, H, W): it uses the merged
kept/reduced view of :mod:`polyml.kernels.reduce` — mean and variance accumulated into
kept-shape buffers by whole-tensor nests, then ``y = (x - mean) / (sqrt(var) + 1e-9)``.

Policy ``off``: streaming passes, parallelized and vectorized as written.
"""

from __future__ import annotations

import math

import llvmlite.ir as ir

from polyml.codegen.builder import REASSOC, Buffer, KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, normalize_axis, register, unsupported_dtype
from polyml.kernels._scalar import FLOAT
from polyml.kernels.matmul import view
from polyml.kernels.reduce import Reduction, merged_view, parallel_rows, rows_loop


def _prod(dims) -> int:
    return math.prod(int(d) for d in dims)


def _float_inputs(node: Node, ins: list[Operand | None]) -> str | None:
    for i, op in enumerate(ins):
        if op is not None and op.type.dtype not in FLOAT:
            return unsupported_dtype(i, op, FLOAT)
    if ins[0].type.size == 0:
        return "normalization of an empty tensor"
    return None


def row_stats(k: KernelBuilder, load, n: int, mean: Buffer, inv: Buffer, at: list, eps: float,
              tag: str = "j") -> tuple[ir.Value, ir.Value]:
    """Mean and 1/sqrt(var + eps) of the ``n`` values ``load(j)`` (two passes, reassociated
    sums) into ``mean[at]`` and ``inv[at]``; returns both values."""
    mean.store(at, k.f32(-0.0))
    with k.loop(0, n, f"{tag}m") as j:
        mean.store(at, k.b.fadd(mean.load(at), load(j), flags=REASSOC))
    mu = k.b.fmul(mean.load(at), k.f32(1.0 / n))
    mean.store(at, mu)
    inv.store(at, k.f32(-0.0))
    with k.loop(0, n, f"{tag}v") as j:
        dv = k.b.fsub(load(j), mean.load(at))
        inv.store(at, k.b.fadd(inv.load(at), k.b.fmul(dv, dv, flags=REASSOC), flags=REASSOC))
    var = k.b.fmul(inv.load(at), k.f32(1.0 / n))
    iv = k.b.fdiv(k.f32(1.0), k.sqrt(k.b.fadd(var, k.f32(eps))))
    inv.store(at, iv)
    return mu, iv


def _affine_out(k: KernelBuilder, xv: ir.Value, mu: ir.Value, iv: ir.Value, scale: ir.Value | None,
                bias: ir.Value | None) -> ir.Value:
    """``(x - mean) · inv · scale + bias``, in onnxruntime's order."""
    v = k.b.fmul(k.b.fsub(xv, mu), iv)
    if scale is not None:
        v = k.b.fmul(v, scale)
    if bias is not None:
        v = k.b.fadd(v, bias)
    return v


@register
class LayerNormalization(Kernel):
    """LayerNormalization (opset 17): rows are the points of ``X.shape[:axis]``."""

    op_types = ("LayerNormalization",)
    polly = "off"

    @staticmethod
    def _dims(node: Node, ins: list[Operand | None]) -> tuple[int, int, int]:
        """(axis, rows, D); checks that Scale and B broadcast to X."""
        shape = ins[0].type.shape
        axis = normalize_axis(node, int(node.attrs.get("axis", -1)), len(shape))
        if len(ins) < 2 or ins[1] is None:
            raise GraphError(f"LayerNormalization node {node.label!r}: needs X and Scale")
        for op in ins[1:3]:
            if op is not None and (len(op.type.shape) > len(shape) or
                                   any(p not in (1, s) for p, s in zip(reversed(op.type.shape), reversed(shape)))):
                raise ShapeError(f"LayerNormalization node {node.label!r}: {op.name!r} of shape {op.type.shape} "
                                 f"does not broadcast to X {shape}")
        return axis, _prod(shape[:axis]), _prod(shape[axis:])

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        stash = int(node.attrs.get("stash_type", 1))
        if stash != 1 and any(node.outputs[1:]):
            return f"stash_type {stash}: Mean and InvStdDev are computed (and typed) as float32 only"
        return _float_inputs(node, ins)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        axis, _, _ = self._dims(node, ins)
        shape = ins[0].type.shape
        stats = TensorType(tuple(shape[:axis]) + (1,) * (len(shape) - axis))
        return [ins[0].type, stats, stats]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """Each row's mean and inverse standard deviation."""
        _, rows, _ = self._dims(node, ins)
        return [TensorType((rows,)), TensorType((rows,))]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        _, rows, d = self._dims(node, ins)
        return f"{rows} rows x {d}"

    @staticmethod
    def _flat_param(p: TensorType | None, norm: tuple[int, ...]) -> bool:
        """Whether parameter ``p`` is indexed by the flat position in the row (its shape is the
        normalized shape, or a scalar)."""
        if p is None or p.size == 1:
            return True
        dims = list(p.shape)
        while dims and dims[0] == 1:
            dims.pop(0)
        return tuple(dims) == tuple(norm[len(norm) - len(dims):]) and p.size == _prod(norm)

    def lower(self, k: KernelBuilder) -> None:
        ops = [Operand("", t) if t is not None else None for t in k.in_types]
        axis, rows, d = self._dims(k.node, ops)
        shape = k.inputs[0].shape
        norm = tuple(shape[axis:])
        x, y = view(k, k.inputs[0], (rows, d)), view(k, k.outputs[0], (rows, d))
        params = [k.inputs[i] if i < len(k.inputs) else None for i in (1, 2)]
        flat = all(self._flat_param(p.type if p else None, norm) for p in params)
        pv = [view(k, p, (p.type.size,)) if p is not None else None for p in params]
        mean, inv = k.temps
        present = [bool(t) for t in k.node.outputs] + [False] * 3
        outs = iter(k.outputs[1:])
        mean_out = view(k, next(outs), (rows,)) if present[1] else None
        inv_out = view(k, next(outs), (rows,)) if present[2] else None
        eps = float(k.attr("epsilon", 1e-5))
        par = 1 if parallel_rows(rows * d) else 0
        with k.loops([rows], names=["row"], parallel=par) as (r,):
            mu, iv = row_stats(k, lambda j: x.load([r, j]), d, mean, inv, [r], eps)
            if mean_out is not None:
                mean_out.store([r], mu)
            if inv_out is not None:
                inv_out.store([r], iv)
            if flat:
                with k.loop(0, d, "jy") as j:
                    sb = [p.load([j if p.type.size > 1 else 0]) if p is not None else None for p in pv]
                    y.store([r, j], _affine_out(k, x.load([r, j]), mean.load([r]), inv.load([r]), *sb))
        if not flat:
            # a parameter broadcast over row dims: an elementwise nest over the whole tensor
            xs, ys = view(k, k.inputs[0], shape), view(k, k.outputs[0], shape)
            ms, vs = (view(k, t, tuple(shape[:axis]) or (1,)) for t in (mean, inv))
            with k.loops(shape, names=[f"e{i}" for i in range(len(shape))], parallel=axis if par else 0) as ix:
                ri = list(ix[:axis]) or [0]
                sb = [p.load(p.broadcast_index(ix)) if p is not None else None for p in params]
                ys.store(ix, _affine_out(k, xs.load(ix), ms.load(ri), vs.load(ri), *sb))


class _ChannelNorm(Kernel):
    """Instance and group normalization of (N, C, spatial...) inputs."""

    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return _float_inputs(node, ins)

    def groups(self, node: Node, ins: list[Operand | None]) -> int:
        raise NotImplementedError

    def _dims(self, node: Node, ins: list[Operand | None]) -> tuple[int, int, int, int, bool]:
        """(N, G, C/G, spatial size, per-channel parameters?)."""
        shape = ins[0].type.shape
        if len(shape) < 2:
            raise ShapeError(f"{node.op_type} node {node.label!r}: input {shape} needs a channel dimension")
        if len(ins) < 3 or ins[1] is None or ins[2] is None:
            raise GraphError(f"{node.op_type} node {node.label!r}: needs the input, scale and bias")
        n, c, s = shape[0], shape[1], _prod(shape[2:])
        g = self.groups(node, ins)
        if g <= 0 or c % g:
            raise ShapeError(f"{node.op_type} node {node.label!r}: {c} channels do not split into {g} groups")
        sizes = {ins[1].type.size, ins[2].type.size}
        if sizes == {c}:
            per_channel = True
        elif sizes == {g}:
            per_channel = False
        else:
            raise ShapeError(f"{node.op_type} node {node.label!r}: scale/bias shapes {ins[1].type.shape}, "
                             f"{ins[2].type.shape} fit neither {c} channels nor {g} groups")
        return n, g, c // g, s, per_channel

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        self._dims(node, ins)
        return [ins[0].type]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        n, g, *_ = self._dims(node, ins)
        return [TensorType((n, g)), TensorType((n, g))]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        n, g, cg, s, _ = self._dims(node, ins)
        return f"{n * g} rows x {cg * s}"

    def lower(self, k: KernelBuilder) -> None:
        ops = [Operand("", t) if t is not None else None for t in k.in_types]
        n, g, cg, s, per_channel = self._dims(k.node, ops)
        xr = view(k, k.inputs[0], (n, g, cg * s))
        x, y = view(k, k.inputs[0], (n, g, cg, s)), view(k, k.outputs[0], (n, g, cg, s))
        scale, bias = (view(k, p, (g, cg) if per_channel else (g,)) for p in k.inputs[1:3])
        mean, inv = k.temps
        eps = float(k.attr("epsilon", 1e-5))
        par = 2 if parallel_rows(n * g * cg * s) else 0
        with k.loops([n, g], names=["n", "g"], parallel=par) as (i, q):
            mu, iv = row_stats(k, lambda j: xr.load([i, q, j]), cg * s, mean, inv, [i, q], eps)
            with k.loops([cg, s], names=["yc", "ys"]) as (c, p):
                at = [q, c] if per_channel else [q]
                y.store([i, q, c, p], _affine_out(k, x.load([i, q, c, p]), mean.load([i, q]), inv.load([i, q]),
                                                  scale.load(at), bias.load(at)))


@register
class InstanceNormalization(_ChannelNorm):
    """InstanceNormalization: one row per (n, c) plane, per-channel scale and bias."""

    op_types = ("InstanceNormalization",)

    def groups(self, node: Node, ins: list[Operand | None]) -> int:
        return ins[0].type.shape[1]


@register
class GroupNormalization(_ChannelNorm):
    """GroupNormalization: one row per (n, group); scale/bias per group (opset 18) or per
    channel (opset 21), told apart by their size."""

    op_types = ("GroupNormalization",)

    def groups(self, node: Node, ins: list[Operand | None]) -> int:
        if "num_groups" not in node.attrs:
            raise GraphError(f"GroupNormalization node {node.label!r}: num_groups is required")
        return int(node.attrs["num_groups"])


#: MeanVarianceNormalization's fixed epsilon (added to the standard deviation)
MVN_EPS = 1e-9


@register
class MeanVarianceNormalization(Kernel):
    """``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes`` (default [0, 2, 3])."""

    op_types = ("MeanVarianceNormalization",)
    polly = "off"

    @staticmethod
    def _axes(node: Node, shape: tuple[int, ...]) -> list[int]:
        axes = [normalize_axis(node, int(a), len(shape)) for a in node.attrs.get("axes", [0, 2, 3])]
        if len(set(axes)) != len(axes):
            raise GraphError(f"MeanVarianceNormalization node {node.label!r}: repeated axes {axes}")
        return sorted(axes)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return _float_inputs(node, ins)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        self._axes(node, ins[0].type.shape)
        return [ins[0].type]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """Mean and 1/(std + eps) per kept point."""
        shape = ins[0].type.shape
        dims, roles = merged_view(shape, self._axes(node, shape))
        kept = _prod(n for n, r in zip(dims, roles) if not r)
        return [TensorType((kept,)), TensorType((kept,))]

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        dims, roles = merged_view(x.shape, self._axes(k.node, x.shape))
        if not dims:
            dims, roles = [1], [False]
        kept = [n for n, r in zip(dims, roles) if not r] or [1]
        count = _prod(n for n, r in zip(dims, roles) if r)
        xv, yv = view(k, x, dims), view(k, y, dims)
        mean, inv = (view(k, t, kept) for t in k.temps)
        with rows_loop(k, dims, roles, x.type.size) as lead:
            red = Reduction(k, dims, roles, lead)

            def load(ix: list) -> ir.Value:
                return xv.load(red.x_index(ix))

            def dev(ix: list) -> ir.Value:
                return k.b.fsub(load(ix), mean.load(red.y_index(ix)))

            red.accumulate(mean, lambda ix: k.f32(-0.0), lambda acc, ix: k.b.fadd(acc, load(ix), flags=REASSOC), "m")
            red.over_kept(lambda yi: mean.store(yi, k.b.fmul(mean.load(yi), k.f32(1.0 / count))))
            red.accumulate(inv, lambda ix: k.f32(-0.0),
                           lambda acc, ix: k.b.fadd(acc, k.b.fmul(dev(ix), dev(ix)), flags=REASSOC), "v")
            red.over_kept(lambda yi: inv.store(yi, k.b.fdiv(k.f32(1.0), k.b.fadd(
                k.sqrt(k.b.fmul(inv.load(yi), k.f32(1.0 / count))), k.f32(MVN_EPS)))))
            sub, _ = red.sub
            with k.loops(sub, names=[f"y{d}" for d in range(len(sub))]) as ix:
                yv.store(red.x_index(ix), k.b.fmul(dev(ix), inv.load(red.y_index(ix))))

