"""Convolution (ONNX Conv, NCHW, 1-3 spatial dimensions) and the sliding-window geometry it
shares with the pooling kernels (:mod:`polyml.kernels.pool`).

A convolution lowers to a few affine nests:

1. ``y[n, m, o] = b[m]`` (or 0) — the init nest;
2. a copy of the input into a temp buffer, only where needed:

   * stride 1 along the width, windows leaving the input: ``xpad = 0`` then
     ``xpad[n, c, p + pb] = x[n, c, p]``;
   * stride ``s > 1`` along the width: the padded input split into column phases,
     ``xph[n, c, r, ph, q] = xpad[n, c, r, q*s + ph]``, so that every tap reads a contiguous
     run of columns (see :func:`_phase_split`);

3. ``y[n, g*Mg + m, o] += xpad[n, g*Cg + c, o*s + j*d] * w[g*Mg + m, c, j]`` — the accumulation
   over ``{[n, g, m, c, j, o]}``, with the group in its own loop so that every subscript is an
   affine function of the loop counters, register-blocked (see :func:`_accumulate`).
   A 1x1 stride-1 unpadded convolution is accumulated over one flattened spatial dimension.

Performance notes (2-core AVX-512 host, 1x64x56x56 input): the accumulation keeps a block of
8 output channels x 32 output columns in registers across the whole reduction, which LLVM
promotes out of the reduction loops and SLP-vectorizes; a 3x3 64->64 convolution went from
6.8 ms (plain ``n, g, m, c, kh, kw, oh, ow`` nest) to 1.4 ms, a 1x1 64->256 one from 5.1 ms to
0.75 ms.  The policy is ``off``: at the pipeline position polyml runs Polly, the blocked nests
are not SCoPs any more (LICM has turned the accumulators into registers), so ``polly`` and
``tile`` measured the same as ``off``; with ``-polly-position=early`` Polly's code generation
undoes the register blocking (3x3: 32 ms with ``polly``, 1x1: 27 ms with ``tile``).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import gemm as packed
from polyml.codegen.builder import Buffer, KernelBuilder, pointer_type
from polyml.codegen.gemm_rows import RowsSpec
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, _window, register
from polyml.kernels._window import (
    VECTOR_LANES,
    Window,
    _isa,
    affine,
    auto_pad_of,
    conv_window,
    copy_parallel,
    make_window,
    nest,
    padded_source,
    register_epilogue,
    view,
)
from polyml.kernels.depthwise import DepthwisePlan, convolve_depthwise, depthwise_plan
from polyml.kernels.fused import epilogue, evaluate_chain
from polyml.kernels.winograd import convolve_winograd, transform_weights, winograd_plan
from polyml.options import CodegenConfig
from polyml.schedule import conv as scheduled_conv
from polyml.schedule import depthwise as scheduled_depthwise
from polyml.schedule import exchange as schedule_exchange
from polyml.schedule import gemm as scheduled_gemm
from polyml.schedule import layout
from polyml.schedule import tree as schedule_tree
from polyml.schedule.codegen import Emitter
from polyml.schedule.intrinsics import DepthwisePhaseCopy, DepthwiseTile, FmaTile
from polyml.schedule.nest import Program

#: fused multiply-add allowed, but no reassociation: the loop vectorizer must not turn the
#: reduction loops into vector reductions (SLP vectorizes across output columns instead).
CONTRACT = ("contract",)
#: register blocks of the accumulation, by the host's vector ISA: ``(channels, columns)`` per
#: statement (columns widen up to MAX_BLOCK_W when a group has fewer channels, as in depthwise
#: convolutions, keeping channels*columns accumulators).  AVX-512: 8 x 32 floats are 16 zmm
#: accumulators of 32 registers; AVX2: 4 x 16 are 8 of 16 ymm; otherwise 4 x 8 (SSE / NEON).
BLOCKS = {"avx512": (8, 32), "avx": (4, 16), "other": (4, 8)}
MAX_BLOCK_W = 128
#: the widest vectors SLP may use in Conv's function: 512-bit halves the FMA count where the
#: CPU has AVX-512 (LLVM's tuning prefers 256 there by default) and changes nothing elsewhere
PREFER_VECTOR_WIDTH = "512"


# -- Conv --------------------------------------------------------------------------------------

#: ISAs on which GEMM convolutions pack their im2col columns, only stems (:data:`STEM_MAX_CHANNELS`
#: input channels) reading them in place: on AVX2 the 6x16 micro-kernel's B rows read through
#: the row table cost more than the packing (per step of whole models, 1 thread,
#: minimum of 15, packed / in place: Inception-v1 5x5/1 32->96 @27 0.42, 24->64 @13 0.43, 3x3/1
#: 96->208 @13 0.79, 160->320 @6 0.99; ResNet-50 3x3/2 128->128 @56 0.74, 512->512 @14 0.90,
#: 3x3/1 512->512 @7 0.92-0.95; SqueezeNet 3x3/1 64->256 @13 0.83; but SqueezeNet's 3x3/2
#: 3->64 stem in place 1.12x faster than direct).  AVX-512 hosts pack too: with the packing's
#: row-unrolled A and prefetched B, packing beats reading in place (docs/PERFORMANCE.md "The
#: GEMM reads im2col rows in place") on every such layer (Sapphire Rapids class host, per step of whole models, minimum of 12,
#: packed / in place, 1 thread: ResNet-50 3x3/2 128->128 @56 0.69, Inception-v1 3x3/1 192->384
#: @6 0.75, 160->320 @6 0.86, 5x5/1 32->96 @27 0.94, ZFNet 5x5/2 96->256 @54 0.95; 2 threads
#: 0.69, 0.89, 0.91, 0.91, 0.87)
PACKED_IM2COL_ISAS = ("avx", "avx512")


def reads_in_place(config: CodegenConfig, win: Window, kk: int) -> bool:
    """Whether a GEMM convolution reads its im2col rows in place from stride-phase planes
    (``gemm_inplace``) rather than packing them into panels.  Never for unpadded 1x1 windows
    (no element is read by two taps: packing the subsampled columns is one pass either way);
    else as :data:`PACKED_IM2COL_ISAS` says, or ``config.conv_inplace`` (``1``: always, ``0``:
    never; ``POLYML_CONV_INPLACE``, for A/B measurements and tests)."""
    if _unpadded_1x1(win):
        return False
    forced = config.conv_inplace
    if forced in ("0", "1"):
        return forced == "1"
    return _window._isa() not in PACKED_IM2COL_ISAS or kk // math.prod(win.kernel) <= STEM_MAX_CHANNELS


#: :meth:`PhasePlanes.fill` runs parallel over the planes' rows below this many channels, else
#: over the channels (per step of whole models, minimum of 20-30, rows /
#: channels: the stems 3x3/2 3->64 (SqueezeNet) 0.83-0.92 at 2 threads and 0.94 at 1, 3x3/2
#: 3->32 (MobileNetV2) 0.76 and 0.85, 7x7/2 3->64 (ResNet-50) 0.93 at 2; SqueezeNet's 3x3
#: 64->256 @13 ``rows`` steps, whose 64 channels split evenly, 1.03-1.06 by rows)
FILL_BY_ROWS_BELOW_CHANNELS = 8


@dataclass(frozen=True)
class PhasePlanes:
    """x copied into stride-phase planes for the in-place GEMM (2-D, one image):
    ``src[c][ph][pw][qh][qw] = xpad[c][qh·sh + ph][qw·sw + pw]`` (0 in the padding).

    Tap ``(kh, kw)`` of output ``(oh, ow)`` reads padded ``(oh·sh + kh·dh, ow·sw + kw·dw)``,
    i.e. phase ``((kh·dh) % sh, (kw·dw) % sw)`` at ``(oh + kh·dh // sh, ow + kw·dw // sw)``.
    With the output rows laid on the planes' row pitch ``qw`` (pitch space, ``j = oh·qw +
    ow``), im2col row ``p = (c, kh, kw)`` is the contiguous run ``src[offsets[p] + j]``: the
    affine access ``j ↦ j + offset`` the GEMM's micro-kernel loads vectors from directly.
    Stride 1 makes this the plain padded copy.  ``qw - ow`` columns per row are computed and
    dropped (1-2 for 3x3).  ``row_align``: ``qw`` rounded up to a multiple of it, so that
    with the register tile's width every tile lies inside one output row or in its padding
    (:func:`row_align`)."""

    channels: int
    win: Window
    nr: int
    row_align: int = 1

    def _shift(self, d: int) -> int:
        w = self.win
        return (w.kernel[d] - 1) * w.dilations[d] // w.strides[d]

    @property
    def qh(self) -> int:
        return self.win.out[0] + self._shift(0)

    @property
    def qw(self) -> int:
        return -(-(self.win.out[1] + self._shift(1)) // self.row_align) * self.row_align

    @property
    def columns(self) -> int:
        """Pitch-space columns of the output: ``(oh - 1)·qw + ow``."""
        return (self.win.out[0] - 1) * self.qw + self.win.out[1]

    @property
    def offsets(self) -> tuple[int, ...]:
        (kh_, kw_), (sh, sw), (dh, dw) = self.win.kernel, self.win.strides, self.win.dilations
        plane = self.qh * self.qw
        return tuple(((c * sh + (y * dh) % sh) * sw + (x * dw) % sw) * plane + (y * dh // sh) * self.qw + x * dw // sw
                     for c in range(self.channels) for y in range(kh_) for x in range(kw_))

    @property
    def size(self) -> int:
        """Floats of the copy, with room for the last panel's columns past the end (read,
        never stored)."""
        sh, sw = self.win.strides
        reach = max(self.offsets) + -(-self.columns // self.nr) * self.nr
        return max(self.channels * sh * sw * self.qh * self.qw, reach)

    def fill(self, k: KernelBuilder, x: Buffer, temp: Buffer) -> Buffer:
        """Fill the copy from ``x`` (1, C, H, W) in one loop over the channels and the planes'
        rows, the outer one parallel: the rows below :data:`FILL_BY_ROWS_BELOW_CHANNELS`
        channels (a stem's three channels split unevenly over two threads), else the channels.
        Per phase plane, a row no input row lands on is zeroed, the others copied with zeros at
        their ends; the run-out past the planes zeroed once.  Returns the copy as a flat buffer."""
        (sh, sw), (h, w), (pt, pl) = self.win.strides, self.win.size, self.win.pads_begin
        c, qh, qw = self.channels, self.qh, self.qw
        flat = view(k, temp, (self.size,), "planes_flat")
        body = c * sh * sw * qh * qw
        if self.size > body:
            with nest(k, [(body, self.size)], ["pz"]) as (z,):
                flat.store([z], k.f32(0.0))
        shape = TensorType((c, sh, sw, qh, qw))  # a prefix of the copy (the rest: run-out)
        planes = Buffer(k, k.b.bitcast(temp.ptr, pointer_type(shape)), shape, "planes")
        zero = k.f32(0.0)

        def zeros(ci: ir.Value | int, ph: int, pw: int, r: ir.Value | int, lo: int, hi: int) -> None:
            if hi > lo:
                with nest(k, [(lo, hi)], ["zq"]) as (q,):
                    planes.store([ci, ph, pw, r, q], zero)

        def copy_row(ci: ir.Value | int, ph: int, pw: int, r: ir.Value | int, c0: int, c1: int) -> None:
            """Row ``r`` of plane ``(ci, ph, pw)``: input columns ``c0 ≤ q < c1``, zeros around."""
            zeros(ci, ph, pw, r, 0, c0)
            if c1 > c0:
                with nest(k, [(c0, c1)], ["pq"]) as (q,):
                    v = x.load([0, ci, affine(k, [(sh, r)], ph - pt), affine(k, [(sw, q)], pw - pl)])
                    planes.store([ci, ph, pw, r, q], v)
            zeros(ci, ph, pw, r, c1, qw)

        parallel = 1 if copy_parallel([1, c, sh * sw * qh * qw]) else 0
        by_rows = c < FILL_BY_ROWS_BELOW_CHANNELS
        with nest(k, [qh, c] if by_rows else [c, qh], ["pr", "pc"] if by_rows else ["pc", "pr"], parallel) as ivs:
            r, ci = ivs if by_rows else ivs[::-1]
            for ph in range(sh):
                for pw in range(sw):
                    # q·s + ph - pad inside [0, size): q in [ceil((pad - ph)/s), floor((size - 1 + pad - ph)/s)]
                    r0 = min(qh, max(0, -((ph - pt) // sh)))
                    r1 = max(r0, min(qh, (h - 1 + pt - ph) // sh + 1))
                    c0 = min(qw, max(0, -((pw - pl) // sw)))
                    c1 = max(c0, min(qw, (w - 1 + pl - pw) // sw + 1))

                    if isinstance(r, int) or (r0 == 0 and r1 == qh):
                        if isinstance(r, int) and not r0 <= r < r1:
                            zeros(ci, ph, pw, r, 0, qw)
                        else:
                            copy_row(ci, ph, pw, r, c0, c1)
                        continue
                    inside = k.b.and_(k.b.icmp_signed(">=", r, ir.Constant(r.type, r0)),
                                      k.b.icmp_signed("<", r, ir.Constant(r.type, r1)))
                    with k.b.if_else(inside) as (then, otherwise):
                        with then:
                            copy_row(ci, ph, pw, r, c0, c1)
                        with otherwise:
                            zeros(ci, ph, pw, r, 0, qw)
        return flat



def row_align(win: Window, nr: int) -> int:
    """The phase planes' row alignment for the in-place GEMM: ``nr`` where ``nr`` divides the
    output width (MobileNet's and ResNet's stems: 112 columns), so that every ``nr``-wide tile
    of pitch space lies inside one output row, stored straight into C, or wholly in the row's
    padding, skipped; else 1 (the natural pitch: a wider one would add partial tiles, not remove
    them).  On the natural pitch (113 for a 3x3/2 @224) one tile in seven straddles two rows and
    goes through the stack tile and the remap.  Rows of at least
    :data:`~polyml.codegen.gemm.IN_PLACE_TAIL_MIN_TILES` tiles align to ``nr`` too: each row
    then ends in a partial tile whose kernel stores only the row's columns into C
    (:func:`polyml.codegen.gemm.in_place_tail`)."""
    from polyml.codegen.gemm import IN_PLACE_TAIL, IN_PLACE_TAIL_MIN_TILES

    if win.out[1] % nr == 0 or (IN_PLACE_TAIL and win.out[1] >= IN_PLACE_TAIL_MIN_TILES * nr):
        return nr
    return 1


@dataclass(frozen=True)
class _Plan:
    """How a Conv node is lowered (a pure function of its types and attributes).

    ``pointwise``: 1x1 kernel, no padding: one flat spatial dimension (strided: over a
    compact subsampled copy).  ``phase``: stride > 1 along the width: a phase-split copy.
    ``flat``: stride 1 along height and width and an output width that fills the register
    blocks badly (7, 14, 28 columns): the output is computed on the (padded) input's row pitch,
    one long row per plane, into ``out_temp`` (a few junk columns per row), then cropped.
    ``direct``: the rest.  ``gemm``: the packed GEMM on the im2col matrix packed on the fly
    (grouped: one product per group, batched over the groups; a polyhedral view: the group
    loop is split out of the output-channel and reduction loops and made the outer parallel
    dimension of the products);
    ``gemm_inplace``: the packed GEMM reading the im2col rows in place from a stride-phase copy
    of x (:class:`PhasePlanes`, scratch in ``src_temp``).  ``rows``: output rows as register
    tiles on 7-14-wide maps (:mod:`polyml.codegen.gemm_rows`; x itself or its phase copy).
    ``depthwise`` and ``winograd``: :mod:`polyml.kernels.depthwise` and
    :mod:`polyml.kernels.winograd` (their scratch in ``src_temp``).
    """

    mode: str
    win: Window
    src_temp: TensorType | None = None
    out_temp: TensorType | None = None
    #: ``gemm_inplace``, ``rows``: the stride-phase copy of x the product reads (:class:`PhasePlanes`)
    planes: PhasePlanes | None = None

    @property
    def temps(self) -> list[TensorType]:
        extra = [TensorType((self.planes.size,))] if self.planes is not None else []
        return [t for t in (self.src_temp, self.out_temp) if t is not None] + extra

    @property
    def pitch(self) -> int:
        """Row pitch of the source in ``flat`` mode."""
        return self.win.required[-1] if self.src_temp is not None else self.win.size[-1]


def _plan(config: CodegenConfig, node: Node, x: TensorType, w: TensorType, constant_w: bool = False) -> _Plan:
    win = conv_window(node, x, w)
    lead = x.shape[:2]
    shape = nest_shape(node, x, w, win)
    if config.schedule and config.plain_nests and (shape or depthwise_shape(node, x, w, win)) is not None:
        return _Plan("plain", win)  # --no-schedule: the plain nest
    dw = depthwise_plan(config, node, x, w, win)
    if dw is not None:  # per plane on a phase-split copy (kernels/depthwise.py)
        shape = depthwise_shape(node, x, w, win) if config.schedule else None
        if shape is not None and config.schedule_tiles:  # imported tiles may need more than the hand plan's
            floats = max(dw.scratch.size, *(scheduled_depthwise_plan(config, shape, dw, par).scratch_floats
                                           for par in (True, False)))
            return _Plan("depthwise", win, TensorType((floats,)))
        return _Plan("depthwise", win, dw.scratch)
    wg = winograd_plan(config, node, x, w, win) if constant_w else None
    if wg is not None:  # 3x3/1 with weights transformed at compile time (kernels/winograd.py)
        return _Plan("winograd", win, wg.scratch)
    rows = rows_plan(config, node, x, w, win) if constant_w else None
    if rows is not None:  # output rows as register tiles (polyml/codegen/gemm_rows.py)
        return rows
    scratch = _gemm_scratch(config, node, x, w, win)
    if scratch is not None:
        m, _, kk = _gemm_spec_dims(x, w, win)
        if int(node.attrs.get("group", 1)) == 1 and reads_in_place(config, win, kk):
            from polyml.kernels.matmul import packed_temps

            nr = packed.blocking_for_host(config.gemm_blocking).nr
            planes = PhasePlanes(x.shape[1], win, nr, row_align(win, nr))
            return _Plan("gemm_inplace", win, packed_temps(config, m, planes.columns, kk)[0], planes=planes)
        # (a folded input scale on a 1x1 window: the packed GEMM scales x as it packs B)
        plans = [scheduled_plan(config, shape, par) for par in (True, False)] if constant_w and shape else [None]
        if plans[0] is not None and not ("input_scale" in node.attrs and win.pointwise):
            return _Plan("schedule", win, TensorType((max(p.scratch_floats for p in plans),)))
        return _Plan("gemm", win, scratch)
    if _unpadded_1x1(win):
        sub = None if all(s == 1 for s in win.strides) else TensorType((*lead, *win.out))
        return _Plan("pointwise", win, sub)
    if win.strides[-1] > 1:
        s = win.strides[-1]
        return _Plan("phase", win, TensorType((*lead, *win.required[:-1], s, -(-win.required[-1] // s))))
    src = TensorType(win.padded_shape(lead)) if win.needs_copy() else None
    bm, bw = BLOCKS[_window._isa()]
    mg = w.shape[0] // int(node.attrs.get("group", 1))
    if win.rank >= 2 and win.strides[-2] == 1 and mg >= bm:
        plan = _Plan("flat", win, src)
        rows = (win.out[-2] - 1) * plan.pitch + win.out[-1]
        if _vector_ops(rows, bw) < 0.9 * win.out[-2] * _vector_ops(win.out[-1], bw):
            return _Plan("flat", win, src, TensorType((x.shape[0], w.shape[0], *win.out[:-2], rows)))
    return _Plan("direct", win, src)


def nest_shape(node: Node, x: TensorType, w: TensorType, win: Window) -> scheduled_conv.Shape | None:
    """The convolution as the schedule layer's nest (:mod:`polyml.schedule.conv`), or None
    where it is not one: a batch, groups, other than two spatial dimensions."""
    if x.shape[0] != 1 or win.rank != 2 or int(node.attrs.get("group", 1)) != 1:
        return None
    return scheduled_conv.Shape(x.shape[1], w.shape[0], win.size, win.kernel, win.strides, win.dilations,
                                win.pads_begin, win.out)


def depthwise_shape(node: Node, x: TensorType, w: TensorType, win: Window) -> scheduled_depthwise.Shape | None:
    """The depthwise convolution as the schedule layer's nest (:mod:`polyml.schedule.depthwise`),
    or None where it is not one: a batch, other than two spatial dimensions, not depthwise."""
    group = int(node.attrs.get("group", 1))
    if x.shape[0] != 1 or win.rank != 2 or group == 1 or group != x.shape[1] or w.shape[0] != group or w.shape[1] != 1:
        return None
    return scheduled_depthwise.Shape(group, win.size, win.kernel, win.strides, win.dilations, win.pads_begin, win.out)


def scheduled_plan(config: CodegenConfig, shape: scheduled_conv.Shape, parallel: bool = True
                   ) -> scheduled_gemm.Plan | None:
    """The GEMM schedule's sizes for the convolution's product (weights as the constant A,
    reduction blocks of whole input channels: :func:`polyml.kernels.matmul.scheduled_plan`),
    or None where the packed GEMM would not run it (``--gemm packed``, too small, fewer
    output channels than a register tile)."""
    from polyml.kernels.matmul import scheduled_plan as product_plan

    return product_plan(config, shape.m, shape.n, shape.k, False, parallel, a_constant=True, kc_step=shape.taps)


#: small-map convolutions may run with output rows as register tiles (False: never)
ROWS = True


def rows_enabled() -> bool:
    """Whether small-map convolutions may run with output rows as register tiles (``rows``)."""
    return ROWS


#: ``rows`` mode: output widths (positions per register tile) ...
ROWS_WIDTHS = range(7, 15)
#: ... and at least this many output channels (one tile of columns); 1x1 convolutions only
#: with whole 32-channel panels and a reduction of this many times the output channels (the
#: tile's transposing store is per element: with a short reduction it costs more than the
#: columns the other paths pad).  Single layers with ReLU6, 2 threads,
#: minimum of 15 blocks, rows / the other paths: 3x3 512->512 @7 0.75, 64->256 @13 0.68, 128->32 @7
#: 0.66, 3x3/2 256->256 @14 0.74; 1x1 2048->512 @7 0.89, 960->160 @7 0.86, 512->128 @7 0.77,
#: 576->96 @14 0.88, 1024->256 @14 0.95, but 512->2048 @7 1.08, 96->576 @14 1.17, 112->672 @14
#: 1.24, 384->48 @13 1.07
ROWS_MIN_CHANNELS = 32
ROWS_POINTWISE_K_PER_CHANNEL = 2


def rows_plan(config: CodegenConfig, node: Node, x: TensorType, w: TensorType, win: Window) -> _Plan | None:
    """The ``rows`` plan (:mod:`polyml.codegen.gemm_rows`) for a convolution with constant
    weights, or None: one group, batch 1, 2-D, a host build with the packed GEMM, ``conv=auto``,
    an AVX-512 host, an output width in :data:`ROWS_WIDTHS` (unstrided 1x1 convolutions to at
    most :data:`FLAT_ROWS_MAX_CHANNELS` channels: any map of at most
    :data:`FLAT_ROWS_MAX_POSITIONS` positions that :func:`flat_rows_width`
    cuts into such rows) and :data:`ROWS_MIN_CHANNELS` channels.  Unstrided, unpadded 1x1
    convolutions read x itself, the rest a phase copy."""
    if (win.rank != 2 or x.shape[0] != 1 or int(node.attrs.get("group", 1)) != 1 or not rows_enabled()
            or not config.packed or config.conv != "auto"):
        return None
    blk = packed.blocking_for_host(config.gemm_blocking)
    if blk.nr != 32 or blk.width != 16 or w.shape[0] < ROWS_MIN_CHANNELS:
        return None
    if win.out[1] not in ROWS_WIDTHS and not (win.pointwise and w.shape[0] <= FLAT_ROWS_MAX_CHANNELS
                                              and math.prod(win.out) <= FLAT_ROWS_MAX_POSITIONS
                                              and flat_rows_width(win)):
        return None
    m, kk = w.shape[0], math.prod(w.shape[1:])
    if math.prod(win.kernel) == 1 and (kk < ROWS_POINTWISE_K_PER_CHANNEL * m or m % 32):
        return None
    return _Plan("rows", win, planes=None if win.pointwise else PhasePlanes(x.shape[1], win, 1))


#: unstrided 1x1 convolutions on wider maps take the ``rows`` tiles up to this many output
#: channels (one 32-channel panel, so x is streamed once): per step of whole
#: models at 2 threads, minimum of 12, rows / GEMM: MobileNetV2's 144->32 and 192->32 @28
#: 0.78-0.83, but ResNet-50's 256->64 and 256->128 @56 1.41-1.55, 512->128 and 512->256 @28
#: 1.26-1.32 (each panel streams all of x again, from L3 on these maps); MobileNetV2 0.98-0.99
#: at 2 threads (0: none) ...
FLAT_ROWS_MAX_CHANNELS = 32
#: ... on maps of at most this many positions: since the GEMM packs a thin A's B in L1-sized
#: blocks (:data:`polyml.codegen.gemm.THIN_A_ROWS`) it ties or wins on 27x27 and 28x28 maps
#: (per step of whole models, minimum of 20, GEMM / rows: SqueezeNet's
#: 128->32 and 256->32 @27 0.72 and 0.90 at 2 threads, 0.86-0.89 and 0.98-1.00 at 1;
#: MobileNetV2's 144->32 and 192->32 @28 0.92-1.07 and 0.96-0.98; Inception-v1's 192->32 and
#: 256->32 @27 0.99-1.01 and 1.02-1.09; all seven 0.95 in sum at 2 threads, 1.00 at 1), where
#: on a 6x6 map (Inception-v1's 832->32) rows still win (GEMM / rows 1.53 and 1.69)
FLAT_ROWS_MAX_POSITIONS = 256


def flat_rows_width(win: Window) -> int:
    """For an unstrided 1x1 convolution on a map wider than :data:`ROWS_WIDTHS`: the widest
    tile row in that range dividing the map's positions (0: none).  Without a window its
    positions are one flat run, which the ``rows`` tiles cut into rows of that width."""
    n = math.prod(win.out)
    return next((w for w in reversed(ROWS_WIDTHS) if n % w == 0), 0)


def _rows_spec(plan: _Plan, x: TensorType, w: TensorType) -> RowsSpec:
    win = plan.win
    m, _, kk = _gemm_spec_dims(x, w, win)
    if plan.planes is None:  # x itself: reduction row p = channel p
        plane = math.prod(win.size)
        offsets = tuple(c * plane for c in range(kk))
        if win.out[1] not in ROWS_WIDTHS:  # the flat run of positions in rows of flat_rows_width
            width = flat_rows_width(win)
            return RowsSpec(m, kk, offsets, plane // width, width, width)
        return RowsSpec(m, kk, offsets, win.out[0], win.out[1], win.size[1])
    return RowsSpec(m, kk, plan.planes.offsets, win.out[0], win.out[1], plan.planes.qw)


def _unpadded_1x1(win: Window) -> bool:
    """A 1x1 window inside the input, of any stride: its im2col matrix is x (subsampled), with
    no tap reading an element twice, so the GEMM packs it rather than reading phase planes."""
    return all(k == 1 for k in win.kernel) and not win.needs_copy()


def _gemm_spec_dims(x: TensorType, w: TensorType, win: Window) -> tuple[int, int, int]:
    """(M, N, K) of the convolution as a product: output channels x output positions x
    (input channels · taps)."""
    return w.shape[0], math.prod(win.out), w.shape[1] * math.prod(win.kernel)


def _gemm_scratch(config: CodegenConfig, node: Node, x: TensorType, w: TensorType, win: Window) -> TensorType | None:
    """The packing scratch when the convolution runs as a packed GEMM, else None.

    Eligible: a host lowering with the packed GEMM on, batch 1, two spatial dims, a product the
    packed GEMM takes (:func:`polyml.kernels.matmul.packed_plan`; with groups, one product per
    group: :func:`polyml.kernels.matmul.batched_plan`), and :func:`prefer_gemm` says it beats
    the register-blocked direct nests for one group's shape.
    """
    from polyml.kernels.matmul import batched_plan, batched_temps, packed_plan, packed_temps

    if x.shape[0] != 1 or win.rank != 2:
        return None
    groups = int(node.attrs.get("group", 1))
    m, n, kk = _gemm_spec_dims(x, w, win)
    mg = m // groups
    choice = config.conv
    if choice == "direct" or (choice == "auto" and not prefer_gemm(config, win, mg, kk)):
        return None
    if groups > 1:
        return batched_temps(config, groups, mg, n, kk)[0] if batched_plan(config, groups, mg, n, kk) is not None else None
    return packed_temps(config, m, n, kk)[0] if packed_plan(config, m, n, kk) is not None else None


#: the packed GEMM beats the direct nests from this many output channels on (below, the
#: direct nests' register blocks of 8 channels are as good and the GEMM's packing is spread over
#: too few output channels) ...
GEMM_MIN_CHANNELS = 32
#: ... but stems (at most this many input channels: an RGB image) run direct: their K = 3·taps
#: reduction spends the GEMM's time in the im2col packing (single layers, 1
#: thread CPU time: 3x3/2 3->64 @224 0.768 -> 0.653 ms, 7x7/2 3->64 3.98 -> 2.32, 3x3/2 3->32
#: with SiLU 0.85 -> 0.52; 2 threads, three runs each: 3x3/2 3->64 0.43-0.51 -> 0.37-0.42 ms)
STEM_MAX_CHANNELS = 4
#: ... except stems of at most this many taps (3x3) when the GEMM reads its rows in place
#: (``gemm_inplace``: no im2col packing; 2 threads, 200 runs each: 3x3/2 3->32
#: @224 (MobileNet, EfficientNet) 0.24-0.30 -> 0.19-0.20 ms, SqueezeNet's unpadded 3x3/2 3->64
#: 0.53-0.60 -> 0.33-0.45; a 7x7/2 stem stays direct: 1.21 -> 1.41-1.49).  Per ISA, None: any
#: stem; on AVX2 the direct nests' 4x16 block loses on the large ones too (single
#: layers with ReLU, 1 thread CPU time, minimum of 20, in place / direct: 7x7/2 3->64 @224
#: (ResNet-50) 0.72, 7x7/2 3->96 (ZFNet) 0.71, 11x11/4 3->96 (AlexNet) 0.77), and with the
#: in-place tiles stored straight into C and the aligned stem planes on
#: AVX-512 too (per step of whole models, minimum of 12, in place / direct,
#: 1 thread: 7x7/2 3->64 0.93-0.95 (ResNet-50, Inception-v1, DenseNet-121), 7x7/2 3->96 0.79,
#: 11x11/4 3->96 0.65; 2 threads 0.88-1.03, 0.70, 0.63)
STEM_GEMM_MAX_TAPS: dict[str, int | None] = {"avx512": None, "avx": None, "other": 9}
#: ... and so do unstrided convolutions of at most this many input channels (K = 16·9 for a
#: 3x3): the direct nests read x where it lies while the GEMM gathers each element into its
#: panel for only 16·9 multiply-adds per column (single layers with ReLU6,
#: minimum of 15 blocks: 3x3 16->64 @55 (SqueezeNet) 2 threads 0.48-0.60 -> 0.32-0.39 ms,
#: 1 thread 0.76 -> 0.59; 3x3 16->16 @56 1 thread 0.39 -> 0.15.  Strided ones are mixed:
#: 3x3/2 16->64 @56 0.15 -> 0.24, 16->32 @112 0.33 -> 0.26; 24 channels tie)
THIN_MAX_CHANNELS = 16
#: ... but on AVX-512 from this many output channels they take the GEMM (its im2col packed,
#: :data:`PACKED_IM2COL_ISAS`): per step of SqueezeNet, GEMM / direct, 3x3 16->64 @55 0.94-0.95 at 1
#: thread and 0.74-0.78 at 2 (the whole model 0.99 / 0.94-0.95), where Inception-v1's 5x5
#: 16->32 @27 lost (1.28 / 1.05).  Per ISA, None: never (AVX2 not measured)
THIN_GEMM_MIN_CHANNELS: dict[str, int | None] = {"avx512": 64, "avx": None, "other": None}


@dataclass(frozen=True)
class PointwiseRule:
    """When 1x1 convolutions without padding leave the direct nests for the packed GEMM, on
    one ISA: unstrided ones (x itself is the B matrix, nothing to gather) from ``min_channels``
    output channels on maps of at least ``min_positions`` positions (below ``thin_channels``
    output channels, of at least ``thin_min_positions``, and in a one-thread build with a
    reduction over at least ``thin_serial_min_k`` input channels); strided ones (ResNet's
    downsampling shortcuts) on output maps of at least ``strided_min_positions`` positions
    (None: never; the GEMM then packs the subsampled columns, the direct nests read a compact
    subsampled copy)."""

    min_channels: int
    min_positions: int
    strided_min_positions: int | None
    thin_channels: int = 0
    thin_min_positions: int = 0
    thin_serial_min_k: int = 0

    def takes_gemm(self, channels: int, positions: int, k: int, threaded: bool) -> bool:
        """Whether an unstrided 1x1 convolution from ``k`` to ``channels`` channels on
        ``positions`` positions takes the GEMM (in a build for more than one thread if ``threaded``)."""
        if channels < self.thin_channels:
            return (channels >= self.min_channels and positions >= self.thin_min_positions
                    and (threaded or k >= self.thin_serial_min_k))
        return channels >= self.min_channels and positions >= self.min_positions


#: AVX-512: two register tiles of rows (24 channels) on maps of a register tile of columns
#: (32 positions) or more, and 16 channels on maps of 512 positions (the
#: 16-channel projections after a concatenation or a depthwise layer, per step of whole models
#: at 2 threads, minimum of 20, GEMM / direct: SqueezeNet's 64->16 @55 0.43 and 128->16 @55
#: 0.37, MobileNetV2's 32->16 @112 0.60, EfficientNet-B0's 0.44, Inception-v1's 192->16 @27
#: 0.59; whole models 0.95, 0.98, 0.99, 1.00: the direct nests' 8-channel blocks stream all of
#: x once per block, 128 rows at a time, where the GEMM packs it once; but 480->16 @13, whose
#: x fits L2, 2.4).  One thread: only from 128 input channels (SqueezeNet's 128->16 @55 0.90,
#: its 64->16 @55 1.24, MobileNetV2's 32->16 @112 1.12).  Maps of up to 196 positions (14x14, 13x13,
#: 7x7) take the GEMM too: a GEMM padding 196 positions to 224 and 49 to 64 lost to the direct
#: nests there (single
#: layers, 2 threads: 1024->256 @14 0.60-0.63 -> 0.53 ms, 320->1280 @7 0.28 -> 0.25), but with
#: the GEMM's narrow and short edge kernels it beats them inside the models
#: (Sapphire Rapids class host, whole models alternated in one process,
#: GEMM / direct: ResNet-50 0.96-0.97 at 1 thread (its 256->1024 @14 steps 0.76-0.87,
#: 512->2048 @7 0.74-0.99), 0.97 at 2; MobileNetV2 0.92-0.95 at 1 and 2 threads; SqueezeNet
#: 0.97-0.99 at 1 (its 13x13 steps 0.79-0.91); EfficientNet-B0 0.98-0.99; Inception-v2 and
#: DenseNet-121 1.00).  1x1 maps (squeeze-excitation) stay direct, as on AVX2.  Strided ones
#: take the GEMM on outputs of 128 positions or more (:func:`prefer_gemm`
#: has the figures), 7x7 outputs stay direct.  AVX2 (no AVX-512): the direct nests' register block is
#: 4 channels x 16 columns against the GEMM's 6x16 tile, and the GEMM wins everywhere from 16
#: channels (single layers with ReLU/ReLU6, 1 thread CPU time, minimum of 30,
#: GEMM / direct: 1024->256 @14 0.29, 2048->512 @7 0.37, 512->2048 @7 0.34, 64->384 @14 0.44,
#: 960->160 @7 0.49, 48->192 @13 0.59, 384->48 @13 0.66, 32->16 @112 0.61, 96->16 @55 0.76,
#: 96->24 @56 0.90; strided 1x1/2 packed: 1024->2048 @14 0.48, 512->1024 @28 0.48, 256->512
#: @56 0.47, the GEMM on stride-phase planes 0.54-0.57), on maps of a register tile of columns
#: (16) or more: below, the GEMM pads the columns to 16 (squeeze-excitation
#: products on 1x1 maps, 1 thread CPU time, minimum of 60, direct / GEMM: 1152->48 0.60, 48->1152
#: 0.46).  Hosts without AVX: AVX-512's rule (not measured)
POINTWISE_GEMM = {"avx512": PointwiseRule(16, 32, 128, 24, 512, 128), "avx": PointwiseRule(16, 16, 0),
                  "other": PointwiseRule(16, 32, 128, 24, 512, 128)}


def prefer_gemm(config: CodegenConfig, win: Window, m: int, kk: int) -> bool:
    """Whether the packed GEMM (im2col packed on the fly) beats the direct nests for this shape.

    Measured per shape, 2 threads (``scripts/bench_conv.py --repeat 30 --block 31`` and single
    conv+bias+relu models run back to back; table in docs/PERFORMANCE.md, "Convolution: direct
    or packed GEMM"): every ResNet-50 layer but the stem is 1.02-3.6x faster as GEMM (strided
    3x3 1.7-3.6x, wide-K 1x1 1.7-2.3x, 3x3/1 1.05-1.5x); stems over 3 input channels 1.2-2.3x
    (squeezenet 3x3/2 to 64, zfnet 7x7/2 and AlexNet 11x11/4 to 96) except ResNet-50's 7x7/2
    to 64 (0.89x, taken anyway: 0.1 ms); 1x1 64->64 even; below 32 output channels the direct
    nests win or tie (3x3 16->16 0.94x, 1x1 128->16 0.79x) but for unstrided 1x1 from 24
    channels (144->24, 96->24, 16->96: 1.3-2.1x; 32->16 0.87x).  Re-measured since: stems of
    :data:`STEM_MAX_CHANNELS` input channels are faster direct (the packing of their short
    reduction dominates; 3x3 stems are not when read in place, :data:`STEM_GEMM_MAX_TAPS`), and
    so are unstrided ones of :data:`THIN_MAX_CHANNELS` (on AVX-512 below
    :data:`THIN_GEMM_MIN_CHANNELS` output channels).
    """
    rule = POINTWISE_GEMM[_window._isa()]
    if win.pointwise:
        return rule.takes_gemm(m, math.prod(win.out), kk, config.threaded)
    if _unpadded_1x1(win):
        # strided 1x1 without padding (ResNet's downsampling shortcuts): the GEMM packing the
        # subsampled columns, or the pointwise nests on a compact subsampled copy.  On AVX-512
        # the nests beat a GEMM on stride-phase planes, which pads
        # each short row of pitch-space columns to whole panels (single layers with ReLU, 1
        # thread: 1x1/2 1024->2048 @14 2.63 -> 2.22 ms, 512->1024 @28 2.28 -> 2.00, 256->512 @56
        # 2.23 -> 2.08); the packed columns (as on AVX2) win on 14x14 and 28x28
        # outputs (ResNet-50's steps, minimum of 10-12, GEMM / nests: 1
        # thread 512->1024 @28 0.82, 256->512 @56 0.90; 2 threads 0.90, 0.83) and lose on 7x7
        # ones (1024->2048 @14 1.14 at 1 and 2 threads: 49 positions in two panels)
        least = rule.strided_min_positions
        return least is not None and m >= rule.min_channels and math.prod(win.out) >= least
    channels = kk // math.prod(win.kernel)
    if channels <= STEM_MAX_CHANNELS:
        most = STEM_GEMM_MAX_TAPS[_window._isa()]
        return reads_in_place(config, win, kk) and (most is None or math.prod(win.kernel) <= most)
    if channels <= THIN_MAX_CHANNELS and all(s == 1 for s in win.strides):
        wide = THIN_GEMM_MIN_CHANNELS[_window._isa()]
        return wide is not None and m >= wide
    return m >= GEMM_MIN_CHANNELS


def _vector_ops(n: int, block: int) -> int:
    """Vector instructions per channel for ``n`` columns in blocks of ``block`` (SLP splits a
    block into power-of-two vectors of at most the ISA's width): a cost model for ``flat``."""
    lanes = VECTOR_LANES[_window._isa()]
    ops = 0
    for _, count, width in _blocks(n, block):
        v, rest = 0, width
        for size in (lanes >> i for i in range(lanes.bit_length())):
            v, rest = v + rest // size, rest % size
        ops += count * v
    return ops


@dataclass(frozen=True)
class _Taps:
    """Taps ``j = j0 + t*jstep`` (``t < count``) of the last kernel dim and where they read:
    output column ``o`` at tap ``t`` reads source column ``o*ostep + col0 + t*colstep`` (of
    phase ``phase`` when the source is phase-split)."""

    phase: int | None
    j0: int
    jstep: int
    count: int
    col0: int
    colstep: int
    ostep: int


def _phase_split(k: KernelBuilder, x: Buffer, win: Window, temp: Buffer) -> list[_Taps]:
    """Stride ``s`` along the last dim: ``temp[n, c, r + pb, ph, q] = xpad[.., q*s + ph]``.

    Output column ``o`` at tap ``j`` reads padded column ``o*s + j*d``, which is phase
    ``(j*d) % s`` column ``o + (j*d)//s``: contiguous in ``o``, so the accumulation vectorizes as
    for stride 1.  Taps of one phase are ``j0 + t*L`` with ``L = s/gcd(s, d)``, an affine family.
    Only the phases some tap reads are filled.
    """
    s, d, kl = win.strides[-1], win.dilations[-1], win.kernel[-1]
    pb_last, size_last = win.pads_begin[-1], win.size[-1]
    nq = temp.shape[-1]
    lead = list(x.shape[:2])
    r = win.rank
    step = s // math.gcd(s, d)
    taps = []
    for ph in sorted({(j * d) % s for j in range(kl)}):
        zero = [*lead, *win.required[:-1], nq]
        with nest(k, zero, names=[f"z{i}" for i in range(r + 2)], parallel=copy_parallel(zero)) as ix:
            temp.store([*ix[:-1], ph, ix[-1]], k.f32(0.0))
        # q*s + ph - pb in [0, size): q in [ceil((pb - ph)/s), floor((size + pb - ph - 1)/s)]
        qlo = max(0, -((ph - pb_last) // s))
        qhi = min(nq, (size_last + pb_last - ph - 1) // s + 1)
        rows = [(max(0, -pb), min(n, rq - pb)) for pb, n, rq in zip(win.pads_begin[:-1], win.size[:-1], win.required[:-1])]
        if qhi > qlo:
            copy = [*lead, *rows, (qlo, qhi)]
            with nest(k, copy, names=["pn", "pc", *[f"p{i}" for i in range(r)]], parallel=copy_parallel(copy)) as ix:
                dst = [*ix[:2], *[affine(k, [(1, i)], pb) for i, pb in zip(ix[2:-1], win.pads_begin[:-1])], ph, ix[-1]]
                temp.store(dst, x.load([*ix[:-1], affine(k, [(s, ix[-1])], ph - pb_last)]))
        j0 = next(j for j in range(kl) if (j * d) % s == ph)
        count = len(range(j0, kl, step))
        taps.append(_Taps(ph, j0, step, count, (j0 * d) // s, step * d // s, 1))
    return taps


def window_problem(node: Node, ins: list[Operand | None], attrs: tuple[str, ...] = ("pads",)) -> str | None:
    """Why a convolution-like node cannot be lowered: 1-3 spatial dims, no negative ``attrs``."""
    if len(ins[0].type.shape) not in (3, 4, 5):
        return f"{node.op_type} with {len(ins[0].type.shape) - 2} spatial dimensions (1-3 are supported)"
    for a in attrs:
        if any(int(p) < 0 for p in node.attrs.get(a, []) or []):
            return f"negative {a} {list(node.attrs[a])}"
    return None


@register
class Conv(Kernel):
    """ONNX Conv: grouped (incl. depthwise), padded, strided, dilated; optional bias."""

    op_types = ("Conv",)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return super().supports(node, ins) or window_problem(node, ins)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x, w = ins[0].type, ins[1].type
        group = int(node.attrs.get("group", 1))
        n, c = x.shape[:2]
        m = w.shape[0]
        if group < 1 or c % group or m % group or w.shape[1] * group != c:
            raise ShapeError(f"Conv node {node.label!r}: input {x.shape}, weight {w.shape} and group={group} do not agree")
        if len(ins) > 2 and ins[2] is not None and ins[2].type.shape != (m,):
            raise ShapeError(f"Conv node {node.label!r}: bias {ins[2].type.shape} should be ({m},)")
        win = conv_window(node, x, w)
        return [TensorType((n, m, *win.out), x.dtype)]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        plan = _plan(self.config, node, ins[0].type, ins[1].type, ins[1].value is not None)
        return plan.temps + ([ins[0].type] if _scales_into_copy(node, plan) else [])

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        plan = _plan(self.config, node, ins[0].type, ins[1].type, ins[1].value is not None)
        win, group = plan.win, int(node.attrs.get("group", 1))
        g = f" g{group}" if group > 1 else ""
        return (f"{'x'.join(map(str, win.kernel))}/{max(win.strides)} {ins[0].type.shape[1]}->{ins[1].type.shape[0]}{g} "
                f"@{'x'.join(map(str, win.size))} {plan.mode}")

    def _prepacks(self, node: Node, ins: list[Operand | None]) -> bool:
        """Constant weights of a gemm-mode convolution are packed at compile time."""
        return ins[1].value is not None and _plan(self.config, node, ins[0].type, ins[1].type, True).mode in (
            "gemm", "gemm_inplace", "rows", "winograd", "schedule")

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        if not self._prepacks(node, ins):
            return []
        w = np.asarray(ins[1].value, np.float32)
        plan = _plan(self.config, node, ins[0].type, ins[1].type, True)
        if plan.mode == "winograd":
            return [transform_weights(w, winograd_plan(self.config, node, ins[0].type, ins[1].type, plan.win))]
        if plan.mode == "schedule":  # the GEMM schedule's constant A
            sched = scheduled_plan(self.config, nest_shape(node, ins[0].type, ins[1].type, plan.win))
            return [scheduled_gemm.constant_a(sched, w.reshape(w.shape[0], -1))]
        if plan.mode == "rows" and _rows_scheduled(self.config, node, ins[0].type, ins[1].type, plan):
            shape = nest_shape(node, ins[0].type, ins[1].type, plan.win)
            return [layout.evaluated(scheduled_conv.rows_layout(shape, flat=True), w.reshape(w.shape[0], -1),
                                     -(-shape.m // scheduled_conv.ROW_CHANNELS) * scheduled_conv.ROW_CHANNELS * shape.k)]
        if plan.mode == "rows":
            from polyml.codegen.gemm_rows import prepack_weights

            return [prepack_weights(w.reshape(w.shape[0], -1))]
        # one group's rows after another (a grouped convolution's products: _convolve_gemm)
        per_group = w.reshape(int(node.attrs.get("group", 1)), -1, math.prod(w.shape[1:]))
        blk = packed.blocking_for_host(self.config.gemm_blocking)
        return [np.concatenate([packed.prepack_a(g, blk, math.prod(w.shape[2:])) for g in per_group])]

    def replaced_inputs(self, node: Node, ins: list[Operand | None]) -> set[int]:
        return {1} if self._prepacks(node, ins) else set()

    def lower(self, k: KernelBuilder) -> None:
        plan = _plan(self.config, k.node, k.in_types[0], k.in_types[1], k.values[1] is not None)
        if _scales_into_copy(k.node, plan):  # x·s into a copy the lowering reads as x
            k.inputs[0] = _scaled_copy(k, k.inputs[0], k.inputs[k.node.attrs["input_scale"]], k.temps[-1])
        if not self._convolve(k, plan):
            epilogue(k, k.outputs[0])  # fused chain as its own nest over y, if there is one

    def _convolve(self, k: KernelBuilder, plan: _Plan) -> bool:
        """Emit the convolution; True if a fused epilogue was applied inside its blocks."""
        x, w = k.inputs[0], k.inputs[1]
        bias = k.inputs[2] if len(k.inputs) > 2 else None
        y = k.outputs[0]
        win, r = plan.win, plan.win.rank
        temps = iter(k.temps)
        src_temp = next(temps) if plan.src_temp is not None else None
        out_temp = next(temps) if plan.out_temp is not None else None
        group = int(k.attr("group", 1))
        if PREFER_VECTOR_WIDTH:
            set.add(k.fn.attributes, f'"prefer-vector-width"="{PREFER_VECTOR_WIDTH}"')
        if plan.mode == "plain" and group > 1:
            return _convolve_depthwise_scheduled(k, plan, None, None)
        if plan.mode in ("schedule", "plain"):
            return _convolve_scheduled(k, plan, src_temp)
        if plan.mode == "gemm":
            return _convolve_gemm(k, plan, src_temp)
        if plan.mode == "gemm_inplace":
            return _convolve_gemm(k, plan, src_temp, next(temps))
        if plan.mode == "rows" and _rows_scheduled(k.config, k.node, k.in_types[0], k.in_types[1], plan):
            return _convolve_rows_scheduled(k, plan, next(temps) if plan.planes is not None else None)
        if plan.mode == "rows":
            return _convolve_gemm(k, plan, None, next(temps) if plan.planes is not None else None)
        if plan.mode == "depthwise":
            dw = depthwise_plan(k.config, k.node, x.type, k.in_types[1], win)
            if k.config.schedule and depthwise_shape(k.node, x.type, k.in_types[1], win) is not None:
                return _convolve_depthwise_scheduled(k, plan, dw, src_temp)
            return convolve_depthwise(k, dw, src_temp)
        if plan.mode == "winograd":
            return convolve_winograd(k, winograd_plan(k.config, k.node, x.type, k.in_types[1], win), src_temp)
        # Every buffer is accessed through one array shape only: Polly gives an array a single
        # shape, and accesses through two (a 4-D store, a flattened load) make its
        # delinearization assumption false, which dismisses the op's whole SCoP.
        acc = out_temp if out_temp is not None else y
        if plan.mode == "pointwise":
            acc = view(k, y, (*y.shape[:2], math.prod(win.out)), "y_flat")
        with nest(k, acc.shape, names=["in", "im", *[f"io{d}" for d in range(acc.rank - 2)]],
                  parallel=copy_parallel(acc.shape)) as ix:
            acc.store(ix, bias.load([ix[1]]) if bias is not None else k.f32(0.0))

        if plan.mode == "pointwise":
            # y[n, m, p] += x[n, c, p] * w[m, c] over one flattened spatial dim p
            p = math.prod(win.out)
            src = view(k, x, (*x.shape[:2], math.prod(x.shape[2:])), "x_flat")
            if src_temp is not None:  # strided: src[n, c, o] = x[n, c, o*s], stored flat
                src = view(k, src_temp, (*src_temp.shape[:2], p), "x_flat")
                with nest(k, src_temp.shape, names=["sn", "sc", *[f"s{d}" for d in range(r)]],
                          parallel=copy_parallel(src_temp.shape)) as ix:
                    at = affine(k, [(math.prod(win.out[d + 1:]), o) for d, o in enumerate(ix[2:])])
                    src.store([*ix[:2], at], x.load([*ix[:2], *[affine(k, [(s, o)]) for s, o in zip(win.strides, ix[2:])]]))
            yf = acc
            wf = view(k, w, (*w.shape[:2], 1), "w_flat")
            finish = _finisher(k, yf)
            _accumulate(k, src, wf, yf, group, (), p, (), [], [], [_Taps(None, 0, 1, 1, 0, 1, 1)], finish)
            return finish is not None
        if plan.mode == "phase":
            taps = _phase_split(k, x, win, src_temp)
            rows = [([s if i == e else 0 for i in range(r - 1)], [d if i == e else 0 for i in range(r - 1)], 0)
                    for e, (s, d) in enumerate(zip(win.strides[:-1], win.dilations[:-1]))]
            finish = _finisher(k, y)
            _accumulate(k, src_temp, w, y, group, win.out[:-1], win.out[-1], win.kernel[:-1], rows, [0] * (r - 1), taps,
                        finish)
            return finish is not None
        # flat mode reads the padded copy with merged rows: fill and copy it that way too
        fill_into = _MergedRows(k, src_temp) if plan.mode == "flat" and src_temp is not None else src_temp
        src, shift = padded_source(k, x, win, fill_into, 0.0)
        if src is fill_into and src_temp is not None:
            src = src_temp
        last = [_Taps(None, 0, 1, win.kernel[-1], shift[-1], win.dilations[-1], 1)]
        if plan.mode == "direct":
            rows = [([s if i == e else 0 for i in range(r - 1)], [d if i == e else 0 for i in range(r - 1)], sh)
                    for e, (s, d, sh) in enumerate(zip(win.strides[:-1], win.dilations[:-1], shift[:-1]))]
            finish = _finisher(k, y)
            _accumulate(k, src, w, y, group, win.out[:-1], win.out[-1], win.kernel[:-1], rows, [0] * (r - 1), last,
                        finish)
            return finish is not None
        # flat: the last two dims as one, on the source's row pitch P: output position
        # q = oh*P + ow reads source position q + kh*dh*P + kw*dw (+ shift); then y is cropped
        pitch = plan.pitch
        src_f = view(k, src, (*src.shape[:-2], src.shape[-2] * src.shape[-1]), "x_rows")
        rows = [([s if i == e else 0 for i in range(r - 2)], [d if i == e else 0 for i in range(r - 1)], sh)
                for e, (s, d, sh) in enumerate(zip(win.strides[:-2], win.dilations[:-2], shift[:-2]))]
        cols = [0] * (r - 2) + [win.dilations[-2] * pitch]
        flat = [_Taps(None, 0, 1, win.kernel[-1], shift[-2] * pitch + shift[-1], win.dilations[-1], 1)]
        _accumulate(k, src_f, w, out_temp, group, win.out[:-2], out_temp.shape[-1], win.kernel[:-1], rows, cols, flat)
        with nest(k, y.shape, names=["cn", "cm", *[f"c{d}" for d in range(r)]], parallel=copy_parallel(y.shape)) as ix:
            q = affine(k, [(pitch, ix[-2]), (1, ix[-1])])
            y.store(ix, out_temp.load([*ix[:-2], q]))


def _scales_into_copy(node: Node, plan: _Plan) -> bool:
    """Whether a Conv with a folded input scale (:mod:`polyml.passes.conv_scale`) scales x into
    a copy first: every lowering but the packed GEMM reading x as B, which scales each element
    as it packs it (:func:`_convolve_gemm`)."""
    return "input_scale" in node.attrs and not (plan.mode == "gemm" and plan.win.pointwise and plan.planes is None)


def _scaled_copy(k: KernelBuilder, x: Buffer, scale: Buffer, copy: Buffer) -> Buffer:
    """``copy[n, c, ...] = x[n, c, ...] · scale[c]`` (scale broadcast as numpy does); returns
    ``copy`` for the lowering to read as x."""
    with nest(k, x.shape, names=["sn", "sc", *[f"s{d}" for d in range(x.rank - 2)]],
              parallel=copy_parallel(x.shape)) as ix:
        copy.store(ix, k.b.fmul(x.load(ix), scale.load(scale.broadcast_index(ix))))
    return copy


def _fused_operands(k: KernelBuilder, y: Buffer, n: int) -> list[tuple[Buffer, TensorType]] | None:
    """The fused chain's operands, each with the flat ``(1, C, 1)`` or ``(1, C, P)`` type a
    product's epilogue reads it through (P = ``n`` output positions), or None where one
    broadcasts otherwise (the chain then runs as its own nest after the convolution)."""
    extras: list[tuple[Buffer, TensorType]] = []
    for buf in k.inputs[k.node.attrs["epilogue_start"]:]:
        if buf is None:
            continue
        full = (1,) * (y.rank - buf.rank) + buf.shape
        if all(d == 1 for d in full[2:]):
            flat = (*full[:2], 1)
        elif full[2:] == y.shape[2:]:
            flat = (*full[:2], n)
        else:
            return None
        extras.append((buf, TensorType(flat, buf.type.dtype)))
    return extras


def _convolve_scheduled(k: KernelBuilder, plan: _Plan, scratch: Buffer | None) -> bool:
    """The convolution's plain nest (:mod:`polyml.schedule.conv`) under the GEMM's schedule
    seen through im2col (mode ``schedule``: weights as the constant A laid out by
    :meth:`Conv.constants`, the im2col panels packed into ``scratch``, the register tiles on
    the FMA intrinsic), or under its initial schedule (``plain``, ``--no-schedule``).  The
    bias and the fused chain are the nest's finishing statement; True if the chain is in it."""
    x, w, y = k.inputs[0], k.inputs[1], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    shape = nest_shape(k.node, k.in_types[0], k.in_types[1], plan.win)
    chain = k.node.attrs.get("epilogue")
    extras = _fused_operands(k, y, shape.n) if chain else None
    kinds = _chain_kinds(extras, shape.m)
    if kinds is None:
        extras = None
    fused = extras is not None
    f32p = ir.FloatType().as_pointer()
    operands = {"X": x, "Y": y, **({"Cb": bias} if bias is not None else {}),
                **{f"R{t}": buf for t, (buf, _) in enumerate(extras or [])}}
    nest = scheduled_conv.nest(shape, bias is not None, kinds if fused else (), fused)
    k.nests += 1
    if plan.mode == "plain":
        arrays = {name: k.b.bitcast(buf.ptr, f32p) for name, buf in {**operands, "W": w}.items()}
        program = _with_finish(Program.of(nest), k, bias is not None, chain if fused else None, extras or [])
        Emitter(k.module, k.fn, k.b, program, arrays, shape.sizes, {}).emit(shape.sizes)
        k.path = "plain"
        return fused
    sched = scheduled_plan(k.config, shape, k.parallel)
    # a bias and ReLU/Clip steps: applied in the FMA intrinsic's registers (E folded into it)
    in_registers = register_epilogue(0 if bias is not None else None, chain if fused else None, extras or [])
    program, ast = scheduled_conv.built(sched, shape, bias is not None, kinds if fused else (), fused,
                                        in_registers is not None)
    arrays = {name: k.b.bitcast(buf.ptr, f32p) for name, buf in {**operands, "Ac": k.constants[0], "Bp": scratch}.items()}
    attrs = tuple(a for a in k.fn.attributes if a != "noinline")
    fma, im2col = FmaTile(sched.blk, attrs, in_registers, "Cb"), shape.im2col(sched.blk.nr)
    Emitter(k.module, k.fn, k.b, _with_finish(program, k, bias is not None, chain if fused else None, extras or []),
            arrays, shape.sizes, {fma.name: fma, im2col.name: im2col}, attrs).emit(shape.sizes, ast)
    k.schedules.append(schedule_tree.text(program.tree))
    k.plans.append(schedule_exchange.record(sched))
    return fused


def _convolve_depthwise_scheduled(k: KernelBuilder, plan: _Plan, dw: DepthwisePlan | None,
                                  scratch: Buffer | None) -> bool:
    """A depthwise convolution as its nest (:mod:`polyml.schedule.depthwise`) under the
    depthwise schedule (``dw``'s threads, groups of planes or row bands; the phase-split
    copies in ``scratch``; the planes on the ``dw.f32`` intrinsic), or with ``dw`` None under
    its initial schedule (``plain``, ``--no-schedule``).  The bias and the fused chain are the
    nest's finishing statement (folded into the intrinsic's registers where they are a bias and
    ReLU/Clip steps); True if the chain is in it."""
    x, w, y = k.inputs[0], k.inputs[1], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    shape = depthwise_shape(k.node, k.in_types[0], k.in_types[1], plan.win)
    chain = k.node.attrs.get("epilogue")
    extras = _fused_operands(k, y, shape.sizes["N"]) if chain else None
    kinds = _chain_kinds(extras, shape.channels)
    fused = kinds is not None
    f32p = ir.FloatType().as_pointer()
    operands = {"X": x, "W": w, "Y": y, **({"Cb": bias} if bias is not None else {}),
                **{f"R{t}": buf for t, (buf, _) in enumerate(extras or []) if fused}}
    k.nests += 1
    if dw is None:
        program = Program.of(scheduled_depthwise.nest(shape, bias is not None, kinds or (), fused))
        arrays = {name: k.b.bitcast(buf.ptr, f32p) for name, buf in operands.items()}
        program = _with_finish(program, k, bias is not None, chain if fused else None, extras or [])
        Emitter(k.module, k.fn, k.b, program, arrays, shape.sizes, {}).emit(shape.sizes)
        k.path = "plain"
        return fused
    if dw.lanes == 16:
        set.add(k.fn.attributes, '"min-legal-vector-width"="512"')
    sched = scheduled_depthwise_plan(k.config, shape, dw, k.parallel)
    in_registers = register_epilogue(None, chain, extras) if fused else None
    fold = (bias is not None and not fused) or in_registers is not None
    program, ast = scheduled_depthwise.built(sched, bias is not None, kinds or (), fused, fold)
    arrays = {name: k.b.bitcast(buf.ptr, f32p) for name, buf in {**operands, "Xph": scratch}.items()}
    attrs = tuple(a for a in k.fn.attributes if a != "noinline")
    tile, copy_in = DepthwiseTile(sched.geometry, attrs, in_registers, "Cb"), DepthwisePhaseCopy(sched.geometry)
    Emitter(k.module, k.fn, k.b, _with_finish(program, k, bias is not None, chain if fused else None, extras or []),
            arrays, shape.sizes, {tile.name: tile, copy_in.name: copy_in}, attrs).emit(shape.sizes, ast)
    k.schedules.append(schedule_tree.text(program.tree))
    k.plans.append(schedule_exchange.record_depthwise(sched))
    return fused


def scheduled_depthwise_plan(config: CodegenConfig, shape: scheduled_depthwise.Shape, dw: DepthwisePlan,
                             parallel: bool) -> scheduled_depthwise.Plan:
    """The depthwise schedule's plan from the hand-written kernel's (its threads, groups of
    planes or row bands), with this node's imported tiles (``--import-schedules``) if any."""
    threads = dw.parts if parallel else 1
    banded = dw.row_bands and threads > 1
    plan = scheduled_depthwise.Plan(shape, dw.lanes, threads, 1 if banded else dw.group, dw.band if banded else 0)
    if config.schedule_tiles:
        return schedule_exchange.with_depthwise_tiles(plan, dict(config.schedule_tiles), "depthwise convolution")
    return plan


def _rows_scheduled(config: CodegenConfig, node: Node, x: TensorType, w: TensorType, plan: _Plan) -> bool:
    """Whether a ``rows`` convolution runs as its nest under the rows schedule
    (:func:`polyml.schedule.conv.rows_schedule`) rather than :func:`polyml.codegen.gemm_rows.emit_rows`."""
    return config.schedule and nest_shape(node, x, w, plan.win) is not None


def _chain_kinds(extras: list[tuple[Buffer, TensorType]] | None, m: int) -> tuple[str, ...] | None:
    """How the finishing statement reads each fused operand (:data:`polyml.schedule.conv.EXTRA_INDEX`),
    or None where one is neither per channel, per element nor a scalar (or not float32)."""
    if extras is None:
        return None
    kinds: tuple[str, ...] = ()
    for _, tt in extras:
        channels, per = tt.shape[1], tt.shape[2]
        if tt.dtype != "float32" or channels not in (1, m) or (channels == 1 and per != 1):
            return None
        kinds += ("scalar" if channels == 1 else "channel" if per == 1 else "element",)
    return kinds


def _convolve_rows_scheduled(k: KernelBuilder, plan: _Plan, planes: Buffer | None) -> bool:
    """A ``rows`` convolution as its nest under the rows schedule: the source (x, or its phase
    copy filled first) read in place by the ``rows.f32.<w>x32`` intrinsic, the weights in
    32-channel panels laid out by :meth:`Conv.constants`, the bias and fused chain applied as
    each tile is stored (E folded into the intrinsic).  True if the chain is applied so."""
    from polyml.schedule.intrinsics import RowsTile

    x, y = k.inputs[0], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    shape = nest_shape(k.node, k.in_types[0], k.in_types[1], plan.win)
    spec = _rows_spec(plan, x.type, k.in_types[1])
    src = plan.planes.fill(k, x, planes) if plan.planes is not None else x
    size = plan.planes.size if plan.planes is not None else x.type.size
    rows = scheduled_conv.Rows(spec.width, spec.rows, spec.pitch, spec.stack,
                               None if plan.planes is None else (plan.planes.qh, plan.planes.qw), size)
    chain = k.node.attrs.get("epilogue")
    extras = _fused_operands(k, y, shape.n) if chain else None
    kinds = _chain_kinds(extras, shape.m)
    fused = kinds is not None
    threads = (os.cpu_count() or 1) if k.parallel else 1
    program, ast = scheduled_conv.rows_built(shape, rows, threads, bias is not None, kinds or (), fused)
    f32p = ir.FloatType().as_pointer()
    operands = {"P": src, "Wr": k.constants[0], "Y": y, **({"Cb": bias} if bias is not None else {}),
                **{f"R{t}": buf for t, (buf, _) in enumerate(extras or []) if fused}}
    arrays = {name: k.b.bitcast(buf.ptr, f32p) for name, buf in operands.items()}
    n = shape.n

    def finish(em, b: ir.IRBuilder, i: ir.Value, j: ir.Value, v: ir.Value) -> ir.Value:  # noqa: ANN001
        at = {"channel": i, "element": b.add(b.mul(i, ir.Constant(i.type, n)), j), "scalar": ir.Constant(i.type, 0)}
        elements = [(buf, b.gep(em.arrays[f"R{t}"], [at[kind]], inbounds=True))
                    for t, ((buf, _), kind) in enumerate(zip(extras, kinds))] if fused else []
        bias_at = b.gep(em.arrays["Cb"], [i], inbounds=True) if bias is not None else None
        return _finished(k, b, v, bias_at, chain if fused else None, elements)

    attrs = tuple(a for a in k.fn.attributes if a != "noinline")
    tile = RowsTile(spec, attrs, finish)
    k.nests += 1
    Emitter(k.module, k.fn, k.b, program, arrays, shape.sizes, {tile.name: tile}, attrs).emit(shape.sizes, ast)
    k.schedules.append(schedule_tree.text(program.tree))
    return fused


class _Element:
    """One element a statement's body has the pointer of, as :func:`evaluate_chain` reads a
    buffer (its index is the statement's own)."""

    def __init__(self, b: ir.IRBuilder, ptr: ir.Value, dtype: str):
        self.b, self.ptr, self.type = b, ptr, TensorType((), dtype)

    def broadcast_index(self, ix: Sequence) -> list:  # noqa: ARG002
        return []

    def load(self, ix: Sequence) -> ir.Value:  # noqa: ARG002
        return self.b.load(self.ptr)


def _finished(k: KernelBuilder, b: ir.IRBuilder, v: ir.Value, bias: ir.Value | None, chain: list | None,
              elements: Sequence[tuple[Buffer, ir.Value]]) -> ir.Value:
    """An output element's value ``v`` finished: plus the bias at ``bias`` (an element
    pointer), then the fused ``chain`` reading each operand buffer's element at its pointer;
    the code goes where ``b`` is (a parallel body function, an intrinsic's store loop)."""
    if bias is not None:
        v = b.fadd(v, b.load(bias))
    if not chain:
        return v
    sub = copy.copy(k)
    sub.b, sub.fn = b, b.function
    bufs = {buf.name: _Element(b, ptr, buf.type.dtype) for buf, ptr in elements}
    return evaluate_chain(sub, chain, {k.node.attrs["epilogue_acc"]: v}, bufs, [])


def _with_finish(program: Program, k: KernelBuilder, bias: bool, chain: list | None,
                 extras: list[tuple[Buffer, TensorType]]) -> Program:
    """``program`` with its finishing statement E computing ``chain(y + bias)`` (E's
    accesses: y, the bias, then the chain's operands in order)."""
    if chain is None or not any(s.name == "E" for s in program.nest.statements):
        return program

    def body(b: ir.IRBuilder, ptrs: Sequence[ir.Value]) -> None:
        at = 2 if bias else 1
        elements = [(buf, ptrs[at + t]) for t, (buf, _) in enumerate(extras)]
        b.store(_finished(k, b, b.load(ptrs[0]), ptrs[1] if bias else None, chain, elements), ptrs[0])

    finish = dataclasses.replace(program.nest.statement("E"), body=body)
    return Program(program.nest.with_statement(finish), program.tree)


def _convolve_gemm(k: KernelBuilder, plan: _Plan, scratch: Buffer, planes: Buffer | None = None) -> bool:
    """``y[m][q] = Σ_p w[m][p] · im2col(x)[p][q]`` through the packed GEMM (1x1 unstrided
    convolutions read x itself as the B matrix; ``gemm_inplace`` reads the rows of im2col(x)
    in place from the stride-phase copy ``planes``), bias and the fused chain applied to each
    register tile of y as the GEMM's epilogue.  True if the chain was fused so."""
    from polyml.kernels.matmul import batched_product, packed_product

    x, w = k.inputs[0], k.inputs[1]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    y = k.outputs[0]
    win = plan.win
    m, n, kk = _gemm_spec_dims(x.type, k.in_types[1], win)
    groups = int(k.attr("group", 1))
    y_flat = view(k, y, (1, m, n), "y_flat")
    taps = math.prod(win.kernel)
    pack_b = in_place = None
    load_b = None
    b_operand = plan.planes.fill(k, x, planes) if plan.planes is not None else x
    if plan.mode == "gemm_inplace":
        in_place = packed.InPlaceB(1, plan.planes.offsets, plan.planes.qw, win.out[-1])
    elif plan.mode == "rows":
        pass  # emit_rows below reads b_operand itself
    elif win.pointwise:
        load_b = packed.matrix_loader(1, n)
    else:
        pack_b = packed.im2col_packer(1, win.size, win.kernel, win.out[-1], n, win.strides, win.dilations,
                                      win.pads_begin, packed.blocking_for_host(k.config.gemm_blocking).nr)
    prepacked = bool(k.constants)  # the weights in panel order (Conv.constants)
    operands: list[Buffer] = [k.constants[0] if prepacked else w, b_operand]
    bias_at = None
    if bias is not None:
        bias_at = len(operands)
        operands.append(bias)
    if "input_scale" in k.node.attrs and load_b is not None:  # B[c][p] = x[c][p] · s[c], scaled as packed
        load_b = _scaled_loader(load_b, len(operands))
        operands.append(view(k, k.inputs[k.node.attrs["input_scale"]], (x.type.shape[1],), "scale_flat"))
    chain = k.node.attrs.get("epilogue")
    extras: list[tuple[int, Buffer, TensorType]] = []  # operand index, buffer, flat (1, C, P) type
    fusable = _fused_operands(k, y, n) if chain else None
    fused = fusable is not None
    for buf, flat in fusable or []:
        extras.append((len(operands), buf, flat))
        operands.append(buf)
    holder: dict[str, KernelBuilder] = {}

    def make_builder(fn: ir.Function) -> ir.IRBuilder:
        holder["k"] = sub = KernelBuilder(k.module, fn, k.node, [], [], [], [], [])
        sub.prefix = f"{k.prefix}.gemm"
        sub.config = k.config
        return sub.b

    def tile_epilogue(b: ir.IRBuilder, ops, i, j, v):  # noqa: ANN001, ANN202
        if bias_at is not None:
            v = b.fadd(v, b.load(b.gep(ops[bias_at], [i], inbounds=True)))
        if fused:
            sub = holder["k"]
            bufs = {buf.name: Buffer(sub, b.bitcast(ops[at], pointer_type(tt)), tt, buf.name) for at, buf, tt in extras}
            v = evaluate_chain(sub, chain, {k.node.attrs["epilogue_acc"]: v}, bufs, [ir.Constant(ir.IntType(64), 0), i, j])
        return v

    has_epilogue = bias is not None or fused
    if plan.mode == "rows":
        from polyml.codegen.gemm_rows import emit_rows

        emit_rows(k, _rows_spec(plan, x.type, k.in_types[1]), b_operand, k.constants[0], operands[2:], y_flat,
                  tile_epilogue if has_epilogue else None, make_builder)
        return fused
    mg = m // groups
    spec = packed.GemmSpec(mg, plan.planes.columns if plan.planes is not None else n, kk, packed.matrix_loader(0, kk),
                           load_b, len(operands), ldc=n, epilogue=tile_epilogue if has_epilogue else None,
                           make_builder=make_builder, prepacked_a=prepacked, kc_step=taps, pack_b=pack_b,
                           in_place_b=in_place, b_row_major=load_b is not None,
                           epilogue_per_row=not fused or all(tt.shape[-1] == 1 for _, _, tt in extras),
                           register_epilogue=register_epilogue(bias_at, chain if fused else None, extras))
    if groups == 1:
        packed_product(k, spec, operands, y_flat, scratch)
        return fused
    # one product per group g: rows g·Mg.. of w (pre-packed: the g-th of equal parts), input
    # channels g·Cg.. of x, output channels g·Mg.. of y and of every per-channel operand
    a_stride = (k.constants[0].type.size if prepacked else m * kk) // groups
    per_channel = [mg * tt.shape[-1] for _, _, tt in extras]
    strides = [[a_stride], [x.type.size // groups], *([[mg]] if bias is not None else []), *[[s] for s in per_channel],
               [mg * n]]
    batched_product(k, spec, operands, y_flat, scratch, (groups,), strides)
    return fused


def _scaled_loader(load: Callable, scale_at: int) -> Callable:
    """``load`` (a B loader of the packed GEMM) times ``ops[scale_at][row]``; keeps the
    loader's ``address`` (the packing's prefetches)."""

    def scaled(b: ir.IRBuilder, ops, row: ir.Value, col: ir.Value) -> ir.Value:  # noqa: ANN001
        return b.fmul(load(b, ops, row, col), b.load(b.gep(ops[scale_at], [row], inbounds=True)))

    scaled.address = load.address  # type: ignore[attr-defined]
    return scaled


def _finisher(k: KernelBuilder, acc: Buffer) -> Callable[[list], None] | None:
    """The fused epilogue as a per-element update of ``acc`` (the output, or its view with the
    spatial dims merged: then each extra input is viewed the same way), or None if there is
    none or an extra input cannot be viewed so."""
    chain = k.node.attrs.get("epilogue")
    if not chain:
        return None
    y = k.outputs[0]
    out, rank = y.shape, y.rank
    extra: dict[str, Buffer] = {}
    for buf in k.inputs[k.node.attrs["epilogue_start"]:]:
        if buf is None:
            continue
        if acc.shape == out:
            extra[buf.name] = buf
            continue
        full = (1,) * (rank - buf.rank) + buf.shape
        if all(d == 1 for d in full[2:]):
            extra[buf.name] = view(k, buf, (*full[:2], 1), f"{buf.name}_flat")
        elif full[2:] == out[2:]:
            extra[buf.name] = view(k, buf, (*full[:2], math.prod(out[2:])), f"{buf.name}_flat")
        else:
            return None
    name = k.node.attrs["epilogue_acc"]

    def finish(yi: list) -> None:
        acc.store(yi, evaluate_chain(k, chain, {name: acc.load(yi)}, extra, yi))

    return finish


class _MergedRows(Buffer):
    """``buf`` indexed with its full shape but stored through a view with the last two dims
    merged (``[.., r, q]`` → ``[.., r*W + q]``, affine), the shape flat mode reads it with."""

    def __init__(self, k: KernelBuilder, buf: Buffer):
        super().__init__(k, buf.ptr, buf.type, buf.name)
        self.flat = view(k, buf, (*buf.shape[:-2], buf.shape[-2] * buf.shape[-1]), f"{buf.name}_rows")

    def addr(self, idx: Sequence[ir.Value | int]) -> ir.Value:
        merged = affine(self.kb, [(self.shape[-1], idx[-2]), (1, idx[-1])])
        return self.flat.addr([*idx[:-2], merged])


def _blocks(n: int, b: int) -> list[tuple[int, int, int]]:
    """Split ``range(n)`` into full blocks of ``b`` and a tail: ``(start, count, width)`` parts."""
    b = max(1, min(b, n))
    full = n // b
    parts = [(0, full, b)] if full else []
    if n % b:
        parts.append((full * b, 1, n % b))
    return parts


Row = tuple[list[int], list[int], int]


def _row_tile(k: KernelBuilder, src: Buffer, cg: int, out_outer: Sequence[int], kern_outer: Sequence[int],
              rows: list[Row]) -> int:
    """Output rows per cache tile (0: untiled): the largest ``R`` whose source slice
    ``cg * (R*s + (kh-1)*d) * row_bytes`` fits ``k.tile_bytes`` (half the L2), if the whole
    plane set does not fit twice that (measured, 2 threads: a 128-channel 3x3/2 conv on 56x56,
    1.7 MB of source, gained nothing tiled; 64-256 channel VGG layers of 3-13 MB gained 7-25%)."""
    budget = getattr(k, "tile_bytes", 0)
    if not budget or not out_outer or not rows or src.rank < 3 or out_outer[0] < 2:
        return 0
    stride = max(rows[0][0][0], 1)
    span = sum((kn - 1) * b for kn, b in zip(kern_outer, rows[0][1])) + 1
    row_bytes = src.type.nbytes // max(src.shape[0] * src.shape[1] * src.shape[2], 1)
    if cg * src.shape[2] * row_bytes <= 2 * budget:  # the planes fit the whole L2: no reuse to win
        return 0
    r = (budget // max(cg * row_bytes, 1) - span) // stride
    return max(1, r) if r < out_outer[0] else 0


def _accumulate(k: KernelBuilder, src: Buffer, w: Buffer, y: Buffer, group: int, out_outer: Sequence[int], width: int,
                kern_outer: Sequence[int], rows: list[Row], cols: list[int], taps: list[_Taps],
                finish: Callable[[list], None] | None = None) -> None:
    """``y[n, g*Mg+m, o, ow] += src[n, g*Cg+c, rows(o, j), col(ow, j, t)] * w[g*Mg+m, c, j, jl(t)]``.

    ``o``/``j`` are the outer output/tap dims (``out_outer``, ``kern_outer``); source row ``i``
    is ``rows[i] = (a, b, e)``: ``a·o + b·j + e`` (a phase index follows for a phase-split
    source); the column is ``ow*ostep + cols·j + col0 + t*colstep`` and the last tap
    ``jl = j0 + t*jstep``, per family in ``taps``.

    Register-blocked direct convolution.  The loops are ``n, g, mB, o..., owB`` then the
    reduction ``c, j..., t``, and one statement updates a block of ``mb`` output channels by
    ``vw`` consecutive output columns (``m = mB*mb + a``, ``ow = owB*vw + l``, unrolled).  The
    block's ``y`` addresses do not depend on the reduction loops, so LLVM keeps them in
    registers across the whole reduction and SLP-vectorizes the ``vw`` columns: per tap, ``w``
    is one broadcast per channel and ``src`` one contiguous run.  Channel and column remainders
    get their own nests.

    ``finish(yi)``, if given, runs on each element of a block once its reduction is complete
    (after the last tap family's reduction loops, inside the block loops): the fused epilogue,
    applied while the block is still in registers.

    Cache tiling (``k.tile_bytes`` > 0, :mod:`polyml.codegen.tiling`): when the source planes
    of one group exceed the budget, the first output-row dim is strip-mined, ``o = rT*R + r``,
    and ``rT`` hoisted outside ``mB`` (the block loops carry no dependence, so the permutation
    is legal): all channel blocks then reuse one row tile's source slice from cache.
    """
    n_, m_all = y.shape[:2]
    cg = w.shape[1]
    mg = m_all // group
    no, nj = len(out_outer), len(kern_outer)
    bm, bw = BLOCKS[_window._isa()]
    mb = min(bm, mg)
    vw = min(max(bw, bm * bw // mb), MAX_BLOCK_W)
    rtile = _row_tile(k, src, cg, out_outer, kern_outer, rows)
    row_parts = _blocks(out_outer[0], rtile) if rtile else [(0, 1, 0)]
    for ti, tp in enumerate(taps):
        for (r0, rcount, rw), (m0, mcount, mw) in itertools.product(row_parts, _blocks(mg, mb)):
            for w0, wcount, ww in _blocks(width, vw):
                if rtile:  # n, g, rT, mB, r, o..., owB
                    outer = [n_, group, rcount, mcount, rw, *out_outer[1:], wcount]
                    names = ["n", "g", "rt", "mb", "r", *[f"o{d}" for d in range(1, no)], "ob"]
                else:
                    outer = [n_, group, mcount, *out_outer, wcount]
                    names = ["n", "g", "mb", *[f"o{d}" for d in range(no)], "ob"]
                # n, g, row tiles, channel blocks, output rows and column blocks carry no dependence
                with nest(k, outer, names=names, parallel=len(outer)) as iv:
                    if rtile:
                        n, g, rt, mblk = iv[:4]
                        os = [affine(k, [(rw, rt), (1, iv[4])], r0), *iv[5 : 4 + no]]
                        oblk = iv[4 + no]
                    else:
                        n, g, mblk = iv[:3]
                        os, oblk = iv[3 : 3 + no], iv[3 + no]
                    block = [[n, affine(k, [(mg, g), (mw, mblk)], m0 + a), *os, affine(k, [(ww, oblk)], w0 + lane)]
                             for a in range(mw) for lane in range(ww)]
                    inner = [cg, *kern_outer, tp.count]
                    with nest(k, inner, names=["c", *[f"k{d}" for d in range(nj + 1)]]) as jv:
                        c, js, t = jv[0], jv[1 : 1 + nj], jv[1 + nj]
                        ic = affine(k, [(cg, g), (1, c)])
                        ri = [affine(k, [*zip(a, os), *zip(b, js)], e) for a, b, e in rows]
                        if tp.phase is not None:
                            ri.append(tp.phase)
                        col = [(tp.ostep * ww, oblk), (tp.colstep, t), *zip(cols, js)]
                        xs = [src.load([n, ic, *ri, affine(k, col, tp.col0 + tp.ostep * (w0 + lane))]) for lane in range(ww)]
                        jl = affine(k, [(tp.jstep, t)], tp.j0)
                        for a in range(mw):
                            oc = block[a * ww][1]
                            wv = w.load([oc, c, *js, jl])
                            for lane in range(ww):
                                yi = block[a * ww + lane]
                                prod = k.b.fmul(xs[lane], wv, flags=CONTRACT)
                                y.store(yi, k.b.fadd(y.load(yi), prod, flags=CONTRACT))
                    if finish is not None and ti == len(taps) - 1:
                        for yi in block:
                            finish(yi)

# the geometry of polyml.kernels._window, as the pooling and other window kernels import it from here
__all__ = ["Conv", "VECTOR_LANES", "Window", "_isa", "affine", "auto_pad_of", "conv_window", "copy_parallel", "make_window",
           "nest", "padded_source", "register_epilogue", "view"]
