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
    skip_polly,
    store_lanes,
    vector_fma,
)
from polyml.codegen.depthwise import (
    UNALIGNED_MAX_LANES,
    VECTOR_ROW_MAX_STRIDE,
    Geometry,
    copy_row,
    copy_row_vectors,
    phase_range,
    step,
    store_row,
    tap_weights,
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
class DepthwisePlan(Geometry):
    """The geometry of one depthwise convolution and its split over threads (a pure function
    of its types and attributes)."""

    batch: int
    channels: int
    parts: int

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
    return DepthwisePlan(win, VECTOR_LANES[_isa()], x.shape[0], group, parts)


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
                s = step(b, work, b.add(row, _c(d)), taps, weights, start, fma, vec)
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
                store_row(b, sums, y_row, ow_n)
            elif not whole_vectors:
                with packed.for_range(b, 0, ow_n, name="dw.ow") as ow:
                    v = b.load(b.gep(acc, [ow], inbounds=True))
                    if chain:
                        v = evaluate_chain(k, chain, {k.node.attrs["epilogue_acc"]: v}, extras, [n, c, oh, ow])
                    b.store(v, b.gep(y_plane, [b.add(b.mul(oh, _c(ow_n)), ow)], inbounds=True))
        return
    with packed.for_range(b, 0, flat, lanes, name="dw.f") as f:
        s = step(b, work, f, taps, weights, start, fma, vec)
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


def _copy_in(b: ir.IRBuilder, plan: DepthwisePlan, src: ir.Value, work: ir.Value,
             band: tuple[ir.Value, ir.Value] | None = None) -> None:
    """The interior of ``xph`` from one input plane: for each row phase ``pr``, the padded
    rows ``r = pr + sh·i`` that hold input rows (``0 ≤ r - pt < H``, ``r < Hreq``), each by
    :func:`_copy_row`; with ``band``, only those the output rows ``[band[0], band[1])`` read
    (``band[0]·sh ≤ r < (band[1] - 1)·sh + (KH - 1)·dh + 1``)."""
    sh, h = plan.phases[0], plan.win.size[0]
    reach = (plan.win.kernel[0] - 1) * plan.win.dilations[0] + 1
    for pr in range(sh):
        i0, i1 = phase_range(pr, sh, plan.win.pads_begin[0], h, plan.win.required[0])
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
            copy_row(b, plan, src, work, pr, i)


def _copy_padded_row(b: ir.IRBuilder, plan: DepthwisePlan, src: ir.Value, work: ir.Value, r: ir.Value,
                     phase: int) -> None:
    """Padded row ``r`` (a run-time value whose row phase ``r mod sh`` is ``phase``) into
    ``xph`` if it holds an input row (else it is padding, zeroed once per thread)."""
    sh = plan.phases[0]
    i0, i1 = phase_range(phase, sh, plan.win.pads_begin[0], plan.win.size[0], plan.win.required[0])
    if i1 <= i0:
        return
    i = b.sdiv(b.sub(r, _c(phase)), _c(sh))
    inside = b.and_(b.icmp_signed(">=", i, _c(i0)), b.icmp_signed("<", i, _c(i1)))
    with b.if_then(inside):
        copy_row(b, plan, src, work, phase, i)


__all__ = ["UNALIGNED_MAX_LANES", "VECTOR_ROW_MAX_STRIDE", "DepthwisePlan", "convolve_depthwise", "copy_row_vectors",
           "depthwise_plan", "phase_range", "step", "tap_weights"]
