"""A 1x1 expansion computed inside the depthwise convolution that reads it
(``polyml.DepthwiseProduct``, made by :mod:`polyml.passes.depthwise_product`).

``y = dw(e(W_e · x + b_e))``: in MobileNetV2's inverted residual blocks a 1x1 Conv expands
``K`` channels to ``C`` (``e``: ReLU6) and a depthwise Conv reads the expanded tensor ``t``.
Unfused, ``t`` (``C·H·W`` floats: 4.8 MB at 96 @112x112, more than a core's L2) is written by
the product and read back by the depthwise layer's copy-in.  Fused, each padded input row of
the depthwise layer is computed where the copy-in would load it: ``t`` is never stored.

Polyhedral view.  The product ``P[c, h, w] = Σ_k W_e[c, k] · x[k, h, w]`` and the depthwise
statement ``D[c, oh, ow]`` (reading ``P[c, oh·sh + i·dh - pt, ...]``) are fused on
``(oh, c)``: ``P[c, h, w] -> [⌊(h + pt - last)/sh⌋ + 1, c, 0, w]``, the instances of ``P``
scheduled at the first output row that reads them, then ``D[c, oh, ow] -> [oh, c, 1, ow]``.
Every dependence ``P -> D`` then runs forward (a row is computed at the first ``oh`` that
reads it, and kept for the later ones), and ``t`` is *contracted* to a ring of ``M`` phase rows
per channel and phase plane, ``M = ⌊(KH-1)·dh/sh⌋ + 1`` (the phase rows one output row reads):
phase row ``p`` lives in slot ``p mod M``, and kernel row ``i`` of output row ``oh`` reads slot
``(oh + ⌊i·dh/sh⌋) mod M`` (within a kernel row the taps keep the constant offsets of
:func:`polyml.codegen.depthwise.step`).  Each phase row's first input column is stored at a
vector boundary (:meth:`ProductPlan.lead`), so the row's stores are aligned, its padding
columns at the end of the row before (zeroed once per call, never written after); pad rows
are written as zeros when they enter the ring.  Measured on MobileNetV2's 1x1 16->96 +
3x3/2 @112 at 2 threads, in a loop: misaligned rows written twice in a ring of ``2M`` rows
0.31 ms, aligned 0.27, aligned in ``M`` rows 0.21.

Per thread (a band of output rows of every plane, :attr:`ProductPlan.bands`, or all rows of a
share of the planes at one thread), for each output row: per block of ``cb`` channels (``cb`` times the
row's vectors ≤ :data:`BLOCK_ACCUMULATORS` registers), the padded rows that output row is the
first to read (``Σ_k``: each x vector loaded once per block, ``cb`` FMAs per load, the
expansion's ReLU/Clip in registers), split into column phases as they are stored
(:func:`polyml.codegen.depthwise.copy_row_vectors`), then the block's output rows with the
depthwise layer's own ReLU/Clip in registers.  x's rows of the current output row stay in L1
across the channel blocks; each channel's ring (a few KiB) is reread from L2 once per row.

Made only where the depthwise layer runs row-wise with 16 lanes (AVX-512) and column stride ≤ 2,
batch 1, ``K ≤`` :data:`MAX_K`, ``t`` of at least :data:`MIN_EXPANDED_BYTES`, and both chains
are ReLU/constant-Clip chains (``POLYML_DW_PRODUCT=0``: never, for A/B measurements).
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
from polyml.kernels import Kernel, Operand, register
from polyml.kernels._window import conv_window, register_epilogue
from polyml.kernels.depthwise import (
    UNALIGNED_MAX_LANES,
    VECTOR_ROW_MAX_STRIDE,
    DepthwisePlan,
    copy_row_vectors,
    depthwise_plan,
    phase_range,
    step,
    tap_weights,
)
from polyml.options import CodegenConfig

DEPTHWISE_PRODUCT_OP = "polyml.DepthwiseProduct"
#: most expansion input channels (the reduction is a loop over them per row and block)
MAX_K = 64
#: smallest expanded tensor fused: smaller ones stay in L2 between the two unfused steps, where
#: the packed GEMM and the depthwise kernel each beat the fused nest
#: (MobileNetV2 per step, minimum of 30, fused / the pair, 2 threads: 1x1 16->96 + 3x3/2 @112
#: (4.8 MB) 0.71, 24->144 + 3x3/1 @56 (1.8 MB) 0.92, + 3x3/2 0.89, 32->192 + 3x3/1 @28 (0.6 MB)
#: 1.06-1.09; 1 thread 0.62, 0.91, 0.82, 0.93-0.96)
MIN_EXPANDED_BYTES = 1 << 20
#: accumulator vectors of one channel block (of the 32 AVX-512 registers: the row's x vectors
#: and a weight broadcast need the rest)
BLOCK_ACCUMULATORS = 24
#: the node's inputs: x, the expansion's weight and bias, the depthwise weight and bias, then the
#: depthwise chain's own inputs (``epilogue_start``)
X, W_E, B_E, W_D, B_D = range(5)


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


@dataclass(frozen=True)
class ProductPlan:
    """The geometry of one fused expansion and depthwise convolution."""

    dw: DepthwisePlan
    k: int
    block: int

    @property
    def ring(self) -> int:
        """``M``: phase rows one output row reads."""
        win = self.dw.win
        return (win.kernel[0] - 1) * win.dilations[0] // win.strides[0] + 1

    def lead(self, pc: int) -> int:
        """The first phase column of column phase ``pc`` that holds an input column (the columns
        before it are padding): it is stored at the start of its row, so the row's stores are
        aligned vectors; the padding columns lie at the end of the row before."""
        sw, pl = self.dw.phases[1], self.dw.win.pads_begin[1]
        return ((pc - pl) % sw + pl) // sw

    @property
    def pitch(self) -> int:
        """Floats per ring row: the phase columns and the longest lead, in whole vectors."""
        dw = self.dw
        columns = -(-dw.win.required[1] // dw.phases[1])
        lanes = dw.lanes
        return -(-(columns + max(self.lead(pc) for pc in range(dw.phases[1]))) // lanes) * lanes

    @property
    def phase_floats(self) -> int:
        """One phase plane of the ring: a vector (the first row's padding columns), then ``M`` rows."""
        return self.dw.lanes + self.ring * self.pitch

    @property
    def plane_floats(self) -> int:
        """One channel's ring (every phase plane) and slack for the last shifted read."""
        sh, sw = self.dw.phases
        return sh * sw * self.phase_floats + 2 * self.dw.lanes

    def tap_offset(self, i: int, j: int) -> int:
        """Offset of tap ``(i, j)``'s read for output column 0 from the start of the ring row
        (slot) it reads, in the ring's first phase plane."""
        (sh, sw), (dh, dw) = self.dw.phases, self.dw.win.dilations
        pc = j * dw % sw
        plane = (i * dh % sh) * sw + pc
        return plane * self.phase_floats + self.dw.lanes + j * dw // sw - self.lead(pc)

    @property
    def vectors(self) -> int:
        """Vectors of one product row."""
        return -(-self.dw.used_columns // self.dw.lanes)

    @property
    def band(self) -> int:
        """Output rows per thread."""
        return -(-self.dw.win.out[0] // self.dw.parts)

    @property
    def bands(self) -> bool:
        """The threads split the output rows (each computes every channel of the input rows
        its band reads, the ``KH - sh`` rows between two bands twice), not the channels.  x was
        written by a product that split the positions: a channel split reads half of x from the
        other core (MobileNetV2 at 2 threads, per step, fused / the unfused
        pair with a channel split / with 14-row bands: 1x1 24->144 + 3x3/2 @56 0.95 / 0.89,
        32->192 + 3x3/1 @28 1.29-1.33 / 1.06-1.09)."""
        return self.dw.parts > 1 and (self.dw.parts - 1) * self.band < self.dw.win.out[0]

    @property
    def share(self) -> int:
        """Planes per thread: all of them with row bands, else whole blocks."""
        dw = self.dw
        if self.bands:
            return dw.channels
        return -(-dw.channels // self.block // dw.parts) * self.block

    @property
    def scratch(self) -> TensorType:
        return TensorType((self.dw.parts * self.share * self.plane_floats,))


def product_plan(config: CodegenConfig, node: Node, x: TensorType, w_e: TensorType, w_d: TensorType) -> ProductPlan | None:
    """The plan of ``node`` (the depthwise Conv's attributes) reading the 1x1 product of ``x``
    (``[1, K, H, W]``) with ``w_e`` (``[C, K, 1, 1]``), or None where the fused form is not made
    (module docstring)."""
    if not config.dw_product or len(x.shape) != 4 or x.shape[0] != 1 or x.dtype != "float32" or x.shape[1] > MAX_K:
        return None
    if len(w_e.shape) != 4 or w_e.shape[1:] != (x.shape[1], 1, 1):
        return None
    t = TensorType((1, w_e.shape[0], *x.shape[2:]), "float32")
    if 4 * math.prod(t.shape) < MIN_EXPANDED_BYTES:
        return None
    dw = depthwise_plan(config, node, t, w_d, conv_window(node, t, w_d))
    if dw is None or not dw.rowwise or dw.lanes <= UNALIGNED_MAX_LANES or dw.phases[1] > VECTOR_ROW_MAX_STRIDE:
        return None
    vectors = -(-dw.used_columns // dw.lanes)
    blocks = [d for d in range(1, dw.channels + 1) if dw.channels % d == 0 and d * vectors <= BLOCK_ACCUMULATORS]
    if not blocks:
        return None
    return ProductPlan(dw, x.shape[1], max(blocks))


def chains_fit(expansion: list[Node] | None, depthwise: list[Node] | None, depthwise_extras: list) -> bool:
    """Both chains apply in registers (none, or ReLUs and constant Clips with no inputs)."""
    return ((not expansion or register_epilogue(None, expansion, []) is not None)
            and (not depthwise or register_epilogue(None, depthwise, depthwise_extras) is not None))


@register
class DepthwiseProduct(Kernel):
    """A 1x1 expansion and the depthwise Conv reading it, one row of the expanded tensor at a time."""

    op_types = (DEPTHWISE_PRODUCT_OP,)
    polly = "off"

    def _plan(self, node: Node, types: list[TensorType | None]) -> ProductPlan:
        plan = product_plan(self.config, node, types[X], types[W_E], types[W_D])
        if plan is None:  # the pass made the node with the same test
            raise AssertionError(f"{node.label}: no fused form for {DEPTHWISE_PRODUCT_OP}")
        return plan

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x, w_e = ins[X].type, ins[W_E].type
        t = TensorType((x.shape[0], w_e.shape[0], *x.shape[2:]), x.dtype)
        return [TensorType((x.shape[0], w_e.shape[0], *conv_window(node, t, ins[W_D].type).out), x.dtype)]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        plan = self._plan(node, [op.type if op is not None else None for op in ins])
        win = plan.dw.win
        return (f"1x1 {plan.k}->{plan.dw.channels} + {'x'.join(map(str, win.kernel))}/{max(win.strides)} "
                f"g{plan.dw.channels} @{'x'.join(map(str, win.size))} depthwise_product")

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        return [self._plan(node, [op.type if op is not None else None for op in ins]).scratch]

    def lower(self, k: KernelBuilder) -> None:
        _emit(k, self._plan(k.node, k.in_types), k.temps[0])


def _emit(k: KernelBuilder, plan: ProductPlan, scratch: Buffer) -> None:
    """The fused nest (module docstring)."""
    dw, win = plan.dw, plan.dw.win
    lanes = dw.lanes
    vec = ir.VectorType(F32, lanes)
    set.add(k.fn.attributes, '"min-legal-vector-width"="512"')
    fma = vector_fma(k.module, lanes)
    start = k.node.attrs.get("epilogue_start", len(k.inputs))
    extras = [buf for buf in k.inputs[start:] if buf is not None]
    expansion = register_epilogue(None, k.node.attrs.get("product_epilogue"), [])
    output = register_epilogue(None, k.node.attrs.get("epilogue"), extras)
    sh, last_tap = dw.phases[0], (win.kernel[0] - 1) * win.dilations[0]
    f32p = F32.as_pointer()
    with k.parallel_loop(0, dw.parts, "dwp") as part:
        b = k.b
        skip_polly(b.function)
        base = b.gep(b.bitcast(scratch.ptr, f32p), [b.mul(part, _c(plan.share * plan.plane_floats))], inbounds=True)
        with packed.for_range(b, 0, plan.share * plan.plane_floats, lanes, name="dwp.zero") as z:  # the pad columns
            b.store(ir.Constant(vec, [0.0] * lanes), b.bitcast(b.gep(base, [z], inbounds=True), vec.as_pointer()),
                    align=4 * lanes)
        if plan.bands:  # every plane, output rows [oh0, oh1)
            lo, hi = _c(0), _c(dw.channels)
            oh0 = b.mul(part, _c(plan.band))
            oh1 = packed._min(b, b.add(oh0, _c(plan.band)), _c(win.out[0]))
        else:
            lo = b.mul(part, _c(plan.share))
            hi = packed._min(b, b.add(lo, _c(plan.share)), _c(dw.channels))
            oh0, oh1 = _c(0), _c(win.out[0])

        def ring(c0: ir.Value, j: int) -> ir.Value:
            return b.gep(base, [b.mul(b.add(b.sub(c0, lo), _c(j)), _c(plan.plane_floats))], inbounds=True)

        def rows(c0: ir.Value, padded: list[tuple[ir.Value, int]]) -> None:
            for r, phase in padded:
                _product_row(k, plan, fma, vec, expansion, c0, [ring(c0, j) for j in range(plan.block)], r, phase)

        with packed.for_range(b, lo, hi, plan.block, name="dwp.first") as c0:  # rows before oh0's first
            rows(c0, [(b.add(b.mul(oh0, _c(sh)), _c(r)), r % sh) for r in range(last_tap - sh + 1)])
        with packed.for_range(b, oh0, oh1, name="dwp.oh") as oh:
            with packed.for_range(b, lo, hi, plan.block, name="dwp.c") as c0:
                rows(c0, [(b.add(b.mul(oh, _c(sh)), _c(last_tap - t)), (last_tap - t) % sh) for t in range(sh)])
                for j in range(plan.block):
                    _output_row(k, plan, fma, vec, output, b.add(c0, _c(j)), ring(c0, j), oh)


def _ring_row(b: ir.IRBuilder, plan: ProductPlan, work: ir.Value, p: ir.Value, phase: int) -> list[ir.Value]:
    """Phase row ``p`` of row phase ``phase`` in a channel's ring (slot ``p mod M``): one
    pointer per column phase to its phase column 0 (:meth:`ProductPlan.lead` floats before the
    row's aligned start)."""
    sw, lanes = plan.dw.phases[1], plan.dw.lanes
    slot = b.mul(b.urem(p, _c(plan.ring)), _c(plan.pitch))
    return [b.gep(work, [b.add(slot, _c((phase * sw + pc) * plan.phase_floats + lanes - plan.lead(pc)))], inbounds=True)
            for pc in range(sw)]


def _product_row(k: KernelBuilder, plan: ProductPlan, fma: ir.Function, vec: ir.VectorType,
                 expansion: packed.RegisterEpilogue | None, c0: ir.Value, works: list[ir.Value], r: ir.Value,
                 phase: int) -> None:
    """Padded row ``r`` (row phase ``phase``) of channels ``c0 ..`` into their rings: the
    product ``e(b_e[c] + Σ_k W_e[c, k] · x[k, r - pt, :])`` if it holds an input row, else zeros."""
    b, dw = k.b, plan.dw
    win, lanes, pitch = dw.win, dw.lanes, plan.pitch
    sh, (h, wd), pt = dw.phases[0], win.size, win.pads_begin[0]
    i0, i1 = phase_range(phase, sh, pt, h, win.required[0])
    p = b.sdiv(b.sub(r, _c(phase)), _c(sh))
    zero = ir.Constant(vec, [0.0] * lanes)
    inside = b.and_(b.icmp_signed(">=", p, _c(i0)), b.icmp_signed("<", p, _c(i1)))
    with b.if_else(inside) as (computed, padding):
        with computed:
            x, w_e, b_e = k.inputs[X], k.inputs[W_E], k.inputs[B_E] if len(k.inputs) > B_E else None
            x_row = b.gep(b.bitcast(x.ptr, F32.as_pointer()), [b.mul(b.sub(r, _c(pt)), _c(wd))], inbounds=True)
            w_rows = [b.gep(b.bitcast(w_e.ptr, F32.as_pointer()), [b.mul(b.add(c0, _c(j)), _c(plan.k))], inbounds=True)
                      for j in range(plan.block)]
            first = [splat(b, b_e.load([b.add(c0, _c(j))]), vec) if b_e is not None else zero for j in range(plan.block)]
            mask_last = dw.used_columns % lanes

            def update(kk: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
                row = b.gep(x_row, [b.mul(kk, _c(h * wd))], inbounds=True)
                xs = []
                for q in range(plan.vectors):
                    ptr = b.bitcast(b.gep(row, [_c(q * lanes)], inbounds=True), vec.as_pointer())
                    if q == plan.vectors - 1 and mask_last:
                        load, mask = masked_intrinsic(b, "load", vec, [u < mask_last for u in range(lanes)])
                        xs.append(b.call(load, [ptr, ir.Constant(ir.IntType(32), 4), mask, zero]))
                    else:
                        xs.append(b.load(ptr, align=4))
                out = []
                for j in range(plan.block):
                    wv = splat(b, b.load(b.gep(w_rows[j], [kk], inbounds=True)), vec)
                    out.extend(b.call(fma, [wv, xs[q], accs[j * plan.vectors + q]]) for q in range(plan.vectors))
                return out

            accs = _reduction(b, plan.k, [v for v in first for _ in range(plan.vectors)], update)
            for j, work in enumerate(works):
                vectors = accs[j * plan.vectors:(j + 1) * plan.vectors]
                if expansion is not None:
                    vectors = [expansion.apply(b, v, None) for v in vectors]
                copy_row_vectors(b, dw, None, _ring_row(b, plan, work, p, phase), vectors)
        with padding:  # the whole rows, from their aligned starts (and the next rows' padding columns)
            for work in works:
                for pc, row in enumerate(_ring_row(b, plan, work, p, phase)):
                    for d in range(plan.lead(pc), plan.lead(pc) + pitch, lanes):
                        b.store(zero, b.bitcast(b.gep(row, [_c(d)], inbounds=True), vec.as_pointer()), align=4 * lanes)


def _reduction(b: ir.IRBuilder, trip: int, init: list[ir.Value],
               update: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """``for (k = 0; k < trip; ++k) v = update(k, v)`` from ``v = init`` (``trip ≥ 1``), the
    values carried by phis; returns the last ``v``."""
    entry = b.block
    body = b.append_basic_block("dwp.k")
    done = b.append_basic_block("dwp.k.done")
    b.branch(body)
    b.position_at_end(body)
    kk = b.phi(I64, "dwp.kk")
    kk.add_incoming(_c(0), entry)
    phis = [b.phi(v.type) for v in init]
    for phi, v in zip(phis, init):
        phi.add_incoming(v, entry)
    new = update(kk, phis)
    following = b.add(kk, _c(1), flags=["nuw", "nsw"])
    latch = b.block
    kk.add_incoming(following, latch)
    for phi, v in zip(phis, new):
        phi.add_incoming(v, latch)
    b.cbranch(b.icmp_signed("<", following, _c(trip)), body, done)
    b.position_at_end(done)
    return new


def _output_row(k: KernelBuilder, plan: ProductPlan, fma: ir.Function, vec: ir.VectorType,
                output: packed.RegisterEpilogue | None, c: ir.Value, work: ir.Value, oh: ir.Value) -> None:
    """Output row ``oh`` of channel ``c`` from its ring, stored from registers: the taps of
    kernel row ``i`` read ring slot ``(oh + ⌊i·dh/sh⌋) mod M``."""
    b, dw = k.b, plan.dw
    (kh, kw), (oh_n, ow_n) = dw.win.kernel, dw.win.out
    (sh, _), dh = dw.phases, dw.win.dilations[0]
    taps = [(i, j, plan.tap_offset(i, j)) for i in range(kh) for j in range(kw)]
    bias = k.inputs[B_D] if len(k.inputs) > B_D else None
    weights, start = tap_weights(b, k.inputs[W_D], bias, c, taps, kw, vec)
    rows = [b.gep(work, [b.mul(b.urem(b.add(oh, _c(i * dh // sh)), _c(plan.ring)), _c(plan.pitch))], inbounds=True)
            for i in range(kh)]
    y_row = b.gep(b.bitcast(k.outputs[0].ptr, F32.as_pointer()), [b.add(b.mul(c, _c(oh_n * ow_n)), b.mul(oh, _c(ow_n)))],
                  inbounds=True)
    for d in range(0, dw.acc_floats, dw.lanes):
        s = start
        for i in range(kh):  # one kernel row at a time, from its slot
            s = step(b, rows[i], _c(d), taps[i * kw:(i + 1) * kw], weights[i * kw:(i + 1) * kw], s, fma, vec)
        if output is not None:
            s = output.apply(b, s, None)
        store_lanes(b, s, b.bitcast(b.gep(y_row, [_c(d)], inbounds=True), vec.as_pointer()), ow_n - d)


__all__ = ["DEPTHWISE_PRODUCT_OP", "DepthwiseProduct", "ProductPlan", "chains_fit", "product_plan"]
