"""Scatter family: ScatterND, ScatterElements (and its deprecated name Scatter).

Each lowering is two nests: a copy ``out[i] = data[i]`` over the data's domain, then one
sequential nest over the updates' domain whose statement writes at data-dependent subscripts
(through :meth:`KernelBuilder.checked_index`: negatives count from the end, out-of-range
values make the run fail with an error naming the node).  The scatter nest runs in the order
of the indices, so duplicate indices follow ONNX's sequential semantics: with
``reduction="none"`` the last update wins, otherwise each update is combined in turn.

* ScatterND — domain ``{(j, s)}`` (``indices`` dims but the last, data dims not indexed),
  ``out[idx[j, 0], ..., idx[j, m-1], s] ⊕= upd[j, s]``;
* ScatterElements — domain ``{i}`` over ``indices``,
  ``out[i with i_axis := idx[i]] ⊕= upd[i]``.

``⊕`` is the reduction: none (store), add, mul, max, min; on bool data add/max are ``or``,
mul/min ``and``.  Data and updates may be any dtype with an LLVM type; indices int64/int32.
"""

from __future__ import annotations

import llvmlite.ir as ir

from polyml.codegen.builder import Buffer, KernelBuilder, is_float
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, normalize_axis, register
from polyml.kernels.gather import check_dtypes, check_extents, names, parallel_dims

REDUCTIONS = ("none", "add", "mul", "max", "min")


def combine(k: KernelBuilder, reduction: str, dtype: str, old: ir.Value, new: ir.Value) -> ir.Value:
    """``old ⊕ new`` for one reduction and dtype."""
    b = k.b
    if reduction == "none":
        return new
    if dtype == "bool":
        return b.or_(old, new) if reduction in ("add", "max") else b.and_(old, new)
    if is_float(dtype):
        return {"add": b.fadd, "mul": b.fmul, "max": k.maxf, "min": k.minf}[reduction](old, new)
    if reduction == "add":
        return b.add(old, new)
    if reduction == "mul":
        return b.mul(old, new)
    pred = ">" if reduction == "max" else "<"
    return b.select(b.icmp_signed(pred, old, new), old, new)


def copy(k: KernelBuilder, src: Buffer, dst: Buffer) -> None:
    """The first nest: ``dst[i] = src[i]`` over the whole domain."""
    with k.loops(src.shape, names=names("c", src.rank), parallel=parallel_dims(src.shape, src.rank)) as ix:
        dst.store(ix, src.load(ix))


class _Scatter(Kernel):
    polly = "off"  # data-dependent write subscripts: no SCoP

    def reduction(self, node: Node) -> str:
        r = node.attrs.get("reduction", "none")
        if r not in REDUCTIONS:
            raise GraphError(f"{node.op_type} node {node.label!r}: unknown reduction {r!r}")
        return r

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        why = check_dtypes(ins, (0, 2), (1,))
        if why:
            return why
        if ins[0].type.dtype != ins[2].type.dtype:
            return f"updates ({ins[2].name!r}) are {ins[2].type.dtype}, the data is {ins[0].type.dtype}"
        if node.attrs.get("reduction", "none") not in REDUCTIONS:
            return f"reduction {node.attrs.get('reduction')!r} is not one of {', '.join(REDUCTIONS)}"
        return None


@register
class ScatterND(_Scatter):
    """ScatterND: each row of ``indices``' last dim addresses a slice of the output."""

    op_types = ("ScatterND",)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        data, idx, upd = ins[0].type, ins[1].type, ins[2].type
        self.reduction(node)
        if not data.shape or not idx.shape:
            raise ShapeError(f"ScatterND node {node.label!r}: data {data.shape} and indices {idx.shape} need rank 1 or more")
        m = idx.shape[-1]
        if m > len(data.shape):
            raise ShapeError(f"ScatterND node {node.label!r}: indices rows of length {m} for data of rank {len(data.shape)}")
        want = (*idx.shape[:-1], *data.shape[m:])
        if upd.shape != want:
            raise ShapeError(f"ScatterND node {node.label!r}: updates have shape {upd.shape}, expected {want}")
        check_extents(node, list(data.shape[:m]), idx.size)
        return [data]

    def lower(self, k: KernelBuilder) -> None:
        data, idx, upd, out = k.inputs[0], k.inputs[1], k.inputs[2], k.outputs[0]
        reduction = self.reduction(k.node)
        if not out.type.size:
            return
        copy(k, data, out)
        if not upd.type.size:
            return
        m = idx.shape[-1]
        lead = idx.shape[:-1]
        with k.loops(lead, names=names("j", len(lead))) as outer:
            subs = [k.checked_index(idx.load([*outer, t]), data.shape[t]) for t in range(m)]
            with k.loops(data.shape[m:], names=names("s", data.rank - m)) as inner:
                dst = [*subs, *inner]
                new = upd.load([*outer, *inner])
                if reduction != "none":
                    new = combine(k, reduction, data.type.dtype, out.load(dst), new)
                out.store(dst, new)


@register
class ScatterElements(_Scatter):
    """ScatterElements along ``axis`` (Scatter, its name before opset 11, is the same op)."""

    op_types = ("ScatterElements", "Scatter")

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        data, idx, upd = ins[0].type, ins[1].type, ins[2].type
        self.reduction(node)
        rank = len(data.shape)
        if rank == 0 or len(idx.shape) != rank:
            raise ShapeError(f"{node.op_type} node {node.label!r}: data {data.shape} and indices {idx.shape} "
                             "must have the same rank (1 or more)")
        if upd.shape != idx.shape:
            raise ShapeError(f"{node.op_type} node {node.label!r}: updates {upd.shape} and indices {idx.shape} differ")
        axis = normalize_axis(node, int(node.attrs.get("axis", 0)), rank)
        if any(i > d for a, (i, d) in enumerate(zip(idx.shape, data.shape)) if a != axis):
            raise ShapeError(f"{node.op_type} node {node.label!r}: indices {idx.shape} exceed data {data.shape} "
                             f"outside axis {axis}")
        check_extents(node, [data.shape[axis]], idx.size)
        return [data]

    def lower(self, k: KernelBuilder) -> None:
        data, idx, upd, out = k.inputs[0], k.inputs[1], k.inputs[2], k.outputs[0]
        reduction = self.reduction(k.node)
        if not out.type.size:
            return
        copy(k, data, out)
        if not upd.type.size:
            return
        axis = normalize_axis(k.node, int(k.attr("axis", 0)), data.rank)
        with k.loops(idx.shape, names=names("u", idx.rank)) as ix:
            dst = list(ix)
            dst[axis] = k.checked_index(idx.load(ix), data.shape[axis])
            new = upd.load(ix)
            if reduction != "none":
                new = combine(k, reduction, data.type.dtype, out.load(dst), new)
            out.store(dst, new)
