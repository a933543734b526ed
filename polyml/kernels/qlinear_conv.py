"""Integer convolutions: ConvInteger (int32 out) and QLinearConv (requantized 8-bit out).

``y[n, m, o] = Σ_{c, j} (x[n, g·Cg + c, o·s + j·d - pad] - x_zp) · (w[m, c, j] - w_zp[m])``
(outside the input ``x`` reads as ``x_zp``, so padding adds nothing), then for QLinearConv
``+ bias[m]`` and the requantization of :mod:`polyml.kernels._integer` with the fused
Relu/Clip (``polyml_clip``).  NCHW, 1-3 spatial dims, groups, strides, dilations, pads as
:mod:`polyml.kernels.conv`.

Three lowerings, exact alike (int32 arithmetic), all but the last reading the input *flat*
(:class:`_Flat`: padded with ``x_zp`` and split into stride phases, so that every tap is a
constant offset from the output position on the plane pitch):

* ``igemm`` (host builds, 2-D, constant weights with zero points 0 after the micro-kernel's
  shift, at least 8 channels per group and 8 reduction elements, large enough): per batch
  index and group, ``w[g] (Mg × Cg·taps) · X`` on :mod:`polyml.codegen.igemm`, ``X``'s rows
  (a channel and tap each) contiguous runs of the flat input packed by ``rows_packer``, the
  weights pre-packed at compile time, ``x_zp`` folded with the weights' row sums and the bias
  into one int32 per channel (:class:`polyml.kernels._integer.Corrections`), the
  requantization fused in the tile epilogue, the junk columns between rows cropped after;
  batch and groups are the parallel dimension with the tiles.
* ``direct`` 2-D (depthwise and other thin groups, weights with nonzero zero points, GPU
  lowerings): per ``n, m`` (parallel) one vectorized loop over the flat output positions
  summing all taps (:meth:`_IntegerConv._direct_flat`).
* ``direct`` 1-D/3-D: the input copied into a buffer padded with ``x_zp``, then per ``n, m``
  and output row an int32 row accumulator ``acc[ow] += x[.., ow·s + j·d] · (w - w_zp)``
  over the channels and taps, and ``acc - x_zp · Σ(w - w_zp)`` into the output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import igemm
from polyml.codegen.builder import F32, I32, Buffer, KernelBuilder, like, pointer_type, splat
from polyml.codegen.quant import quantize_value, to_i32
from polyml.driver.toolchain import host_target
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Operand, register
from polyml.kernels._integer import (
    QTYPES,
    Corrections,
    IntegerKernel,
    QLinear,
    Requant,
    Tables,
    ZeroPoint,
    emit_rb,
    requantized,
    store_output,
    zero_point,
    zp_problem,
)
from polyml.kernels.conv import Window, conv_window, copy_parallel, nest, window_problem

I64 = ir.IntType(64)
I8 = ir.IntType(8)
#: the integer GEMM needs at least this many output channels and reduction elements per group
GEMM_MIN_CHANNELS = 8
GEMM_MIN_REDUCTION = 8
GEMM_MIN_MACS = 1 << 15
#: register tile heights of the positions-as-rows product (7 divides 7x7 and 14x14 maps)
POSITION_TILES = (12, 8, 7)
#: maps with at most this many output positions run positions-as-rows, when the reduction
#: has at least ROWS_MIN_REDUCTION elements: its epilogue stores each output byte apart (down
#: the channel planes), which short reductions do not pay for (mobilenet_v2's 1x1 convs with
#: K = 64…320 at 14x14 and 7x7: the model 13 % slower)
ROWS_MAX_POSITIONS = 196
ROWS_MIN_REDUCTION = 512
#: int8 im2col packed in place where the input allows (False: packed as a copy)
IGEMM_INPLACE = True


def _view(k: KernelBuilder, buf: Buffer, shape: tuple[int, ...]) -> Buffer:
    tt = TensorType(tuple(int(d) for d in shape), buf.type.dtype)
    assert tt.size == buf.type.size, (shape, buf.shape)
    return Buffer(k, k.b.bitcast(buf.ptr, pointer_type(tt)), tt, buf.name)


@dataclass(frozen=True)
class _Flat:
    """A 2-D convolution's input as the GEMM reads it: padded with the zero point and split
    into ``sh × sw`` phases, ``xq[c][a][b][r][q] = xpad[c][r·sh + a][q·sw + b]`` (``Hq × Wq``
    planes), so that tap ``(kh, kw)`` of output ``(oh, ow)`` is ``xq[c][φ][oh + δh][ow + δw]``
    with ``φ = (kh·dh mod sh, kw·dw mod sw)``, ``δ = (kh·dh div sh, kw·dw div sw)``: a
    constant offset from ``oh·Wq + ow``.  Read flat, each row of the product (a channel and
    tap) is one contiguous run over the output positions on the plane's pitch ``Wq``:
    ``N' = (OH-1)·Wq + OW`` columns, of which those with ``ow ≥ OW`` are junk the epilogue
    skips (a few % at 56x56, 24 % at 7x7 with a 3x3 kernel).  Unstrided and unpadded, ``x``
    itself is read so (``copy`` False)."""

    strides: tuple[int, int]
    rows: int
    pitch: int
    columns: int
    copy: bool
    pads: tuple[int, int]
    dilations: tuple[int, int]
    size: tuple[int, int]
    kernel: tuple[int, int]
    #: bytes past the last plane that a full panel's vector loads may touch: none (N' stops
    #: at the last output), kept as a guard
    SLACK = 64

    @staticmethod
    def of(win: Window) -> _Flat:
        (sh, sw), (hp, wp) = win.strides, win.required
        copy = win.needs_copy() or sh > 1 or sw > 1
        rows, pitch = (-(-hp // sh), -(-wp // sw)) if copy else win.size
        return _Flat((sh, sw), rows, pitch, (win.out[0] - 1) * pitch + win.out[1], copy, win.pads_begin, win.dilations,
                     win.size, win.kernel)

    @property
    def plane_set(self) -> int:
        """Elements of one channel's phase planes."""
        return self.strides[0] * self.strides[1] * self.rows * self.pitch

    def tap_offsets(self, win: Window) -> list[int]:
        """Per tap ``(kh, kw)``: its element offset within a channel's phase planes."""
        (sh, sw), (dh, dw) = self.strides, self.dilations
        out = []
        for kh in range(self.kernel[0]):
            for kw in range(self.kernel[1]):
                a, b = (kh * dh) % sh, (kw * dw) % sw
                out.append(((a * sw + b) * self.rows + (kh * dh) // sh) * self.pitch + (kw * dw) // sw)
        return out

    def phases(self, h: int, w: int) -> Iterator[tuple[int, int, tuple[int, int], tuple[int, int]]]:
        """Per stride phase ``(a, b)`` holding any input element: the plane's index ``a·sw + b``,
        its first element's offset, and the plane rows and columns the input covers."""
        (sh, sw), (pt, pl) = self.strides, self.pads
        for a in range(sh):  # the input rows r·sh + a - pt and columns q·sw + b - pl inside x
            rows = (max(0, -((a - pt) // sh)), min(self.rows, (h - 1 + pt - a) // sh + 1))
            for bb in range(sw):
                cols = (max(0, -((bb - pl) // sw)), min(self.pitch, (w - 1 + pl - bb) // sw + 1))
                if rows[1] > rows[0] and cols[1] > cols[0]:
                    yield a, bb, rows, cols

    def border(self, h: int, w: int) -> list[tuple[int, int]]:
        """The runs ``(offset, length)`` of a channel's phase planes that no input element
        lands in (the padding, and phases with no input at all), adjacent runs merged."""
        plane = self.rows * self.pitch
        inside = {a * self.strides[1] + bb: (rows, cols) for a, bb, rows, cols in self.phases(h, w)}
        runs: list[tuple[int, int]] = []

        def add(lo: int, hi: int) -> None:
            if hi <= lo:
                return
            if runs and runs[-1][0] + runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], hi - runs[-1][0])
            else:
                runs.append((lo, hi - lo))

        for phi in range(self.strides[0] * self.strides[1]):
            p0 = phi * plane
            if phi not in inside:
                add(p0, p0 + plane)
                continue
            (r0, r1), (c0, c1) = inside[phi]
            at = p0
            for r in range(r0, r1):
                add(at, p0 + r * self.pitch + c0)
                at = p0 + r * self.pitch + c1
            add(at, p0 + plane)
        return runs

    def copies(self, h: int, w: int) -> list[tuple[int, list[int], tuple[int, int], tuple[int, int]]]:
        """The copy into the phase planes as ``(a, [b, ...], rows, columns)`` nests: per row
        phase ``a``, the columns every column phase has in one nest (a contiguous run of the
        input, one store stream per plane: it vectorizes), then the few columns only some have."""
        by_row: dict[int, list[tuple[int, tuple[int, int], tuple[int, int]]]] = {}
        for a, bb, rows, cols in self.phases(h, w):
            by_row.setdefault(a, []).append((bb, rows, cols))
        out = []
        for a, phases in by_row.items():
            rows = phases[0][1]
            lo, hi = max(cols[0] for _, _, cols in phases), min(cols[1] for _, _, cols in phases)
            if hi > lo:
                out.append((a, [bb for bb, _, _ in phases], rows, (lo, hi)))
            for bb, _, (c0, c1) in phases:
                for span in ((c0, min(c1, lo)), (max(c0, hi), c1)) if hi > lo else ((c0, c1),):
                    if span[1] > span[0]:
                        out.append((a, [bb], rows, span))
        return out

    def _source(self, k: KernelBuilder, a: int, bb: int, r: ir.Value, q: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        """Within a channel: the flat offset of plane ``(a, b)``'s element ``(r, q)`` and the
        input row and column it holds."""
        b = k.b
        (sh, sw), (pt, pl) = self.strides, self.pads
        at = b.add(b.mul(r, k.i64(self.pitch)), b.add(q, k.i64((a * sw + bb) * self.rows * self.pitch)))
        return at, b.add(b.mul(r, k.i64(sh)), k.i64(a - pt)), b.add(b.mul(q, k.i64(sw)), k.i64(bb - pl))

    def fill(self, k: KernelBuilder, x: Buffer, xq: Buffer, zx: ir.Value | None, zx_buf: Buffer | None) -> None:
        """``xq`` = the zero point everywhere, then the input copied into its phase planes."""
        n_, c_all, h, w = x.shape
        with nest(k, [xq.shape[0]], names=["zfill"], parallel=min(1, copy_parallel([xq.shape[0]]))) as (i,):
            xq.store([i], zx if zx is not None else zx_buf.load([0]))
        for a, bbs, rows, cols in self.copies(h, w):
            extents = [n_, c_all, rows]
            with nest(k, extents, names=["qn", "qc", "qr"], parallel=copy_parallel([*extents, cols])) as (n, c, r):
                b = k.b
                plane0 = b.mul(b.add(b.mul(k.i64(n), k.i64(c_all)), k.i64(c)), k.i64(self.plane_set))
                self._copy_columns(k, x, k.i64(n), k.i64(c), a, bbs, k.i64(r), cols,
                                   b.gep(b.bitcast(xq.ptr, I8.as_pointer()), [plane0], inbounds=True))

    def fill_channel(self, k: KernelBuilder, x: Buffer, n: ir.Value, c: ir.Value, dst: ir.Value, zx: ir.Value,
                     slack: int) -> None:
        """One channel's phase planes (and ``slack`` bytes after them) at ``dst`` (``i8*``): the
        zero point, then the input copied in; inside a parallel loop body, so that each thread
        copies the channels it computes while they fit its L1."""
        with k.loop(0, self.plane_set + slack, "zfill") as i:
            k.b.store(zx, k.b.gep(dst, [k.i64(i)], inbounds=True))
        for a, bbs, rows, cols in self.copies(*x.shape[2:]):
            with nest(k, [rows], names=["qr"]) as (r,):
                self._copy_columns(k, x, n, c, a, bbs, k.i64(r), cols, dst)

    def fill_grouped(self, k: KernelBuilder, x: Buffer, xq: Buffer, zx: ir.Constant | None, zx_buf: Buffer | None,
                     g: int, flip: bool) -> None:
        """``xq`` as :meth:`fill`'s planes with every ``g`` channels interleaved,
        ``xq[n][c/g][φ plane element][c%g]``: a column's ``g`` channels at a tap are one word,
        the operand the integer GEMM reads in place (``IGemmSpec.x_offsets``); ``flip``
        xors each byte's top bit (int8 activations for ``vpdpbusd``'s unsigned operand).
        One parallel loop over ``(n, c/g)``: the block's :meth:`border` set to the zero point
        (a memset of the whole buffer before the copy cost 11 % of a 3x3/2 conv, one of each
        block 5 %), its rows copied in, :attr:`SPLIT` columns a step: one load per channel (two
        column phases: its even and odd bytes), the ``g`` vectors interleaved by shuffles into
        one store."""
        n_, c_all, h, w = x.shape
        i8p = I8.as_pointer()
        v, (sh, sw) = self.SPLIT, self.strides
        block = self.plane_set * g
        par = copy_parallel([n_, c_all // g, block])
        with nest(k, [n_, c_all // g], names=["gn", "gc"], parallel=par) as (n, cb):
            b = k.b
            n, cb = k.i64(n), k.i64(cb)
            base = b.gep(b.bitcast(xq.ptr, i8p), [b.mul(b.add(b.mul(n, k.i64(c_all // g)), cb), k.i64(block))],
                         inbounds=True)
            value = zx if zx is not None else zx_buf.load([0])
            if flip:
                value = b.xor(value, ir.Constant(I8, 0x80))
            for start, length, count, stride in _strided(self.border(h, w)):
                nbytes = length * g
                if nbytes > self.MAX_SPLAT:  # a long run (a whole plane): a byte loop per run, i.e. a memset
                    with nest(k, [count, nbytes], names=["gzr", "gzl"]) as (i, e):
                        b = k.b
                        at = b.add(k.i64(start * g), b.add(b.mul(k.i64(i), k.i64(stride * g)), k.i64(e)))
                        b.store(value, b.gep(base, [at], inbounds=True))
                    continue
                fill_vec = splat(b, value, ir.VectorType(I8, nbytes))
                with nest(k, [count], names=["gz"]) as (i,):  # one fixed-size store per run
                    b = k.b
                    at = b.add(k.i64(start * g), b.mul(k.i64(i), k.i64(stride * g)))
                    b.store(fill_vec, b.bitcast(b.gep(base, [at], inbounds=True), fill_vec.type.as_pointer()), align=1)
            chans = [b.add(b.mul(cb, k.i64(g)), k.i64(e)) for e in range(g)]
            for a, bbs, rows, (lo, hi) in self.copies(h, w):
                with k.loop(rows[0], rows[1], "gr") as r:
                    b = k.b
                    r = k.i64(r)
                    ih = b.add(b.mul(r, k.i64(sh)), k.i64(a - self.pads[0]))
                    if hi - lo >= v and (sw == 1 or (sw == 2 and len(bbs) == 2)):
                        rows_src = [b.bitcast(x.addr([n, c, ih, 0]), i8p) for c in chans]
                        with k.loop(0, -(-(hi - lo) // v), "gv") as t:
                            b = k.b
                            q0 = b.add(b.mul(k.i64(t), k.i64(v)), k.i64(lo))
                            q0 = b.select(b.icmp_signed(">", q0, k.i64(hi - v)), k.i64(hi - v), q0)
                            iw0 = b.add(b.mul(q0, k.i64(sw)), k.i64(-self.pads[1]))
                            loads = [b.load(b.bitcast(b.gep(src, [iw0], inbounds=True),
                                                      ir.VectorType(I8, sw * v).as_pointer()), align=1)
                                     for src in rows_src]
                            for bb in bbs:
                                parts = loads if sw == 1 else [
                                    b.shuffle_vector(ld, ir.Constant(ld.type, None),
                                                     ir.Constant(ir.VectorType(I32, v), [2 * i + bb for i in range(v)]))
                                    for ld in loads]
                                words = _interleave(b, parts)
                                if flip:
                                    words = b.xor(words, ir.Constant(words.type, [0x80] * (g * v)))
                                at, _, _ = self._source(k, a, bb, r, q0)
                                b.store(words, b.bitcast(b.gep(base, [b.mul(at, k.i64(g))], inbounds=True),
                                                         words.type.as_pointer()), align=1)
                    elif hi > lo:
                        with k.loop(lo, hi, "gq") as q:
                            b = k.b
                            for bb in bbs:
                                at, ih_, iw = self._source(k, a, bb, r, k.i64(q))
                                for e, c in enumerate(chans):
                                    val = x.load([n, c, ih_, iw])
                                    if flip:
                                        val = b.xor(val, ir.Constant(I8, 0x80))
                                    b.store(val, b.gep(base, [b.add(b.mul(at, k.i64(g)), k.i64(e))], inbounds=True))

    #: longest border run (bytes) set by one vector store
    MAX_SPLAT = 512

    #: columns per vector step of a two-phase copy (one 32-byte load split into its even and odd bytes)
    SPLIT = 16

    def _copy_columns(self, k: KernelBuilder, x: Buffer, n: ir.Value, c: ir.Value, a: int, bbs: list[int],
                      r: ir.Value, cols: tuple[int, int], dst: ir.Value) -> None:
        """Plane row ``r`` of row phase ``a``, columns ``cols``, for the column phases ``bbs``,
        from input channel ``(n, c)`` into the channel's planes at ``dst`` (``i8*``).  Two column
        phases (stride 2) take :attr:`SPLIT` columns a step: one contiguous load of the input
        row, its even and odd bytes stored to the two planes (LLVM leaves the strided byte loop
        scalar); the last step ends at the last column, overlapping the one before (the same
        bytes stored twice).  Fewer columns than a step go element by element."""
        b = k.b
        lo, hi = cols
        v = self.SPLIT
        if self.strides[1] == 2 and len(bbs) == 2 and hi - lo >= v:
            ih = b.add(b.mul(r, k.i64(self.strides[0])), k.i64(a - self.pads[0]))
            row = b.bitcast(x.addr([n, c, ih, 0]), I8.as_pointer())
            with k.loop(0, -(-(hi - lo) // v), "qv") as t:
                b = k.b
                q0 = b.add(b.mul(k.i64(t), k.i64(v)), k.i64(lo))
                q0 = b.select(b.icmp_signed(">", q0, k.i64(hi - v)), k.i64(hi - v), q0)
                src = b.gep(row, [b.add(b.mul(q0, k.i64(2)), k.i64(-self.pads[1]))], inbounds=True)
                both = b.load(b.bitcast(src, ir.VectorType(I8, 2 * v).as_pointer()), align=1)
                for bb in (0, 1):
                    part = b.shuffle_vector(both, ir.Constant(both.type, None),
                                            ir.Constant(ir.VectorType(I32, v), [2 * i + bb for i in range(v)]))
                    at, _, _ = self._source(k, a, bb, r, q0)
                    b.store(part, b.bitcast(b.gep(dst, [at], inbounds=True), part.type.as_pointer()), align=1)
            return
        if hi > lo:
            with nest(k, [(lo, hi)], names=["qq"]) as (q,):
                for bb in bbs:
                    at, ih, iw = self._source(k, a, bb, r, k.i64(q))
                    k.b.store(x.load([n, c, ih, iw]), k.b.gep(dst, [at], inbounds=True))


def _strided(runs: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """``(offset, length)`` runs as ``(offset, length, count, stride)``: consecutive runs of
    one length at one spacing (a plane's per-row pads) folded into one."""
    out: list[tuple[int, int, int, int]] = []
    for off, length in runs:
        if out:
            o, n, c, st = out[-1]
            if n == length and (c == 1 or off - (o + (c - 1) * st) == st):
                out[-1] = (o, n, c + 1, off - o if c == 1 else st)
                continue
        out.append((off, length, 1, 0))
    return out


def _interleave(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    """``g`` vectors of ``v`` bytes as one of ``g·v``: element ``i`` of part ``e`` at ``i·g + e``."""
    g, v = len(parts), parts[0].type.count
    while len(parts) > 1:  # concatenate pairwise, then one shuffle picks the interleaved order
        parts = [b.shuffle_vector(parts[i], parts[i + 1],
                                  ir.Constant(ir.VectorType(I32, 2 * parts[i].type.count),
                                              list(range(2 * parts[i].type.count))))
                 for i in range(0, len(parts), 2)]
    whole = parts[0]
    return b.shuffle_vector(whole, ir.Constant(whole.type, None),
                            ir.Constant(ir.VectorType(I32, g * v), [e * v + i for i in range(v) for e in range(g)]))


@dataclass(frozen=True)
class _DirectParams:
    """What both direct lowerings read per kernel: the zero points (run-time ones as buffers
    ``zx_buf``/``zw_buf``), the requantization and the constant tables (multipliers, bias,
    weight zero points; None where absent)."""

    zx: ZeroPoint
    zw: ZeroPoint
    rq: Requant | None
    tables: Tables
    mult: ir.GlobalVariable | None
    bias_t: ir.GlobalVariable | None
    zw_t: ir.GlobalVariable | None
    zw_buf: Buffer | None
    zx_buf: Buffer | None


#: x86's multiply-add of int16 lane pairs into int32 lanes, by int32 lanes per vector
_PMADDWD = {16: "llvm.x86.avx512.pmaddw.d.512", 8: "llvm.x86.avx2.pmadd.wd", 4: "llvm.x86.sse2.pmadd.wd"}


def _memcpy(b: ir.IRBuilder, dst: ir.Value, src: ir.Value, nbytes: int) -> None:
    """``llvm.memcpy`` of a constant size (expanded inline into a few wide moves)."""
    module = b.block.function.module
    i8p = I8.as_pointer()
    fn = module.globals.get("llvm.memcpy.p0i8.p0i8.i64") or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [i8p, i8p, I64, ir.IntType(1)]), "llvm.memcpy.p0i8.p0i8.i64")
    b.call(fn, [dst, src, ir.Constant(I64, nbytes), ir.Constant(ir.IntType(1), 0)])


def _pmaddwd(module: ir.Module, lanes: int) -> ir.Function:
    """``pmaddwd``: ``r[j] = a[2j]·b[2j] + a[2j+1]·b[2j+1]`` (int16 in, int32 out); with an add
    of the result LLVM selects ``vpdpwssd`` where the CPU has VNNI.  Written as the intrinsic:
    as plain multiplies and shuffles, instcombine moves the shuffles before the multiply and the
    pattern is lost."""
    name = _PMADDWD[lanes]
    fn = module.globals.get(name)
    if fn is None:
        v16 = ir.VectorType(ir.IntType(16), 2 * lanes)
        fn = ir.Function(module, ir.FunctionType(ir.VectorType(I32, lanes), [v16, v16]), name)
    return fn


class _IntegerConv(IntegerKernel):
    """The shared lowering; subclasses say where the operands are."""

    #: input positions: x, w, x_zp, w_zp
    X, W, ZX, ZW = 0, 1, 2, 3

    # -- shapes and choices -------------------------------------------------------------------
    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        for i, what in ((self.X, "x"), (self.W, "w")):
            if ins[i].type.dtype not in QTYPES:
                return f"{what} ({ins[i].name!r}) is {ins[i].type.dtype}; supported: int8, uint8"
        m = ins[self.W].type.shape[0] if ins[self.W].type.shape else 1
        return (window_problem(node, [ins[self.X]])
                or zp_problem(node, ins, self.ZX, ins[self.X].type.dtype, (1,), "x's zero point")
                or zp_problem(node, ins, self.ZW, ins[self.W].type.dtype, (m,), "w's zero point"))

    def geometry(self, node: Node, ins: list[Operand | None]) -> tuple[Window, int]:
        x, w = ins[self.X].type, ins[self.W].type
        group = int(node.attrs.get("group", 1))
        if len(x.shape) < 3 or len(w.shape) != len(x.shape):
            raise ShapeError(f"{node.op_type} node {node.label!r}: input {x.shape} and weight {w.shape} must both be N-C-spatial")
        c, m = x.shape[1], w.shape[0]
        if group < 1 or c % group or m % group or w.shape[1] * group != c:
            raise ShapeError(f"{node.op_type} node {node.label!r}: input {x.shape}, weight {w.shape} and group={group} "
                             "do not agree")
        return conv_window(node, x, w), group

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        win, _ = self.geometry(node, ins)
        x, w = ins[self.X].type, ins[self.W].type
        return [TensorType((x.shape[0], w.shape[0], *win.out), self.out_dtype(ins))]

    def corrections(self, node: Node, ins: list[Operand | None], blk: igemm.IBlocking) -> Corrections:
        w = ins[self.W]
        m, kk = w.type.shape[0], math.prod(w.type.shape[1:])
        dw, dx = blk.shifts(w.type.dtype == "int8", ins[self.X].type.dtype == "int8")
        row_sums = None if w.value is None else np.asarray(w.value).astype(np.int64).reshape(m, kk).sum(axis=1)
        return Corrections(m, kk, dw, dx, zero_point(ins, self.ZW, w.type.dtype),
                           zero_point(ins, self.ZX, ins[self.X].type.dtype), row_sums, self.bias(ins))

    def use_gemm(self, node: Node, ins: list[Operand | None]) -> bool:
        """Whether this node runs on the integer GEMM (see the module docstring)."""
        if not self.config.packed or ins[self.W].value is None:
            return False
        win, group = self.geometry(node, ins)
        x, w = ins[self.X].type, ins[self.W].type
        mg, kk = w.shape[0] // group, math.prod(w.shape[1:])
        if win.rank != 2 or mg < GEMM_MIN_CHANNELS or kk < GEMM_MIN_REDUCTION:
            return False
        cor = self.corrections(node, ins, igemm.blocking_for_host(override=self.config.igemm))
        if cor.needs_cx or not cor.zw.known:
            return False
        return x.shape[0] * w.shape[0] * math.prod(win.out) * kk >= GEMM_MIN_MACS

    def use_pairs(self, node: Node, ins: list[Operand | None]) -> bool:
        """Whether this node runs :meth:`_depthwise_groups`: a host build, 2-D, one input and
        one output channel per group, constant weights and zero points, a flat copy."""
        if not self.config.packed or ins[self.W].value is None or self.use_gemm(node, ins):
            return False
        win, group = self.geometry(node, ins)
        x, w = ins[self.X].type, ins[self.W].type
        zw = zero_point(ins, self.ZW, w.dtype)
        return (win.rank == 2 and group == x.shape[1] == w.shape[0] and _Flat.of(win).copy and zw.known
                and host_target().triple.startswith("x86_64"))

    def _gemm_dims(self, node: Node, ins: list[Operand | None]) -> tuple[int, int, int, int, int]:
        """(units = N·groups, Mg, N' = the flat columns, K, groups)."""
        win, group = self.geometry(node, ins)
        x, w = ins[self.X].type, ins[self.W].type
        return x.shape[0] * group, w.shape[0] // group, _Flat.of(win).columns, math.prod(w.shape[1:]), group

    def _interleavable(self, node: Node, ins: list[Operand | None]) -> bool:
        """Whether the input can be read from a channel-interleaved flat copy
        (:meth:`_Flat.fill_grouped`): ``vnni`` (one byte per element) and whole groups of 4
        channels per conv group."""
        if not IGEMM_INPLACE:
            return False
        _, mg, _, _, group = self._gemm_dims(node, ins)
        blk = igemm.blocking_for_host(mg, self.config.igemm)
        return blk.variant == "vnni" and (ins[self.X].type.shape[1] // group) % blk.group == 0

    def in_place(self, node: Node, ins: list[Operand | None]) -> bool:
        """Whether the GEMM reads its input in place from the channel-interleaved flat copy
        (``IGemmSpec.x_offsets``, or ``w_rows`` positions-as-rows) instead of packing panels of
        it: an input copied anyway (padded or strided: an unpadded 1x1 conv on a large map
        reads ``x`` itself, and an interleaving copy costs more there than the packing it
        saves, mobilenet_v2 int8 +7 %), or a positions-as-rows product."""
        if not self._interleavable(node, ins):
            return False
        return _Flat.of(self.geometry(node, ins)[0]).copy or self.rows_blocking(node, ins) is not None

    def rows_blocking(self, node: Node, ins: list[Operand | None]) -> igemm.IBlocking | None:
        """The blocking of the *positions-as-rows* product when this conv runs it, else None:
        ``y[:, p]ᵀ = X[p, :] · Wᵀ`` with the exact output positions as the rows (read in place
        from the interleaved flat input through a table of their offsets, ``IGemmSpec.w_rows``)
        and the output channels as the vector columns (weights pre-packed as X panels).  No
        junk columns and no padding of the positions to 32-wide panels: 7x7 maps computed
        61 flat columns in two panels (64 for 49 outputs), 14x14 224 for 196; the register
        tile takes the height in :data:`POSITION_TILES` that pads the positions least.  For
        maps of at most :data:`ROWS_MAX_POSITIONS` outputs, reductions of at least
        :data:`ROWS_MIN_REDUCTION` and whole vectors of channels (``config.igemm_rows``,
        ``POLYML_IGEMM_ROWS=0|1``, forces it off or on where possible)."""
        if not self._interleavable(node, ins):
            return None
        win, group = self.geometry(node, ins)
        mg = ins[self.W].type.shape[0] // group
        p_out = math.prod(win.out)
        kk = math.prod(ins[self.W].type.shape[1:])
        force = self.config.igemm_rows
        if force == "0" or mg % 32 or (force != "1" and (p_out > ROWS_MAX_POSITIONS or kk < ROWS_MIN_REDUCTION)):
            return None
        blk = igemm.blocking_for_host(mg, self.config.igemm)
        mr = min(POSITION_TILES, key=lambda r: (-(-p_out // r) * r, -r))
        return replace(blk, mr=mr, mc=max(mr, blk.mc // mr * mr))

    # -- hooks ------------------------------------------------------------------------------
    def policy(self, node: Node, ins: list[Operand | None]) -> str:
        return "off"

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        win, group = self.geometry(node, ins)
        g = f" g{group}" if group > 1 else ""
        blk = igemm.blocking_for_host(ins[self.W].type.shape[0] // group, self.config.igemm)
        rows = self.rows_blocking(node, ins) if self.use_gemm(node, ins) else None
        how = (f"igemm {rows.variant} {rows.mr}x{rows.nr} positions-as-rows" if rows is not None
               else f"igemm {blk.variant} {blk.mr}x{blk.nr}{' in place' if self.in_place(node, ins) else ''}"
               if self.use_gemm(node, ins)
               else f"direct {'vnni quads' if self.depthwise_span(node, ins) == 4 else 'int16 pairs'}"
               if self.use_pairs(node, ins) else "direct")
        return (f"{'x'.join(map(str, win.kernel))}/{max(win.strides)} {ins[self.X].type.shape[1]}->"
                f"{ins[self.W].type.shape[0]}{g} @{'x'.join(map(str, win.size))} {ins[self.X].type.dtype}x"
                f"{ins[self.W].type.dtype} {how}")

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        if self.use_gemm(node, ins):
            units, mg, p, kk, _ = self._gemm_dims(node, ins)
            win = self.geometry(node, ins)[0]
            rows_blk = self.rows_blocking(node, ins)
            blk = igemm.blocking_for_host(mg, self.config.igemm)
            if rows_blk is not None:
                positions = math.prod(win.out)
                scratch = igemm.scratch_size(units, positions, mg, kk, packs_x=False, blk=rows_blk)
                p = positions
            else:
                scratch = igemm.scratch_size(units, mg, p, kk, packs_x=not self.in_place(node, ins), blk=blk)
            t = [TensorType((units * mg, p) if igemm.needs_c(kk, blk) else (1,), "int32"),
                 TensorType((-(-scratch // 4),), "int32")]
            flat = _Flat.of(win)
            x = ins[self.X].type
            if self.in_place(node, ins):  # a full panel's words past the last column (nr words), and a guard
                t.append(TensorType((x.shape[0] * x.shape[1] * flat.plane_set + 4 * blk.nr
                                     + flat.SLACK,), x.dtype))
            elif flat.copy:
                t.append(TensorType((x.shape[0] * x.shape[1] * flat.plane_set + flat.SLACK,), x.dtype))
            if flat.pitch != win.out[-1] and rows_blk is None:  # the output on the plane pitch, then cropped
                t.append(TensorType((units * mg * p,), outs[0].dtype))
            if not self.corrections(node, ins, igemm.blocking_for_host(override=self.config.igemm)).constant_rb:
                t.append(TensorType((ins[self.W].type.shape[0],), "int32"))
            return t
        win, _ = self.geometry(node, ins)
        x = ins[self.X].type
        if self.use_pairs(node, ins):
            return []
        if win.rank == 2:
            flat = _Flat.of(win)
            return [TensorType((x.shape[0] * x.shape[1] * flat.plane_set + flat.SLACK,), x.dtype)] if flat.copy else []
        return [TensorType(win.padded_shape(x.shape[:2]), x.dtype)] if win.needs_copy() else []

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        """For the GEMM: the weights pre-packed per group, the per-channel multipliers
        (QLinearConv) and, when constant, the folded per-channel int32 ``rb``."""
        if not self.use_gemm(node, ins):
            return []
        units, mg, _, kk, group = self._gemm_dims(node, ins)
        blk = igemm.blocking_for_host(mg, self.config.igemm)
        w = np.asarray(ins[self.W].value).reshape(group, mg, kk)
        if self.in_place(node, ins):  # the reduction in the order X's words hold it: (c/g, tap, c%g)
            g, cg = blk.group, ins[self.W].type.shape[1]
            w = w.reshape(group, mg, cg // g, g, kk // cg).transpose(0, 1, 2, 4, 3).reshape(group, mg, kk)
        signed = ins[self.W].type.dtype == "int8"
        rows_blk = self.rows_blocking(node, ins)
        if rows_blk is not None:  # the weights are the product's X (columns)
            out = [np.concatenate([igemm.prepack_x(w[g], rows_blk, signed) for g in range(group)])]
        else:
            out = [np.concatenate([igemm.prepack_w(w[g], blk, signed) for g in range(group)])]
        rq = self.requant(node, ins, group * mg)
        if rq is not None:
            out.append(rq.multipliers.astype(np.float32))
        cor = self.corrections(node, ins, blk)
        if cor.constant_rb:
            out.append(cor.rb())
        return out

    def replaced_inputs(self, node: Node, ins: list[Operand | None]) -> set[int]:
        return {self.W} if self.use_gemm(node, ins) else set()

    # -- lowering ---------------------------------------------------------------------------
    def _operands(self, k: KernelBuilder) -> list[Operand | None]:
        return [None if t is None else Operand(f"in{i}", t, v) for i, (t, v) in enumerate(zip(k.in_types, k.values))]

    def lower(self, k: KernelBuilder) -> None:
        ins = self._operands(k)
        set.add(k.fn.attributes, '"prefer-vector-width"="512"')
        if self.use_gemm(k.node, ins):
            self._gemm(k, ins)
        elif self.use_pairs(k.node, ins):
            self._depthwise_groups(k, ins)
        elif self.geometry(k.node, ins)[0].rank == 2:
            self._direct_flat(k, ins)
        else:
            self._direct(k, ins)

    def _gemm(self, k: KernelBuilder, ins: list[Operand | None]) -> None:
        """Per batch index and group: ``w[g] · X`` with X the phase-split padded input read
        flat (:class:`_Flat`), packed by :func:`polyml.codegen.igemm.rows_packer`."""
        win, group = self.geometry(k.node, ins)
        flat = _Flat.of(win)
        units, mg, ncols, kk, _ = self._gemm_dims(k.node, ins)
        rows_blk = self.rows_blocking(k.node, ins)
        blk = rows_blk or igemm.blocking_for_host(mg, self.config.igemm)
        cor = self.corrections(k.node, ins, blk)
        rq = self.requant(k.node, ins, group * mg)
        x, y = k.inputs[self.X], k.outputs[0]
        n_, c_all = x.shape[:2]
        cg, m_all = c_all // group, group * mg
        p_out = math.prod(win.out)
        consts = iter(k.constants)
        w_packed = next(consts)
        mult = next(consts) if rq is not None else None
        temps = iter(k.temps)
        c_temp, scratch = next(temps), next(temps)
        zx_buf = None if cor.zx.known else _view(k, k.inputs[self.ZX], (1,))
        in_place = self.in_place(k.node, ins)
        x_signed = ins[self.X].type.dtype == "int8"
        if in_place:
            xq = next(temps)
            flat.fill_grouped(k, x, xq, ir.Constant(I8, cor.zx.at(0) & 0xFF) if zx_buf is None else None, zx_buf,
                              blk.group, x_signed)
            plane_set = flat.plane_set
        elif flat.copy:
            xq = next(temps)
            flat.fill(k, x, xq, ir.Constant(I8, cor.zx.at(0) & 0xFF) if zx_buf is None else None, zx_buf)
            plane_set = flat.plane_set
        else:
            xq = x
            plane_set = math.prod(win.size)
        cropped = flat.pitch != win.out[-1] and rows_blk is None
        y_flat = next(temps) if cropped else y
        p_y = ncols if cropped else p_out  # y_flat's columns per channel
        if cor.constant_rb:
            rb = next(consts)
        else:
            rb = next(temps)
            emit_rb(k, cor, rb, None, k.inputs[self.ZX])
        if rows_blk is not None:  # the product's W is the input (rows), its X the weights
            operands: list[Buffer] = [xq, w_packed, y_flat, rb]
            strides = [[c_all * plane_set, cg * plane_set], [0, igemm.prepacked_size(mg, kk, replace(blk, mr=blk.nr)) // blk.group],
                       [m_all * p_y, mg * p_y], [0, mg]]
        else:
            operands = [w_packed, xq, y_flat, rb]
            strides = [[0, igemm.prepacked_size(mg, kk, blk) // blk.group], [c_all * plane_set, cg * plane_set],
                       [m_all * p_y, mg * p_y], [0, mg]]
        mult_at = None
        if mult is not None:
            mult_at = len(operands)
            operands.append(mult)
            strides.append([0, mg])
        c_cols = p_out if rows_blk is not None else ncols  # C is P x Mg in the rows product, Mg x N' else
        strides.append([m_all * c_cols, mg * c_cols])  # C
        out_bytes = 4 if rq is None else 1
        taps = np.array(flat.tap_offsets(win), np.int64)
        tables = Tables(k.module, k.fn.name)
        pack_x = x_offsets = None
        if in_place:  # group q = (c/g, tap): its words' byte offset in the interleaved planes
            g = blk.group
            offsets = (np.arange(cg // g, dtype=np.int64)[:, None] * plane_set + taps[None, :]).reshape(-1) * g
            x_offsets = tables.i32(offsets, "xoff")
        else:  # per reduction row p = (c, tap): its offset from the group's first plane, one
            # table load per packed row instead of a division and a tap lookup
            rows = (np.arange(cg, dtype=np.int64)[:, None] * plane_set + taps[None, :]).reshape(-1)
            row_table = tables.i32(rows, "rows")

            def row_ptr(b: ir.IRBuilder, ops, p: ir.Value) -> ir.Value:  # noqa: ANN001
                return b.gep(ops[1], [b.sext(Tables.load(b, row_table, p), I64)], inbounds=True)

            pack_x = igemm.rows_packer(row_ptr, kk, ncols, blk, x_signed)

        def epilogue(b: ir.IRBuilder, ops, i: ir.Value, j: ir.Value, acc: ir.Value) -> None:  # noqa: ANN001
            """One accumulator, or a tile row's (``acc`` a vector of the columns from ``j``)."""
            v = b.add(acc, splat(b, b.load(b.gep(b.bitcast(ops[3], I32.as_pointer()), [i])), acc.type))
            m = None
            if mult_at is not None:
                m = b.load(b.gep(b.bitcast(ops[mult_at], ir.FloatType().as_pointer()), [i]))
            dst = b.gep(ops[2], [b.mul(b.add(b.mul(i, ir.Constant(I64, p_y)), j), ir.Constant(I64, out_bytes))])
            store_output(b, v, dst, m, rq)

        if rows_blk is not None:
            # row i = output position (oh, ow): its byte offset in a channel block's planes
            oh, ow = np.divmod(np.arange(p_out, dtype=np.int64), win.out[1])
            at = (oh * flat.pitch + ow) * blk.group
            at = np.concatenate([at, np.full(-(-p_out // blk.mr) * blk.mr - p_out, at[-1])])
            w_rows = (tables.i32(at, "positions"), x_offsets)
            nr = blk.nr

            def epilogue(b: ir.IRBuilder, ops, i: ir.Value, j: ir.Value, acc: ir.Value) -> None:  # noqa: ANN001, F811
                """Position ``i``, channel ``j`` (or channels ``j…j+nr``: one requantization of
                the vector, the outputs stored one by one down the channels' planes)."""
                lanes = acc.type.count if isinstance(acc.type, ir.VectorType) else 1
                rb_p = b.gep(b.bitcast(ops[3], I32.as_pointer()), [j])
                v = b.add(acc, b.load(b.bitcast(rb_p, acc.type.as_pointer()), align=4))
                m = None
                if mult_at is not None:
                    m_p = b.gep(b.bitcast(ops[mult_at], F32.as_pointer()), [j])
                    m = b.load(b.bitcast(m_p, (ir.VectorType(F32, lanes) if lanes > 1 else F32).as_pointer()), align=4)
                if lanes == 1:
                    store_output(b, v, b.gep(ops[2], [b.mul(b.add(b.mul(j, ir.Constant(I64, p_y)), i),
                                                            ir.Constant(I64, out_bytes))]), m, rq)
                    return
                q = requantized(b, v, m, rq)
                base = b.bitcast(b.gep(ops[2], [b.mul(b.add(b.mul(j, ir.Constant(I64, p_y)), i), ir.Constant(I64, out_bytes))]),
                                 q.type.element.as_pointer())
                for c in range(nr):
                    b.store(b.extract_element(q, ir.Constant(I32, c)), b.gep(base, [ir.Constant(I64, c * p_y)]))

            spec = igemm.IGemmSpec(p_out, mg, kk, None, None, len(operands), ins[self.W].type.dtype == "int8", x_signed,
                                   epilogue, vector_epilogue=True, w_rows=w_rows, blocking=blk)
        else:
            spec = igemm.IGemmSpec(mg, ncols, kk, None, None, len(operands), ins[self.W].type.dtype == "int8", x_signed,
                                   epilogue, pack_x=pack_x, prepacked_w=True, vector_epilogue=True, x_offsets=x_offsets,
                                   blocking=blk)
        igemm.emit(k, spec, operands, c_temp if igemm.needs_c(kk, blk) else None, scratch, batch=(n_, group), strides=strides)
        if cropped:  # y[n][m][oh][ow] = y_flat[n][m][oh·Wq + ow]: one fixed-size memcpy per row
            src = _view(k, y_flat, (n_ * m_all, ncols))
            dst = _view(k, y, (n_ * m_all, *win.out))
            with nest(k, [n_ * m_all, win.out[0]], names=["yc", "yh"], parallel=1) as (c, oh):
                b = k.b
                _memcpy(b, b.bitcast(dst.addr([c, oh, 0]), I8.as_pointer()),
                        b.bitcast(src.addr([c, b.mul(k.i64(oh), k.i64(flat.pitch))]), I8.as_pointer()),
                        win.out[1] * out_bytes)

    def _params(self, k: KernelBuilder, ins: list[Operand | None], m_all: int, x_dtype: str,
                w_dtype: str) -> _DirectParams:
        """The direct lowerings' zero points, requantization and constant tables."""
        zx = zero_point(ins, self.ZX, x_dtype)
        zw = zero_point(ins, self.ZW, w_dtype)
        rq = self.requant(k.node, ins, m_all)
        bias = self.bias(ins)
        tables = Tables(k.module, k.fn.name)
        return _DirectParams(
            zx, zw, rq, tables,
            mult=tables.f32(rq.multipliers, "mult") if rq is not None else None,
            bias_t=tables.i32(bias.astype(np.int32), "bias") if bias is not None else None,
            zw_t=tables.i32(zw.array(m_all).astype(np.int32), "zw") if zw.known else None,
            zw_buf=None if zw.known else _view(k, k.inputs[self.ZW], (zw.size,)),
            zx_buf=None if zx.known else _view(k, k.inputs[self.ZX], (1,)))

    def _direct_flat(self, k: KernelBuilder, ins: list[Operand | None]) -> None:
        """2-D direct convolution on the flat phase-split input (:class:`_Flat`): per ``n, m``
        (parallel), one loop over the ``N'`` flat output positions whose body sums all taps
        (``Σ_t x[q + off_t]·w_t``, constant offsets, contiguous loads: vectorized along q,
        long trip counts even for 7x7 maps), requantized into a flat row buffer, then the
        valid columns copied out.  Groups of several channels accumulate in an int32 buffer."""
        win, group = self.geometry(k.node, ins)
        flat = _Flat.of(win)
        x, w, y = k.inputs[self.X], k.inputs[self.W], k.outputs[0]
        x_dtype, w_dtype = ins[self.X].type.dtype, ins[self.W].type.dtype
        n_, c_all = x.shape[:2]
        m_all = w.shape[0]
        cg, mg = c_all // group, m_all // group
        p = self._params(k, ins, m_all, x_dtype, w_dtype)
        zx, zw, rq, tables, mult, bias_t, zw_t, zw_buf, zx_buf = (p.zx, p.zw, p.rq, p.tables, p.mult, p.bias_t,
                                                                  p.zw_t, p.zw_buf, p.zx_buf)
        if flat.copy:
            src = k.temps[0]
            flat.fill(k, x, src, ir.Constant(I8, zx.at(0) & 0xFF) if zx_buf is None else None, zx_buf)
            plane_set = flat.plane_set
        else:
            src = _view(k, x, (x.type.size,))
            plane_set = math.prod(win.size)
        ncols, pitch, (oh_n, ow_n) = flat.columns, flat.pitch, win.out
        offsets = flat.tap_offsets(win)
        kh_n, kw_n = win.kernel
        out_t = ir.IntType(8) if rq is not None else I32
        with nest(k, [n_, m_all], names=["n", "m"], parallel=2) as (n, m):
            yrow = k.entry_alloca(ir.ArrayType(out_t, ncols), "y.flat")
            acc = k.entry_alloca(ir.ArrayType(I32, ncols), "acc.flat") if cg > 1 else None
            wsum = k.entry_alloca(I32, "wsum")
            b = k.b
            m_i = k.i64(m)
            g = b.udiv(m_i, k.i64(mg))
            zw_m = (tables.load(b, zw_t, m_i) if zw_t is not None
                    else to_i32(b, zw_buf.load([m_i if zw.size > 1 else 0]), w_dtype))
            b.store(ir.Constant(I32, 0), wsum)
            if acc is not None:
                with k.loop(0, ncols, "zq") as q:
                    k.b.store(ir.Constant(I32, 0), k.b.gep(acc, [k.i64(0), q], inbounds=True))
            with nest(k, [cg], names=["c"]) as (c,):
                b = k.b
                wvs = []
                for kh in range(kh_n):
                    for kw in range(kw_n):
                        wv = b.sub(to_i32(b, w.load([m_i, c, kh, kw]), w_dtype), zw_m)
                        b.store(b.add(b.load(wsum), wv), wsum)
                        wvs.append(wv)
                ic = b.add(b.mul(g, k.i64(cg)), k.i64(c))
                base = b.mul(b.add(b.mul(k.i64(n), k.i64(c_all)), ic), k.i64(plane_set))
                last = acc is None
                with k.loop(0, ncols, "q") as q:
                    b = k.b
                    at = b.add(base, q)
                    total = None
                    for off, wv in zip(offsets, wvs):
                        xv = to_i32(b, src.load([b.add(at, k.i64(off))]), x_dtype)
                        total = b.mul(xv, wv) if total is None else b.add(total, b.mul(xv, wv))
                    if last:
                        self._flat_out(b, total, wsum, zx, zx_buf, x_dtype, bias_t, mult, rq, tables, m_i, yrow, q)
                    else:
                        ptr = b.gep(acc, [k.i64(0), q], inbounds=True)
                        b.store(b.add(b.load(ptr), total), ptr)
            if acc is not None:
                with k.loop(0, ncols, "rq") as q:
                    b = k.b
                    total = b.load(b.gep(acc, [k.i64(0), q], inbounds=True))
                    self._flat_out(b, total, wsum, zx, zx_buf, x_dtype, bias_t, mult, rq, tables, m_i, yrow, q)
            with nest(k, [oh_n, ow_n], names=["yh", "yw"]) as (oh, ow):
                b = k.b
                v = b.load(b.gep(yrow, [k.i64(0), b.add(b.mul(k.i64(oh), k.i64(pitch)), k.i64(ow))], inbounds=True))
                y.store([n, m, oh, ow], v)

    @staticmethod
    def _flat_out(b: ir.IRBuilder, total: ir.Value, wsum: ir.Value, zx, zx_buf, x_dtype: str, bias_t, mult,  # noqa: ANN001
                  rq: Requant | None, tables: Tables, m: ir.Value, yrow: ir.Value, q: ir.Value | None) -> None:
        """``total - x_zp·Σw (+ bias)``, requantized (or int32) into the flat row buffer at ``q``
        (``q`` None: ``yrow`` is the element's address)."""
        zxv = ir.Constant(I32, zx.at(0)) if zx_buf is None else to_i32(b, zx_buf.load([0]), x_dtype)
        v = b.sub(total, b.mul(zxv, b.load(wsum)))
        if bias_t is not None:
            v = b.add(v, tables.load(b, bias_t, m))
        scale = tables.load(b, mult, m) if mult is not None else None
        store_output(b, v, yrow if q is None else b.gep(yrow, [ir.Constant(I64, 0), q], inbounds=True), scale, rq)

    @staticmethod
    def tap_groups(offsets: list[int], span: int) -> list[tuple[int, list[tuple[int, int]]]]:
        """The taps grouped as ``(base, [(position, tap), ...])``: every tap of a group reads
        ``x[q + base + position]`` with ``position < span``, so one multiply-add over ``span``
        consecutive elements (int16 pairs, or VNNI's 4-byte groups) covers the whole group."""
        at = sorted((off, t) for t, off in enumerate(offsets))
        assert len({off for off, _ in at}) == len(at), "two taps read the same element"
        groups: list[tuple[int, list[tuple[int, int]]]] = []
        for off, t in at:
            if groups and off - groups[-1][0] < span:
                groups[-1][1].append((off - groups[-1][0], t))
            else:
                groups.append((off, [(0, t)]))
        return groups

    def depthwise_span(self, node: Node, ins: list[Operand | None]) -> int:
        """Taps per multiply-add of :meth:`_depthwise_groups`: 4 (``vpdpbusd``, uint8 inputs
        times int8 weights) on VNNI hosts where the weights minus their zero point fit int8,
        else 2 (int16 pairs)."""
        w = np.asarray(ins[self.W].value).astype(np.int64)
        wv = w.reshape(w.shape[0], -1) - zero_point(ins, self.ZW, ins[self.W].type.dtype).array(w.shape[0])[:, None]
        blk = igemm.blocking_for_host(override=self.config.igemm)
        vnni = blk.variant == "vnni" and blk.width == 16
        fits = bool(wv.size == 0 or (wv.min() >= -128 and wv.max() <= 127))
        return 4 if vnni and ins[self.X].type.dtype == "uint8" and fits else 2

    def _depthwise_groups(self, k: KernelBuilder, ins: list[Operand | None]) -> None:
        """Depthwise 2-D convolution with ``g`` taps per multiply-add (:meth:`depthwise_span`).

        On the flat input (:class:`_Flat`) tap ``t`` of flat output ``q`` reads ``x[q + off_t]``;
        the taps whose offsets lie within ``g`` consecutive elements form a group
        (:meth:`tap_groups`: a 3x3 kernel's rows, or ``kw`` 0 and 2 of one stride phase).  A
        vector loaded at ``q + base + r`` holds, in its ``g``-element lane groups ``j``, the
        group's inputs of output ``q + g·j + r``; multiplied by the group's weights (zero where
        no tap sits) and summed per lane group, it adds the whole group to those ``L`` outputs.
        ``g`` = 4: bytes as they are, ``vpdpbusd`` (uint8 × int8, 4 products per int32 lane);
        ``g`` = 2: bytes widened to int16, ``pmaddwd`` (``vpdpwssd`` with VNNI).  All products
        and sums are exact in int32.  The ``g`` phase accumulators are interleaved into the
        block's outputs in order, requantized in registers into a byte row of the flat outputs
        (ConvInteger: an int32 row), whose valid columns are copied to each output row with
        one fixed-size ``memcpy``.  Per 64 outputs a 3x3 stride-1 kernel takes 12 ``vpdpbusd`` with
        their loads (the int32 nest took 36 widening loads, 36 ``vpmulld`` and 36 adds).
        Each thread copies its channel's planes into a stack buffer (:meth:`_Flat.fill_channel`)
        just before computing it; loads of the last block may run up to ``g·L + g`` bytes past
        the planes, into slack the buffer has, and only feed junk columns."""
        win, _ = self.geometry(k.node, ins)
        flat = _Flat.of(win)
        x, y = k.inputs[self.X], k.outputs[0]
        x_dtype, w_dtype = ins[self.X].type.dtype, ins[self.W].type.dtype
        n_, c_all = x.shape[:2]
        p = self._params(k, ins, c_all, x_dtype, w_dtype)
        span = self.depthwise_span(k.node, ins)
        wv = (np.asarray(ins[self.W].value).astype(np.int64).reshape(c_all, math.prod(win.kernel))
              - p.zw.array(c_all).astype(np.int64)[:, None])
        groups = self.tap_groups(flat.tap_offsets(win), span)
        bits = 32 // span
        packed_w = np.zeros((c_all, len(groups)), np.int64)
        for i, (_, members) in enumerate(groups):
            for pos, t in members:
                packed_w[:, i] |= (wv[:, t] & ((1 << bits) - 1)) << (bits * pos)
        group_t = p.tables.i32(packed_w.astype(np.uint32).view(np.int32), "wgroups")
        wsum_t = p.tables.i32(wv.sum(axis=1).astype(np.int32), "wsum")
        lanes = igemm.blocking_for_host(override=self.config.igemm).width
        vec = ir.VectorType(I32, lanes)
        part = ir.VectorType(ir.IntType(bits), span * lanes)  # one load, as the multiply-add reads it
        if span == 4:
            dp = igemm.vpdpbusd(k.module)
        else:
            madd = _pmaddwd(k.module, lanes)
        wide = ir.VectorType(I32, 2 * lanes)
        mix2 = ir.Constant(wide, [i // 2 + (lanes if i % 2 else 0) for i in range(2 * lanes)])
        mix4 = ir.Constant(ir.VectorType(I32, 4 * lanes),
                           [2 * (i // 4) + (i % 4 if i % 4 < 2 else 2 * lanes + i % 4 - 2) for i in range(4 * lanes)])
        per_block = span * lanes
        ncols, pitch, (oh_n, ow_n) = flat.columns, flat.pitch, win.out
        blocks = -(-ncols // per_block)
        slack = per_block + span  # past the planes, the last block's loads (junk columns only)
        rq = p.rq
        with nest(k, [n_, c_all], names=["n", "m"], parallel=2) as (n, m):
            planes = k.entry_alloca(ir.ArrayType(I8, flat.plane_set + slack), "x.flat")
            row = k.entry_alloca(ir.ArrayType(I32 if rq is None else I8, blocks * per_block), "y.flat")
            wsum = k.entry_alloca(I32, "wsum")
            b = k.b
            m_i = k.i64(m)
            b.store(Tables.load(b, wsum_t, m_i), wsum)
            wvecs = []
            for i in range(len(groups)):
                pw = Tables.load(b, group_t, b.add(b.mul(m_i, k.i64(len(groups))), k.i64(i)))
                wvecs.append(splat(b, pw, vec) if span == 4 else b.bitcast(splat(b, pw, vec), part))
            if rq is not None:  # per channel: the correction -x_zp·Σw (+ bias) and the multiplier
                zxv = ir.Constant(I32, p.zx.at(0)) if p.zx_buf is None else to_i32(b, p.zx_buf.load([0]), x_dtype)
                corr = b.sub(ir.Constant(I32, 0), b.mul(zxv, b.load(wsum)))
                if p.bias_t is not None:
                    corr = b.add(corr, Tables.load(b, p.bias_t, m_i))
                outv = ir.VectorType(I32, per_block)
                fv = ir.VectorType(F32, per_block)
                corr_v, mult_v = splat(b, corr, outv), splat(b, Tables.load(b, p.mult, m_i), fv)
            base = b.bitcast(planes, I8.as_pointer())
            zx = ir.Constant(I8, p.zx.at(0) & 0xFF) if p.zx_buf is None else p.zx_buf.load([0])
            flat.fill_channel(k, x, k.i64(n), m_i, base, zx, slack)
            with k.loop(0, blocks, "qb") as qb:
                b = k.b
                q0 = b.mul(k.i64(qb), k.i64(per_block))
                accs = [ir.Constant(vec, [0] * lanes) for _ in range(span)]
                for (off, _), wvec in zip(groups, wvecs):
                    for r in range(span):
                        ptr = b.gep(base, [b.add(q0, k.i64(off + r))], inbounds=True)
                        xv = b.load(b.bitcast(ptr, ir.VectorType(I8, per_block).as_pointer()), align=1)
                        if span == 4:
                            accs[r] = b.call(dp, [accs[r], b.bitcast(xv, vec), wvec])
                        else:
                            xw = b.sext(xv, part) if x_dtype == "int8" else b.zext(xv, part)
                            accs[r] = b.add(accs[r], b.call(madd, [xw, wvec]), flags=["nsw"])
                out = b.shuffle_vector(accs[0], accs[1], mix2)
                if span == 4:
                    out = b.shuffle_vector(out, b.shuffle_vector(accs[2], accs[3], mix2), mix4)
                dst = b.gep(row, [k.i64(0), q0], inbounds=True)
                if rq is not None:  # requantized in registers (store_output's arithmetic, lane by lane)
                    scaled = b.fmul(b.sitofp(b.add(out, corr_v), fv), mult_v)
                    out = quantize_value(b, scaled, like(fv, float(rq.zero_point)), rq.dtype, rq.lo, rq.hi)
                b.store(out, b.bitcast(dst, out.type.as_pointer()), align=1)
            if rq is not None:  # the valid columns of each output row: one fixed-size memcpy
                with k.loop(0, oh_n, "yh") as oh:
                    b = k.b
                    src_row = b.gep(row, [k.i64(0), b.mul(k.i64(oh), k.i64(pitch))], inbounds=True)
                    _memcpy(b, b.bitcast(y.addr([n, m, oh, 0]), I8.as_pointer()), src_row, ow_n)
                return
            with nest(k, [oh_n, ow_n], names=["yh", "yw"]) as (oh, ow):  # int32 out: corrected into y
                b = k.b
                total = b.load(b.gep(row, [k.i64(0), b.add(b.mul(k.i64(oh), k.i64(pitch)), k.i64(ow))], inbounds=True))
                self._flat_out(b, total, wsum, p.zx, p.zx_buf, x_dtype, p.bias_t, p.mult, p.rq, p.tables, m_i,
                               y.addr([n, m, oh, ow]), None)

    def _direct(self, k: KernelBuilder, ins: list[Operand | None]) -> None:
        """The padded copy (if needed), then per ``n, m`` and output row an int32 row accumulator."""
        win, group = self.geometry(k.node, ins)
        x, w, y = k.inputs[self.X], k.inputs[self.W], k.outputs[0]
        x_dtype, w_dtype = ins[self.X].type.dtype, ins[self.W].type.dtype
        n_, c_all = x.shape[:2]
        m_all = w.shape[0]
        cg, mg = c_all // group, m_all // group
        r = win.rank
        p = self._params(k, ins, m_all, x_dtype, w_dtype)
        zx, zw, rq, tables, mult, bias_t, zw_t, zw_buf, zx_buf = (p.zx, p.zw, p.rq, p.tables, p.mult, p.bias_t,
                                                                  p.zw_t, p.zw_buf, p.zx_buf)

        def zx_value() -> ir.Value:
            if zx_buf is None:
                return ir.Constant(I32, zx.at(0))
            return to_i32(k.b, zx_buf.load([0]), x_dtype)

        src, shift = x, [-pb for pb in win.pads_begin]
        if win.needs_copy():
            src, shift = k.temps[0], [0] * r
            with nest(k, src.shape, names=[f"z{d}" for d in range(src.rank)], parallel=copy_parallel(src.shape)) as ix:
                fill = ir.Constant(I8, zx.at(0) & 0xFF) if zx_buf is None else zx_buf.load([0])
                src.store(ix, fill)
            ranges = [(max(0, -pb), min(nn, rq_ - pb)) for pb, nn, rq_ in zip(win.pads_begin, win.size, win.required)]
            with nest(k, [n_, c_all, *ranges], names=["pn", "pc", *[f"p{d}" for d in range(r)]],
                      parallel=copy_parallel([n_, c_all, *ranges])) as ix:
                dst = [*ix[:2], *[k.b.add(k.i64(i), k.i64(pb)) if pb else i for i, pb in zip(ix[2:], win.pads_begin)]]
                src.store(dst, x.load(ix))
        ow = win.out[-1]
        with nest(k, [n_, m_all, *win.out[:-1]], names=["n", "m", *[f"o{d}" for d in range(r - 1)]], parallel=2) as iv:
            n, m, os_ = iv[0], iv[1], iv[2:]
            b = k.b
            row = k.entry_alloca(ir.ArrayType(I32, ow), "acc.row")
            wsum = k.entry_alloca(I32, "acc.wsum")
            m_i = k.i64(m)
            g = b.udiv(m_i, k.i64(mg))
            with k.loop(0, ow, "init") as o:
                k.b.store(ir.Constant(I32, 0), k.b.gep(row, [k.i64(0), o], inbounds=True))
            k.b.store(ir.Constant(I32, 0), wsum)
            zw_m = (tables.load(k.b, zw_t, m_i) if zw_t is not None
                    else to_i32(k.b, zw_buf.load([m_i if zw.size > 1 else 0]), w_dtype))
            with nest(k, [cg, *win.kernel], names=["c", *[f"j{d}" for d in range(r)]]) as jv:
                b = k.b
                c, js = jv[0], jv[1:]
                wv = b.sub(to_i32(b, w.load([m_i, c, *js]), w_dtype), zw_m)
                b.store(b.add(b.load(wsum), wv), wsum)
                ic = b.add(b.mul(g, k.i64(cg)), k.i64(c))
                rows_ = [b.add(b.add(b.mul(k.i64(o), k.i64(s)), b.mul(k.i64(j), k.i64(d))), k.i64(sh))
                         for o, j, s, d, sh in zip(os_, js[:-1], win.strides[:-1], win.dilations[:-1], shift[:-1])]
                col0 = b.add(b.mul(k.i64(js[-1]), k.i64(win.dilations[-1])), k.i64(shift[-1]))
                with k.loop(0, ow, "ow") as o:
                    b = k.b
                    col = b.add(b.mul(o, k.i64(win.strides[-1])), col0)
                    xv = to_i32(b, src.load([n, ic, *rows_, col]), x_dtype)
                    at = b.gep(row, [k.i64(0), o], inbounds=True)
                    b.store(b.add(b.load(at), b.mul(xv, wv)), at)
            b = k.b
            corr = b.mul(zx_value(), b.load(wsum))
            if bias_t is not None:
                corr = b.sub(corr, tables.load(b, bias_t, m_i))
            scale = tables.load(b, mult, m_i) if mult is not None else None
            with k.loop(0, ow, "out") as o:
                b = k.b
                v = b.sub(b.load(b.gep(row, [k.i64(0), o], inbounds=True)), corr)
                store_output(b, v, y.addr([n, m, *os_, o]), scale, rq)


@register
class ConvInteger(_IntegerConv):
    """ONNX ConvInteger: int32 convolution of zero-point-shifted 8-bit operands."""

    op_types = ("ConvInteger",)


@register
class QLinearConv(QLinear, _IntegerConv):
    """ONNX QLinearConv (bias int32 input 8, ``polyml_clip`` for a fused Relu/Clip)."""

    op_types = ("QLinearConv",)
    X, W, ZX, ZW = 0, 3, 2, 5

    def channels(self, ins: list[Operand | None]) -> int:
        return ins[self.W].type.shape[0]
