"""Gather family: Gather, GatherElements, GatherND (data-dependent reads).

Each lowering is one nest over the output domain whose single copy statement reads the data at
an index taken from the ``indices`` tensor, so the write access is affine and the read access has
one (GatherND: ``m``) data-dependent subscript.  Every such subscript goes through
:meth:`KernelBuilder.checked_index`: negatives count from the end, out-of-range values read
element 0 and make the run fail with an error naming the node.

* Gather — domain ``{(o, j, s)}`` (data dims before ``axis``, ``indices`` dims, data dims after
  it), ``out[o, j, s] = data[o, idx[j], s]``; the index is loaded once per ``(o, j)``;
* GatherElements — domain ``{i}`` over ``indices``, ``out[i] = data[i with i_axis := idx[i]]``;
* GatherND — domain ``{(b, j, s)}`` (batch dims, the rest of ``indices`` but its last dim, the
  data dims not indexed), ``out[b, j, s] = data[b, idx[b, j, 0], ..., idx[b, j, m-1], s]``.

The moved data may be any dtype with an LLVM type (float32, int64, int32, bool); indices are
int64 or int32.
"""

from __future__ import annotations

from polyml.codegen.builder import LLVM_TYPES, KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, normalize_axis, register, unsupported_dtype

DATA_DTYPES = frozenset(LLVM_TYPES)
INDEX_DTYPES = frozenset({"int64", "int32"})
#: below this many output elements a parallel region costs more than it saves
PARALLEL_MIN_ELEMENTS = 1 << 15


def check_dtypes(ins: list[Operand | None], data: tuple[int, ...], index: tuple[int, ...]) -> str | None:
    """Why the ``data`` positions (moved bytes) or ``index`` positions (int64/int32) cannot be
    lowered, or None."""
    for i in data:
        if i < len(ins) and ins[i] is not None and ins[i].type.dtype not in DATA_DTYPES:
            return unsupported_dtype(i, ins[i], DATA_DTYPES)
    for i in index:
        if i < len(ins) and ins[i] is not None and ins[i].type.dtype not in INDEX_DTYPES:
            return unsupported_dtype(i, ins[i], INDEX_DTYPES)
    return None


def check_extents(node: Node, extents: list[int], count: int) -> None:
    """A data dimension of extent 0 has no valid index: refuse it unless no index is read."""
    if count and 0 in extents:
        raise ShapeError(f"{node.op_type} node {node.label!r}: an indexed data dimension has extent 0, "
                         "so every index would be out of range")


def parallel_dims(shape: tuple[int, ...], dims: int) -> int:
    """How many leading dims of a nest of ``dims`` dims over ``shape`` may be split over threads."""
    size = 1
    for d in shape:
        size *= d
    return dims if size >= PARALLEL_MIN_ELEMENTS else 0


def names(prefix: str, n: int, start: int = 0) -> list[str]:
    return [f"{prefix}{d}" for d in range(start, start + n)]


