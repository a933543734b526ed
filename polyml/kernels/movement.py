"""Data movement ops: Concat, Transpose and Pad (constant mode, including negative pads).

All three only move elements, so every nest is one affine copy statement:

* Concat — one nest per input, ``out[..., off_j + i, ...] = in_j[..., i, ...]``;
* Transpose — one nest over the output (contiguous writes), ``out[i] = in[i permuted back]``;
* Pad — fill nests over the border slabs of the output (never the interior, so no element is
  written twice) and one copy nest ``out[i + begin] = in[i]`` over the part of the input that
  survives cropping (negative pads).

They move bytes of any dtype the code generator knows (float32, int64, int32, bool).
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import LLVM_TYPES, KernelBuilder, constant
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, const_ints, normalize_axis, register
from polyml.kernels._scalar import outer_parallel_dims


def _movable(node: Node, op: Operand | None, i: int) -> str | None:
    """Why input ``i`` cannot be moved by generated code (a dtype with no LLVM type), or None."""
    if op is not None and op.type.dtype not in LLVM_TYPES:
        return f"input {i} ({op.name!r}) is {op.type.dtype}; supported dtypes are {', '.join(LLVM_TYPES)}"
    return None


@register
class Concat(Kernel):
    """Concat along ``axis`` (negative allowed) of any number of inputs."""

    op_types = ("Concat",)
    polly = "off"  # contiguous copies: no policy measured faster than -O3

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        present = [op for op in ins if op is not None]
        if not present:
            return "Concat needs at least one input"
        if len({op.type.dtype for op in present}) > 1:
            return f"inputs have different dtypes {sorted({op.type.dtype for op in present})}"
        for i, op in enumerate(ins):
            why = _movable(node, op, i)
            if why:
                return why
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        present = [op for op in ins if op is not None]
        rank = len(present[0].type.shape)
        if "axis" not in node.attrs:
            raise GraphError(f"Concat node {node.label!r}: the 'axis' attribute is required")
        axis = normalize_axis(node, int(node.attrs["axis"]), rank)
        out = list(present[0].type.shape)
        out[axis] = 0
        for op in present:
            s = op.type.shape
            if len(s) != rank or any(a != b for d, (a, b) in enumerate(zip(s, present[0].type.shape)) if d != axis):
                raise ShapeError(
                    f"Concat node {node.label!r}: shapes {[o.type.shape for o in present]} differ outside axis {axis}"
                )
            out[axis] += s[axis]
        return [TensorType(tuple(out), present[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        out = k.outputs[0]
        axis = normalize_axis(k.node, int(k.attr("axis")), out.rank)
        offset = 0
        for j, src in enumerate(k.inputs):
            if src is None:  # absent, or stored in place in its slice of out (codegen.lower)
                t = k.in_types[j]
                offset += t.shape[axis] if t is not None and k.node.inputs[j] else 0
                continue
            if src.type.size:
                off = offset
                with k.loops(src.shape, names=[f"c{j}_{d}" for d in range(src.rank)]) as ix:
                    dst = list(ix)
                    if off:
                        dst[axis] = k.b.add(ix[axis], k.i64(off), flags=["nsw"])
                    out.store(dst, src.load(ix))
            offset += src.shape[axis]


@register
class Transpose(Kernel):
    """Transpose by ``perm`` (default: reverse the dimensions)."""

    op_types = ("Transpose",)
    #: measured (2048² and NCHW→NHWC): Polly's rescheduled, tiled nest is 6x faster than -O3,
    #: "tile" (original order) is no better than -O3
    polly = "polly"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return _movable(node, ins[0], 0)

    def policy(self, node: Node, ins: list[Operand | None]) -> str:
        """Polly's tiled transposition where the innermost axis moves; where it stays (a
        transformer's ``[b, s, h, d] → [b, h, s, d]``) every row of ``d`` is a contiguous copy,
        which plain -O3 vectorizes: Polly's tiling of that nest measured 10x slower (BERT-base:
        0.75 ms per head split, 128x12x64)."""
        rank = len(ins[0].type.shape)
        return "off" if rank and self.perm(node, rank)[-1] == rank - 1 else self.polly

    @staticmethod
    def perm(node: Node, rank: int) -> list[int]:
        perm = node.attrs.get("perm")
        if perm is None:
            return list(reversed(range(rank)))
        perm = [int(p) for p in perm]
        if any(not -rank <= p < rank for p in perm) or sorted(p % rank for p in perm) != list(range(rank)):
            raise GraphError(f"Transpose node {node.label!r}: perm {perm} is not a permutation of {rank} axes")
        return [p % rank for p in perm]

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        perm = self.perm(node, len(shape))
        return [TensorType(tuple(shape[p] for p in perm), ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, out = k.inputs[0], k.outputs[0]
        perm = self.perm(k.node, x.rank)
        if not out.type.size:
            return
        inner_kept = perm[-1] == x.rank - 1
        with k.loops(out.shape, parallel=outer_parallel_dims(out.shape) if inner_kept else 0) as ix:
            src: list = [0] * x.rank
            for i, p in enumerate(perm):
                src[p] = ix[i]
            out.store(ix, x.load(src))


@register
class Pad(Kernel):
    """Pad in ``constant`` mode: pads from the attribute (opset < 11) or a constant input, an
    optional ``constant_value`` (constant or computed scalar) and opset 18's ``axes``."""

    op_types = ("Pad",)
    polly = "off"
    static_inputs = (1, 3)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        mode = node.attrs.get("mode", "constant")
        if mode != "constant":
            return f"Pad mode {mode!r} is not supported (only 'constant')"
        why = _movable(node, ins[0], 0)
        if why:
            return why
        if len(ins) > 2 and ins[2] is not None:
            cv = ins[2]
            if cv.type.size != 1:
                return f"constant_value ({cv.name!r}) has shape {cv.type.shape}; a scalar is expected"
            if cv.type.dtype != ins[0].type.dtype:
                return f"constant_value ({cv.name!r}) is {cv.type.dtype}, the data is {ins[0].type.dtype}"
        return None

    @staticmethod
    def pads(node: Node, ins: list[Operand | None]) -> tuple[list[int], list[int]]:
        """Per-dimension (begin, end) pad amounts; negative values crop."""
        rank = len(ins[0].type.shape)
        if len(ins) > 1 and ins[1] is not None:
            pads = const_ints(node, ins[1], "pads")
        else:
            pads = [int(p) for p in node.attrs.get("pads", node.attrs.get("paddings", []))]
        if len(ins) > 3 and ins[3] is not None:
            axes = [normalize_axis(node, a, rank) for a in const_ints(node, ins[3], "axes")]
        else:
            axes = list(range(rank))
        if len(set(axes)) != len(axes):
            raise GraphError(f"Pad node {node.label!r}: repeated axes {axes}")
        if len(pads) != 2 * len(axes):
            raise ShapeError(f"Pad node {node.label!r}: {len(pads)} pads for {len(axes)} axes (expected {2 * len(axes)})")
        begin, end = [0] * rank, [0] * rank
        for i, a in enumerate(axes):
            begin[a], end[a] = pads[i], pads[i + len(axes)]
        return begin, end

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        begin, end = self.pads(node, ins)
        out = tuple(d + b + e for d, b, e in zip(shape, begin, end))
        if any(d < 0 for d in out):
            raise ShapeError(f"Pad node {node.label!r}: pads {begin + end} crop {shape} to a negative size {out}")
        return [TensorType(out, ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, out = k.inputs[0], k.outputs[0]
        ins = [Operand("", t, v) if t is not None else None for t, v in zip(k.in_types, k.values)]
        begin, end = self.pads(k.node, ins)
        rank, dtype = x.rank, out.type.dtype

        # the fill value: a compile-time constant where possible, else a scalar load
        cv = k.inputs[2] if len(k.inputs) > 2 else None
        if cv is not None and k.values[2] is not None:
            value: ir.Value = constant(dtype, np.asarray(k.values[2]).reshape(-1)[0])
        elif cv is not None:
            value = cv.load([0] * cv.rank)
        else:
            value = constant(dtype, float(k.attr("value", 0.0)))

        # the interior box of the output that input elements land in, per dimension
        inner = [(max(0, b), min(o, b + n)) for b, n, o in zip(begin, x.shape, out.shape)]
        if any(lo >= hi for lo, hi in inner):
            # cropping removed every input element: the output is all fill
            if out.type.size:
                with k.loops(out.shape, names=[f"fill{d}" for d in range(rank)]) as ix:
                    out.store(ix, value)
            return

        # border slabs: dims < d inside the interior, dim d before/after it, dims > d whole;
        # together they cover the output outside the interior exactly once
        for d in range(rank):
            lo, hi = inner[d]
            for part, span in (("pre", (0, lo)), ("post", (hi, out.shape[d]))):
                ext = [*inner[:d], span, *[(0, n) for n in out.shape[d + 1 :]]]
                if any(a >= c for a, c in ext):
                    continue
                with k.loops(ext, names=[f"{part}{d}_{e}" for e in range(rank)]) as ix:
                    out.store(ix, value)

        # the copy: input index i lands at i + begin
        src_range = [(lo - b, hi - b) for (lo, hi), b in zip(inner, begin)]
        with k.loops(src_range, names=[f"p{d}" for d in range(rank)]) as ix:
            dst = [k.b.add(i, k.i64(b), flags=["nsw"]) if b else i for i, b in zip(ix, begin)]
            out.store(dst, x.load(ix))
