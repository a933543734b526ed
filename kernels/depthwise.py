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
3. *Epilogue*: the fused chain (activation, per-channel scale) applied to ``acc`` along ``f``
   (a countable loop LLVM vectorizes), then the crop ``y[n, c, oh, ow] = acc[oh·P + ow]``; a
   chain reading a full-size tensor (a residual add) runs in the crop loop instead.

In polyhedral terms the plane loop ``(n, c)`` is the only loop carrying no reuse, so it is the
parallel one; the copy is a data-layout transformation (the phase split) that makes every
statement instance of one tap read a unit-stride run, and the flattening of ``(oh, ow)`` into
``f`` is a change of basis of the output domain that pads each row to the source pitch.

Chosen for every depthwise convolution of a host build with the packed GEMM on, unless
``--conv direct`` (then the register-blocked nests of :mod:`polyml.kernels.conv` run, the
comparison point of ``scripts/bench_issue14.py layers``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import llvmlite.ir as ir
from polyml.kernels.conv import VECTOR_LANES, Window, _isa
from polyml.kernels.fused import evaluate_chain

from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32, I64, Buffer, KernelBuilder, splat
from polyml.graph import Node, TensorType

#: planes·taps·outputs below which the convolution runs on one thread (the fork/join of a
#: parallel region costs more than it saves)
PARALLEL_MIN_MACS = 1 << 16
#: scratch floats per thread for a group of small planes: all of a group's planes are copied in
#: before the first is computed, so the accumulation's vector loads do not read the copy's
#: narrow stores just made (a failed store-to-load forward per load; 7x7 and 14x14 planes)
GROUP_FLOATS = 8192


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
    def pitch(self) -> int:
        """Columns ``P`` of each phase plane (the flat index's row pitch)."""
        return -(-self.win.required[1] // self.win.strides[1])

    @property
    def flat(self) -> int:
        """Accumulated flat outputs ``F``: ``OH·P`` rounded up to whole vectors."""
        return -(-self.win.out[0] * self.pitch // self.lanes) * self.lanes

    def tap_offset(self, i: int, j: int) -> int:
        """Offset in the phase-split buffer of tap ``(i, j)``'s read for flat output 0."""
        (sh, sw), (dh, dw) = self.phases, self.win.dilations
        plane = (i * dh % sh) * sw + (j * dw % sw)
        return plane * self.rows * self.pitch + (i * dh // sh) * self.pitch + j * dw // sw

    @property
    def in_floats(self) -> int:
        """The phase-split buffer, long enough for the last vector of the farthest tap."""
        kh, kw = self.win.kernel
        sh, sw = self.phases
        far = max(self.tap_offset(i, j) for i in range(kh) for j in range(kw))
        return max(sh * sw * self.rows * self.pitch, far + self.flat)

    @property
    def per_plane(self) -> int:
        return self.in_floats + self.flat

    @property
    def group(self) -> int:
        """Planes copied in before any of them is computed (:data:`GROUP_FLOATS`)."""
        share = -(-self.batch * self.channels // self.parts)
        return max(1, min(share, GROUP_FLOATS // self.per_plane))

    @property
    def per_thread(self) -> int:
        return self.group * self.per_plane

    @property
    def scratch(self) -> TensorType:
        return TensorType((self.parts * self.per_thread,))


def depthwise_plan(node: Node, x: TensorType, w: TensorType, win: Window) -> DepthwisePlan | None:
    """The plan when this Conv is depthwise (``group = C = M``, two spatial dims) in a host
    build that lets convolutions leave the plain nests (the packed GEMM on, ``conv`` not
    ``direct``), else None."""
    group = int(node.attrs.get("group", 1))
    if win.rank != 2 or group == 1 or group != x.shape[1] or w.shape[0] != group or w.shape[1] != 1:
        return None
    if not packed.enabled() or packed.conv_choice() == "direct":
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
    fma = k.module.globals.get(f"llvm.fma.v{lanes}f32") or ir.Function(
        k.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{lanes}f32")

    with k.parallel_loop(0, plan.parts, "dw") as part:
        b = k.b
        base = b.gep(b.bitcast(scratch.ptr, f32p), [b.mul(part, _c(plan.per_thread))], inbounds=True)
        with packed.for_range(b, 0, plan.per_thread, name="dw.zero") as z:
            b.store(ir.Constant(F32, 0.0), b.gep(base, [z], inbounds=True))
        lo = b.mul(part, _c(share))
        hi = b.select(b.icmp_signed("<", b.add(lo, _c(share)), _c(planes)), b.add(lo, _c(share)), _c(planes))
        with packed.for_range(b, lo, hi, plan.group, name="dw.group") as g0:
            g1 = b.select(b.icmp_signed("<", b.add(g0, _c(plan.group)), hi), b.add(g0, _c(plan.group)), hi)
            with packed.for_range(b, g0, g1, name="dw.copy") as pn:
                work = b.gep(base, [b.mul(b.sub(pn, g0), _c(plan.per_plane))], inbounds=True)
                _copy_in(b, plan, b.gep(b.bitcast(x.ptr, f32p), [b.mul(pn, _c(h * wd))], inbounds=True), work)
            with packed.for_range(b, g0, g1, name="dw.plane") as pn:
                _plane(k, plan, pn, b.gep(base, [b.mul(b.sub(pn, g0), _c(plan.per_plane))], inbounds=True), fma, vec)
    return bool(k.node.attrs.get("epilogue"))


def _plane(k: KernelBuilder, plan: DepthwisePlan, pn: ir.Value, work: ir.Value, fma: ir.Function,
           vec: ir.VectorType) -> None:
    """Accumulate, epilogue and crop of plane ``pn`` whose phase-split copy is at ``work``."""
    b, win = k.b, plan.win
    w, y = k.inputs[1], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    chain = k.node.attrs.get("epilogue")
    extras = {buf.name: buf for buf in k.inputs[k.node.attrs["epilogue_start"]:] if buf is not None} if chain else {}
    flat_chain = bool(chain) and _chain_is_per_channel(k)
    (kh, kw), (oh_n, ow_n) = win.kernel, win.out
    pitch, flat, lanes, f32p = plan.pitch, plan.flat, plan.lanes, F32.as_pointer()
    taps = [(i, j, plan.tap_offset(i, j)) for i in range(kh) for j in range(kw)]
    acc = b.gep(work, [_c(plan.in_floats)], inbounds=True)
    n, c = b.udiv(pn, _c(plan.channels)), b.urem(pn, _c(plan.channels))
    # acc[f] = b[c] + Σ w[c, i, j] · xph[f + off(i, j)], L outputs per step
    wbase = b.gep(b.bitcast(w.ptr, f32p), [b.mul(c, _c(kh * kw))], inbounds=True)
    weights = [splat(b, b.load(b.gep(wbase, [_c(i * kw + j)], inbounds=True)), vec) for i, j, _ in taps]
    start = splat(b, bias.load([c]), vec) if bias is not None else ir.Constant(vec, [0.0] * lanes)
    with packed.for_range(b, 0, flat, lanes, name="dw.f") as f:
        s = start
        for (_, _, off), wv in zip(taps, weights):
            ptr = b.bitcast(b.gep(work, [b.add(f, _c(off))], inbounds=True), vec.as_pointer())
            s = b.call(fma, [wv, b.load(ptr, align=4), s])
        b.store(s, b.bitcast(b.gep(acc, [f], inbounds=True), vec.as_pointer()), align=4)
    if flat_chain:
        with packed.for_range(b, 0, flat, name="dw.epi") as f:
            at = b.gep(acc, [f], inbounds=True)
            b.store(evaluate_chain(k, chain, {k.node.attrs["epilogue_acc"]: b.load(at)}, extras, [n, c, _c(0), _c(0)]), at)
    y_plane = b.gep(b.bitcast(y.ptr, f32p), [b.mul(pn, _c(oh_n * ow_n))], inbounds=True)
    with packed.for_range(b, 0, oh_n, name="dw.oh") as oh:
        with packed.for_range(b, 0, ow_n, name="dw.ow") as ow:
            v = b.load(b.gep(acc, [b.add(b.mul(oh, _c(pitch)), ow)], inbounds=True))
            if chain and not flat_chain:
                v = evaluate_chain(k, chain, {k.node.attrs["epilogue_acc"]: v}, extras, [n, c, oh, ow])
            b.store(v, b.gep(y_plane, [b.add(b.mul(oh, _c(ow_n)), ow)], inbounds=True))


def _copy_in(b: ir.IRBuilder, plan: DepthwisePlan, src: ir.Value, work: ir.Value) -> None:
    """The interior of ``xph`` from one input plane: for each row phase ``pr``, the padded
    rows ``r = pr + sh·i`` that hold input rows (``0 ≤ r - pt < H``, ``r < Hreq``), and in each
    the columns ``q = pc + sw·j`` likewise, ``xph[pr][pc][i][j] = x[r-pt][q-pl]``.  The column
    phases are filled in one loop over ``j`` where all of them have an element (an interleave
    group of factor ``sw``: LLVM loads whole vectors and deinterleaves them with shuffles; one
    loop per phase reading every ``sw``-th float ran the 3x3/2 copy 3-4x slower), the few
    columns where only some phases have one in short loops of their own."""
    win = plan.win
    (h, wd), (sh, sw), (pt, pl), (rq_h, rq_w) = win.size, plan.phases, win.pads_begin, win.required
    rows, pitch = plan.rows, plan.pitch
    spans = [_phase_range(pc, sw, pl, wd, rq_w) for pc in range(sw)]
    common = (max(lo for lo, _ in spans), min(hi for _, hi in spans))
    for pr in range(sh):
        i0, i1 = _phase_range(pr, sh, pt, h, rq_h)
        if i1 <= i0:
            continue
        with packed.for_range(b, i0, i1, name="dw.ci") as i:
            src_row = b.gep(src, [b.mul(b.add(b.mul(i, _c(sh)), _c(pr - pt)), _c(wd))], inbounds=True)
            dst_rows = [b.gep(work, [b.add(b.mul(i, _c(pitch)), _c((pr * sw + pc) * rows * pitch))], inbounds=True)
                        for pc in range(sw)]

            def copy(j: ir.Value, pc: int, src_row: ir.Value = src_row, dst_rows: list = dst_rows) -> None:
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


def _phase_range(p: int, s: int, pad: int, size: int, required: int) -> tuple[int, int]:
    """Indices ``i`` of phase ``p`` (padded position ``p + s·i``) that hold an input element:
    ``pad ≤ p + s·i < min(pad + size, required)``."""
    lo = max(0, -(-(pad - p) // s))
    hi = -(-(min(pad + size, required) - p) // s)
    return lo, max(lo, hi)


__all__ = ["DepthwisePlan", "convolve_depthwise", "depthwise_plan"]
