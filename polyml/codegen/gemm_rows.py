"""Convolutions on small maps with output positions as the register tile's rows.

``y[m][oh·OW + ow] = Σ_p w[m][p] · x̂[p][oh, ow]`` as the product ``Yᵀ = X̂ᵀ · Wᵀ`` tiled so that
one register tile is one *output row*: its ``OW`` positions are the tile's rows, 32 output
channels (two 16-lane vectors) its columns.  In polyhedral terms the ``(oh, ow, m)`` space is
tiled by ``1 × OW × 32`` and the ``ow`` and ``m`` tile loops are unrolled into registers, the
whole reduction ``p`` running innermost.  It suits maps of 7-14 columns (ResNet's and
MobileNet's 7x7 and 14x14 stages), where the packed GEMM's 32-position panels pad 49 positions
to 64 and 196 to 224, and wastes nothing there: every tile row is an output position.

* A (the im2col matrix, transposed) is never packed: position ``ow`` of output row ``oh`` at
  reduction row ``p = (c, kh, kw)`` is ``src[offsets[p] + oh·pitch + ow]`` of the input itself
  (unstrided 1x1) or of its stride-phase copy (:class:`polyml.kernels.conv.PhasePlanes`), so the
  tile's ``OW`` broadcasts at step ``p`` are consecutive floats;
* B is the weights, transposed and packed at compile time into 32-channel panels
  ``[panel][p][32]`` (:func:`prepack_weights`);
* the tile (``OW × 2`` vector accumulators, ``OW ≤`` :data:`MAX_ROWS`) holds the whole
  reduction, then is transposed in registers (:func:`transpose16`) into per-channel runs of
  ``OW`` positions, stored into ``y``'s channel planes with the epilogue (bias, fused chain).

Work units ``(panel, tile)`` are dealt to the threads panel-major, so a thread streams each
weight panel once for all its rows.  Rows of at most 7 positions are stacked two to a tile
(:attr:`RowsSpec.stack`), and each reduction step prefetches the source run of a step
:data:`PREFETCH_AHEAD` ahead and the weights :data:`WEIGHTS_AHEAD` ahead.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import F32, I64, Buffer, KernelBuilder, splat, vector_fma
from polyml.codegen.gemm import F32P, Epilogue, _c, _function, _min, _prefetch, for_range, tile_loop

#: output channels per tile (two AVX-512 vectors)
CHANNELS = 32
WIDTH = 16
#: most positions per tile: 2 accumulators each + 2 weight vectors + 1 broadcast ≤ 32 zmm
MAX_ROWS = 14
#: whether rows of at most MAX_ROWS / 2 positions are stacked two to a tile (False: one output
#: row per tile)
STACK = True
#: reduction steps ahead whose source run the micro-kernel prefetches (0: none)
PREFETCH_AHEAD = 24
#: reduction steps ahead whose weight lines the micro-kernel prefetches
#: (0: none): a tile reads its whole weight panel, which
#: comes from memory for the first tile and from L2 after, faster than the hardware prefetcher
#: brings it.  ResNet-50 at 2 threads, alternated, 8 / 16 steps / none:
#: the model 0.96 / 0.97 (its 3x3 512 @7x7 steps 0.77-0.78, 2048->512 @7x7 0.81-0.82,
#: 1024->256 @14x14 0.94-0.96)
WEIGHTS_AHEAD = 8


@dataclass(frozen=True)
class RowsSpec:
    """One convolution as output-row tiles: ``m`` output channels, ``k`` reduction rows at
    ``offsets`` (relative to the source's origin), ``rows × width`` outputs, output row ``oh``
    starting at source position ``oh·pitch``."""

    m: int
    k: int
    offsets: tuple[int, ...]
    rows: int
    width: int
    pitch: int

    @property
    def panels(self) -> int:
        return -(-self.m // CHANNELS)

    @property
    def stack(self) -> int:
        """Output rows per register tile: two when two rows fit (7x7 maps: 14 positions, 28
        accumulators, against 14 for one row), else one."""
        return 2 if STACK and 2 * self.width <= MAX_ROWS else 1

    @property
    def tiles(self) -> int:
        """Register tiles per output plane (the last holds ``rows % stack`` rows when that is
        not 0)."""
        return -(-self.rows // self.stack)


def prepack_weights(w: np.ndarray) -> np.ndarray:
    """``w`` (M × K) as ``[panel][p][32]``: panel ``q``'s column ``jj`` is output channel
    ``32q + jj`` (zeros past M)."""
    m, k = w.shape
    panels = -(-m // CHANNELS)
    out = np.zeros((panels * CHANNELS, k), np.float32)
    out[:m] = w
    return np.ascontiguousarray(out.reshape(panels, CHANNELS, k).transpose(0, 2, 1)).ravel()


def micro_kernel(module: ir.Module, spec: RowsSpec, attrs: Sequence[str], stack: int = 1) -> ir.Function:
    """``ukernel(k, src_row, offsets, panel, tile)``: the ``(stack·width) × 32`` tile over ``k``
    steps (step ``p`` broadcasts ``src_row[offsets[p] + ⌊r/width⌋·pitch + r mod width]`` for
    each tile row ``r``: ``stack`` output rows of ``width`` positions, and loads the panel's 32
    weights), stored row-major (pitch 32) into ``tile``."""
    name = f"polyml.rows_ukernel.{spec.width}" + (f"x{stack}.{spec.pitch}" if stack > 1 else "")
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    vec = ir.VectorType(F32, WIDTH)
    i32p = ir.IntType(32).as_pointer()
    fn = _function(module, name, [I64, F32P, i32p, F32P, F32P], attrs, True)
    fn.linkage = "internal"
    kc, src, rows_at, bp, tile = fn.args
    for a in (src, bp, tile):
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = vector_fma(module, 16)
    vectors = CHANNELS // WIDTH

    def step(p: ir.Value, accs: list[list[ir.Value]]) -> list[list[ir.Value]]:
        b_row = b.gep(bp, [b.mul(p, _c(CHANNELS), flags=["nsw"])], inbounds=True)
        b_vecs = [b.load(b.bitcast(b.gep(b_row, [_c(v * WIDTH)], inbounds=True), vec.as_pointer()), align=4)
                  for v in range(vectors)]
        a_row = b.gep(src, [b.sext(b.load(b.gep(rows_at, [p], inbounds=True)), I64)], inbounds=True)
        if WEIGHTS_AHEAD:
            for line in range(0, CHANNELS, 16):
                _prefetch(b, b.gep(b_row, [_c(WEIGHTS_AHEAD * CHANNELS + line)]))
        if PREFETCH_AHEAD:  # the table holds PREFETCH_AHEAD more entries (the last offset again)
            at = b.load(b.gep(rows_at, [b.add(p, _c(PREFETCH_AHEAD))], inbounds=True))
            ahead = b.gep(src, [b.sext(at, I64)], inbounds=True)
            for off in sorted({0, (stack - 1) * spec.pitch + spec.width - 1}):
                _prefetch(b, b.gep(ahead, [_c(off)], inbounds=True))
        new = []
        for r in range(stack * spec.width):
            at = r // spec.width * spec.pitch + r % spec.width
            a_vec = splat(b, b.load(b.gep(a_row, [_c(at)], inbounds=True)), vec)
            new.append([b.call(fma, [a_vec, b_vecs[v], accs[r][v]]) for v in range(vectors)])
        return new

    tile_loop(b, ir.Constant(vec, [0.0] * WIDTH), stack * spec.width, vectors, kc, "p", step, tile, _c(CHANNELS),
              ir.Constant(ir.IntType(1), 0), b.fadd)
    return fn


def transpose16(b: ir.IRBuilder, rows: list[ir.Value]) -> list[ir.Value]:
    """The 16 × 16 matrix of 16 ``<16 x float>`` rows, transposed in registers: four butterfly
    stages, stage ``k`` swapping the off-diagonal ``2^k``-blocks of each ``2^(k+1)``-block
    (two-source shuffles; x86 lowers them to ``vunpck``/``vshuf``/``vperm2`` forms)."""
    rows = list(rows)
    i32v = ir.VectorType(ir.IntType(32), 16)
    for k in range(4):
        blk = 1 << k
        upper_mask = [j if not j & blk else 16 + j - blk for j in range(16)]
        lower_mask = [j + blk if not j & blk else 16 + j for j in range(16)]
        out = list(rows)
        for i in range(16):
            if i & blk:
                continue
            a, c = rows[i], rows[i + blk]
            out[i] = b.shuffle_vector(a, c, ir.Constant(i32v, upper_mask))
            out[i + blk] = b.shuffle_vector(a, c, ir.Constant(i32v, lower_mask))
        rows = out
    return rows


def offsets_table(module: ir.Module, spec: RowsSpec) -> ir.GlobalVariable:
    """The reduction rows' source offsets as a constant table of ``module`` (the last one
    repeated for the micro-kernel's prefetches past the last step), one per distinct table."""
    offsets = [int(o) for o in spec.offsets]
    offsets += offsets[-1:] * PREFETCH_AHEAD
    name = "polyml.rows_offsets." + hashlib.sha256(repr(offsets).encode()).hexdigest()[:12]
    table = module.globals.get(name)
    if table is None:
        kind = ir.ArrayType(ir.IntType(32), len(offsets))
        table = ir.GlobalVariable(module, kind, name)
        table.global_constant = True
        table.linkage = "internal"
        table.initializer = ir.Constant(kind, offsets)
    return table


def transpose_tile(b: ir.IRBuilder, tile: ir.Value, tile_t: ir.Value, positions: int) -> None:
    """The micro-kernel's ``positions × 32`` tile (row-major) into ``tile_t``, channel-major
    with 16 positions per channel (those past ``positions`` zero), in registers."""
    vec = ir.VectorType(F32, WIDTH)
    for v in range(CHANNELS // WIDTH):  # 16 channels x positions -> per-channel runs
        loaded = [b.load(b.bitcast(b.gep(tile, [_c(r * CHANNELS + v * WIDTH)], inbounds=True), vec.as_pointer()),
                         align=4) for r in range(positions)]
        loaded += [ir.Constant(vec, [0.0] * WIDTH)] * (WIDTH - positions)
        for c, row in enumerate(transpose16(b, loaded)):
            b.store(row, b.bitcast(b.gep(tile_t, [_c((v * WIDTH + c) * WIDTH)], inbounds=True), vec.as_pointer()),
                    align=4)


def emit_rows(k: KernelBuilder, spec: RowsSpec, src: Buffer, weights: Buffer, operands: Sequence[Buffer], y: Buffer,
              epilogue: Epilogue | None, make_builder: Callable[[ir.Function], ir.IRBuilder] | None = None) -> None:
    """``y`` (``m`` channel planes of ``rows·width`` positions) from ``src`` (the input or its
    phase copy) and the packed ``weights``; ``operands`` are what ``epilogue(b, ops, channel,
    position, value)`` reads (``ops`` = their pointers, after src and weights); ``make_builder``
    as :attr:`polyml.codegen.gemm.GemmSpec.make_builder`."""
    attrs = [a for a in k.fn.attributes if a != "noinline"]
    ukernel = micro_kernel(k.module, spec, attrs)
    stacked = micro_kernel(k.module, spec, attrs, spec.stack) if spec.stack > 1 else ukernel
    positions = spec.stack * spec.width
    name = f"{k.fn.name}.rows{k.nests}"
    k.nests += 1
    table = offsets_table(k.module, spec)

    nops = 2 + len(operands)
    fn = _function(k.module, name, [F32P] * (nops + 1) + [I64, I64], attrs, True)
    fn.attributes.add("noinline")
    *ops, out, u0, u1 = fn.args
    for a in (*ops, out):
        a.add_attribute("noalias")
    b = make_builder(fn) if make_builder else ir.IRBuilder(fn.append_basic_block("entry"))
    tile = b.alloca(ir.ArrayType(F32, positions * CHANNELS), name="tile")
    tile_p = b.bitcast(tile, F32P)
    # the tile transposed: channel-major, 16 positions per channel (those past width unused)
    tile_t = b.alloca(ir.ArrayType(F32, CHANNELS * WIDTH), name="tile_t")
    tile_tp = b.bitcast(tile_t, F32P)
    plane = spec.rows * spec.width
    with for_range(b, u0, u1, name="unit") as u:
        panel = b.udiv(u, _c(spec.tiles))
        oh = b.mul(b.urem(u, _c(spec.tiles)), _c(spec.stack))
        src_row = b.gep(ops[0], [b.mul(oh, _c(spec.pitch))], inbounds=True)
        bp = b.gep(ops[1], [b.mul(panel, _c(spec.k * CHANNELS))], inbounds=True)
        rows_at = b.gep(table, [_c(0), _c(0)], inbounds=True)

        def per_tile(emit: Callable[[bool], None]) -> None:
            """``emit(True)`` for a tile of ``stack`` rows, ``emit(False)`` for the last tile
            of an odd number of rows (one row)."""
            if spec.stack == 1:
                emit(False)
                return
            with b.if_else(b.icmp_signed("<=", b.add(oh, _c(spec.stack)), _c(spec.rows))) as (then, otherwise):
                with then:
                    emit(True)
                with otherwise:
                    emit(False)

        per_tile(lambda whole: b.call(stacked if whole else ukernel, [_c(spec.k), src_row, rows_at, bp, tile_p]))
        transpose_tile(b, tile_p, tile_tp, positions)
        ch0 = b.mul(panel, _c(CHANNELS))
        channels = _min(b, _c(CHANNELS), b.sub(_c(spec.m), ch0))
        pos0 = b.mul(oh, _c(spec.width))  # the tile's rows are consecutive positions in y

        def store(count: int) -> None:
            with for_range(b, 0, channels, name="store.ch") as ch:
                i = b.add(ch0, ch)
                dst_row = b.gep(out, [b.add(b.mul(i, _c(plane)), pos0)], inbounds=True)
                with for_range(b, 0, count, name="store.ow") as ow:
                    v = b.load(b.gep(tile_tp, [b.add(b.mul(ch, _c(WIDTH)), ow)], inbounds=True))
                    if epilogue is not None:
                        v = epilogue(b, ops, i, b.add(pos0, ow), v)
                    b.store(v, b.gep(dst_row, [ow], inbounds=True))

        per_tile(lambda whole: store(positions if whole else spec.width))
    b.ret_void()

    units = spec.panels * spec.tiles
    bufs = [src, weights, *operands]
    if k.parallel and units > 1:
        threads = os.cpu_count() or 1
        share = -(-units // threads)
        count = -(-units // share)
        with k.parallel_loop(0, count, "rows") as part:
            kb = k.b
            lo = kb.mul(part, _c(share))
            hi = _min(kb, kb.add(lo, _c(share)), _c(units))
            kb.call(fn, [*[kb.bitcast(x.ptr, F32P) for x in (*bufs, y)], lo, hi])
    else:
        k.b.call(fn, [*[k.b.bitcast(x.ptr, F32P) for x in (*bufs, y)], _c(0), _c(units)])