@register
class Gather(Kernel):
    """Gather along ``axis`` (negative allowed) with indices of any rank (a scalar included)."""

    op_types = ("Gather",)
    polly = "off"  # data-dependent subscripts: no SCoP; -O3 vectorizes the inner copy

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return check_dtypes(ins, (0,), (1,))

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        data, idx = ins[0].type, ins[1].type
        if not data.shape:
            raise ShapeError(f"Gather node {node.label!r}: data is a scalar (rank 1 or more expected)")
        axis = normalize_axis(node, int(node.attrs.get("axis", 0)), len(data.shape))
        check_extents(node, [data.shape[axis]], idx.size)
        return [TensorType((*data.shape[:axis], *idx.shape, *data.shape[axis + 1 :]), data.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        data, idx, out = k.inputs[0], k.inputs[1], k.outputs[0]
        if not out.type.size:
            return
        axis = normalize_axis(k.node, int(k.attr("axis", 0)), data.rank)
        lead = out.shape[: axis + idx.rank]
        with k.loops(lead, names=[*names("o", axis), *names("j", idx.rank)],
                     parallel=parallel_dims(out.shape, len(lead))) as outer:
            j = k.checked_index(idx.load(outer[axis:]), data.shape[axis])
            with k.loops(out.shape[len(lead) :], names=names("s", data.rank - axis - 1)) as inner:
                out.store([*outer, *inner], data.load([*outer[:axis], j, *inner]))


@register
class GatherElements(Kernel):
    """GatherElements along ``axis``: the output has the shape of ``indices``."""

    op_types = ("GatherElements",)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return check_dtypes(ins, (0,), (1,))

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        data, idx = ins[0].type, ins[1].type
        rank = len(data.shape)
        if rank == 0 or len(idx.shape) != rank:
            raise ShapeError(f"GatherElements node {node.label!r}: data {data.shape} and indices {idx.shape} "
                             "must have the same rank (1 or more)")
        axis = normalize_axis(node, int(node.attrs.get("axis", 0)), rank)
        if any(i > d for a, (i, d) in enumerate(zip(idx.shape, data.shape)) if a != axis):
            raise ShapeError(f"GatherElements node {node.label!r}: indices {idx.shape} exceed data {data.shape} "
                             f"outside axis {axis}")
        check_extents(node, [data.shape[axis]], idx.size)
        return [TensorType(idx.shape, data.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        data, idx, out = k.inputs[0], k.inputs[1], k.outputs[0]
        if not out.type.size:
            return
        axis = normalize_axis(k.node, int(k.attr("axis", 0)), data.rank)
        with k.loops(out.shape, names=names("g", out.rank), parallel=parallel_dims(out.shape, out.rank)) as ix:
            src = list(ix)
            src[axis] = k.checked_index(idx.load(ix), data.shape[axis])
            out.store(ix, data.load(src))


@register
class GatherND(Kernel):
    """GatherND with ``batch_dims``: each row of ``indices``' last dim addresses a slice of data."""

    op_types = ("GatherND",)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return check_dtypes(ins, (0,), (1,))

    @staticmethod
    def dims(node: Node, data: tuple[int, ...], idx: tuple[int, ...]) -> tuple[int, int]:
        """``(batch_dims, m)``: leading dims shared by data and indices, subscripts per row."""
        b = int(node.attrs.get("batch_dims", 0))
        r, q = len(data), len(idx)
        if q < 1 or r < 1:
            raise ShapeError(f"GatherND node {node.label!r}: data {data} and indices {idx} need rank 1 or more")
        if not 0 <= b < min(r, q):
            raise GraphError(f"GatherND node {node.label!r}: batch_dims {b} out of range for ranks {r} and {q}")
        if data[:b] != idx[:b]:
            raise ShapeError(f"GatherND node {node.label!r}: batch dims of data {data} and indices {idx} differ")
        m = idx[-1]
        if m > r - b:
            raise ShapeError(f"GatherND node {node.label!r}: indices rows of length {m} for data {data} "
                             f"with {b} batch dims")
        return b, m

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        data, idx = ins[0].type, ins[1].type
        b, m = self.dims(node, data.shape, idx.shape)
        check_extents(node, list(data.shape[b : b + m]), idx.size)
        return [TensorType((*idx.shape[:-1], *data.shape[b + m :]), data.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        data, idx, out = k.inputs[0], k.inputs[1], k.outputs[0]
        if not out.type.size:
            return
        b, m = self.dims(k.node, data.shape, idx.shape)
        lead = idx.shape[:-1]
        with k.loops(lead, names=[*names("b", b), *names("j", len(lead) - b)],
                     parallel=parallel_dims(out.shape, len(lead))) as outer:
            subs = [k.checked_index(idx.load([*outer, t]), data.shape[b + t]) for t in range(m)]
            with k.loops(data.shape[b + m :], names=names("s", data.rank - b - m)) as inner:
                out.store([*outer, *inner], data.load([*outer[:b], *subs, *inner]))
