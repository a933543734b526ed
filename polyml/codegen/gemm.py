"""Packed GEMM with a register-tiled vector micro-kernel, emitted as LLVM IR.

``C[i][j] (+)= Σ_p A(i, p) · B(p, j)`` in BLIS's five loops.  In polyhedral terms this is the
schedule Polly's GEMM pattern optimizer produces (tile i, j, p by the cache blocks
``mc × nc × kc``, tile again by the register block ``mr × nr``, pack the two operand tiles into
contiguous panels, unroll-and-jam the register tile), written out by polyml itself so that

* the operands need not be plain arrays: ``A(i, p)`` and ``B(p, j)`` are callbacks emitting the
  element's load, so a transposed operand, or a convolution's input read as its im2col matrix
  (:mod:`polyml.kernels.conv`), is packed straight from where it lives, with no copy;
* an epilogue (bias, activation, residual add) runs on each register tile of C right after its
  last accumulation, while the tile is in L1;
* the micro-kernel keeps ``mr × nr/w`` vector accumulators in registers (``<w x float>``
  phis, one ``llvm.fma`` per accumulator and step of ``p``), sized from the host's vector
  registers, and the cache blocks from the host's caches;
* the rows or columns are split over OpenMP threads (each packs its own panels).

Polly's pattern path cannot take these liberties (it matches only ``C[i][j] += A[i][k] *
B[k][j]`` alone in its statement, and at LLVM 19 its tuned variant miscompiled large products,
:func:`polyml.driver.flags.polly_gemm_flags`), so products that reach this module are compiled with the plain ``-O3`` policy.  Nor
can polyml's JSCoP layer express it: a JSCoP import may change schedules and access relations
(and declare new arrays for them) but cannot add statements, and packing is two new copy
statements per block; the register tile additionally needs its accumulators promoted to
registers, which Polly's code generator does not do for an imported schedule.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import (
    F32,
    I64,
    Buffer,
    KernelBuilder,
    counted_loop,
    load_lanes,
    skip_polly,
    splat,
    store_lanes,
    vector_fma,
)
from polyml.errors import PolymlError

F32P = F32.as_pointer()

#: ``load(builder, pointers, row, col) -> float``: one element of an operand, where ``pointers``
#: are the block function's operand arguments (``float*``) and row/col ``i64`` values in range
Loader = Callable[[ir.IRBuilder, Sequence[ir.Value], ir.Value, ir.Value], ir.Value]
#: ``epilogue(builder, pointers, row, col, value) -> value``: applied to each final C element
Epilogue = Callable[[ir.IRBuilder, Sequence[ir.Value], ir.Value, ir.Value, ir.Value], ir.Value]


@dataclass(frozen=True)
class Blocking:
    """Register tile ``mr × nr`` (``nr`` a multiple of the vector width ``w``) and cache blocks."""

    mr: int
    nr: int
    width: int
    mc: int
    kc: int
    nc: int
    fma: bool = True
    #: ``kc`` and ``nc`` of products whose A is packed at run time (:func:`block_kc`,
    #: :func:`block_nc`); 0: ``kc``, ``nc``
    kc_wide: int = 0
    nc_wide: int = 0

    @property
    def vectors(self) -> int:
        return self.nr // self.width


def host_blocking(features: str, l1: int = 32 << 10, l2: int = 1 << 20, l3: int = 32 << 20) -> Blocking:
    """The blocking for a CPU with these LLVM target features and data cache sizes (bytes).

    AVX-512 (32 vector registers): a 12 × 32 tile, 24 zmm accumulators + 2 B vectors + 1
    broadcast of A.  AVX2 (16 registers): 6 × 16, 12 ymm accumulators.  ``kc`` sizes one
    ``kc × nr`` B micro-panel to L1, ``mc`` one ``mc × kc`` A block to a quarter of L2 and
    ``nc`` the ``kc × nc`` B block to half of it.  Where A is packed at run time (a MatMul of
    activations: :func:`block_kc`, :func:`block_nc`) ``kc_wide`` sizes the A block to half of L2
    and ``nc_wide`` the B block to half of L3 (at most 4096 columns): A is packed again for
    every column block, so on a host with an 8 MiB L3 the former 1/16 (160 columns) packed a
    2048³ product's A 13 times, 7 % of its time (``perf``, Zen 1, 1 thread); at half of L3
    (1360) twice: 0.95x the time at 1 and 2 threads.  Measured at 1024³ and 2048³ on the
    development host (48 KiB L1, 2 MiB L2; 2 threads): kc 256-384 beat 192 by 5-10 %, mc
    from 96 to 480 and nc from 512 to 1344 within noise (``POLYML_GEMM_BLOCKING`` overrides).
    """
    has = set(features.split(","))
    if "+avx512f" in has:
        mr, nr, w = 12, 32, 16
    elif "+avx2" in has or "+avx" in has:
        mr, nr, w = 6, 16, 8
    else:
        mr, nr, w = 4, 8, 4
    kc = max(64, min(384, l1 // (4 * nr) // 16 * 16))
    mc = max(mr, min(480, (l2 // 4) // (4 * kc) // mr * mr))
    nc = max(nr, min(4096, (l2 // 2) // (4 * kc) // nr * nr))
    kc_wide = max(kc, min(1024, (l2 // 2) // (4 * mc) // 16 * 16))
    nc_wide = max(nc, min(4096, (l3 // 2) // (4 * kc_wide) // nr * nr))
    return Blocking(mr, nr, w, mc, kc, nc, fma="+fma" in has or "+avx512f" in has, kc_wide=kc_wide,
                    nc_wide=nc_wide)


@dataclass(frozen=True)
class InPlaceB:
    """B read where it lies, for a convolution whose input was copied into stride-phase
    planes (:class:`polyml.kernels.conv.PhasePlanes`): reduction row ``p`` of B is the run
    ``src[offsets[p] + j]`` of operand ``operand``, for columns ``j`` in *pitch space*
    (``j = oh·pitch + ow``: each output row padded to the source's row pitch), so the
    micro-kernel loads its ``nr`` columns straight from the copy and nothing is packed.  C's
    column ``j`` is output position ``oh·width + ow``; the ``pitch - width`` columns past each
    row's end are computed and dropped when the tile is stored."""

    operand: int
    offsets: tuple[int, ...]
    pitch: int
    width: int


@dataclass(frozen=True)
class RegisterEpilogue:
    """An epilogue ``y = steps(c + bias[i])`` (``bias``: the operand index of a per-row bias,
    -1: none; ``steps``: ``("relu", None, None)`` or ``("clip", lo, hi)`` (a bound None: none),
    in order, each as the scalar kernels compute it) that the micro-kernel applies to its
    accumulators before the store after the last reduction block, instead of a pass that
    reloads the tile from C (:data:`REGISTER_EPILOGUE`)."""

    bias: int
    steps: tuple[tuple[str, float | None, float | None], ...] = ()

    @property
    def tag(self) -> str:
        """A name suffix unique to the epilogue's form and constants."""
        return f"{int(self.bias >= 0)}." + hashlib.sha256(repr(self.steps).encode()).hexdigest()[:8]

    def apply(self, b: ir.IRBuilder, v: ir.Value, bias: ir.Value | None) -> ir.Value:
        """The epilogue on a vector ``v`` of one row (``bias``: its bias, a scalar)."""
        vec = v.type
        if bias is not None:
            v = b.fadd(v, splat(b, bias, vec))
        for op, lo, hi in self.steps:
            if op == "relu":  # as the scalar ReLU: select(x > 0, x, 0), so NaN gives 0
                zero = ir.Constant(vec, [0.0] * vec.count)
                v = b.select(b.fcmp_ordered(">", v, zero), v, zero)
                continue
            if lo is not None:  # as the scalar Clip: NaN passes
                bound = ir.Constant(vec, [lo] * vec.count)
                v = b.select(b.fcmp_ordered("<", v, bound), bound, v)
            if hi is not None:
                bound = ir.Constant(vec, [hi] * vec.count)
                v = b.select(b.fcmp_ordered(">", v, bound), bound, v)
        return v


#: full register tiles apply a :class:`RegisterEpilogue` in registers (False: the epilogue pass on C)
REGISTER_EPILOGUE = True


@dataclass
class GemmSpec:
    """One product ``C (M×N, row stride ldc) = A (M×K) · B (K×N)`` and how to read it."""

    m: int
    n: int
    k: int
    load_a: Loader
    #: None when ``pack_b`` packs B itself
    load_b: Loader | None
    #: number of ``float*`` operand pointers the loaders and epilogue use (C excluded)
    operands: int
    ldc: int = 0
    epilogue: Epilogue | None = None
    #: ``kc`` blocks are a multiple of this (a convolution's taps, so a block holds whole
    #: input channels for :func:`im2col_packer`)
    kc_step: int = 1
    #: packs one ``kc × nr`` B panel instead of the element-wise loop over ``load_b``:
    #: ``pack(builder, ops, dst_panel, pc, kc, col0)`` (columns past N may hold anything)
    pack_b: Callable[..., None] | None = None
    #: operand 0 is A already in panel order (:func:`prepack_a`: a compile-time constant
    #: re-laid out once, so the block function does not pack it)
    prepacked_a: bool = False
    #: operand 1 is B already in panel order (:func:`prepack_b`: constant weights of a
    #: MatMul/Gemm, packed once at compile time instead of on every run)
    prepacked_b: bool = False
    #: > 0: operand 0 is A row-major with this row stride, read in place by the micro-kernel
    #: for whole ``mr``-row tiles (only a partial last panel is packed). For products with
    #: few column panels, where packing A costs more than its reuse saves (attention's
    #: 128×64 @ 64×128 heads: packing A was 20-30 % of the time)
    lda: int = 0
    #: makes the block function's builder (positioned in its new entry block); a kernel that
    #: evaluates its epilogue with a :class:`KernelBuilder` of its own passes one here
    make_builder: Callable[[ir.Function], ir.IRBuilder] | None = None
    #: B read in place in pitch space (``n`` counts pitch-space columns; C, row stride
    #: ``ldc``, is addressed by output position): see :class:`InPlaceB`
    in_place_b: InPlaceB | None = None
    #: the epilogue reads only the row (a per-channel chain: bias, activation, scale), not the
    #: column: :func:`_store_remapped` runs it on the stack tile, whose rows have the constant
    #: length ``nr``, before the remap
    epilogue_per_row: bool = False
    #: ``load_b`` reads a row-major B (a 1x1 convolution's input): pack each ``kc × nc`` block
    #: row by row (:func:`_pack_b_rows`) rather than panel by panel
    b_row_major: bool = False
    #: the epilogue in the simple form the micro-kernels apply to their registers
    #: (:class:`RegisterEpilogue`); ``epilogue`` still runs on the edge tiles
    register_epilogue: RegisterEpilogue | None = None

    def __post_init__(self) -> None:
        self.ldc = self.ldc or self.n
        if self.load_b is None and self.pack_b is None and self.in_place_b is None:
            raise ValueError("GemmSpec: B needs a load_b, a pack_b or in_place_b")
        if self.prepacked_b and (self.prepacked_a or self.lda):  # prepack_b's kc is block_kc's for a packed A
            raise ValueError("GemmSpec: a pre-packed B goes with an A packed at run time")
        if self.in_place_b is not None and len(self.in_place_b.offsets) != self.k:
            raise ValueError(f"GemmSpec: in_place_b has {len(self.in_place_b.offsets)} row offsets for K = {self.k}")


def packs_a(spec: GemmSpec) -> bool:
    """Whether the block function packs A at run time (not pre-packed, not read in place)."""
    return not spec.prepacked_a and not spec.lda


def kc_for(k: int, kc: int, step: int = 1) -> int:
    """The reduction block for ``K`` under a limit of ``kc``: the fewest blocks, of equal size
    (a multiple of ``step``), so that no short last block reads and writes C again for little
    work (1x1 512->128 @28 with ReLU, 1 thread: 384 + 128 → 256 + 256, 0.95x
    the time; K = 1152 of a 3x3 over 128 channels: 3 × 378 + 18 → 4 × 288).  The integer
    GEMM's blocks too (:func:`polyml.codegen.igemm.kc_for`)."""
    kc = max(step, kc // step * step)
    blocks = max(1, -(-k // kc))
    return max(step, _round_up(-(-k // blocks), step))  # K = 0: one step (loops over K never run)


def block_kc(spec: GemmSpec, blk: Blocking) -> int:
    """The reduction block of this product, a multiple of ``spec.kc_step``: at most
    ``blk.kc``, or ``blk.kc_wide`` where A is packed at run time (:func:`kc_for`).  Each ``kc``
    block reads and writes all of C once more; for a MatMul of activations whose C leaves the
    caches that traffic is what the wide block saves (2048³, 1 thread: kc 256 → 512, 173 →
    163-166 ms; 2 threads 0.95x the time).  A convolution's C (channels × positions) is small;
    its ``kc`` stays."""
    return kc_for(spec.k, (blk.kc_wide or blk.kc) if packs_a(spec) else blk.kc, spec.kc_step)


def block_nc(spec: GemmSpec, blk: Blocking) -> int:
    """The column block of this product.  Every ``nc`` block packs A's rows again, so where A
    is packed at run time the B block grows from L2 to L3 size (``nc_wide``): 2048³ MatMul,
    1 thread, 178 → 173 ms (nc 512 → 2048: A packed once instead of four times).  A
    pre-packed A (a convolution's weights) or one read in place costs nothing per block, and
    there the L2-sized B block stays, reused from L2 by every ``mc`` block of rows; but for
    at most :data:`THIN_A_ROWS` rows there is one ``mc`` block and little reuse, and the B
    block shrinks to :data:`THIN_B_BLOCK_BYTES` (at least two panels), packed and consumed
    from L1 (an L2-sized block evicted the input it was packed from).  Not where B is read
    in place: nothing is packed."""
    if packs_a(spec):
        return blk.nc_wide or blk.nc
    if blk.nr == 32 and spec.m <= THIN_A_ROWS and spec.in_place_b is None and not spec.prepacked_b:
        kc = min(block_kc(spec, blk), spec.k)
        return min(blk.nc, max(2 * blk.nr, THIN_B_BLOCK_BYTES // (4 * kc) // blk.nr * blk.nr))
    return blk.nc


#: a product of a pre-packed A of at most this many rows (0: none) packs B in blocks of :data:`THIN_B_BLOCK_BYTES` (at least two
#: panels; AVX-512).  Per step of whole models, minimum of 15-30, these blocks / the
#: L2 block of 672 columns: at 2 threads SqueezeNet's 64->16 and 128->16 @55 0.69-0.84,
#: 256->48 and 384->48 @13 0.93; at 1 thread its 128->16 0.83-0.90.  Fixed 64-column blocks
#: instead: ResNet-50's 256->64 @56 0.86-0.94, 64->64 @56 0.90; Inception-v1's 512->24 @13
#: 0.87-0.91, 832->48 @6 0.82; but SqueezeNet's 16->64 @55 1.10-1.20 (K = 16: a 4 KiB block),
#: hence the byte budget.  Whole models' GEMM steps in sum: MobileNetV2 0.98 (2 threads) and
#: 1.01 (1), ShuffleNet 0.96 / 0.95, EfficientNet-B0 0.98 / 0.99, DenseNet-121 0.99 (1)
THIN_A_ROWS = 64
THIN_B_BLOCK_BYTES = 32 << 10


#: reductions up to this long run the register tiles row panel by row panel (``ir`` outside
#: ``jr``): their B micro-panels are small enough to re-read from L1/L2, and C is written as
#: ``mr`` sequential streams instead of one per row of the ``mc`` block (see :func:`rows_outer`;
#: AVX2, steps of whole models interleaved, 1 thread, minimum of 18: 1x1 16->96
#: @112 0.83-0.85x (MobileNetV2), 0.95x with SiLU (EfficientNet-B0); 24->144 @56, 32->192 @28
#: and 32->16 @112 within 3 %).  AVX-512's 12 x 32 tile (:data:`ROWS_OUTER_MAX_K_WIDE`) keeps it
#: longer
ROWS_OUTER_MAX_K = 32
#: ... on AVX-512 hosts (32-column tiles): Sapphire Rapids class host,
#: ResNet-50's steps at 1 thread, ``ir`` outside / inside: 1x1 64->256 @56 0.87-0.94, 128->512
#: @28 0.94-0.97, 256->64 and 256->128 @56 0.97-0.99, 512->128 @28 0.99-1.03; whole models
#: alternated (minimum / median): ResNet-50 0.96 / 0.95 at 1 thread and 0.97 / 0.95 at 2,
#: Inception-v2 0.99 / 0.97 and DenseNet-121 0.98 / 0.98 at 2, MobileNetV2 1.00 / 1.02 at 2
ROWS_OUTER_MAX_K_WIDE = 512


def rows_outer(spec: GemmSpec, blk: Blocking) -> bool:
    """Whether the block function runs its ``ir`` loop outside ``jr`` (a loop interchange of
    two parallel tile loops, always legal).  With ``jr`` outside, a column panel of B stays in
    L1 for all row panels, the right order when each tile's reduction is long; with a short
    one the tiles are store-bound and the ``mc`` rows of C written side by side are that many
    write streams: MobileNetV2's 1x1 16->96 @112x112 writes 96 channel planes at once."""
    return spec.k <= (ROWS_OUTER_MAX_K_WIDE if blk.nr == 32 else ROWS_OUTER_MAX_K)


def packing_floats(spec: GemmSpec, blk: Blocking, m_part: int, n_part: int) -> int:
    """Floats of packing scratch one thread needs for an ``m_part × n_part`` share of C."""
    kc = min(block_kc(spec, blk), spec.k)
    mc = _round_up(min(blk.mc, spec.m), blk.mr)  # the block function's layout: see there
    nc = _round_up(min(block_nc(spec, blk), n_part), blk.nr)
    return (mc + nc) * kc + blk.mr * blk.nr


#: cost of packing one operand element, in multiply-adds of the micro-kernel (a scalar copy,
#: or for im2col a bounds check and a strided load, next to 1/16 of a vector FMA per MAC)
PACK_COST_MACS = 32
#: elements of a pre-packed operand read for the cost of one packed element
READ_PER_PACK = 4


def split(spec: GemmSpec, blk: Blocking, parts: int) -> tuple[str, int]:
    """Split C over ``parts`` threads along rows ("m") or columns ("n"); returns (dim, share).

    Shares are whole register tiles (multiples of ``mr`` or ``nr``), so only the last share has
    partial tiles.  Each thread packs the operand panels its share reads: a split along rows
    packs all of B in every thread, one along columns all of A (nothing when A is pre-packed).
    The split with the smaller cost of its busiest thread is taken: register tiles computed
    (``mr·nr·K`` multiply-adds each, partial ones counted whole) plus elements packed
    (:data:`PACK_COST_MACS` each).  Measured on ResNet-50's 1x1 convolutions on 14x14 maps
    (N = 196 = 6 tiles + 4 columns): a column split gave threads 4 and 3 tiles.
    """
    tiles_m, tiles_n = math.ceil(spec.m / blk.mr), math.ceil(spec.n / blk.nr)
    tile_macs = blk.mr * blk.nr * spec.k
    best = None
    for dim, tiles, other in (("n", tiles_n, tiles_m), ("m", tiles_m, tiles_n)):
        if tiles < parts and best is not None:
            continue
        per = math.ceil(tiles / parts)  # tiles in the busiest share
        # a pre-packed A is not packed but still streamed from memory by every thread
        a_all = spec.m * spec.k // (READ_PER_PACK if spec.prepacked_a else 1)
        a_share = per * blk.mr * spec.k // (READ_PER_PACK if spec.prepacked_a else 1)
        b_div = READ_PER_PACK if spec.prepacked_b or spec.in_place_b is not None else 1
        if dim == "n":
            packed = per * blk.nr * spec.k // b_div + a_all
        else:
            packed = spec.k * spec.n // b_div + a_share
        cost = per * other * tile_macs + PACK_COST_MACS * packed
        if best is None or cost < best[0]:
            best = (cost, dim, per)
    _, dim, per = best
    return dim, per * (blk.nr if dim == "n" else blk.mr)


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def _c(v: int) -> ir.Constant:
    return ir.Constant(I64, v)


def _min(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)


@contextmanager
def for_range(b: ir.IRBuilder, lo: ir.Value | int, hi: ir.Value | int, step: int = 1, name: str = "i",
              hints: Sequence[str | tuple[str, int]] = ()) -> Iterator[ir.Value]:
    """``for (iv = lo; iv < hi; iv += step)`` on a raw builder (:func:`counted_loop`); yields ``iv``."""
    with counted_loop(b, _c(lo) if isinstance(lo, int) else lo, _c(hi) if isinstance(hi, int) else hi, name, name,
                      step, hints=hints) as iv:
        yield iv


def _function(module: ir.Module, name: str, args: Sequence[ir.Type], attrs: Sequence[str], wide: bool) -> ir.Function:
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), list(args)), name)
    for a in attrs:
        set.add(fn.attributes, a)
    if wide:
        # explicit <16 x float> values are split into two ymm halves unless the function
        # allows 512-bit legal types (x86 prefers 256 bits by default)
        set.add(fn.attributes, '"prefer-vector-width"="512"')
        set.add(fn.attributes, '"min-legal-vector-width"="512"')
    return fn


def add_edge_tile(b: ir.IRBuilder, tile: ir.Value, nr: int, c_addr: Callable[[ir.Value, ir.Value], ir.Value],
                  i0: ir.Value, j0: ir.Value, rows: ir.Value, cols: ir.Value, first: ir.Value, zero: ir.Constant,
                  add: Callable[[ir.Value, ir.Value], ir.Value]) -> None:
    """An edge tile's ``rows × cols`` results (stack tile, row pitch ``nr``) added (``add``)
    into C at ``(i0, j0)``, to ``zero`` on the first reduction block."""
    with for_range(b, 0, rows, name="edge.r") as r:
        with for_range(b, 0, cols, name="edge.c") as cc:
            t = b.load(b.gep(tile, [b.add(b.mul(r, _c(nr)), cc)], inbounds=True))
            dst = c_addr(b.add(i0, r), b.add(j0, cc))
            b.store(add(b.select(first, zero, b.load(dst)), t), dst)


def tile_loop(b: ir.IRBuilder, zero: ir.Constant, mr: int, vectors: int, trip: ir.Value, iv_name: str,
              step: Callable[[ir.Value, list[list[ir.Value]]], list[list[ir.Value]]], c: ir.Value, ldc: ir.Value,
              accumulate: ir.Value, add: Callable[[ir.Value, ir.Value], ir.Value], cols: int = 0,
              post: Callable[[int, ir.Value], ir.Value] | None = None) -> None:
    """The micro-kernels' common frame (float :func:`micro_kernel`, integer
    :func:`polyml.codegen.igemm.micro_kernel`): ``mr × vectors`` register accumulators of the
    vector type of ``zero``, ``zero`` on entry, carried by phis through ``for (iv = 0; iv < trip; ++iv) accs =
    step(iv, accs)`` (the reduction, one rank-1 update per step), then the tile stored row by
    row into ``C`` (row stride ``ldc``) or, with ``accumulate``, added to it (``add``); ends the
    function (``ret void``).  Before the reduction the tile's C lines (first and last element of
    each row) are prefetched for writing (:data:`C_PREFETCH`), so the store at the end does not
    wait for them.  ``cols`` (float tiles): only the first ``cols`` columns of each row are
    stored (masked), 0: all; ``post(r, value)``: applied to each of row ``r``'s vectors
    before the store (after the add)."""
    vec = zero.type
    width = vec.count
    if C_PREFETCH:
        for r in range(mr):
            c_row = b.gep(c, [b.mul(ldc, _c(r), flags=["nsw"])], inbounds=True)
            for off in (0, vectors * width - 1):
                _prefetch(b, b.gep(c_row, [_c(off)], inbounds=True), write=True)
    entry = b.block
    loop = b.append_basic_block("k.body")
    done = b.append_basic_block("k.done")
    b.cbranch(b.icmp_signed(">", trip, _c(0)), loop, done)
    b.position_at_end(loop)
    iv = b.phi(I64, iv_name)
    iv.add_incoming(_c(0), entry)
    accs = [[b.phi(vec, f"acc{r}.{v}") for v in range(vectors)] for r in range(mr)]
    for row in accs:
        for acc in row:
            acc.add_incoming(zero, entry)
    new_accs = step(iv, accs)
    iv_next = b.add(iv, _c(1), flags=["nsw"])
    iv.add_incoming(iv_next, loop)
    for r in range(mr):
        for v in range(vectors):
            accs[r][v].add_incoming(new_accs[r][v], loop)
    b.cbranch(b.icmp_signed("<", iv_next, trip), loop, done)
    b.position_at_end(done)
    finals = [[b.phi(vec) for _ in range(vectors)] for _ in range(mr)]
    for r in range(mr):
        for v in range(vectors):
            finals[r][v].add_incoming(zero, entry)
            finals[r][v].add_incoming(new_accs[r][v], loop)
    add_bb = b.append_basic_block("c.add")
    set_bb = b.append_basic_block("c.set")
    b.cbranch(accumulate, add_bb, set_bb)
    for bb, accumulating in ((add_bb, True), (set_bb, False)):
        b.position_at_end(bb)
        for r in range(mr):
            c_row = b.gep(c, [b.mul(ldc, _c(r), flags=["nsw"])], inbounds=True)
            finish = (lambda v, r=r: post(r, v)) if post is not None else (lambda v: v)
            for v in range(vectors):
                count = cols - v * width if cols else width  # lanes of this vector stored
                if count <= 0:
                    continue
                ptr = b.bitcast(b.gep(c_row, [_c(v * width)], inbounds=True), vec.as_pointer())
                val = finals[r][v]
                if accumulating:
                    val = add(load_lanes(b, ptr, count), val)
                store_lanes(b, finish(val), ptr, count)
        b.ret_void()


def micro_kernel(module: ir.Module, blk: Blocking, attrs: Sequence[str], lda: int = 0, b_rows: bool = False,
                 b_pitch: int = 0, a_pitch: int = 0, cols: int = 0, epilogue: RegisterEpilogue | None = None
                 ) -> ir.Function:
    """``ukernel(kc, Ap, Bp, C, ldc, accumulate)``: one ``mr × nr`` register tile of C.

    ``Ap`` is an ``kc × mr`` packed A panel (``lda`` > 0: ``mr`` rows of A in place, row
    stride ``lda``), ``Bp`` a ``kc × nr`` packed B panel (``b_rows``: B in place, step ``p``
    reads ``Bp + rows[p]``, an extra ``i32*`` argument ``rows`` after ``Bp``); for each step
    ``p`` the kernel loads ``nr/w`` vectors of B, broadcasts each of the ``mr`` A values and
    accumulates ``mr · nr/w`` FMAs into vector registers; at the end it stores (or, with
    ``accumulate``, adds) the tile into ``C`` with row stride ``ldc``.  ``b_pitch``: the packed
    panel's row length when it is wider than ``nr`` (a narrow kernel on the first columns of a
    wider panel, :func:`narrow_kernels`); ``a_pitch`` the packed A panel's row length when it
    is higher than ``mr`` (a short kernel on the first rows of a wider panel, :func:`short_kernel`);
    ``cols``: the tile stores only its first ``cols`` columns (masked; :func:`in_place_tail`);
    ``epilogue``: two more arguments ``(bias_rows, last)``, the bias of the tile's first row and
    whether this is the last reduction block, after which the tile is stored as
    ``act(c + bias[r])`` (:class:`RegisterEpilogue`).
    """
    b_pitch = b_pitch or blk.nr
    a_pitch = a_pitch or blk.mr
    name = (f"polyml.ukernel.{blk.mr}x{blk.nr}" + (f".lda{lda}" if lda else "") + (".rows" if b_rows else "")
            + (f".pitch{b_pitch}" if b_pitch != blk.nr else "") + (f".apitch{a_pitch}" if a_pitch != blk.mr else "")
            + (f".cols{cols}" if cols else "")
            + (f".epi{epilogue.tag}" if epilogue is not None else ""))
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    vec = ir.VectorType(F32, blk.width)
    i32p = ir.IntType(32).as_pointer()
    fn = _function(module, name, [I64, F32P, F32P, *([i32p] if b_rows else []), F32P, I64, ir.IntType(1),
                                  *([F32P, ir.IntType(1)] if epilogue is not None else [])], attrs, blk.width == 16)
    fn.linkage = "internal"
    if cols:  # masked stores (see column_kernel)
        skip_polly(fn)
    args = list(fn.args)
    if epilogue is not None:
        bias_rows, last = args[-2:]
        args = args[:-2]
    if b_rows:
        kc, ap, bp, rows_at, c, ldc, accumulate = args
    else:
        kc, ap, bp, c, ldc, accumulate = args
    for a in (ap, bp, c):
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(vec, [0.0] * blk.width)
    fma = None
    if blk.fma:
        fma = vector_fma(module, blk.width)
    def step(p: ir.Value, accs: list[list[ir.Value]]) -> list[list[ir.Value]]:
        if b_rows:
            b_row = b.gep(bp, [b.sext(b.load(b.gep(rows_at, [p], inbounds=True)), I64)], inbounds=True)
        else:
            b_row = b.gep(bp, [b.mul(p, _c(b_pitch), flags=["nsw"])], inbounds=True)
        b_vecs = [b.load(b.bitcast(b.gep(b_row, [_c(v * blk.width)], inbounds=True), vec.as_pointer()), align=4)
                  for v in range(blk.vectors)]
        a_row = b.gep(ap, [p if lda else b.mul(p, _c(a_pitch), flags=["nsw"])], inbounds=True)
        if A_PREFETCH and not lda and not b_rows:
            _prefetch(b, b.gep(a_row, [_c(A_PREFETCH)], inbounds=False))
        new_accs = []
        for r in range(blk.mr):
            a_val = b.load(b.gep(a_row, [_c(r * lda if lda else r)], inbounds=True))
            a_vec = splat(b, a_val, vec)
            row = []
            for v in range(blk.vectors):
                acc = accs[r][v]
                if fma is not None:
                    row.append(b.call(fma, [a_vec, b_vecs[v], acc]))
                else:
                    row.append(b.fadd(acc, b.fmul(a_vec, b_vecs[v])))
            new_accs.append(row)
        return new_accs

    post = None
    if epilogue is not None:
        def post(r: int, v: ir.Value) -> ir.Value:
            bias = b.load(b.gep(bias_rows, [_c(r)], inbounds=True)) if epilogue.bias >= 0 else None
            return b.select(last, epilogue.apply(b, v, bias), v)

    tile_loop(b, zero, blk.mr, blk.vectors, kc, "p", step, c, ldc, accumulate, b.fadd, cols, post)
    return fn


#: fewest lanes of a narrow kernel's vectors (an SSE register)
NARROW_MIN_LANES = 4


def narrow_kernels(module: ir.Module, blk: Blocking, attrs: Sequence[str], lda: int,
                   tail: int) -> tuple[int, tuple[ir.Function, ...]]:
    """``(cols, kernels)``: micro-kernels ``cols`` wide on the same packed panels (the packed-A
    one, and with ``lda`` the one reading A in place) for the last column panel, which holds
    ``tail`` (``N mod nr``) columns: the narrowest of ``nr/2``, ``nr/4``, .. (vectors of at least
    :data:`NARROW_MIN_LANES` lanes) that holds them, so that panel computes less padding (a
    7x7 map: 49 columns, the fourth 16-column panel holds one); ``(0, ())`` where none is
    narrower than ``nr``.  Below the vector width the vectors get narrower: on AVX2 a 4-column
    kernel runs on SSE registers, whose FMA is one micro-op where a 256-bit one is two on
    128-bit FMA units (Zen 1).  Called on a branch, not through a selected pointer (an
    indirect call: no gain measured).  MobileNetV2 at 1 thread, AVX2 (Zen 1), per step, minimum
    of 20: half width with / without every 1x1 @7x7 0.91-0.92, @14x14
    0.94-0.98; the narrowest / half width @7x7 0.94-0.95, @14x14 0.98-0.99."""
    cols = blk.nr
    while cols // 2 >= max(tail, NARROW_MIN_LANES):
        cols //= 2
    if not tail or cols == blk.nr:
        return 0, ()
    narrow = replace(blk, nr=cols, width=min(blk.width, cols))
    return cols, (micro_kernel(module, narrow, attrs, b_pitch=blk.nr),
                  *([micro_kernel(module, narrow, attrs, lda, b_pitch=blk.nr)] if lda else []))


#: most tail columns :func:`column_kernel` takes (0: none, the last panel's columns by
#: :func:`narrow_kernels` alone)
COLUMN_KERNEL_MAX = 12


def edge_columns(blk: Blocking, tail: int) -> tuple[int, int]:
    """``(w, r)``: how the last column panel's ``tail`` (``N mod nr``) columns are computed: a
    ``w``-column micro-kernel (``nr`` or a narrow one; 0: none) on the first ones and
    :func:`column_kernel` on the ``r`` after them (0: none), the split of least estimated time
    per reduction step.  A ``w``-column kernel issues ``mr · ⌈w/width⌉`` FMAs and ``mr +
    ⌈w/width⌉`` loads whatever the tail, the column kernel ``⌈mr/width⌉`` FMAs and loads per
    column plus its A vectors (two FMA and two load ports): 49 columns (a 7x7 map) in 32-column
    panels leave 17, one 16-column kernel and one column (7.5 cycles a step against 12 for the
    whole 32-column kernel); 196 (14x14) leave 4, four columns (2.5 against 6.5 for the 4-lane
    narrow kernel)."""
    if not tail:
        return 0, 0
    row_vectors = -(-blk.mr // blk.width)

    def kernel(w: int) -> float:
        v = max(1, w // blk.width)
        return max(blk.mr * v, blk.mr + v) / 2 if w else 0.0

    def columns(r: int) -> float:
        return max(r * row_vectors, r + row_vectors) / 2 if r else 0.0

    widths, w = [], blk.nr
    while w >= NARROW_MIN_LANES:
        widths.append(w)
        w //= 2
    if row_vectors > 2:  # a column of A would need more vectors than a register tile has rows
        return next(w for w in reversed(widths) if w >= tail), 0
    # least time, then fewest columns, then the narrowest kernel
    _, r, w = min((kernel(w) + columns(max(0, tail - w)), max(0, tail - w), w) for w in [*widths, 0]
                  if tail - w <= COLUMN_KERNEL_MAX)
    return w, r


def column_kernel(module: ir.Module, blk: Blocking, attrs: Sequence[str], cols: int) -> ir.Function:
    """``colk(kc, Ap, Bp, T)``: ``cols`` columns of an ``mr``-row register tile with vectors
    along the tile's rows instead of its columns: per reduction step ``p`` the packed A panel's
    ``mr`` values (contiguous) are ``⌈mr/width⌉`` vectors (the last masked) and each column's B
    value ``Bp[p·nr + j]`` one broadcast, so a column costs ``⌈mr/width⌉`` FMAs a step where a
    register tile of columns costs ``mr`` per vector of them.  Short dependence chains are
    split over ``p`` (up to 4 partial sums, added at the end).  The results go to the stack
    tile ``T[r·nr + j]`` (pitch ``nr``; callers offset ``Bp`` and ``T`` to the first column)."""
    name = f"polyml.colkernel.{blk.mr}x{cols}.w{blk.width}.pitch{blk.nr}"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    width, mr, nr = blk.width, blk.mr, blk.nr
    vec = ir.VectorType(F32, width)
    row_vectors = -(-mr // width)
    fn = _function(module, name, [I64, F32P, F32P, F32P], attrs, width == 16)
    fn.linkage = "internal"
    skip_polly(fn)  # masked loads: Polly 19 crashed exporting its SCoP (as the depthwise kernel's)
    kc, ap, bp, tile = fn.args
    for a in (ap, bp, tile):
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(vec, [0.0] * width)
    fma = None
    if blk.fma:
        fma = vector_fma(module, width)
    last_lanes = mr - (row_vectors - 1) * width
    chains = max(1, min(4, 8 // (cols * row_vectors)))

    def a_vectors(p: ir.Value) -> list[ir.Value]:
        row = b.gep(ap, [b.mul(p, _c(mr), flags=["nsw"])], inbounds=True)
        out = []
        for v in range(row_vectors):
            ptr = b.bitcast(b.gep(row, [_c(v * width)], inbounds=True), vec.as_pointer())
            out.append(load_lanes(b, ptr, last_lanes if v == row_vectors - 1 else width))
        return out

    def update(p: ir.Value, accs: list[list[ir.Value]]) -> list[list[ir.Value]]:
        a = a_vectors(p)
        b_row = b.gep(bp, [b.mul(p, _c(nr), flags=["nsw"])], inbounds=True)
        new = []
        for j in range(cols):
            bj = splat(b, b.load(b.gep(b_row, [_c(j)], inbounds=True)), vec)
            new.append([b.call(fma, [a[v], bj, accs[j][v]]) if fma is not None
                        else b.fadd(accs[j][v], b.fmul(a[v], bj)) for v in range(row_vectors)])
        return new

    def loop(lo: ir.Value, hi: ir.Value, step: int, init: list[list[list[ir.Value]]], tag: str
             ) -> list[list[list[ir.Value]]]:
        """``for (p = lo; p < hi; p += step)``: ``step`` partial sums, step ``u`` of each
        iteration into the ``u``-th."""
        entry = b.block
        body = b.append_basic_block(f"{tag}.body")
        done = b.append_basic_block(f"{tag}.done")
        b.cbranch(b.icmp_signed("<", lo, hi), body, done)
        b.position_at_end(body)
        p = b.phi(I64, f"{tag}.p")
        p.add_incoming(lo, entry)
        phis = [[[b.phi(vec) for _ in range(row_vectors)] for _ in range(cols)] for _ in range(step)]
        for u in range(step):
            for j in range(cols):
                for v in range(row_vectors):
                    phis[u][j][v].add_incoming(init[u][j][v], entry)
        new = [update(b.add(p, _c(u), flags=["nsw"]), phis[u]) for u in range(step)]
        p_next = b.add(p, _c(step), flags=["nsw"])
        p.add_incoming(p_next, body)
        for u in range(step):
            for j in range(cols):
                for v in range(row_vectors):
                    phis[u][j][v].add_incoming(new[u][j][v], body)
        b.cbranch(b.icmp_signed("<", p_next, hi), body, done)
        b.position_at_end(done)
        out = [[[b.phi(vec) for _ in range(row_vectors)] for _ in range(cols)] for _ in range(step)]
        for u in range(step):
            for j in range(cols):
                for v in range(row_vectors):
                    out[u][j][v].add_incoming(init[u][j][v], entry)
                    out[u][j][v].add_incoming(new[u][j][v], body)
        return out

    zeros = [[[zero] * row_vectors for _ in range(cols)] for _ in range(chains)]
    main_end = b.mul(b.sdiv(kc, _c(chains)), _c(chains))
    partial = loop(_c(0), main_end, chains, zeros, "colk")
    sums = partial[0]
    for u in range(1, chains):
        sums = [[b.fadd(sums[j][v], partial[u][j][v]) for v in range(row_vectors)] for j in range(cols)]
    if chains > 1:
        (sums,) = loop(main_end, kc, 1, [sums], "colk.rest")
    for j in range(cols):
        for r in range(mr):
            v, lane = divmod(r, width)
            b.store(b.extract_element(sums[j][v], _c(lane)), b.gep(tile, [_c(r * nr + j)], inbounds=True))
    b.ret_void()
    return fn


@dataclass(frozen=True)
class EdgeColumns:
    """The last column panel's ``tail`` columns: ``kernel`` (None: none) on the first
    ``width``, ``columns`` (:func:`column_kernel`) on the rest."""

    tail: int
    width: int
    kernel: ir.Function | None
    columns: ir.Function


def edge_column_kernels(module: ir.Module, blk: Blocking, attrs: Sequence[str], tail: int,
                        ukernel: ir.Function) -> EdgeColumns | None:
    """The kernels of :func:`edge_columns`'s split of the last panel, or None where it
    takes no column kernel (then :func:`narrow_kernels`)."""
    width, rest = edge_columns(blk, tail)
    if not rest:
        return None
    if width == blk.nr:
        kernel = ukernel
    elif width:
        kernel = micro_kernel(module, replace(blk, nr=width, width=min(blk.width, width)), attrs, b_pitch=blk.nr)
    else:
        kernel = None
    return EdgeColumns(tail, width, kernel, column_kernel(module, blk, attrs, rest))


def short_kernel(module: ir.Module, spec: GemmSpec, blk: Blocking, attrs: Sequence[str]) -> ir.Function | None:
    """The micro-kernel of the product's last, partial row panel (``M mod mr`` rows, read from
    the packed ``mr``-high panel), or None where ``mr`` divides M.  Shares and ``mc`` blocks
    are whole panels, so that is the only partial panel; its whole-width tiles go straight
    into C and compute only the rows that exist, where the ``mr``-row kernel computed the
    padding too and went through the stack tile (32 output channels: 2 of 6 rows)."""
    rest = spec.m % blk.mr
    if not rest:
        return None
    return micro_kernel(module, replace(blk, mr=rest), attrs, b_rows=spec.in_place_b is not None, a_pitch=blk.mr)


def block_function(module: ir.Module, name: str, spec: GemmSpec, blk: Blocking, attrs: Sequence[str]) -> ir.Function:
    """``block(operands..., C, scratch, m0, m1, n0, n1)``: ``C[m0:m1, n0:n1]`` by the five loops.

    ``jc`` (columns by ``nc``) → ``pc`` (reduction by ``kc``; pack B's ``kc × nc`` block into
    ``nr``-wide panels) → ``ic`` (rows by ``mc``; pack A's ``mc × kc`` block into ``mr``-high
    panels) → ``jr`` → ``ir`` (register tiles: the micro-kernel).  Partial tiles at the edges
    go through a stack tile and a guarded copy; the epilogue runs per tile after the last
    ``pc`` block.
    """
    in_place = spec.in_place_b
    ukernel = micro_kernel(module, blk, attrs, b_rows=in_place is not None)
    direct = spec.lda > 0 and not spec.prepacked_a
    epi = spec.register_epilogue if REGISTER_EPILOGUE and spec.epilogue is not None and not direct else None
    epi_kernel = micro_kernel(module, blk, attrs, b_rows=in_place is not None, epilogue=epi) if epi else None
    tail = in_place_tail(module, in_place, blk, attrs, epi) if in_place is not None else None
    direct_kernel = micro_kernel(module, blk, attrs, spec.lda) if direct else None
    columns = None if direct else edge_column_kernels(module, blk, attrs, spec.n % blk.nr, ukernel)
    narrow = (0, ()) if columns else narrow_kernels(module, blk, attrs, spec.lda if direct else 0, spec.n % blk.nr)
    short = short_kernel(module, spec, blk, attrs)
    args = [F32P] * spec.operands + [F32P, F32P, I64, I64, I64, I64]
    fn = _function(module, name, args, attrs, blk.width == 16)
    fn.attributes.add("noinline")
    *ops, c, scratch, m0, m1, n0, n1 = fn.args
    for a in (*ops, c, scratch):
        a.add_attribute("noalias")
    b = spec.make_builder(fn) if spec.make_builder else ir.IRBuilder(fn.append_basic_block("entry"))
    mr, nr = blk.mr, blk.nr
    # scratch: [edge tile mr*nr][A block mc*kc][B block kc*nc] (nc bounded by the share)
    kc_block = block_kc(spec, blk)
    kc_max = min(kc_block, spec.k)
    mc_pad = _round_up(min(blk.mc, spec.m), mr)
    tile = scratch
    a_pack = b.gep(scratch, [_c(mr * nr)], inbounds=True)
    b_pack = b.gep(a_pack, [_c(mc_pad * kc_max)], inbounds=True)
    ldc = _c(spec.ldc)
    row_table = None
    if in_place is not None:  # the reduction rows' offsets, a constant table
        table_type = ir.ArrayType(ir.IntType(32), spec.k)
        row_table = ir.GlobalVariable(module, table_type, f"{name}.brows")
        row_table.global_constant = True
        row_table.linkage = "internal"
        row_table.initializer = ir.Constant(table_type, [int(o) for o in in_place.offsets])

    def c_addr(i: ir.Value, j: ir.Value) -> ir.Value:
        return b.gep(c, [b.add(b.mul(i, ldc, flags=["nsw"]), j, flags=["nsw"])], inbounds=True)

    def in_registers(kernel: ir.Function | None) -> Callable[[list[ir.Value], ir.Value, ir.Value], None] | None:
        """``call(args, i0, last)``: ``kernel`` (an ``epilogue`` variant) with the bias of row
        ``i0`` and ``last``; None without a register epilogue."""
        if epi is None:
            return None

        def call(args: list[ir.Value], i0: ir.Value, last: ir.Value) -> None:
            bias_rows = b.gep(ops[epi.bias], [i0], inbounds=True) if epi.bias >= 0 else c
            b.call(kernel, [*args, bias_rows, last])
        return call

    nc_block = block_nc(spec, blk)
    n_blocks = b.sdiv(b.add(b.sub(n1, n0), _c(nc_block - 1)), _c(nc_block))
    with for_range(b, 0, n_blocks, name="jc") as jcb:
        jc = b.add(n0, b.mul(jcb, _c(nc_block)))
        nc = _min(b, _c(nc_block), b.sub(n1, jc))
        with for_range(b, 0, spec.k, kc_block, name="pc") as pc:
            kc = _min(b, _c(kc_block), b.sub(_c(spec.k), pc))
            first = b.icmp_signed("==", pc, _c(0))
            last = b.icmp_signed("==", b.add(pc, kc), _c(spec.k))
            # pack B[pc:pc+kc, jc:jc+nc] into nr-wide panels: Bp[jp][p][jj]; columns past the
            # end read the last column (their results are never stored)
            panels_n = b.sdiv(b.add(nc, _c(nr - 1)), _c(nr))
            if in_place is not None:
                b_block = None
            elif spec.prepacked_b:  # panels of columns jc.. in the kc block at pc: B + pc*Npad + jc*kc
                b_block = b.gep(ops[1], [b.add(b.mul(pc, _c(_round_up(spec.n, nr))), b.mul(jc, kc))], inbounds=True)
            elif spec.b_row_major and spec.pack_b is None:
                b_block = b_pack
                _pack_b_rows(b, spec, ops, b_pack, pc, kc, jc, nc, panels_n, nr)
            else:
                b_block = b_pack
                with for_range(b, 0, panels_n, name="pack_b.jp") as jp:
                    dst_panel = b.gep(b_pack, [b.mul(b.mul(jp, kc), _c(nr))], inbounds=True)
                    col0 = b.add(jc, b.mul(jp, _c(nr)))
                    if spec.pack_b is not None:
                        spec.pack_b(b, ops, dst_panel, pc, kc, col0)
                    else:
                        _pack_b_panel(b, spec, ops, dst_panel, pc, kc, col0, nr)
            m_blocks = b.sdiv(b.add(b.sub(m1, m0), _c(blk.mc - 1)), _c(blk.mc))
            with for_range(b, 0, m_blocks, name="ic") as icb:
                ic = b.add(m0, b.mul(icb, _c(blk.mc)))
                mc = _min(b, _c(blk.mc), b.sub(m1, ic))
                panels_m = b.sdiv(b.add(mc, _c(mr - 1)), _c(mr))
                if spec.prepacked_a:  # panels of rows ic.. in the kc block at pc: A + pc*Mpad + ic*kc
                    a_block = b.gep(ops[0], [b.add(b.mul(pc, _c(_round_up(spec.m, mr))), b.mul(ic, kc))], inbounds=True)
                else:
                    a_block = a_pack  # in place: only the partial last panel (rows past M)
                    partial = b.sdiv(mc, _c(mr)) if direct else _c(0)
                    _pack_a(b, spec, ops, a_pack, ic, pc, kc, panels_m, mr, partial)
                def register_tile(jp: ir.Value, ipn: ir.Value) -> None:
                    jr = b.mul(jp, _c(nr))
                    cols = _min(b, _c(nr), b.sub(nc, jr))
                    ir_ = b.mul(ipn, _c(mr))
                    rows = _min(b, _c(mr), b.sub(mc, ir_))
                    ap = b.gep(a_block, [b.mul(ir_, kc)], inbounds=True)
                    i0 = b.add(ic, ir_)
                    j0 = b.add(jc, jr)
                    if in_place is not None:
                        bp = b.gep(ops[in_place.operand], [b.add(jc, jr)], inbounds=True)
                        rows_at = b.gep(row_table, [_c(0), pc], inbounds=True)
                        _store_in_place_tile(b, spec, ops, ukernel, short, kc, ap, bp, rows_at, tile, first, last,
                                             i0, j0, rows, cols, c, c_addr, mr, nr, tail,
                                             in_registers(epi_kernel),
                                             in_registers(tail[1]) if tail else None)
                    else:
                        bp = b.gep(b_block, [b.mul(jr, kc)], inbounds=True)
                        _store_tile(b, spec, ops, blk, ukernel, direct_kernel if direct else None, narrow, short, ap,
                                    bp, tile, first, last, i0, j0, pc, kc, rows, cols, c_addr, columns,
                                    in_registers(epi_kernel))

                if rows_outer(spec, blk):  # a row panel's tiles along C's rows, then the next panel
                    with for_range(b, 0, panels_m, name="ir") as ipn, for_range(b, 0, panels_n, name="jr") as jp:
                        register_tile(jp, ipn)
                else:  # a column panel of B, kept in L1, against every row panel of A
                    with for_range(b, 0, panels_n, name="jr") as jp, for_range(b, 0, panels_m, name="ir") as ipn:
                        register_tile(jp, ipn)
    b.ret_void()
    return fn


def _store_tile(b: ir.IRBuilder, spec: GemmSpec, ops: Sequence[ir.Value], blk: Blocking, ukernel: ir.Function,
                direct_kernel: ir.Function | None, narrow: tuple[int, Sequence[ir.Function]], short: ir.Function | None,
                ap: ir.Value, bp: ir.Value, tile: ir.Value, first: ir.Value, last: ir.Value, i0: ir.Value,
                j0: ir.Value, pc: ir.Value, kc: ir.Value, rows: ir.Value, cols: ir.Value,
                c_addr: Callable[[ir.Value, ir.Value], ir.Value], columns: EdgeColumns | None = None,
                whole_in_registers: Callable[[list[ir.Value], ir.Value, ir.Value], None] | None = None) -> None:
    """One register tile of C: whole tiles straight into C, so are the whole-width tiles of
    the partial row panel (by the ``short`` kernel); the other edge tiles through the stack
    tile (those of at most ``narrow[0]`` columns by a ``narrow`` kernel, those of the last
    panel's ``columns.tail`` by its kernels); the epilogue after the last ``kc`` block (in the
    whole tiles' registers with ``whole_in_registers``: :class:`RegisterEpilogue`)."""
    mr, nr = blk.mr, blk.nr
    ldc = _c(spec.ldc)
    full = b.and_(b.icmp_signed("==", rows, _c(mr)), b.icmp_signed("==", cols, _c(nr)))
    kernel = ukernel
    narrow_cols, narrow_fns = narrow
    edge_kernel = narrow_fns[0] if narrow_fns else None
    if direct_kernel is not None:  # whole row tiles read A in place, the partial one its panel
        ap_in_place = b.gep(ops[0], [b.add(b.mul(i0, _c(spec.lda)), pc)], inbounds=True)
        whole_rows = b.icmp_signed("==", rows, _c(mr))
        ap = b.select(whole_rows, ap_in_place, ap)
        kernel = b.select(whole_rows, direct_kernel, ukernel)
        if narrow_fns:
            edge_kernel = b.select(whole_rows, narrow_fns[1], narrow_fns[0])
    with b.if_else(full) as (then, otherwise):
        with then:
            if whole_in_registers is not None:
                whole_in_registers([kc, ap, bp, c_addr(i0, j0), ldc, b.not_(first)], i0, last)
            else:
                b.call(kernel, [kc, ap, bp, c_addr(i0, j0), ldc, b.not_(first)])
                # constant bounds: LLVM vectorizes the epilogue along the tile's row
                _tile_epilogue(b, spec, ops, last, i0, j0, _c(mr), _c(nr), c_addr)
        with otherwise:
            def into_tile(k: ir.Value) -> None:
                b.call(k, [kc, ap, bp, tile, _c(nr), ir.Constant(ir.IntType(1), 0)])

            def edge_tile() -> None:
                if columns is not None:
                    with b.if_else(b.icmp_signed("==", cols, _c(columns.tail))) as (tail_tile, wide_tile):
                        with tail_tile:
                            if columns.kernel is not None:
                                into_tile(columns.kernel)
                            at = _c(columns.width)
                            b.call(columns.columns, [kc, ap, b.gep(bp, [at], inbounds=True),
                                                     b.gep(tile, [at], inbounds=True)])
                        with wide_tile:
                            into_tile(kernel)
                elif edge_kernel is None:
                    into_tile(kernel)
                else:
                    with b.if_else(b.icmp_signed("<=", cols, _c(narrow_cols))) as (narrow_tile, wide_tile):
                        with narrow_tile:
                            into_tile(edge_kernel)
                        with wide_tile:
                            into_tile(kernel)
                add_edge_tile(b, tile, nr, c_addr, i0, j0, rows, cols, first, ir.Constant(F32, 0.0), b.fadd)
                _tile_epilogue(b, spec, ops, last, i0, j0, rows, cols, c_addr)

            _short_or(b, spec, short, mr, nr, rows, cols, edge_tile,
                      lambda: b.call(short, [kc, ap, bp, c_addr(i0, j0), ldc, b.not_(first)]),
                      lambda: _tile_epilogue(b, spec, ops, last, i0, j0, _c(spec.m % mr), _c(nr), c_addr))


def _short_or(b: ir.IRBuilder, spec: GemmSpec, short: ir.Function | None, mr: int, nr: int, rows: ir.Value,
              cols: ir.Value, edge_tile: Callable[[], None], call_short: Callable[[], None],
              short_epilogue: Callable[[], None]) -> None:
    """A tile that is not whole: where it is the partial row panel's at full width, the
    ``short`` kernel straight into C and the epilogue on constant bounds; else ``edge_tile``."""
    if short is None:
        edge_tile()
        return
    short_tile = b.and_(b.icmp_signed("==", rows, _c(spec.m % mr)), b.icmp_signed("==", cols, _c(nr)))
    with b.if_else(short_tile) as (then, otherwise):
        with then:
            call_short()
            short_epilogue()
        with otherwise:
            edge_tile()


def _store_in_place_tile(b: ir.IRBuilder, spec: GemmSpec, ops: Sequence[ir.Value], ukernel: ir.Function,
                         short: ir.Function | None, kc: ir.Value, ap: ir.Value, bp: ir.Value, rows_at: ir.Value,
                         tile: ir.Value, first: ir.Value, last: ir.Value, i0: ir.Value, j0: ir.Value, rows: ir.Value,
                         cols: ir.Value, c: ir.Value, c_addr: Callable[[ir.Value, ir.Value], ir.Value], mr: int,
                         nr: int, tail: tuple[int, ir.Function] | None = None,
                         whole_in_registers: Callable[[list[ir.Value], ir.Value, ir.Value], None] | None = None,
                         tail_in_registers: Callable[[list[ir.Value], ir.Value, ir.Value], None] | None = None) -> None:
    """One register tile of an in-place product (:class:`InPlaceB`): a whole tile whose
    pitch-space columns lie inside one output row goes straight into C (its columns are one
    contiguous run there) with the epilogue on constant bounds, like a packed product's tile;
    the rest through the stack tile and :func:`_store_remapped`, but for the partial row
    panel's tiles inside a row, which the ``short`` kernel stores into C; a tile wholly in a
    row's padding columns is skipped (planes of aligned rows:
    :func:`polyml.kernels.conv.row_align`); with ``tail`` (:func:`in_place_tail`), the last
    tile of each row goes straight into C by its kernel, which stores only the row's columns.
    ``*_in_registers``: those tiles' kernels with the epilogue in registers
    (:class:`RegisterEpilogue`).  (SqueezeNet's 3x3/2 3->64 stem @224, 1 thread, AVX2: every tile through the stack tile
    spent as long in the remap as in the 27-step micro-kernel.)"""
    ip = spec.in_place_b
    pitch = _c(ip.pitch)
    oh = b.udiv(j0, pitch)
    ow = b.sub(j0, b.mul(oh, pitch))
    whole = b.and_(b.icmp_signed("==", rows, _c(mr)), b.icmp_signed("==", cols, _c(nr)))
    inside = b.icmp_signed("<=", b.add(ow, _c(nr)), _c(ip.width))
    at = b.add(b.mul(oh, _c(ip.width)), ow)  # output position of column j0 (when inside)
    padding = b.and_(b.icmp_signed(">=", ow, _c(ip.width)), b.icmp_signed("<=", b.add(ow, cols), pitch))

    def into_c(kernel: ir.Function, in_registers: Callable | None, width: int) -> None:
        """The tile at output position ``at`` straight into C by ``kernel``, ``width`` columns
        stored, then its epilogue (in the kernel's registers with ``in_registers``)."""
        args = [kc, ap, bp, rows_at, c_addr(i0, at), _c(spec.ldc), b.not_(first)]
        if in_registers is not None:
            in_registers(args, i0, last)
        else:
            b.call(kernel, args)
            _tile_epilogue(b, spec, ops, last, i0, at, _c(mr), _c(width), c_addr)

    with b.if_then(b.not_(padding)), b.if_else(b.and_(whole, inside)) as (then, otherwise):
        with then:
            into_c(ukernel, whole_in_registers, nr)
        with otherwise:
            def remapped() -> None:
                b.call(ukernel, [kc, ap, bp, rows_at, tile, _c(nr), ir.Constant(ir.IntType(1), 0)])
                _store_remapped(b, spec, ops, tile, nr, first, last, i0, j0, rows, cols, c)

            def edge() -> None:
                # a tile not inside one row has fewer than nr columns there: ``cols`` stands for both
                _short_or(b, spec, short, mr, nr, rows, b.select(inside, cols, _c(0)), remapped,
                          lambda: b.call(short, [kc, ap, bp, rows_at, c_addr(i0, at), _c(spec.ldc), b.not_(first)]),
                          lambda: _tile_epilogue(b, spec, ops, last, i0, at, _c(spec.m % mr), _c(nr), c_addr))

            if tail is None:
                edge()
            else:
                left, kernel = tail
                row_end = b.and_(b.icmp_signed("==", rows, _c(mr)), b.icmp_signed("==", b.sub(_c(ip.width), ow), _c(left)))
                with b.if_else(row_end) as (tail_tile, other):
                    with tail_tile:
                        into_c(kernel, tail_in_registers, left)
                    with other:
                        edge()


#: :func:`in_place_tail` (False: rows on the natural pitch)
IN_PLACE_TAIL = True
#: output rows of at least this many register tiles take :func:`in_place_tail`'s aligned rows
#: (narrower ones would pad a larger share of each row)
IN_PLACE_TAIL_MIN_TILES = 2


def in_place_tail(module: ir.Module, ip: InPlaceB, blk: Blocking, attrs: Sequence[str],
                  epilogue: RegisterEpilogue | None = None) -> tuple[int, ir.Function] | None:
    """``(t, kernel)`` for an in-place product on rows aligned to the register tile
    (:func:`polyml.kernels.conv.row_align`) whose output rows end in a partial tile of ``t =
    width mod nr`` columns: the micro-kernel of the narrowest of ``nr/2`` and ``nr`` that holds
    them, storing only ``t`` columns (masked), so the row's last tile goes into C too, where on
    the natural pitch one tile per row straddles two rows and goes through the stack tile and
    the remap (MobileNet's and ResNet's 112-wide stems: three tiles and 16 columns a row,
    SqueezeNet's 111: and 15); None otherwise.  With ``epilogue``, the kernel's
    :class:`RegisterEpilogue` variant."""
    left = ip.width % blk.nr
    if not (IN_PLACE_TAIL and left and ip.pitch % blk.nr == 0 and ip.width >= IN_PLACE_TAIL_MIN_TILES * blk.nr):
        return None
    half = blk.nr // 2
    narrow = replace(blk, nr=half, width=min(blk.width, half)) if left <= half and half % min(blk.width, half) == 0 else blk
    return left, micro_kernel(module, narrow, attrs, b_rows=True, cols=0 if left == narrow.nr else left,
                              epilogue=epilogue)


def _store_remapped(b: ir.IRBuilder, spec: GemmSpec, ops: Sequence[ir.Value], tile: ir.Value, nr: int,
                    first: ir.Value, last: ir.Value, i0: ir.Value, j0: ir.Value, rows: ir.Value, cols: ir.Value,
                    c: ir.Value) -> None:
    """The stack tile (row pitch ``nr``) of pitch-space columns ``j0 ..`` into C by output
    position (:class:`InPlaceB`): per output row the tile touches, the run of its columns that
    are inside the row, ``C[i][oh·width + ow] (+)= tile[r][j - j0]`` (added from the second
    ``kc`` block on), with the epilogue after the last block.  Each run is contiguous in the
    tile and in C, so the copy vectorizes."""
    ip = spec.in_place_b
    pitch, width = _c(ip.pitch), _c(ip.width)
    ldc = _c(spec.ldc)
    if spec.epilogue is not None and spec.epilogue_per_row:
        # one kc block (first and last): the epilogue on the stack tile's rows of nr (a
        # constant trip count: whole vectors) before the remap. The remap's runs are short
        # (≤ nr, split at output rows) and left LLVM's vector loop for its scalar remainder,
        # which for a SiLU epilogue cost more than the GEMM (EfficientNet's stem 0.60 -> 0.41 ms).
        # The column loop stays rolled: unrolled (a cheap epilogue such as bias + ReLU), LLVM
        # vectorized the loop over rows instead, with gathers and scatters (3x slower)
        with b.if_then(b.and_(first, last)):
            with for_range(b, 0, rows, name="remap.tile.r") as r:
                i = b.add(i0, r)
                with for_range(b, 0, nr, name="remap.tile.j", hints=("llvm.loop.unroll.disable",)) as jj:
                    at = b.gep(tile, [b.add(b.mul(r, _c(nr)), jj)], inbounds=True)
                    b.store(spec.epilogue(b, ops, i, jj, b.load(at)), at)
    end = b.add(j0, cols)
    oh_first = b.udiv(j0, pitch)
    oh_end = b.add(b.udiv(b.sub(end, _c(1)), pitch), _c(1))
    zero = ir.Constant(F32, 0.0)
    with for_range(b, oh_first, oh_end, name="remap.oh") as oh:
        row_start = b.mul(oh, pitch)
        lo = b.select(b.icmp_signed(">", j0, row_start), j0, row_start)
        hi = _min(b, end, b.add(row_start, width))
        shift = b.sub(b.mul(oh, width), row_start)  # output position = j + shift

        def copy(with_epilogue: bool) -> None:
            branch = "epi" if with_epilogue else "acc"
            with for_range(b, 0, rows, name=f"remap.{branch}.r") as r:
                i = b.add(i0, r)
                t_row = b.gep(tile, [b.sub(b.mul(r, _c(nr)), j0)], inbounds=False)
                c_row = b.gep(c, [b.add(b.mul(i, ldc), shift)], inbounds=False)
                with for_range(b, lo, hi, name=f"remap.{branch}.j") as j:
                    v = b.load(b.gep(t_row, [j], inbounds=False))
                    dst = b.gep(c_row, [j], inbounds=False)
                    v = b.fadd(b.select(first, zero, b.load(dst)), v)
                    if with_epilogue:
                        v = spec.epilogue(b, ops, i, b.add(j, shift), v)
                    b.store(v, dst)

        if spec.epilogue is None:
            copy(False)
        else:
            # after the last block, unless that was also the first and the epilogue ran on the tile
            epilogue_now = b.and_(last, b.not_(first)) if spec.epilogue_per_row else last
            with b.if_else(epilogue_now) as (then, otherwise):
                with then:
                    copy(True)
                with otherwise:
                    copy(False)

def _tile_epilogue(b: ir.IRBuilder, spec: GemmSpec, ops: Sequence[ir.Value], last: ir.Value, i0: ir.Value,
                   j0: ir.Value, rows: ir.Value, cols: ir.Value, c_addr: Callable[[ir.Value, ir.Value], ir.Value]) -> None:
    """After the tile's last ``kc`` block: ``C[i][j] = epilogue(C[i][j])`` over its rows x cols."""
    if spec.epilogue is None:
        return
    with b.if_then(last):
        with for_range(b, 0, rows, name="epi.r") as r:
            i = b.add(i0, r)
            with for_range(b, 0, cols, name="epi.c") as cc:
                j = b.add(j0, cc)
                dst = c_addr(i, j)
                b.store(spec.epilogue(b, ops, i, j, b.load(dst)), dst)


#: rows ahead whose runs :func:`_pack_b_rows` prefetches (0: none).  A row's run in the block is ``nc`` floats, a few cache lines: too short
#: a stream for the hardware prefetcher to get ahead of, so the packing of an input that has
#: left L2 waited on every row.  Zen 1, MobileNetV2 at 1 thread, per step,
#: minimum of 20, 8 rows ahead / none: 96->24 @56 0.84, 144->24 @56 0.91, the rest within 3 %
#: (4 and 16 rows ahead: within noise of 8)
PACK_PREFETCH_ROWS = 8


#: micro-kernels prefetch their C tile before the reduction (Zen 1: 2048³ MatMul 0.98-0.99x the time at 1 and 2 threads,
#: MobileNetV2's 1x1 steps 0.99x in sum, 96→24 @56 0.89x, none slower)
C_PREFETCH = True
#: floats ahead of the current step at which micro-kernels reading a packed A panel prefetch
#: it (0: none): the next panels of a pre-packed A (the weights) come
#: from memory, a stream the hardware prefetcher runs too late for the kernel's pace.
#: ResNet-50 at 2 threads, whole model alternated: 192, 384, 768 floats
#: 0.96, 0.95, 0.95 (512->2048 @7x7 steps 0.82, Winograd's products 0.82-0.95); 512->2048
#: @7x7 alone after a cache flush 0.90-0.92
A_PREFETCH = 384


def _prefetch(b: ir.IRBuilder, ptr: ir.Value, write: bool = False) -> None:
    """``llvm.prefetch`` of the cache line at ``ptr`` for reading (``write``: for writing),
    into all cache levels."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = b.module.globals.get("llvm.prefetch.p0i8") or ir.Function(
        b.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
    b.call(fn, [b.bitcast(ptr, i8p), ir.Constant(i32, int(write)), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _pack_b_rows(b: ir.IRBuilder, spec: GemmSpec, ops: Sequence[ir.Value], b_pack: ir.Value, pc: ir.Value,
                 kc: ir.Value, jc: ir.Value, nc: ir.Value, panels_n: ir.Value, nr: int) -> None:
    """B[pc:pc+kc, jc:jc+nc] into its ``nr``-wide panels row by row: each row of the block is
    one contiguous run of B (a prefetched stream) scattered over the panels, where panel by
    panel reads ``kc`` rows of B one cache line each.  The last, partial panel by
    :func:`_pack_b_panel`.  (MobileNetV2 at 1 thread, per step, minimum of
    10: the 1x1 projections after a depthwise layer, whose input has just left L2, 96->24 @56
    0.81, 144->24 @56 0.86, 144->32 @28 0.90; on 14x14 and 7x7 maps within 5 %.)"""
    whole = b.sdiv(nc, _c(nr))
    address = getattr(spec.load_b, "address", None) if PACK_PREFETCH_ROWS > 0 else None
    with for_range(b, 0, kc, name="pack_b.row") as p:
        row = b.add(pc, p)
        ahead = _min(b, b.add(row, _c(PACK_PREFETCH_ROWS)), _c(spec.k - 1)) if address is not None else None
        with for_range(b, 0, whole, name="pack_b.row.jp") as jp:
            dst = b.gep(b_pack, [b.add(b.mul(b.mul(jp, kc), _c(nr)), b.mul(p, _c(nr)))], inbounds=True)
            col0 = b.add(jc, b.mul(jp, _c(nr)))
            if address is not None:
                _prefetch(b, address(b, ops, ahead, col0))
            with for_range(b, 0, nr, name="pack_b.row.jj") as jj:
                b.store(spec.load_b(b, ops, row, b.add(col0, jj)), b.gep(dst, [jj], inbounds=True))
    with for_range(b, whole, panels_n, name="pack_b.tail") as jp:
        dst_panel = b.gep(b_pack, [b.mul(b.mul(jp, kc), _c(nr))], inbounds=True)
        _pack_b_panel(b, spec, ops, dst_panel, pc, kc, b.add(jc, b.mul(jp, _c(nr))), nr)


def _pack_b_panel(b: ir.IRBuilder, spec: GemmSpec, ops: Sequence[ir.Value], dst_panel: ir.Value, pc: ir.Value,
                  kc: ir.Value, col0: ir.Value, nr: int) -> None:
    """B[pc:pc+kc, col0:col0+nr] into one panel ``Bp[p][jj]`` through ``load_b``; whole panels
    copy runs of nr columns (vectorized), the last one reads the last column past N."""
    whole = b.icmp_signed("<=", b.add(col0, _c(nr)), _c(spec.n))
    with b.if_else(whole) as (then, otherwise):
        for clamp, branch in ((False, then), (True, otherwise)):
            with branch:  # whole panels copy runs of nr columns (vectorized)
                with for_range(b, 0, kc, name="pack_b.p") as p:
                    dst = b.gep(dst_panel, [b.mul(p, _c(nr))], inbounds=True)
                    row = b.add(pc, p)
                    with for_range(b, 0, nr, name="pack_b.jj") as jj:
                        col = b.add(col0, jj)
                        if clamp:
                            col = _min(b, col, _c(spec.n - 1))
                        b.store(spec.load_b(b, ops, row, col), b.gep(dst, [jj], inbounds=True))


def _pack_a(b: ir.IRBuilder, spec: GemmSpec, ops: Sequence[ir.Value], a_pack: ir.Value, ic: ir.Value, pc: ir.Value,
            kc: ir.Value, panels_m: ir.Value, mr: int, first: ir.Value | None = None) -> None:
    """A[ic:ic+mc, pc:pc+kc] into mr-high panels ``Ap[ip][p][r]`` (rows past M repeat the last).

    The ``mr`` rows are unrolled inside the loop over ``p``, so each step writes one
    contiguous ``mr``-float row of the panel and LLVM vectorizes ``p`` with one contiguous
    load and one 16-lane scatter per row.  With ``p`` inside a loop over ``r`` (the other order
    of the transpose) LLVM vectorized ``r`` instead, with gathers and scatters: 2048³ MatMul,
    1 thread, A packed 4 times (16 M elements), 198 → 178 ms."""
    with for_range(b, first if first is not None else 0, panels_m, name="pack_a.ip") as ip:
        dst_panel = b.gep(a_pack, [b.mul(b.mul(ip, kc), _c(mr))], inbounds=True)
        row0 = b.add(ic, b.mul(ip, _c(mr)))
        rows = [_min(b, b.add(row0, _c(r)), _c(spec.m - 1)) for r in range(mr)]
        with for_range(b, 0, kc, name="pack_a.p") as p:
            col = b.add(pc, p)
            dst = b.gep(dst_panel, [b.mul(p, _c(mr))], inbounds=True)
            for r, row in enumerate(rows):
                b.store(spec.load_a(b, ops, row, col), b.gep(dst, [_c(r)], inbounds=True))


def matrix_loader(index: int, ld: int, transposed: bool = False) -> Loader:
    """Loader of a row-major matrix at operand ``index`` with leading dimension ``ld``
    (``transposed``: element (r, c) is stored at ``[c][r]``)."""

    def address(b: ir.IRBuilder, ops: Sequence[ir.Value], row: ir.Value, col: ir.Value) -> ir.Value:
        r, c = (col, row) if transposed else (row, col)
        return b.gep(ops[index], [b.add(b.mul(r, _c(ld), flags=["nsw"]), c, flags=["nsw"])], inbounds=True)

    def load(b: ir.IRBuilder, ops: Sequence[ir.Value], row: ir.Value, col: ir.Value) -> ir.Value:
        return b.load(address(b, ops, row, col))

    load.address = address  # type: ignore[attr-defined]  # for prefetches (_pack_b_rows)
    return load


def emit_gemm(k: KernelBuilder, spec: GemmSpec, operands: Sequence[Buffer], c: Buffer, scratch: Buffer,
              blk: Blocking, parts: int) -> None:
    """Compute ``spec`` into ``c`` from the op function of ``k``: C's rows or columns split
    into ``parts`` shares run by OpenMP threads (:meth:`KernelBuilder.parallel_loop`), each
    through one call of the block function with its own slice of ``scratch``."""
    dim, share = split(spec, blk, parts)
    total = spec.m if dim == "m" else spec.n
    count = math.ceil(total / share)
    per = packing_floats(spec, blk, share if dim == "m" else spec.m, share if dim == "n" else spec.n)
    if scratch.type.size < count * per:
        raise AssertionError(f"{k.node.label}: GEMM scratch of {scratch.type.size} floats < {count} x {per}")
    attrs = [a for a in k.fn.attributes if a != "noinline"]
    fn = block_function(k.module, f"{k.fn.name}.gemm{k.nests}", spec, blk, attrs)
    k.nests += 1
    with k.parallel_loop(0, count, "gemm") as part:
        b = k.b
        lo = b.mul(part, _c(share), flags=["nsw"])
        hi = _min(b, b.add(lo, _c(share)), _c(total))
        ranges = [lo, hi, _c(0), _c(spec.n)] if dim == "m" else [_c(0), _c(spec.m), lo, hi]
        ptrs = [b.bitcast(buf.ptr, F32P) for buf in (*operands, c)]
        work = b.gep(b.bitcast(scratch.ptr, F32P), [b.mul(part, _c(per), flags=["nsw"])], inbounds=True)
        b.call(fn, [*ptrs, work, *ranges])


def scratch_floats(spec: GemmSpec, blk: Blocking, parts: int) -> int:
    """Size of the ``scratch`` buffer :func:`emit_gemm` needs for at most ``parts`` shares,
    whichever dimension :func:`split` picks (it depends on whether A is pre-packed)."""
    sizes = []
    for parts_ in range(1, parts + 1):
        for dim, total, q in (("m", spec.m, blk.mr), ("n", spec.n, blk.nr)):
            share = _round_up(math.ceil(total / parts_), q)
            per = packing_floats(spec, blk, share if dim == "m" else spec.m, share if dim == "n" else spec.n)
            sizes.append(math.ceil(total / share) * per)
    return max(sizes)


def blocking_for_host(override: str = "") -> Blocking:
    """:func:`host_blocking` for this machine's target features and caches; ``override``
    (:attr:`polyml.options.CodegenConfig.gemm_blocking`) sets any of its sizes."""
    from polyml.driver.toolchain import host_target, target_data_caches

    caches = target_data_caches()
    l1 = caches.get(1, (32 << 10, 8))[0]
    l2 = caches.get(2, (1 << 20, 16))[0]
    l3 = caches.get(3, (32 << 20, 16))[0]
    blk = host_blocking(host_target().features, l1, l2, l3)
    # experiments: "mr=12,nr=32,mc=480,kc=192,nc=1344" (any subset; kc_wide, nc_wide, width=8, fma=0 too)
    if override:
        try:
            fields = {key.strip(): int(v) for key, v in (item.split("=") for item in override.split(","))}
            if "fma" in fields:
                fields["fma"] = bool(fields["fma"])
            for size in ("kc", "nc"):  # a block size set alone applies to every product
                if size in fields:
                    fields.setdefault(f"{size}_wide", fields[size])
            blk = replace(blk, **fields)
        except (ValueError, TypeError) as e:
            raise PolymlError(f"POLYML_GEMM_BLOCKING={override!r}: expected mr=..,nr=..,mc=..,kc=..,nc=..,"
                              f"kc_wide=..,nc_wide=..,width=..,fma=0|1 ({e})") from None
        if blk.width not in (4, 8, 16) or blk.nr % blk.width or min(blk.mr, blk.nr, blk.mc, blk.kc, blk.nc) < 1 \
                or min(blk.kc_wide, blk.nc_wide) < 0:
            raise PolymlError(f"POLYML_GEMM_BLOCKING={override!r}: width must be 4, 8 or 16, nr a multiple of it "
                              f"({blk.width}), every size positive")
    return blk


def prepack_a(a: np.ndarray, blk: Blocking, kc_step: int = 1) -> np.ndarray:
    """``A`` (M×K) in the order the block function reads packed A panels, for a constant A:
    per ``kc`` block of columns, per ``mr`` rows (zero rows pad M), the panel ``[p][r]``.
    Element ``(i, pc + p)`` lands at ``pc·Mpad + (i - i % mr)·kc_b + p·mr + i % mr``."""
    m, k = a.shape
    mp = _round_up(m, blk.mr)
    kc = kc_for(k, blk.kc, kc_step)  # block_kc
    padded = np.zeros((mp, k), np.float32)
    padded[:m] = a
    parts = [padded[:, pc:pc + kc].reshape(mp // blk.mr, blk.mr, -1).transpose(0, 2, 1).ravel()
             for pc in range(0, k, kc)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def prepack_b(bm: np.ndarray, blk: Blocking) -> np.ndarray:
    """``B`` (K×N) in the order the block function reads packed B panels, for a constant B:
    per ``kc`` block of rows, per ``nr``-wide panel of columns (zero columns pad N), the panel
    ``[p][jj]``.  Element ``(pc + p, j)`` lands at ``pc·Npad + (j - j % nr)·kc_b + p·nr + j % nr``."""
    k, n = bm.shape
    npad = _round_up(n, blk.nr)
    kc = kc_for(k, blk.kc_wide or blk.kc)  # block_kc: a pre-packed B goes with an A packed at run time
    padded = np.zeros((k, npad), np.float32)
    padded[:, :n] = bm
    parts = [padded[pc:pc + kc].reshape(-1, npad // blk.nr, blk.nr).transpose(1, 0, 2).ravel() for pc in range(0, k, kc)]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def im2col_packer(index: int, size: tuple[int, int], kernel: tuple[int, int], out_width: int, columns: int,
                  strides: tuple[int, int], dilations: tuple[int, int], pads: tuple[int, int],
                  nr: int) -> Callable[..., None]:
    """Packs one B panel of a 2-D convolution's im2col matrix straight from ``x[C][H][W]``
    (operand ``index``), for ``kc`` blocks of whole input channels (``GemmSpec.kc_step`` = taps).
    Row ``p = (c*KH + kh)*KW + kw``, column ``q = oh*OW + ow`` of the matrix holds
    ``x[c][oh*sh + kh*dh - ph][ow*sw + kw*dw - pw]``, 0 in the padding; it is never stored.

    First, per panel, a table of ``taps x nr`` source offsets and in-bounds flags (the divisions
    and bounds checks, once per column and tap); then, per channel and tap, one run of ``nr``
    columns: ``Bp[c·taps + t][jj] = inside ? x[c][off[t][jj]] : 0``, contiguous stores of
    gathered loads that LLVM vectorizes (AVX-512 gathers).  Measured on ResNet-50's strided 3x3
    convolutions (scripts/bench_conv.py, 2 threads): an element-wise loader dividing per element
    gave 57-86 GFLOP/s, a per-column packer with channel-innermost loops 85-110, this one
    161-250."""
    (h, w), (kh_, kw_), (sh, sw), (dh, dw), (ph, pw) = size, kernel, strides, dilations, pads
    taps = kh_ * kw_
    i32, i8 = ir.IntType(32), ir.IntType(8)

    def pack(b: ir.IRBuilder, ops: Sequence[ir.Value], dst_panel: ir.Value, pc: ir.Value, kc: ir.Value,
             col0: ir.Value) -> None:
        entry = ir.IRBuilder(b.function.entry_basic_block)
        entry.position_at_start(b.function.entry_basic_block)
        offsets = entry.alloca(ir.ArrayType(i32, taps * nr), name="im2col.off")
        inside = entry.alloca(ir.ArrayType(i8, taps * nr), name="im2col.in")
        with for_range(b, 0, nr, name="im2col.jj") as jj:
            q = _min(b, b.add(col0, jj), _c(columns - 1))
            ih0 = b.sub(b.mul(b.udiv(q, _c(out_width)), _c(sh)), _c(ph))
            iw0 = b.sub(b.mul(b.urem(q, _c(out_width)), _c(sw)), _c(pw))
            for ky in range(kh_):
                ih = b.add(ih0, _c(ky * dh))
                row_in = b.icmp_unsigned("<", ih, _c(h))  # also ≥ 0
                for kx in range(kw_):
                    iw = b.add(iw0, _c(kx * dw))
                    ok = b.and_(row_in, b.icmp_unsigned("<", iw, _c(w)))
                    at = b.add(_c((ky * kw_ + kx) * nr), jj)
                    off = b.select(ok, b.add(b.mul(ih, _c(w)), iw), _c(0))
                    b.store(b.trunc(off, i32), b.gep(offsets, [_c(0), at], inbounds=True))
                    b.store(b.zext(ok, i8), b.gep(inside, [_c(0), at], inbounds=True))
        x0 = b.gep(ops[index], [b.mul(b.udiv(pc, _c(taps)), _c(h * w))], inbounds=True)
        with for_range(b, 0, b.udiv(kc, _c(taps)), name="im2col.c") as c:
            plane = b.gep(x0, [b.mul(c, _c(h * w))], inbounds=True)
            with for_range(b, 0, taps, name="im2col.t") as t:
                row = b.gep(dst_panel, [b.mul(b.add(b.mul(c, _c(taps)), t), _c(nr))], inbounds=True)
                with for_range(b, 0, nr, name="im2col.col") as jj:
                    at = b.add(b.mul(t, _c(nr)), jj)
                    off = b.sext(b.load(b.gep(offsets, [_c(0), at], inbounds=True)), I64)
                    ok = b.trunc(b.load(b.gep(inside, [_c(0), at], inbounds=True)), ir.IntType(1))
                    v = b.load(b.gep(plane, [off], inbounds=True))
                    b.store(b.select(ok, v, ir.Constant(F32, 0.0)), b.gep(row, [jj], inbounds=True))

    return pack
