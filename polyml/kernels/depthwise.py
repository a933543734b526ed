"""Depthwise convolution (ONNX Conv with ``group`` = input channels = output channels, 2-D):
one plane at a time, on a phase-split padded copy in L1/L2, with explicit vectors along a
flattened output plane.

For each plane ``(n, c)`` (planes split statically over the threads, each with its own scratch;
small planes in groups of up to :data:`GROUP_FLOATS` floats of scratch, all copied in before
any is accumulated):

1. *Copy in*: the padded input ``xpad[r][q]`` (pads zero) is stored split into ``sh × sw`` phase
   planes, ``xph[r % sh][q % sw][r // sh][q // sw]``, each ``R × P`` (``R = ⌈Hreq/sh⌉``,
   ``P = ⌈Wreq/sw⌉``).  Tap ``(i, j)`` of output ``(oh, ow)`` reads padded ``(oh·sh + i·dh,
   ow·sw + j·dw)``, which is phase plane ``((i·dh) % sh, (j·dw) % sw)`` at row ``oh + ⌊i·dh/sh⌋``,
   column ``ow + ⌊j·dw/sw⌋``: with the flat index ``f = oh·P + ow`` the read is ``xph[f + off(i, j)]``,
   an affine function of ``f`` with a constant offset per tap, for every stride and dilation.
   The border is zeroed once per thread (its positions are the same for every plane); only the
   interior is copied per plane.
2. *Accumulate*: ``acc[f] = b[c] + Σ_{i,j} w[c, i, j] · xph[f + off(i, j)]`` for ``f < F``
   (``F = OH·P`` rounded up to the vector width), one ``<L x float>`` accumulator per
   step of ``f`` with the taps' weights broadcast once per plane: ``KH·KW`` FMAs per ``L``
   outputs.  The ``P - OW`` columns per row past the output (and the tail up to ``F``) are junk,
   never stored: this keeps 7×7 and 14×14 planes in whole vectors (a 7×7 3×3/1 plane is 4
   vectors of 16 instead of 7 rows of 7 columns).
3. *Epilogue*: a chain of ReLUs and constant Clips on each accumulator vector in registers
   (:func:`_register_chain`); another fused chain (SiLU, a per-channel scale) applied to ``acc``
   along ``f`` (a countable loop LLVM vectorizes); then the crop ``y[n, c, oh, ow] = acc[oh·P +
   ow]``; a chain reading a full-size tensor (a residual add) runs in the crop loop instead.

In polyhedral terms the plane loop ``(n, c)`` is the only loop carrying no reuse, so it is the
parallel one; the copy is a data-layout transformation (the phase split) that makes every
statement instance of one tap read a unit-stride run, and the flattening of ``(oh, ow)`` into
``f`` is a change of basis of the output domain that pads each row to the source pitch.

Chosen for every depthwise convolution of a host build with the packed GEMM on, unless
``--conv direct`` (then the register-blocked nests of :mod:`polyml.kernels.conv` run, the
comparison point of ``scripts/bench_models.py layers``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import llvmlite.ir as ir

from polyml.codegen import gemm as packed
from polyml.codegen.builder import (
    F32,
    I64,
    Buffer,
    KernelBuilder,
    masked_intrinsic,
    skip_polly,
    splat,
    store_lanes,
    vector_fma,
)
from polyml.graph import Node, TensorType
from polyml.kernels._window import VECTOR_LANES, Window, _isa, register_epilogue
from polyml.kernels.fused import evaluate_chain
from polyml.options import CodegenConfig

#: planes·taps·outputs below which the convolution runs on one thread (the fork/join of a
#: parallel region costs more than it saves)
PARALLEL_MIN_MACS = 1 << 16
#: scratch floats per thread for a group of small planes: all of a group's planes are copied in
#: before the first is computed, so the accumulation's vector loads do not read the copy's
#: narrow stores just made (a failed store-to-load forward per load; 7x7 and 14x14 planes)
GROUP_FLOATS = 8192
#: column strides whose copy-in runs on whole vectors (:func:`_copy_row_vectors`); wider
#: strides keep LLVM's loops (a phase split of more than two vectors is several shuffles)
VECTOR_ROW_MAX_STRIDE = 2
#: vector widths whose unaligned tap reads are plain unaligned loads (AVX2: a 32-byte load
#: crosses a cache line at half the offsets); AVX-512's 16 lanes shift two aligned vectors
#: instead (:func:`_step`).  On AVX2 the two-source lane shift is a ``vperm2f128`` and one or
#: two ``vshufps`` per tap (Zen 1 EPYC, single depthwise layers with ReLU6, 1
#: thread CPU time, minimum of 40, unaligned / shifted: 3x3 576 @14 0.66, 144 @56 0.78, 3x3/2
#: 96 @112 0.65, 960 @7 0.92)
UNALIGNED_MAX_LANES = 8
#: :func:`_chain_after_crop` (False: the chain per plane)
CHAIN_AFTER_CROP = True
#: the interleave count asked of LLVM for that loop (its own choice was 1: one logistic at a
#: time, bound by the latency of its polynomial; EfficientNet-B0's 7x7
#: depthwise steps at 2 threads, two runs, 4 / 1: 0.93-0.97)
CHAIN_INTERLEAVE = 4
#: row-wise planes (AVX-512) store each output row from the accumulator's registers, the last
#: vector masked, instead of a scalar crop loop reading the row back from the accumulator
ROW_VECTOR_STORES = True
#: :func:`_register_chain` (False: the chain as a pass)
REGISTER_CHAIN = True
#: :attr:`DepthwisePlan.interleaved`
INTERLEAVE_COPY = True
#: :attr:`DepthwisePlan.row_bands`
ROW_BANDS = True
#: fewest output rows in a thread's band (smaller planes keep the plane split: each thread
#: would set up every plane for a few rows)
BAND_MIN_ROWS = 28


@dataclass(frozen=True)
class DepthwisePlan:
    """The geometry of one depthwise convolution (a pure function of its types and attributes)."""

    win: Window
    batch: int
    channels: int
    lanes: int
    parts: int

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

    @property
    def interleaved(self) -> bool:
        """Row-wise planes copied in one at a time (:attr:`group` 1: planes larger than
        :data:`GROUP_FLOATS`) copy each input row just before the first output row that reads
        it, so the rows are read from L1 and the input's loads overlap the FMAs.  Strided rows
        on AVX-512 only (MobileNetV2 at 2 threads, per step, minimum of 12,
        interleaved / whole plane: 3x3/2 96 @112 0.82-0.83, the model 0.99-1.0; EfficientNet-B0's
        with SiLU 1.01; unstrided 3x3 32 @112 1.12-1.24; AVX2 not measured)."""
        return (INTERLEAVE_COPY and self.rowwise and self.group == 1 and self.phases[0] > 1
                and self.lanes > UNALIGNED_MAX_LANES)

    @property
    def row_bands(self) -> bool:
        """The threads split each plane's output rows into bands of :attr:`band` rows (each
        thread runs every plane, copying in only the input rows its band reads) instead of
        splitting the planes.  The 1x1 products around a depthwise layer split the positions
        between the threads (:func:`polyml.codegen.gemm.split`), so a plane split reads half of
        each plane from the other core's cache and leaves half of its output there for the
        next product; bands keep both on the core that wrote them.  Row-wise planes of batch 1
        on AVX-512 (AVX2 not measured)."""
        return (ROW_BANDS and self.parts > 1 and self.rowwise and self.batch == 1
                and self.lanes > UNALIGNED_MAX_LANES and self.band >= BAND_MIN_ROWS
                and (self.parts - 1) * self.band < self.win.out[0])

    @property
    def band(self) -> int:
        """Output rows per thread when :attr:`row_bands`."""
        return -(-self.win.out[0] // self.parts)

    @property
    def group(self) -> int:
        """Planes copied in before any of them is computed (:data:`GROUP_FLOATS`)."""
        share = self.batch * self.channels if self.row_bands else -(-self.batch * self.channels // self.parts)
        return max(1, min(share, GROUP_FLOATS // self.per_plane))

    @property
    def per_thread(self) -> int:
        return self.group * self.per_plane

    @property
    def scratch(self) -> TensorType:
        return TensorType((self.parts * self.per_thread,))


def depthwise_plan(config: CodegenConfig, node: Node, x: TensorType, w: TensorType, win: Window) -> DepthwisePlan | None:
    """The plan when this Conv is depthwise (``group = C = M``, two spatial dims) in a host
    build that lets convolutions leave the plain nests (the packed GEMM on, ``conv`` not
    ``direct``), else None."""
    group = int(node.attrs.get("group", 1))
    if win.rank != 2 or group == 1 or group != x.shape[1] or w.shape[0] != group or w.shape[1] != 1:
        return None
    if not config.packed or config.conv == "direct":
        return None
    planes = x.shape[0] * group
    macs = planes * math.prod(win.kernel) * math.prod(win.out)
    parts = min(os.cpu_count() or 1, planes) if macs >= PARALLEL_MIN_MACS else 1
    return DepthwisePlan(win, x.shape[0], group, VECTOR_LANES[_isa()], parts)


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _chain_is_per_channel(k: KernelBuilder) -> bool:
    """Whether every extra input of the fused chain is constant over the spatial dims."""
    y = k.outputs[0]
    for buf in k.inputs[k.node.attrs["epilogue_start"]:]:
        if buf is not None:
            full = (1,) * (y.rank - buf.rank) + buf.shape
            if any(d != 1 for d in full[2:]):
                return False
    return True


def convolve_depthwise(k: KernelBuilder, plan: DepthwisePlan, scratch: Buffer) -> bool:
    """Emit the depthwise convolution into ``k`` (module docstring); True: the fused chain ran."""
    x = k.inputs[0]
    lanes, win = plan.lanes, plan.win
    if lanes == 16:
        set.add(k.fn.attributes, '"min-legal-vector-width"="512"')
    planes = plan.batch * plan.channels
    share = -(-planes // plan.parts)
    h, wd = win.size
    f32p = F32.as_pointer()
    vec = ir.VectorType(F32, lanes)
    fma = vector_fma(k.module, lanes)

    with k.parallel_loop(0, plan.parts, "dw") as part:
        b = k.b
        skip_polly(b.function)
        base = b.gep(b.bitcast(scratch.ptr, f32p), [b.mul(part, _c(plan.per_thread))], inbounds=True)
        with packed.for_range(b, 0, plan.per_thread, name="dw.zero") as z:
            b.store(ir.Constant(F32, 0.0), b.gep(base, [z], inbounds=True))
        band = None
        if plan.row_bands:  # every plane, output rows [oh0, oh1)
            lo, hi = _c(0), _c(planes)
            oh0 = b.mul(part, _c(plan.band))
            band = (oh0, packed._min(b, b.add(oh0, _c(plan.band)), _c(win.out[0])))
        else:
            lo = b.mul(part, _c(share))
            hi = b.select(b.icmp_signed("<", b.add(lo, _c(share)), _c(planes)), b.add(lo, _c(share)), _c(planes))
        with packed.for_range(b, lo, hi, plan.group, name="dw.group") as g0:
            g1 = b.select(b.icmp_signed("<", b.add(g0, _c(plan.group)), hi), b.add(g0, _c(plan.group)), hi)
            def source(pn: ir.Value) -> ir.Value:
                return b.gep(b.bitcast(x.ptr, f32p), [b.mul(pn, _c(h * wd))], inbounds=True)

            if not plan.interleaved:
                with packed.for_range(b, g0, g1, name="dw.copy") as pn:
                    work = b.gep(base, [b.mul(b.sub(pn, g0), _c(plan.per_plane))], inbounds=True)
                    _copy_in(b, plan, source(pn), work, band)
            with packed.for_range(b, g0, g1, name="dw.plane") as pn:
                _plane(k, plan, pn, b.gep(base, [b.mul(b.sub(pn, g0), _c(plan.per_plane))], inbounds=True), fma, vec,
                       source(pn) if plan.interleaved else None, band)
            if _chain_after_crop(k, plan):  # the group's planes are contiguous in y: one loop
                per = math.prod(win.out)
                _chain_in_place(k, b.bitcast(k.outputs[0].ptr, f32p), b.mul(g0, _c(per)), b.mul(g1, _c(per)), {},
                                [_c(0)] * 4, "dw.chain", (("llvm.loop.interleave.count", CHAIN_INTERLEAVE),))
    return bool(k.node.attrs.get("epilogue"))


def _chain_in_place(k: KernelBuilder, base: ir.Value, lo: ir.Value | int, hi: ir.Value | int, extras: dict,
                    index: list[ir.Value], name: str, hints: tuple = ()) -> None:
    """``base[f] = chain(base[f])`` for ``lo ≤ f < hi``: the node's fused chain over a run of
    floats, its extra inputs read at ``index`` (per-channel ones: the same for the whole run)."""
    b = k.b
    chain, acc_name = k.node.attrs["epilogue"], k.node.attrs["epilogue_acc"]
    with packed.for_range(b, lo, hi, name=name, hints=hints) as f:
        at = b.gep(base, [f], inbounds=True)
        b.store(evaluate_chain(k, chain, {acc_name: b.load(at)}, extras, index), at)


def _chain_after_crop(k: KernelBuilder, plan: DepthwisePlan) -> bool:
    """Whether the fused chain runs over the cropped output of each group of planes (one
    countable loop over contiguous floats) instead of per plane on the flat accumulator, whose
    padding lanes it would compute too (a 7x7 plane on an 11-wide pitch: 80 lanes for 49
    outputs): planes narrower than a vector (not :attr:`DepthwisePlan.rowwise`) and a chain with
    no inputs of its own (SiLU; not a per-channel scale or a clip's bounds).  Measured on
    EfficientNet-B0 per step, three runs at 1 and 2 threads: 5x5 1152 @7x7 with SiLU
    0.87-0.89x, 3x3 1152 @7x7 0.89-0.90x.  Rows of 14 and 28 outputs (LLVM gives their element
    loop a masked tail) measured 0.82x at 1 thread, and at 2 in the model 0.95x in a fast spell
    and 1.3-2.0x in a slow one (the same runs, interleaved 4): not taken."""
    if not CHAIN_AFTER_CROP or plan.rowwise or not k.node.attrs.get("epilogue") or _register_chain(k):
        return False
    return not any(buf is not None for buf in k.inputs[k.node.attrs["epilogue_start"]:])


def _register_chain(k: KernelBuilder) -> packed.RegisterEpilogue | None:
    """The fused chain as a :class:`~polyml.codegen.gemm.RegisterEpilogue` (ReLUs and Clips with
    constant bounds, no inputs of their own), applied to each accumulator vector in registers
    before it is stored, instead of a pass that stores the row, reloads it and stores it again
    (:func:`_chain_in_place`); None where the chain is another one (or there is none)."""
    chain = k.node.attrs.get("epilogue")
    if not REGISTER_CHAIN or not chain:
        return None
    extras = [buf for buf in k.inputs[k.node.attrs["epilogue_start"]:] if buf is not None]
    return register_epilogue(None, chain, extras)


def _plane(k: KernelBuilder, plan: DepthwisePlan, pn: ir.Value, work: ir.Value, fma: ir.Function,
           vec: ir.VectorType, src: ir.Value | None = None, band: tuple[ir.Value, ir.Value] | None = None) -> None:
    """Accumulate, epilogue and crop of plane ``pn`` whose phase-split copy is at ``work``
    (with ``src``, its input plane: :attr:`DepthwisePlan.interleaved`, each output row copies
    the input rows it is the first to read just before it is computed); with ``band``, only
    the output rows ``[band[0], band[1])`` (:attr:`DepthwisePlan.row_bands`, row-wise planes)."""
    b, win = k.b, plan.win
    w, y = k.inputs[1], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    in_registers = _register_chain(k)  # applied to each accumulator vector: no chain pass
    chain = None if in_registers is not None or _chain_after_crop(k, plan) else k.node.attrs.get("epilogue")
    extras = {buf.name: buf for buf in k.inputs[k.node.attrs["epilogue_start"]:] if buf is not None} if chain else {}
    flat_chain = bool(chain) and _chain_is_per_channel(k)
    (kh, kw), (oh_n, ow_n) = win.kernel, win.out
    pitch, flat, lanes, f32p = plan.pitch, plan.flat, plan.lanes, F32.as_pointer()
    taps = [(i, j, plan.tap_offset(i, j)) for i in range(kh) for j in range(kw)]
    acc = b.gep(work, [_c(plan.in_floats)], inbounds=True)
    n, c = b.udiv(pn, _c(plan.channels)), b.urem(pn, _c(plan.channels))
    # acc[f] = b[c] + Σ w[c, i, j] · xph[f + off(i, j)], L outputs per step
    weights, start = tap_weights(b, w, bias, c, taps, kw, vec)
    if plan.rowwise:
        # per output row: its vectors into the row accumulator (in L1), then the fused chain
        # and the store of the row; no plane-sized accumulator pass
        y_plane = b.gep(b.bitcast(y.ptr, f32p), [b.mul(pn, _c(oh_n * ow_n))], inbounds=True)
        whole_vectors = ROW_VECTOR_STORES and lanes > UNALIGNED_MAX_LANES and (not chain or flat_chain)
        sh, last_tap = plan.phases[0], (kh - 1) * win.dilations[0]
        oh0, oh1 = band or (_c(0), _c(oh_n))
        if src is not None:  # the padded rows before the ones output row oh0 is the first to read
            for r in range(last_tap - sh + 1):
                _copy_padded_row(b, plan, src, work, b.add(b.mul(oh0, _c(sh)), _c(r)), r % sh)
        with packed.for_range(b, oh0, oh1, name="dw.oh") as oh:
            if src is not None:  # padded rows oh·sh + last_tap - t, t < sh: first read by this row
                for t in range(sh):
                    r = b.add(b.mul(oh, _c(sh)), _c(last_tap - t))
                    _copy_padded_row(b, plan, src, work, r, (last_tap - t) % sh)
            row = b.mul(oh, _c(pitch))
            y_row = b.gep(y_plane, [b.mul(oh, _c(ow_n))], inbounds=True)
            for d in range(0, plan.acc_floats, lanes):
                s = _step(b, work, b.add(row, _c(d)), taps, weights, start, fma, vec)
                if in_registers is not None:
                    s = in_registers.apply(b, s, None)
                if whole_vectors and not chain:  # stored as computed: few live vectors, no spills
                    store_lanes(b, s, b.bitcast(b.gep(y_row, [_c(d)], inbounds=True), vec.as_pointer()), ow_n - d)
                else:
                    b.store(s, b.bitcast(b.gep(acc, [_c(d)], inbounds=True), vec.as_pointer()), align=4 * lanes)
            if whole_vectors and chain:  # per channel: on the row's whole vectors, then read back as stored
                _chain_in_place(k, acc, 0, plan.acc_floats, extras, [n, c, _c(0), _c(0)], "dw.epi",
                                (("llvm.loop.vectorize.width", lanes), ("llvm.loop.interleave.count", 1)))
                sums = [b.load(b.bitcast(b.gep(acc, [_c(d)], inbounds=True), vec.as_pointer()), align=4 * lanes)
                        for d in range(0, plan.acc_floats, lanes)]
                _store_row(b, sums, y_row, ow_n)
            elif not whole_vectors:
                with packed.for_range(b, 0, ow_n, name="dw.ow") as ow:
                    v = b.load(b.gep(acc, [ow], inbounds=True))
                    if chain:
                        v = evaluate_chain(k, chain, {k.node.attrs["epilogue_acc"]: v}, extras, [n, c, oh, ow])
                    b.store(v, b.gep(y_plane, [b.add(b.mul(oh, _c(ow_n)), ow)], inbounds=True))
        return
    with packed.for_range(b, 0, flat, lanes, name="dw.f") as f:
        s = _step(b, work, f, taps, weights, start, fma, vec)
        if in_registers is not None:
            s = in_registers.apply(b, s, None)
        b.store(s, b.bitcast(b.gep(acc, [f], inbounds=True), vec.as_pointer()), align=4 * lanes)
    if flat_chain:
        _chain_in_place(k, acc, 0, flat, extras, [n, c, _c(0), _c(0)], "dw.epi")
    y_plane = b.gep(b.bitcast(y.ptr, f32p), [b.mul(pn, _c(oh_n * ow_n))], inbounds=True)
    with packed.for_range(b, 0, oh_n, name="dw.oh") as oh:
        with packed.for_range(b, 0, ow_n, name="dw.ow") as ow:
            v = b.load(b.gep(acc, [b.add(b.mul(oh, _c(pitch)), ow)], inbounds=True))
            if chain and not flat_chain:
                v = evaluate_chain(k, chain, {k.node.attrs["epilogue_acc"]: v}, extras, [n, c, oh, ow])
            b.store(v, b.gep(y_plane, [b.add(b.mul(oh, _c(ow_n)), ow)], inbounds=True))


def tap_weights(b: ir.IRBuilder, w: Buffer, bias: Buffer | None, c: ir.Value, taps: list[tuple[int, int, int]],
                kw: int, vec: ir.VectorType) -> tuple[list[ir.Value], ir.Value]:
    """Channel ``c``'s tap weights broadcast in tap order, and its bias broadcast (zeros without one)."""
    wbase = b.gep(b.bitcast(w.ptr, F32.as_pointer()), [b.mul(c, _c(len(taps)))], inbounds=True)
    weights = [splat(b, b.load(b.gep(wbase, [_c(i * kw + j)], inbounds=True)), vec) for i, j, _ in taps]
    return weights, splat(b, bias.load([c]), vec) if bias is not None else ir.Constant(vec, [0.0] * vec.count)


def _store_row(b: ir.IRBuilder, sums: list[ir.Value], y_row: ir.Value, width: int) -> None:
    """An output row of ``width`` floats from its accumulator vectors, straight from the
    registers: whole vectors stored as they are, the last partial one with a masked store."""
    vec = sums[0].type
    for q, v in enumerate(sums):
        d = q * vec.count
        if d >= width:
            break
        store_lanes(b, v, b.bitcast(b.gep(y_row, [_c(d)], inbounds=True), vec.as_pointer()), width - d)


def _step(b: ir.IRBuilder, work: ir.Value, f: ir.Value, taps: list[tuple[int, int, int]], weights: list[ir.Value],
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


def _copy_in(b: ir.IRBuilder, plan: DepthwisePlan, src: ir.Value, work: ir.Value,
             band: tuple[ir.Value, ir.Value] | None = None) -> None:
    """The interior of ``xph`` from one input plane: for each row phase ``pr``, the padded
    rows ``r = pr + sh·i`` that hold input rows (``0 ≤ r - pt < H``, ``r < Hreq``), each by
    :func:`_copy_row`; with ``band``, only those the output rows ``[band[0], band[1])`` read
    (``band[0]·sh ≤ r < (band[1] - 1)·sh + (KH - 1)·dh + 1``)."""
    sh, h = plan.phases[0], plan.win.size[0]
    reach = (plan.win.kernel[0] - 1) * plan.win.dilations[0] + 1
    for pr in range(sh):
        i0, i1 = _phase_range(pr, sh, plan.win.pads_begin[0], h, plan.win.required[0])
        if i1 <= i0:
            continue
        lo, hi = _c(i0), _c(i1)
        if band is not None:  # i from ⌈(r_lo - pr)/sh⌉ to ⌈(r_hi - pr)/sh⌉, inside [i0, i1)
            r_lo = b.mul(band[0], _c(sh))
            r_hi = b.add(b.mul(b.sub(band[1], _c(1)), _c(sh)), _c(reach))
            first = b.sdiv(b.add(r_lo, _c(sh - 1 - pr)), _c(sh))
            end = b.sdiv(b.add(r_hi, _c(sh - 1 - pr)), _c(sh))
            lo = b.select(b.icmp_signed(">", first, lo), first, lo)
            hi = packed._min(b, end, hi)
        with packed.for_range(b, lo, hi, name="dw.ci") as i:
            _copy_row(b, plan, src, work, pr, i)


def _copy_padded_row(b: ir.IRBuilder, plan: DepthwisePlan, src: ir.Value, work: ir.Value, r: ir.Value,
                     phase: int) -> None:
    """Padded row ``r`` (a run-time value whose row phase ``r mod sh`` is ``phase``) into
    ``xph`` if it holds an input row (else it is padding, zeroed once per thread)."""
    sh = plan.phases[0]
    i0, i1 = _phase_range(phase, sh, plan.win.pads_begin[0], plan.win.size[0], plan.win.required[0])
    if i1 <= i0:
        return
    i = b.sdiv(b.sub(r, _c(phase)), _c(sh))
    inside = b.and_(b.icmp_signed(">=", i, _c(i0)), b.icmp_signed("<", i, _c(i1)))
    with b.if_then(inside):
        _copy_row(b, plan, src, work, phase, i)


def _copy_row(b: ir.IRBuilder, plan: DepthwisePlan, src: ir.Value, work: ir.Value, pr: int, i: ir.Value) -> None:
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
        _copy_row_vectors(b, plan, src_row, dst_rows)
        return
    spans = [_phase_range(pc, sw, pl, wd, rq_w) for pc in range(sw)]
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


def _copy_row_vectors(b: ir.IRBuilder, plan: DepthwisePlan, src_row: ir.Value | None, dst_rows: list[ir.Value],
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


def _phase_range(p: int, s: int, pad: int, size: int, required: int) -> tuple[int, int]:
    """Indices ``i`` of phase ``p`` (padded position ``p + s·i``) that hold an input element:
    ``pad ≤ p + s·i < min(pad + size, required)``."""
    lo = max(0, -(-(pad - p) // s))
    hi = -(-(min(pad + size, required) - p) // s)
    return lo, max(lo, hi)


__all__ = ["DepthwisePlan", "convolve_depthwise", "depthwise_plan", "tap_weights"]
