"""The depthwise convolution's register-level pieces: the phase-split layout of a padded input
plane (:class:`Geometry`), the copy of one input row into its phase rows, and the step that
accumulates one vector of outputs from all the taps.

``xpad[r][q]`` (pads zero) is stored split into ``sh × sw`` phase planes,
``xph[r % sh][q % sw][r // sh][q // sw]``, each ``R × P``: tap ``(i, j)`` of output ``(oh, ow)``
then reads ``xph[f + off(i, j)]`` with ``f = oh·P + ow`` — an affine function of ``f`` with a
constant offset per tap, for every stride and dilation (:meth:`Geometry.tap_offset`).  The
hand-written kernel (:mod:`polyml.kernels.depthwise`) and the depthwise intrinsics of the
schedule layer (:mod:`polyml.schedule.intrinsics`) both emit through these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import llvmlite.ir as ir

from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32, I64, Buffer, masked_intrinsic, splat, store_lanes

#: column strides whose copy-in runs on whole vectors (:func:`copy_row_vectors`); wider
#: strides keep LLVM's loops (a phase split of more than two vectors is several shuffles)
VECTOR_ROW_MAX_STRIDE = 2
#: vector widths whose unaligned tap reads are plain unaligned loads (AVX2: a 32-byte load
#: crosses a cache line at half the offsets); AVX-512's 16 lanes shift two aligned vectors
#: instead (:func:`step`).  On AVX2 the two-source lane shift is a ``vperm2f128`` and one or
#: two ``vshufps`` per tap (Zen 1 EPYC, single depthwise layers with ReLU6, 1
#: thread CPU time, minimum of 40, unaligned / shifted: 3x3 576 @14 0.66, 144 @56 0.78, 3x3/2
#: 96 @112 0.65, 960 @7 0.92)
UNALIGNED_MAX_LANES = 8


class WindowLike(Protocol):
    """A 2-D sliding window (:class:`polyml.kernels._window.Window` is one)."""

    size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def required(self) -> tuple[int, ...]: ...


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


@dataclass(frozen=True)
class Geometry:
    """One plane's phase-split layout and accumulator for a window, at ``lanes`` floats a vector."""

    win: WindowLike
    lanes: int

    @property
    def phases(self) -> tuple[int, int]:
        return self.win.strides[0], self.win.strides[1]

    @property
    def rows(self) -> int:
        """Rows ``R`` of each phase plane."""
        return -(-self.win.required[0] // self.win.strides[0])

    @property
    def rowwise(self) -> bool:
        """Output rows of at least one vector are computed row by row (:func:`_plane`)."""
        return self.win.out[1] >= self.lanes

    @property
    def pitch(self) -> int:
        """Columns ``P`` of each phase plane (the flat index's row pitch); whole vectors when
        :attr:`rowwise`, so every row starts on a vector boundary."""
        p = -(-self.win.required[1] // self.win.strides[1])
        return -(-p // self.lanes) * self.lanes if self.rowwise else p

    @property
    def used_columns(self) -> int:
        """Input columns some output reads."""
        return min(self.win.size[1], self.win.required[1] - self.win.pads_begin[1])

    @property
    def flat(self) -> int:
        """Accumulated flat outputs ``F``: ``OH·P`` rounded up to whole vectors."""
        return -(-self.win.out[0] * self.pitch // self.lanes) * self.lanes

    @property
    def acc_floats(self) -> int:
        """The accumulator: one output row in whole vectors when :attr:`rowwise`, else ``F``."""
        return -(-self.win.out[1] // self.lanes) * self.lanes if self.rowwise else self.flat

    def tap_offset(self, i: int, j: int) -> int:
        """Offset in the phase-split buffer of tap ``(i, j)``'s read for flat output 0."""
        (sh, sw), (dh, dw) = self.phases, self.win.dilations
        plane = (i * dh % sh) * sw + (j * dw % sw)
        return plane * self.rows * self.pitch + (i * dh // sh) * self.pitch + j * dw // sw

    @property
    def in_floats(self) -> int:
        """The phase-split buffer, long enough for the aligned vector after the last one the
        farthest tap reads, in whole vectors (so the accumulator after it, and every plane's
        copy, starts on a vector boundary: :func:`_plane` reads only aligned vectors)."""
        kh, kw = self.win.kernel
        sh, sw = self.phases
        far = max(self.tap_offset(i, j) for i in range(kh) for j in range(kw))
        lanes = self.lanes
        return -(-max(sh * sw * self.rows * self.pitch, far + self.flat + lanes) // lanes) * lanes

    @property
    def per_plane(self) -> int:
        return self.in_floats + self.acc_floats


def tap_weights(b: ir.IRBuilder, w: Buffer, bias: Buffer | None, c: ir.Value, taps: list[tuple[int, int, int]],
                kw: int, vec: ir.VectorType) -> tuple[list[ir.Value], ir.Value]:
    """Channel ``c``'s tap weights broadcast in tap order, and its bias broadcast (zeros without one)."""
    wbase = b.gep(b.bitcast(w.ptr, F32.as_pointer()), [b.mul(c, _c(len(taps)))], inbounds=True)
    weights = [splat(b, b.load(b.gep(wbase, [_c(i * kw + j)], inbounds=True)), vec) for i, j, _ in taps]
    return weights, splat(b, bias.load([c]), vec) if bias is not None else ir.Constant(vec, [0.0] * vec.count)


def store_row(b: ir.IRBuilder, sums: list[ir.Value], y_row: ir.Value, width: int) -> None:
    """An output row of ``width`` floats from its accumulator vectors, straight from the
    registers: whole vectors stored as they are, the last partial one with a masked store."""
    vec = sums[0].type
    for q, v in enumerate(sums):
        d = q * vec.count
        if d >= width:
            break
        store_lanes(b, v, b.bitcast(b.gep(y_row, [_c(d)], inbounds=True), vec.as_pointer()), width - d)


def step(b: ir.IRBuilder, work: ir.Value, f: ir.Value, taps: list[tuple[int, int, int]], weights: list[ir.Value],
          start: ir.Value, fma: ir.Function, vec: ir.VectorType) -> ir.Value:
    """``start + Σ w(i, j) · xph[f + off(i, j) : +L]`` for a vector-aligned ``f``: with 16
    lanes every read is a lane shift of two aligned vectors (one ``valignd``/``vpermt2ps``), as
    an unaligned 64-byte load splits over two cache lines; with fewer (:data:`UNALIGNED_MAX_LANES`)
    an unaligned load; one partial sum per kernel row, added at the end, so no chain of
    ``KH·KW`` dependent FMAs bounds the step."""
    lanes = vec.count
    aligned: dict[int, ir.Value] = {}

    def vector(q: int) -> ir.Value:
        if q not in aligned:
            ptr = b.bitcast(b.gep(work, [b.add(f, _c(q * lanes))], inbounds=True), vec.as_pointer())
            aligned[q] = b.load(ptr, align=4 * lanes)
        return aligned[q]

    partial: dict[int, ir.Value] = {}
    for (i, _, off), wv in zip(taps, weights):
        q, r = divmod(off, lanes)
        if r and lanes <= UNALIGNED_MAX_LANES:
            v = b.load(b.bitcast(b.gep(work, [b.add(f, _c(off))], inbounds=True), vec.as_pointer()), align=4)
        elif r:
            shift = ir.Constant(ir.VectorType(ir.IntType(32), lanes), list(range(r, r + lanes)))
            v = b.shuffle_vector(vector(q), vector(q + 1), shift)
        else:
            v = vector(q)
        partial[i] = b.call(fma, [wv, v, partial[i]]) if i in partial else b.fmul(wv, v)
    s = start
    for p in partial.values():
        s = b.fadd(s, p)
    return s


def copy_row(b: ir.IRBuilder, plan: Geometry, src: ir.Value, work: ir.Value, pr: int, i: ir.Value) -> None:
    """Padded row ``r = pr + sh·i`` (an input row) into its phase rows: the columns
    ``q = pc + sw·j`` that hold input columns, ``xph[pr][pc][i][j] = x[r-pt][q-pl]``.  The column
    phases are filled in one loop over ``j`` where all of them have an element (an interleave
    group of factor ``sw``: LLVM loads whole vectors and deinterleaves them with shuffles; one
    loop per phase reading every ``sw``-th float ran the 3x3/2 copy 3-4x slower), the few
    columns where only some phases have one in short loops of their own."""
    win = plan.win
    (wd, (sh, sw), (pt, pl), rq_w) = win.size[1], plan.phases, win.pads_begin, win.required[1]
    rows, pitch = plan.rows, plan.pitch
    src_row = b.gep(src, [b.mul(b.add(b.mul(i, _c(sh)), _c(pr - pt)), _c(wd))], inbounds=True)
    dst_rows = [b.gep(work, [b.add(b.mul(i, _c(pitch)), _c((pr * sw + pc) * rows * pitch))], inbounds=True)
                for pc in range(sw)]
    if sw <= VECTOR_ROW_MAX_STRIDE:
        copy_row_vectors(b, plan, src_row, dst_rows)
        return
    spans = [phase_range(pc, sw, pl, wd, rq_w) for pc in range(sw)]
    common = (max(lo for lo, _ in spans), min(hi for _, hi in spans))

    def copy(j: ir.Value, pc: int) -> None:
        v = b.load(b.gep(src_row, [b.add(b.mul(j, _c(sw)), _c(pc - pl))], inbounds=True))
        b.store(v, b.gep(dst_rows[pc], [j], inbounds=True))

    if common[1] > common[0]:
        with packed.for_range(b, common[0], common[1], name="dw.cj") as j:
            for pc in range(sw):
                copy(j, pc)
    for pc, (lo, hi) in enumerate(spans):
        for a, z in ((lo, min(hi, common[0])), (max(lo, common[1]), hi)) if common[1] > common[0] else ((lo, hi),):
            if z > a:
                with packed.for_range(b, a, z, name="dw.ce") as j:
                    copy(j, pc)


def copy_row_vectors(b: ir.IRBuilder, plan: Geometry, src_row: ir.Value | None, dst_rows: list[ir.Value],
                      vectors: list[ir.Value] | None = None) -> None:
    """One input row into its ``sw`` phase rows with whole vectors: chunks of ``L·sw`` input
    floats are loaded (masked past the row's used columns), split into the ``sw`` column phases
    by one shuffle each (``sw = 2``: the even and the odd lanes of two vectors, one
    ``vpermt2ps``), and stored with masked stores at ``j = (w + pl) // sw``.  The column pads
    stay the zeros written once per thread.  Replaces the scalar loops LLVM made of the short
    rows' remainders: the copy ran 3x slower than a memcpy of the same bytes.  With AVX2's
    widths (:data:`UNALIGNED_MAX_LANES`) the partial vectors are loaded and stored lane by lane
    instead: ``vmaskmovps`` is microcoded on AMD's cores (Zen 1 EPYC, single
    layers with ReLU6, 1 thread CPU time, minimum of 60, lanes / masked: 3x3 960 @7 0.62, 5x5
    1152 @7 0.76, 3x3 576 @14 0.83; 40 runs: 3x3/2 144 @56 0.70, 3x3/2 96 @112 1.01).
    With ``vectors`` (the row's ``L``-float vectors from its first column, lanes past the used
    columns ignored), the row comes from registers instead of ``src_row``
    (:mod:`polyml.kernels.depthwise_product`)."""
    win = plan.win
    lanes, sw, pl = plan.lanes, plan.phases[1], win.pads_begin[1]
    vec = ir.VectorType(F32, lanes)
    used = plan.used_columns
    align = ir.Constant(ir.IntType(32), 4)
    for w0 in range(0, used, lanes * sw):
        parts = []
        for t in range(sw):
            first = w0 + t * lanes
            on = [first + u < used for u in range(lanes)]
            if not any(on):
                parts.append(ir.Constant(vec, None))
                continue
            if vectors is not None:
                parts.append(vectors[first // lanes])
                continue
            ptr = b.bitcast(b.gep(src_row, [_c(first)], inbounds=True), vec.as_pointer())
            if all(on):
                parts.append(b.load(ptr, align=4))
            elif lanes <= UNALIGNED_MAX_LANES:  # AVX2: the lanes one by one (no vmaskmovps)
                src = b.bitcast(ptr, F32.as_pointer())
                v = ir.Constant(vec, None)
                for u in (u for u, lane_on in enumerate(on) if lane_on):
                    v = b.insert_element(v, b.load(b.gep(src, [_c(u)], inbounds=True)), ir.Constant(ir.IntType(32), u))
                parts.append(v)
            else:
                load, mask = masked_intrinsic(b, "load", vec, on)
                parts.append(b.call(load, [ptr, align, mask, ir.Constant(vec, None)]))
        for pc in range(sw):
            t0 = (pc - pl) % sw
            if sw == 1:
                v = parts[0]
            else:
                idx = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [t0 + sw * u for u in range(lanes)])
                v = b.shuffle_vector(parts[0], parts[1], idx)
            on = [w0 + t0 + sw * u < used for u in range(lanes)]
            if not any(on):
                continue
            ptr = b.bitcast(b.gep(dst_rows[pc], [_c(w0 // sw + (pl + t0) // sw)], inbounds=True), vec.as_pointer())
            if all(on):
                b.store(v, ptr, align=4)
            elif lanes <= UNALIGNED_MAX_LANES:
                dst = b.bitcast(ptr, F32.as_pointer())
                for u in (u for u, lane_on in enumerate(on) if lane_on):
                    b.store(b.extract_element(v, ir.Constant(ir.IntType(32), u)), b.gep(dst, [_c(u)], inbounds=True))
            else:
                store, mask = masked_intrinsic(b, "store", vec, on)
                b.call(store, [v, ptr, align, mask])


def phase_range(p: int, s: int, pad: int, size: int, required: int) -> tuple[int, int]:
    """Indices ``i`` of phase ``p`` (padded position ``p + s·i``) that hold an input element:
    ``pad ≤ p + s·i < min(pad + size, required)``."""
    lo = max(0, -(-(pad - p) // s))
    hi = -(-(min(pad + size, required) - p) // s)
    return lo, max(lo, hi)


__all__ = ["UNALIGNED_MAX_LANES", "VECTOR_ROW_MAX_STRIDE", "Geometry", "copy_row", "copy_row_vectors",
           "phase_range", "step", "store_row", "tap_weights"]
