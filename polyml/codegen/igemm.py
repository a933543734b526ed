"""Packed integer GEMM: 8-bit operands, int32 accumulation, emitted as LLVM IR.

``C[i][j] (+)= Σ_p W'(i, p) · X'(p, j)`` in BLIS's five loops, as :mod:`polyml.codegen.gemm`
does for floats, with ``W`` the *weight side* (``M × K``, broadcast by the micro-kernel) and
``X`` the *activation side* (``K × N``, the vector side).  The quantized kernels
(:mod:`polyml.kernels.qlinear_matmul`, :mod:`polyml.kernels.qlinear_conv`) always put the
weights on ``W``: a convolution is ``w (Cout × Cin·taps) · im2col(x)`` as for floats (its input
read flat, :mod:`polyml.kernels.qlinear_conv`), a
``MatMul`` ``A (M × K) · B (K × N)`` is computed transposed, ``Cᵀ = Bᵀ · Aᵀ``, so that per
output channel quantities (weight zero points, scales, bias) are per row of the product and
constant weights are pre-packed once at compile time (:func:`prepack_w`).

The reduction dimension is packed in groups of ``g`` elements, the operand layout of the
micro-kernel's instruction:

* ``vnni`` (AVX-512 VNNI, ``g = 4``): ``vpdpbusd`` (``llvm.x86.avx512.vpdpbusd.512``) adds to
  each of 16 int32 lanes the four products of an unsigned byte of its first operand by a
  signed byte of its second.  The activation side is the unsigned one: int8 activations are
  made uint8 by flipping the top bit (``x' = x + 128``), uint8 weights int8 (``w' = w - 128``);
  both shifts are zero-point changes (below).  Products and their sums are exact (no 16-bit
  intermediate, unlike ``vpmaddubsw``, which saturates pairs of u8·s8 products to int16).
* ``madd`` (AVX-512BW with 16 lanes, AVX2 with 8, anything else through LLVM's legalization,
  ``g = 2``): both sides widened to int16 when packed (sign- or zero-extended as their dtype
  says), then per pair ``sext(a0)·sext(b0) + sext(a1)·sext(b1)`` in int32, written as generic
  IR that LLVM selects as ``vpmaddwd`` + ``vpaddd`` (``vpdpwssd`` where VNNI exists).  Exact:
  |products| ≤ 255² and two of them fit int32.  Half the MACs per instruction of ``vnni``.

Zero points.  With ``W' = W`` or its shift and ``zW'``, ``zX'`` the zero points shifted alike,
``Σ_p (W[i,p] - zW[i])(X[p,j] - zX[j]) = acc - zX'[j]·(RW[i] - K·zW'[i]) - zW'[i]·CX[j]``,
``acc = Σ W'X'``, ``RW`` the row sums of ``W'``, ``CX`` the column sums of ``X'``.  The kernels
fold what is constant at compile time (row sums of constant weights, per-tensor activation
zero points) into a per-row int32 bias and only compute the rest at run time.  The epilogue
(a callback, run on each register tile after its last reduction block, reading the int32
accumulators) applies them, and for the ``QLinear*`` ops requantizes (:func:`polyml.codegen.quant.quantize_value` with :func:`multipliers`).

Reduction positions past ``K`` (the last group) are packed as 0 on both sides, which adds
nothing; the row/column sums are of the unpadded operands.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import I32, I64, Buffer, KernelBuilder, splat
from polyml.codegen.gemm import _c, _function, _min, _round_up, add_edge_tile, for_range, tile_loop
from polyml.codegen.gemm import kc_for as float_kc_for
from polyml.codegen.gemm import matrix_loader as matrix_loader  # the same row-major loader, 8-bit elements here
from polyml.errors import PolymlError

I8 = ir.IntType(8)
I16 = ir.IntType(16)
I8P = I8.as_pointer()
I32P = I32.as_pointer()

#: ``load(builder, operand_pointers, row, col) -> i8``: one element of an operand, as stored
Loader = Callable[[ir.IRBuilder, Sequence[ir.Value], ir.Value, ir.Value], ir.Value]
#: ``epilogue(builder, operand_pointers, row, col, acc_i32) -> None``: consumes one final
#: accumulator of C (stores the op's output element itself)
Epilogue = Callable[[ir.IRBuilder, Sequence[ir.Value], ir.Value, ir.Value, ir.Value], None]
#: ``pack(builder, ops, dst_panel, pc, kc, col0)``: one ``kc × nr`` X panel in micro-kernel
#: order (``[p/g][jj][p%g]``, elements already converted with :meth:`IBlocking.convert_x`)
Packer = Callable[..., None]

VARIANTS = ("vnni", "madd")


@dataclass(frozen=True)
class IBlocking:
    """Register tile ``mr × nr`` of int32 accumulators (``nr`` a multiple of the ``width``
    lanes), cache blocks, and the micro-kernel's instruction family (``variant``)."""

    mr: int
    nr: int
    width: int
    mc: int
    kc: int
    nc: int
    variant: str

    @property
    def group(self) -> int:
        """Reduction elements per int32 lane and instruction (4 bytes, or 2 int16)."""
        return 4 if self.variant == "vnni" else 2

    @property
    def elem(self) -> ir.IntType:
        return I8 if self.variant == "vnni" else I16

    @property
    def np_elem(self) -> type:
        return np.int8 if self.variant == "vnni" else np.int16

    @property
    def elem_bytes(self) -> int:
        return 1 if self.variant == "vnni" else 2

    @property
    def vectors(self) -> int:
        return self.nr // self.width

    def shifts(self, w_signed: bool, x_signed: bool) -> tuple[int, int]:
        """``(dW, dX)``: packed ``W' = W + dW``, ``X' = X + dX`` (the top-bit flips of ``vnni``)."""
        if self.variant != "vnni":
            return 0, 0
        return (0 if w_signed else -128), (128 if x_signed else 0)


#: the reduction block: ResNet's largest 3x3 reduction (512 channels · 9 taps), so that the
#: products of CNNs run in one block and each register tile goes from the micro-kernel to the
#: epilogue through a stack tile, never through a C array in memory (mobilenet_v2's 1x1
#: 16 -> 96 conv at 112x112: a 4.8 MB int32 C written and read back took 2/3 of its time).
#: Both panels of a step then come from L2 (12x4608 and 4608x32 bytes), 7 bytes per cycle of
#: the micro-kernel's 24 vpdpbusd, well within L2's bandwidth.
KC_MAX = 4608


def host_iblocking(features: str, l1: int = 32 << 10, l2: int = 1 << 20, variant: str | None = None) -> IBlocking:
    """The integer blocking for a CPU with these LLVM target features and cache sizes.

    AVX-512: 12 × 32 (24 zmm accumulators, two X vectors, one broadcast), ``vnni`` where the
    CPU has ``avx512vnni``, else ``madd``; AVX2: 6 × 16 ``madd``; otherwise 4 × 8 ``madd`` on
    4 lanes.  ``kc`` is :data:`KC_MAX`, ``mc`` sizes the W block to half of L2, ``nc`` the
    X block to four times L2 (it is re-read per ``mc`` block, from L3)."""
    has = set(features.split(","))
    if "+avx512f" in has and "+avx512bw" in has:
        mr, nr, w = 12, 32, 16
    elif "+avx2" in has:
        mr, nr, w = 6, 16, 8
    else:
        mr, nr, w = 4, 8, 4
    if variant is None:
        variant = "vnni" if w == 16 and "+avx512vnni" in has else "madd"
    eb = 1 if variant == "vnni" else 2
    kc = KC_MAX
    mc = max(mr, min(480, (l2 // 2) // (eb * kc) // mr * mr))
    nc = max(nr, min(4096, (l2 * 4) // (eb * kc) // nr * nr))
    return IBlocking(mr, nr, w, mc, kc, nc, variant)


#: register tiles of the AVX-512 micro-kernels the row count chooses between: 12 x 32 (24
#: accumulators), or 8 x 32 where 8 rows pad less (64-channel convolutions: 72 rows of 12 are
#: 12.5 % wasted multiply-adds; every power-of-two channel count divides by 8)
ROW_TILES = (12, 8)


def blocking_for_host(m: int | None = None, override: str = "") -> IBlocking:
    """:func:`host_iblocking` for this machine; ``override`` (``POLYML_IGEMM``,
    :attr:`polyml.options.CodegenConfig.igemm`) forces a micro-kernel for
    tests and experiments: ``vnni``, ``madd`` (same width as the host's), ``madd8`` (the AVX2
    6 × 16 tile on 8 lanes), optionally followed by ``,mr=..,nr=..,kc=..,mc=..,nc=..``."""
    from polyml.driver.toolchain import host_target, target_data_caches

    caches = target_data_caches()
    l1 = caches.get(1, (32 << 10, 8))[0]
    l2 = caches.get(2, (1 << 20, 16))[0]
    features = host_target().features
    blk = host_iblocking(features, l1, l2)
    override = override.strip()
    if not override:
        return _rows_tile(blk, m)
    kind, *rest = [s.strip() for s in override.split(",")]
    if kind == "vnni":
        if "+avx512vnni" not in features.split(","):
            raise PolymlError("POLYML_IGEMM=vnni: this CPU has no AVX-512 VNNI")
        blk = host_iblocking(features, l1, l2, "vnni")
    elif kind == "madd":
        blk = host_iblocking(features, l1, l2, "madd")
    elif kind == "madd8":
        blk = host_iblocking("+avx2", l1, l2, "madd")
    elif kind:
        raise PolymlError(f"POLYML_IGEMM={override!r}: expected vnni, madd or madd8, then optional mr=..,nr=..,kc=..")
    try:
        fields = {key.strip(): int(v) for key, v in (item.split("=") for item in rest if item)}
        blk = replace(blk, **fields)
    except (ValueError, TypeError) as e:
        raise PolymlError(f"POLYML_IGEMM={override!r}: expected vnni|madd|madd8[,mr=..,nr=..,kc=..,mc=..,nc=..] ({e})") from None
    if blk.kc % 4 or min(blk.kc, blk.mc, blk.nc, blk.mr, blk.nr) < 1 or blk.nr % blk.width:
        raise PolymlError(f"POLYML_IGEMM={override!r}: kc a positive multiple of 4, nr of the width ({blk.width}), "
                          "every size positive")
    blk = replace(blk, mc=_round_up(blk.mc, blk.mr), nc=_round_up(blk.nc, blk.nr))
    return blk if "mr" in fields else _rows_tile(blk, m)


def _rows_tile(blk: IBlocking, m: int | None) -> IBlocking:
    """``blk`` with the :data:`ROW_TILES` height that pads ``m`` rows least (ties: the first)."""
    if m is None or blk.mr != ROW_TILES[0]:
        return blk
    mr = min(ROW_TILES, key=lambda r: (_round_up(m, r), ROW_TILES.index(r)))
    return replace(blk, mr=mr, mc=max(mr, blk.mc // mr * mr))


@dataclass
class IGemmSpec:
    """One product ``C (M×N) = W (M×K) · X (K×N)`` of 8-bit operands and how to read it.

    Operand pointers are ``i8*`` (loaders and the epilogue bitcast them); operand 0 is W,
    operand 1 X's source, further ones are the epilogue's."""

    m: int
    n: int
    k: int
    #: W element (row, p) as stored (int8/uint8 bits); None when ``prepacked_w``
    load_w: Loader | None
    #: X element (p, col); None when ``pack_x`` packs X or ``x_offsets`` reads it in place
    load_x: Loader | None
    operands: int
    w_signed: bool
    x_signed: bool
    epilogue: Epilogue
    pack_x: Packer | None = None
    #: operand 0 is :func:`prepack_w`'s array (constant weights packed at compile time)
    prepacked_w: bool = False
    #: the epilogue walks a tile column by column (rows innermost): for outputs stored
    #: transposed (a MatMul's ``Cᵀ``), whose rows are then contiguous
    epilogue_cols_outer: bool = False
    #: the epilogue also takes a whole tile row at once (``acc`` a vector of ``nr`` columns
    #: from ``j``): full-width tiles then run it on vectors (one store per row of the tile)
    vector_epilogue: bool = False
    make_builder: Callable[[ir.Function], ir.IRBuilder] | None = None
    #: X read in place, never packed: operand 1 holds X already grouped (``g`` reduction
    #: elements of a column in one word, the columns' words contiguous), group ``q``'s words
    #: at byte ``x_offsets[q]`` (a private i32 table) from column 0's, so that a panel is one
    #: run of ``nr`` words (a convolution's channel-interleaved flat input: :func:`micro_kernel`)
    x_offsets: ir.GlobalVariable | None = None
    #: W's rows read in place (``(rows, groups)``, two private i32 tables): operand 0 holds the
    #: rows' bytes (unsigned, the activations of a convolution whose rows are its output
    #: positions), row ``i``'s word of group ``q`` at byte ``groups[q] + rows[i]`` (``rows``
    #: padded to whole register tiles); operand 1 is X pre-packed (:func:`prepack_x`, the
    #: weights as the columns)
    w_rows: tuple[ir.GlobalVariable, ir.GlobalVariable] | None = None
    #: the blocking (:func:`blocking_for_host` of M and ``CodegenConfig.igemm``); :func:`emit`
    #: requires it (None only for specs that merely size scratch or blocks)
    blocking: IBlocking | None = None

    def __post_init__(self) -> None:
        if self.load_x is None and self.pack_x is None and self.x_offsets is None and self.w_rows is None:
            raise ValueError("IGemmSpec: X needs a load_x, a pack_x, x_offsets or w_rows")
        if self.load_w is None and not self.prepacked_w and self.w_rows is None:
            raise ValueError("IGemmSpec: W needs a load_w unless it is pre-packed")


def kc_for(k: int, blk: IBlocking) -> int:
    """The reduction block for ``K``: the fewest blocks of at most ``blk.kc``, of equal size
    (whole groups), so that no short last block costs a second pass over C for little work
    (K = 576 with kc 512: two blocks of 288, not 512 + 64; :func:`polyml.codegen.gemm.kc_for`)."""
    return float_kc_for(k, blk.kc, blk.group)


def block_kc(spec: IGemmSpec, blk: IBlocking) -> int:
    return kc_for(spec.k, blk)


def scratch_bytes(spec: IGemmSpec, blk: IBlocking, m_part: int, n_part: int) -> int:
    """Bytes of scratch one thread needs for an ``m_part × n_part`` share: the edge tile
    (int32), the W block and the X block (64-byte aligned).  The W block is sized by the
    whole M, as :func:`block_function` lays the scratch out (the X block follows it), not by
    the share: a row split with shares below ``mc`` overran the next thread's scratch."""
    kc = block_kc(spec, blk)
    mc = _round_up(min(blk.mc, spec.m), blk.mr)
    nc = _round_up(min(blk.nc, n_part), blk.nr)
    sizes = [4 * blk.mr * blk.nr, blk.elem_bytes * mc * kc, blk.elem_bytes * kc * nc]
    return sum(_round_up(s, 64) for s in sizes)


# -- element conversions --------------------------------------------------------------------

def _convert(b: ir.IRBuilder, v: ir.Value, blk: IBlocking, signed: bool, side: str) -> ir.Value:
    """A stored 8-bit element as the micro-kernel's operand: ``vnni`` flips the top bit where
    the side's signedness is not the instruction's (W signed, X unsigned), ``madd`` widens."""
    if blk.variant == "vnni":
        flip = (side == "w") != signed  # W must be s8, X u8
        return b.xor(v, ir.Constant(I8, 0x80)) if flip else v
    return b.sext(v, I16) if signed else b.zext(v, I16)


def convert_np(a: np.ndarray, blk: IBlocking, signed: bool, side: str) -> np.ndarray:
    """:func:`_convert` on numpy values (int8/uint8 array) -> the packed element dtype."""
    v = a.astype(np.int32)
    if blk.variant == "vnni":
        dw, dx = blk.shifts(signed, signed)
        v = v + (dw if side == "w" else dx)
        return v.astype(np.uint8 if side == "x" else np.int8).view(np.int8)
    return v.astype(np.int16)


def prepack_w(w: np.ndarray, blk: IBlocking, signed: bool) -> np.ndarray:
    """:func:`pack_w_elements` as int32 words (one per group of ``g`` elements: 4 bytes or 2
    int16), the dtype the graph stores constants in."""
    return pack_w_elements(w, blk, signed).view(np.int32)


def pack_w_elements(w: np.ndarray, blk: IBlocking, signed: bool) -> np.ndarray:
    """Constant ``W`` (M×K, int8 or uint8 values) in the block function's W panel order,
    converted: per ``kc`` block (the last padded to a whole group with zeros), per ``mr``
    rows (zero rows pad M), ``[p/g][r][p%g]``.  Element ``(i, pc + p)`` lands at
    ``pc·Mpad + (i - i%mr)·kcp + (p//g)·mr·g + (i%mr)·g + p%g``, ``kcp`` the block's padded size."""
    m, k = w.shape
    g, mr = blk.group, blk.mr
    mp = _round_up(m, mr)
    kc = kc_for(k, blk)
    conv = convert_np(w, blk, signed, "w")
    parts = []
    for pc in range(0, k, kc):
        kcp = _round_up(min(kc, k - pc), g)
        tile = np.zeros((mp, kcp), conv.dtype)
        tile[:m, : min(kc, k - pc)] = conv[:, pc:pc + kc]
        # [mp/mr][mr][kcp/g][g] -> [mp/mr][kcp/g][mr][g]
        parts.append(tile.reshape(mp // mr, mr, kcp // g, g).transpose(0, 2, 1, 3).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, conv.dtype)


def prepack_x(xt: np.ndarray, blk: IBlocking, signed: bool) -> np.ndarray:
    """Constant ``X`` given as ``Xᵀ`` (N×K) in the block function's X panel order (``nr``
    columns a panel, ``[p/g][jj][p%g]``, per ``kc`` block), int32 words, W's conversion
    (``w_rows`` products: X is the signed side)."""
    return pack_w_elements(xt, replace(blk, mr=blk.nr), signed).view(np.int32)


def prepacked_size(m: int, k: int, blk: IBlocking) -> int:
    """Elements of :func:`prepack_w`'s array."""
    return _round_up(m, blk.mr) * _round_up(k, blk.group)  # every block but the last is whole groups


# -- the micro-kernel --------------------------------------------------------------------------

def _without_vnni(attrs: Sequence[str]) -> list[str]:
    """The function attributes with the VNNI features switched off: what a CPU without them
    runs (the forced ``madd`` variant on a VNNI host must not become ``vpdpwssd``)."""
    out = []
    for a in attrs:
        if a.startswith('"target-features"='):
            feats = [f for f in a.split("=", 1)[1].strip('"').split(",") if f and f.lstrip("+-") not in ("avx512vnni", "avxvnni")]
            a = '"target-features"="' + ",".join([*feats, "-avx512vnni", "-avxvnni"]) + '"'
        out.append(a)
    return out


def vpdpbusd(module: ir.Module) -> ir.Function:
    """AVX-512 VNNI ``vpdpbusd(acc, u8x4, s8x4)``: per int32 lane, ``acc`` plus the four
    products of unsigned bytes of the second operand with signed bytes of the third."""
    name = "llvm.x86.avx512.vpdpbusd.512"
    vec = ir.VectorType(I32, 16)
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(vec, [vec, vec, vec]), name)


def micro_kernel(module: ir.Module, blk: IBlocking, attrs: Sequence[str], in_place: bool = False,
                 rows_in_place: bool = False) -> ir.Function:
    """``ukernel(kq, Wp, Xp, C, ldc, accumulate[, offsets[, base]])``: one ``mr × nr`` int32 tile of C.

    ``Wp`` is a packed W panel of ``kq`` groups × ``mr`` rows (one int32 of ``g`` elements per
    row and group), ``Xp`` an X panel of ``kq`` groups × ``nr`` columns (``in_place``: group
    ``q``'s ``nr`` words start ``offsets[q]`` bytes after ``Xp``, see ``IGemmSpec.x_offsets``;
    ``rows_in_place``: ``Wp`` holds the tile's ``mr`` row offsets instead, row ``r``'s word of
    group ``q`` at byte ``base + offsets[q] + Wp[r]``, and W is the unsigned side, see
    ``IGemmSpec.w_rows``).  Per group the kernel loads ``nr/w`` X vectors, broadcasts each
    row's int32 of W and updates ``mr·nr/w`` vector accumulators (``vpdpbusd`` or the ``madd``
    sequence), then stores (or adds) the tile into C (int32, row stride ``ldc``)."""
    tag = ".inplace" if in_place else ".rows" if rows_in_place else ""
    name = f"polyml.iukernel.{blk.variant}.{blk.mr}x{blk.nr}w{blk.width}{tag}"
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    w = blk.width
    vec = ir.VectorType(I32, w)
    if blk.variant == "madd" and w == 16:
        attrs = _without_vnni(attrs)
    extra = [I32P] if in_place else [I32P, I8P] if rows_in_place else []
    fn = _function(module, name, [I64, I32P, I32P, I32P, I64, ir.IntType(1), *extra], attrs, w == 16)
    fn.linkage = "internal"
    kq, wp, xp, c, ldc, accumulate = fn.args[:6]
    offsets = fn.args[6] if in_place or rows_in_place else None
    for a in (wp, xp, c):
        a.add_attribute("noalias")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    zero = ir.Constant(vec, [0] * w)
    if blk.variant == "vnni":
        dp = vpdpbusd(module)

        def update(acc: ir.Value, wv: ir.Value, xv: ir.Value) -> ir.Value:
            # (acc, unsigned bytes, signed bytes): X is unsigned, or W where its rows are activations
            return b.call(dp, [acc, wv, xv] if rows_in_place else [acc, xv, wv])
    else:
        v16 = ir.VectorType(I16, 2 * w)
        wide = ir.VectorType(I32, 2 * w)
        even = ir.Constant(ir.VectorType(I32, w), list(range(0, 2 * w, 2)))
        odd = ir.Constant(ir.VectorType(I32, w), list(range(1, 2 * w, 2)))
        undef_wide = ir.Constant(wide, None)

        def update(acc: ir.Value, wv: ir.Value, xv: ir.Value) -> ir.Value:
            prod = b.mul(b.sext(b.bitcast(wv, v16), wide), b.sext(b.bitcast(xv, v16), wide), flags=["nsw"])
            pair = b.add(b.shuffle_vector(prod, undef_wide, even), b.shuffle_vector(prod, undef_wide, odd), flags=["nsw"])
            return b.add(acc, pair)
    row_offsets = []
    if rows_in_place:  # the tile's row offsets, loaded once
        base = fn.args[7]
        row_offsets = [b.sext(b.load(b.gep(wp, [_c(r)], inbounds=True), align=4), I64) for r in range(blk.mr)]

    def step(q: ir.Value, accs: list[list[ir.Value]]) -> list[list[ir.Value]]:
        if offsets is None or rows_in_place:
            x_row = b.gep(xp, [b.mul(q, _c(blk.nr), flags=["nsw"])], inbounds=True)
        else:
            at = b.sext(b.load(b.gep(offsets, [q], inbounds=True), align=4), I64)
            x_row = b.bitcast(b.gep(b.bitcast(xp, I8P), [at], inbounds=True), I32P)
        x_vecs = [b.load(b.bitcast(b.gep(x_row, [_c(v * w)], inbounds=True), vec.as_pointer()), align=4)
                  for v in range(blk.vectors)]
        if rows_in_place:
            group = b.gep(base, [b.sext(b.load(b.gep(offsets, [q], inbounds=True), align=4), I64)], inbounds=True)
        else:
            w_row = b.gep(wp, [b.mul(q, _c(blk.mr), flags=["nsw"])], inbounds=True)
        new_accs = []
        for r in range(blk.mr):
            if rows_in_place:
                wval = b.load(b.bitcast(b.gep(group, [row_offsets[r]], inbounds=True), I32P), align=1)
            else:
                wval = b.load(b.gep(w_row, [_c(r)], inbounds=True), align=4)
            wvec = splat(b, wval, vec)
            new_accs.append([update(accs[r][v], wvec, x_vecs[v]) for v in range(blk.vectors)])
        return new_accs

    tile_loop(b, zero, blk.mr, blk.vectors, kq, "q", step, c, ldc, accumulate, b.add)
    if blk.variant == "madd" and w == 16:
        fn.attributes.add("noinline")  # keep its features (no VNNI) apart from the caller's
    return fn


# -- packing -----------------------------------------------------------------------------------

def _pack_w(b: ir.IRBuilder, spec: IGemmSpec, blk: IBlocking, ops: Sequence[ir.Value], dst: ir.Value, ic: ir.Value,
            pc: ir.Value, kc: ir.Value, kcp: ir.Value, panels: ir.Value) -> None:
    """W[ic:ic+mc, pc:pc+kc] into ``mr``-row panels ``[p/g][r][p%g]`` (rows past M repeat the
    last; positions past kc, up to ``kcp``, are 0)."""
    g, mr = blk.group, blk.mr
    zero = ir.Constant(blk.elem, 0)
    with for_range(b, 0, panels, name="pack_w.ip") as ip:
        panel = b.gep(dst, [b.mul(ip, b.mul(kcp, _c(mr)))], inbounds=True)
        row0 = b.add(ic, b.mul(ip, _c(mr)))
        with for_range(b, 0, mr, name="pack_w.r") as r:
            row = _min(b, b.add(row0, r), _c(spec.m - 1))
            with for_range(b, 0, kcp, name="pack_w.p") as p:
                inside = b.icmp_signed("<", p, kc)
                col = _min(b, b.add(pc, p), _c(spec.k - 1))
                v = _convert(b, spec.load_w(b, ops, row, col), blk, spec.w_signed, "w")
                at = b.add(b.add(b.mul(b.udiv(p, _c(g)), _c(mr * g)), b.mul(r, _c(g))), b.urem(p, _c(g)))
                b.store(b.select(inside, v, zero), b.gep(panel, [at], inbounds=True))


def _pack_x_panel(b: ir.IRBuilder, spec: IGemmSpec, blk: IBlocking, ops: Sequence[ir.Value], dst: ir.Value,
                  pc: ir.Value, kc: ir.Value, kcp: ir.Value, col0: ir.Value) -> None:
    """X[pc:pc+kc, col0:col0+nr] into one panel ``[p/g][jj][p%g]`` through ``load_x`` (columns
    past N read the last column; positions past kc are 0)."""
    g, nr = blk.group, blk.nr
    zero = ir.Constant(blk.elem, 0)
    with for_range(b, 0, kcp, step=g, name="pack_x.q") as p0:
        row_dst = b.gep(dst, [b.mul(p0, _c(nr))], inbounds=True)
        with for_range(b, 0, nr, name="pack_x.jj") as jj:
            col = _min(b, b.add(col0, jj), _c(spec.n - 1))
            for e in range(g):
                p = b.add(p0, _c(e))
                inside = b.icmp_signed("<", p, kc)
                row = _min(b, b.add(pc, p), _c(spec.k - 1))
                v = _convert(b, spec.load_x(b, ops, row, col), blk, spec.x_signed, "x")
                b.store(b.select(inside, v, zero), b.gep(row_dst, [b.add(b.mul(jj, _c(g)), _c(e))], inbounds=True))


def _convert_vector(b: ir.IRBuilder, v: ir.Value, blk: IBlocking, signed: bool) -> ir.Value:
    """:func:`_convert` of a vector of X elements (``<n x i8>``)."""
    n = v.type.count
    if blk.variant == "vnni":
        return b.xor(v, ir.Constant(v.type, [0x80] * n)) if signed else v
    wide = ir.VectorType(I16, n)
    return b.sext(v, wide) if signed else b.zext(v, wide)


def transposed_packer(index: int, ld: int, k_total: int, columns: int, blk: IBlocking, signed: bool) -> Packer:
    """Packs X panels of ``X = Aᵀ`` for a row-major 8-bit ``A`` (operand ``index``, row length
    ``ld``): ``X[p][j] = A[j][p]``, so a group of ``g`` reduction elements of column ``j`` is
    ``g`` consecutive bytes of row ``j``: one 32-bit (``vnni``) or 16-bit (``madd``, then
    widened) load, converted and stored as the panel's word ``[p/g][jj]``.  Rows past the
    last column repeat it; the reduction's last partial group goes element by element."""
    g, nr = blk.group, blk.nr
    whole_groups = k_total // g
    src_t = ir.IntType(8 * g)
    elems = ir.VectorType(I8, g)

    def pack(b: ir.IRBuilder, ops: Sequence[ir.Value], dst_panel: ir.Value, pc: ir.Value, kc: ir.Value,
             kcp: ir.Value, col0: ir.Value) -> None:
        words = b.bitcast(dst_panel, I32P)
        # groups entirely inside both the block and K: word copies
        full_q = _min(b, b.sdiv(kc, _c(g)), b.sub(_c(whole_groups), b.sdiv(pc, _c(g))))
        with for_range(b, 0, nr, name="tr.jj") as jj:
            row = _min(b, b.add(col0, jj), _c(columns - 1))
            src = b.gep(ops[index], [b.add(b.mul(row, _c(ld)), pc)], inbounds=True)
            with for_range(b, 0, full_q, name="tr.q") as q:
                v = b.load(b.bitcast(b.gep(src, [b.mul(q, _c(g))], inbounds=True), src_t.as_pointer()), align=1)
                wv = _convert_vector(b, b.bitcast(v, elems), blk, signed)
                b.store(b.bitcast(wv, I32), b.gep(words, [b.add(b.mul(q, _c(nr)), jj)], inbounds=True))
            # the rest of the block's groups (K's last partial group, or none): element by element
            with for_range(b, b.mul(full_q, _c(g)), kcp, name="tr.p") as p:
                live = b.icmp_signed("<", b.add(pc, p), _c(k_total))
                live = b.and_(live, b.icmp_signed("<", p, kc))
                at = _min(b, p, b.sub(_c(k_total - 1), pc))
                v = _convert(b, b.load(b.gep(src, [at], inbounds=True)), blk, signed, "x")
                dst = b.gep(dst_panel, [b.add(b.add(b.mul(b.udiv(p, _c(g)), _c(nr * g)), b.mul(jj, _c(g))),
                                              b.urem(p, _c(g)))], inbounds=True)
                b.store(b.select(live, v, ir.Constant(blk.elem, 0)), dst)

    return pack


def rows_packer(row_ptr: Callable[[ir.IRBuilder, Sequence[ir.Value], ir.Value], ir.Value], k_total: int, columns: int,
                blk: IBlocking, signed: bool) -> Packer:
    """Packs X panels of a matrix whose rows are contiguous runs of bytes, ``X[p][j] =
    row_ptr(p)[j]`` (a 1x1 convolution's input planes, a convolution's phase-split padded
    input read flat): per group of ``g`` rows, ``g`` vector loads of ``nr`` bytes, converted
    and interleaved by one shuffle into ``[jj][p%g]`` order, one store.  The last (partial)
    panel goes element by element, reading its last column for columns past N."""
    g, nr = blk.group, blk.nr
    vec8 = ir.VectorType(I8, nr)
    elem_vec = ir.VectorType(blk.elem, nr)
    zero_vec = ir.Constant(elem_vec, [0] * nr)
    mask = [e * nr + jj for jj in range(nr) for e in range(g)]

    def interleave(b: ir.IRBuilder, vecs: list[ir.Value]) -> ir.Value:
        if g == 2:
            return b.shuffle_vector(vecs[0], vecs[1], ir.Constant(ir.VectorType(I32, 2 * nr), mask))
        pair = ir.Constant(ir.VectorType(I32, 2 * nr), list(range(2 * nr)))
        lo, hi = b.shuffle_vector(vecs[0], vecs[1], pair), b.shuffle_vector(vecs[2], vecs[3], pair)
        return b.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(I32, 4 * nr), mask))

    def pack(b: ir.IRBuilder, ops: Sequence[ir.Value], dst_panel: ir.Value, pc: ir.Value, kc: ir.Value,
             kcp: ir.Value, col0: ir.Value) -> None:
        whole = b.icmp_signed("<=", b.add(col0, _c(nr)), _c(columns))
        with b.if_else(whole) as (then, otherwise):
            with then:
                with for_range(b, 0, kcp, step=g, name="rows.q") as p0:
                    vecs = []
                    for e in range(g):
                        p = b.add(p0, _c(e))
                        row = _min(b, b.add(pc, p), _c(k_total - 1))
                        src = b.bitcast(b.gep(row_ptr(b, ops, row), [col0], inbounds=True), vec8.as_pointer())
                        v = _convert_vector(b, b.load(src, align=1), blk, signed)
                        vecs.append(b.select(b.icmp_signed("<", p, kc), v, zero_vec))
                    dst = b.bitcast(b.gep(dst_panel, [b.mul(p0, _c(nr))], inbounds=True),
                                    ir.VectorType(blk.elem, g * nr).as_pointer())
                    b.store(interleave(b, vecs), dst, align=1)
            with otherwise:
                zero = ir.Constant(blk.elem, 0)
                with for_range(b, 0, kcp, step=g, name="rows.tail.q") as p0:
                    row_dst = b.gep(dst_panel, [b.mul(p0, _c(nr))], inbounds=True)
                    for e in range(g):
                        p = b.add(p0, _c(e))
                        live = b.icmp_signed("<", p, kc)
                        base = row_ptr(b, ops, _min(b, b.add(pc, p), _c(k_total - 1)))
                        with for_range(b, 0, nr, name="rows.tail.jj") as jj:
                            col = _min(b, b.add(col0, jj), _c(columns - 1))
                            v = _convert(b, b.load(b.gep(base, [col], inbounds=True)), blk, signed, "x")
                            b.store(b.select(live, v, zero), b.gep(row_dst, [b.add(b.mul(jj, _c(g)), _c(e))], inbounds=True))

    return pack


# -- the block function ------------------------------------------------------------------------

def block_function(module: ir.Module, name: str, spec: IGemmSpec, blk: IBlocking, attrs: Sequence[str]) -> ir.Function:
    """``block(operands..., C, scratch, m0, m1, n0, n1)``: ``C[m0:m1, n0:n1]`` by the five loops
    (``jc`` → ``pc``: pack the X block → ``ic``: pack the W block → ``jr`` → ``ir``: the
    micro-kernel), C an int32 buffer of the product's shape; after a tile's last ``kc`` block
    the epilogue consumes its accumulators."""
    in_place = spec.x_offsets is not None
    rows_mode = spec.w_rows is not None
    ukernel = micro_kernel(module, blk, attrs, in_place, rows_mode)
    args = [I8P] * spec.operands + [I32P, I8P, I64, I64, I64, I64]
    fn = _function(module, name, args, attrs, blk.width == 16)
    fn.attributes.add("noinline")
    *ops, c, scratch, m0, m1, n0, n1 = fn.args
    for a in (*ops, c, scratch):
        a.add_attribute("noalias")
    b = spec.make_builder(fn) if spec.make_builder else ir.IRBuilder(fn.append_basic_block("entry"))
    mr, nr, g = blk.mr, blk.nr, blk.group
    eptr = blk.elem.as_pointer()
    kc_block = block_kc(spec, blk)
    single = kc_block >= spec.k  # one reduction block: no C array
    mc_pad = _round_up(min(blk.mc, spec.m), mr)
    tile = b.bitcast(scratch, I32P)
    w_pack = b.bitcast(b.gep(scratch, [_c(_round_up(4 * mr * nr, 64))], inbounds=True), eptr)
    x_pack = b.bitcast(b.gep(scratch, [_c(_round_up(4 * mr * nr, 64) + _round_up(blk.elem_bytes * mc_pad * kc_block, 64))],
                             inbounds=True), eptr)
    ldc = _c(spec.n)
    mpad = _round_up(spec.m, mr)

    def c_addr(i: ir.Value, j: ir.Value) -> ir.Value:
        return b.gep(c, [b.add(b.mul(i, ldc, flags=["nsw"]), j, flags=["nsw"])], inbounds=True)

    n_blocks = b.sdiv(b.add(b.sub(n1, n0), _c(blk.nc - 1)), _c(blk.nc))
    with for_range(b, 0, n_blocks, name="jc") as jcb:
        jc = b.add(n0, b.mul(jcb, _c(blk.nc)))
        nc = _min(b, _c(blk.nc), b.sub(n1, jc))
        with for_range(b, 0, spec.k, kc_block, name="pc") as pc:
            kc = _min(b, _c(kc_block), b.sub(_c(spec.k), pc))
            kcp = b.mul(b.sdiv(b.add(kc, _c(g - 1)), _c(g)), _c(g))
            kq = b.sdiv(kcp, _c(g))
            first = b.icmp_signed("==", pc, _c(0))
            last = b.icmp_signed("==", b.add(pc, kc), _c(spec.k))
            panels_n = b.sdiv(b.add(nc, _c(nr - 1)), _c(nr))
            if in_place:  # this block's groups' offsets; X's columns from jc on
                offsets = b.gep(spec.x_offsets, [_c(0), b.sdiv(pc, _c(g))], inbounds=True)
                x_cols = b.gep(ops[1], [b.mul(jc, _c(g * blk.elem_bytes))], inbounds=True)
                extra = [offsets]
            elif rows_mode:  # this block's groups' offsets from W's rows; X's panels pre-packed
                offsets = b.gep(spec.w_rows[1], [_c(0), b.sdiv(pc, _c(g))], inbounds=True)
                x_block = b.gep(b.bitcast(ops[1], eptr), [b.add(b.mul(pc, _c(_round_up(spec.n, nr))), b.mul(jc, kcp))],
                                inbounds=True)
                extra = [offsets, ops[0]]
            else:
                extra = []
                with for_range(b, 0, panels_n, name="pack_x.jp") as jp:
                    dst_panel = b.gep(x_pack, [b.mul(b.mul(jp, kcp), _c(nr))], inbounds=True)
                    col0 = b.add(jc, b.mul(jp, _c(nr)))
                    if spec.pack_x is not None:
                        spec.pack_x(b, ops, dst_panel, pc, kc, kcp, col0)
                    else:
                        _pack_x_panel(b, spec, blk, ops, dst_panel, pc, kc, kcp, col0)
            m_blocks = b.sdiv(b.add(b.sub(m1, m0), _c(blk.mc - 1)), _c(blk.mc))
            with for_range(b, 0, m_blocks, name="ic") as icb:
                ic = b.add(m0, b.mul(icb, _c(blk.mc)))
                mc = _min(b, _c(blk.mc), b.sub(m1, ic))
                panels_m = b.sdiv(b.add(mc, _c(mr - 1)), _c(mr))
                if rows_mode:
                    w_block = None
                elif spec.prepacked_w:  # block pc of the constant: W + pc*Mpad + ic*kcp
                    w_block = b.gep(b.bitcast(ops[0], eptr), [b.add(b.mul(pc, _c(mpad)), b.mul(ic, kcp))], inbounds=True)
                else:
                    w_block = w_pack
                    _pack_w(b, spec, blk, ops, w_pack, ic, pc, kc, kcp, panels_m)
                with for_range(b, 0, panels_n, name="jr") as jpn:
                    jr = b.mul(jpn, _c(nr))
                    cols = _min(b, _c(nr), b.sub(nc, jr))
                    if in_place:
                        xp = b.bitcast(b.gep(x_cols, [b.mul(jr, _c(g * blk.elem_bytes))], inbounds=True), I32P)
                    elif rows_mode:
                        xp = b.bitcast(b.gep(x_block, [b.mul(jr, kcp)], inbounds=True), I32P)
                    else:
                        xp = b.bitcast(b.gep(x_pack, [b.mul(jr, kcp)], inbounds=True), I32P)
                    with for_range(b, 0, panels_m, name="ir") as ipn:
                        ir_ = b.mul(ipn, _c(mr))
                        rows = _min(b, _c(mr), b.sub(mc, ir_))
                        i0 = b.add(ic, ir_)
                        if rows_mode:  # the tile's row offsets
                            wp = b.gep(spec.w_rows[0], [_c(0), i0], inbounds=True)
                        else:
                            wp = b.bitcast(b.gep(w_block, [b.mul(ir_, kcp)], inbounds=True), I32P)
                        j0 = b.add(jc, jr)
                        if single:  # the whole reduction in one call: through the stack tile
                            b.call(ukernel, [kq, wp, xp, tile, _c(nr), ir.Constant(ir.IntType(1), 0), *extra])
                            _tile_epilogue(b, spec, ops, i0, j0, rows, cols, nr,
                                           lambda r, cc: b.gep(tile, [b.add(b.mul(r, _c(nr)), cc)], inbounds=True))
                        else:
                            _accumulate_tile(b, ukernel, kq, wp, xp, tile, c_addr, i0, j0, rows, cols, first, last, ldc,
                                             spec, ops, blk, extra)
    b.ret_void()
    return fn


def _tile_epilogue(b: ir.IRBuilder, spec: IGemmSpec, ops: Sequence[ir.Value], i0: ir.Value, j0: ir.Value,
                   rows: ir.Value, cols: ir.Value, nr: int, acc_at: Callable[[ir.Value, ir.Value], ir.Value]) -> None:
    """The epilogue over a tile's ``rows × cols`` accumulators (columns innermost, or rows
    with ``epilogue_cols_outer``); ``acc_at(r, c)`` addresses one.  With ``vector_epilogue``
    a full-width tile goes row by row as ``nr``-lane vectors (the element loop vectorized by
    LLVM stored each 16 outputs with a ``vpmovdb`` to memory, which bound the epilogue)."""
    def elements() -> None:
        outer, inner = (cols, rows) if spec.epilogue_cols_outer else (rows, cols)
        with for_range(b, 0, outer, name="epi.o") as o:
            with for_range(b, 0, inner, name="epi.i") as n_:
                r, cc = (n_, o) if spec.epilogue_cols_outer else (o, n_)
                spec.epilogue(b, ops, b.add(i0, r), b.add(j0, cc), b.load(acc_at(r, cc)))

    if not spec.vector_epilogue or spec.epilogue_cols_outer:
        elements()
        return
    row_t = ir.VectorType(I32, nr)
    with b.if_else(b.icmp_signed("==", cols, _c(nr))) as (full, ragged):
        with full:
            with for_range(b, 0, rows, name="epi.r") as r:
                acc = b.load(b.bitcast(acc_at(r, _c(0)), row_t.as_pointer()), align=4)
                spec.epilogue(b, ops, b.add(i0, r), j0, acc)
        with ragged:
            elements()


def _accumulate_tile(b: ir.IRBuilder, ukernel: ir.Function, kq: ir.Value, wp: ir.Value, xp: ir.Value, tile: ir.Value,
                     c_addr: Callable[[ir.Value, ir.Value], ir.Value], i0: ir.Value, j0: ir.Value, rows: ir.Value,
                     cols: ir.Value, first: ir.Value, last: ir.Value, ldc: ir.Value, spec: IGemmSpec,
                     ops: Sequence[ir.Value], blk: IBlocking, extra: Sequence[ir.Value] = ()) -> None:
    """Several reduction blocks: the tile accumulates in C (whole tiles in place, edge tiles
    through the stack tile), the epilogue reads C after the last block."""
    mr, nr = blk.mr, blk.nr
    full = b.and_(b.icmp_signed("==", rows, _c(mr)), b.icmp_signed("==", cols, _c(nr)))
    with b.if_else(full) as (then, otherwise):
        with then:
            b.call(ukernel, [kq, wp, xp, c_addr(i0, j0), ldc, b.not_(first), *extra])
        with otherwise:
            b.call(ukernel, [kq, wp, xp, tile, _c(nr), ir.Constant(ir.IntType(1), 0), *extra])
            add_edge_tile(b, tile, nr, c_addr, i0, j0, rows, cols, first, ir.Constant(I32, 0), b.add)
    with b.if_then(last):
        _tile_epilogue(b, spec, ops, i0, j0, rows, cols, nr, lambda r, cc: c_addr(b.add(i0, r), b.add(j0, cc)))


# -- emission from an op function -----------------------------------------------------------

@dataclass(frozen=True)
class IPlan:
    """How :func:`emit` runs ``count`` products (a batch, or a grouped convolution's groups):
    each cut into ``shares`` pieces of ``share`` rows or columns (``dim``), the units dealt
    in contiguous runs to ``slots`` threads with ``per`` bytes of scratch each."""

    blk: IBlocking
    dim: str
    share: int
    shares: int
    slots: int
    per: int


#: products with at least this many multiply-adds in all are split over threads
PARALLEL_MIN_MACS = 1 << 20


#: packing one X panel (``nr`` columns over K) against one register tile's multiply-adds
#: over K (``mr·nr·K/64`` vpdpbusd): about half a tile for 8-row tiles
PANEL_PACK_TILES = 0.5


def plan(count: int, m: int, n: int, k: int, parallel: bool = True, *, blk: IBlocking,
         packs_x: bool = True) -> IPlan:
    """Threads and shares for ``count`` products of ``M×K · K×N``: the split (rows or columns,
    whole register tiles) and number of shares per product that minimize the busiest thread's
    work (ties: fewer shares, columns first): its register tiles, plus, where X is packed
    (``packs_x``), the panels it packs, :data:`PANEL_PACK_TILES` tiles each — a row split
    packs every panel in each share (a 1x1 192 -> 32 conv at 28x28 split its 4 row tiles and
    ran 1.03x faster on 2 threads than on one).  ``blk``: the products' blocking
    (:func:`blocking_for_host` of M and the build's ``CodegenConfig.igemm``)."""
    threads = (os.cpu_count() or 1) if parallel and count * m * n * k >= PARALLEL_MIN_MACS else 1
    best = None
    for dim, total, q in (("n", n, blk.nr), ("m", m, blk.mr)):
        tiles_other = math.ceil((m if dim == "n" else n) / (blk.mr if dim == "n" else blk.nr))
        tiles = math.ceil(total / q)
        for p in range(1, min(threads, tiles) + 1):
            share = math.ceil(tiles / p) * q
            shares = math.ceil(total / share)
            panels = math.ceil(share / q) if dim == "n" else tiles_other
            per_unit = math.ceil(share / q) * tiles_other + (PANEL_PACK_TILES * panels if packs_x else 0)
            load = math.ceil(count * shares / threads) * per_unit
            if best is None or load < best[0]:
                best = (load, dim, share, shares)
    _, dim, share, shares = best
    dummy = IGemmSpec(m, n, k, None, lambda *a: None, 2, True, False, lambda *a: None, prepacked_w=True)
    per = _round_up(scratch_bytes(dummy, blk, share if dim == "m" else m, share if dim == "n" else n), 64)
    return IPlan(blk, dim, share, shares, max(1, min(threads, count * shares)), per)


def scratch_size(count: int, m: int, n: int, k: int, parallel: bool = True, packs_x: bool = True, *,
                 blk: IBlocking) -> int:
    """Bytes of the scratch :func:`emit` needs (``blk``: the spec's blocking)."""
    p = plan(count, m, n, k, parallel, blk=blk, packs_x=packs_x)
    return p.slots * p.per


def needs_c(k: int, blk: IBlocking) -> bool:
    """Whether a product with this reduction needs an int32 C array (more than one block)."""
    return kc_for(k, blk) < k


def emit(k: KernelBuilder, spec: IGemmSpec, operands: Sequence[Buffer], c: Buffer | None, scratch: Buffer,
         batch: Sequence[int] = (), strides: Sequence[Sequence[int]] = ()) -> None:
    """``C[β] = W[β] · X[β]`` (then the epilogue) for every index β of the ``batch`` shape,
    ``strides[x][d]`` the element stride of batch dim ``d`` in operand ``x`` (C last; 0 where
    it is shared), the products cut and dealt to OpenMP threads as :func:`plan` says; each
    unit is one call of the block function with its base pointers and row/column range."""
    count = math.prod(batch)
    if spec.blocking is None:
        raise ValueError(f"{k.node.label}: IGemmSpec without a blocking (blocking_for_host(m, config.igemm))")
    p = plan(count, spec.m, spec.n, spec.k, k.parallel, blk=spec.blocking,
             packs_x=spec.x_offsets is None and spec.w_rows is None)
    if scratch.type.nbytes < p.slots * p.per:
        raise AssertionError(f"{k.node.label}: integer GEMM scratch {scratch.type.nbytes} B < {p.slots} x {p.per}")
    attrs = [a for a in k.fn.attributes if a != "noinline"]
    fn = block_function(k.module, f"{k.fn.name}.igemm{k.nests}", spec, p.blk, attrs)
    k.nests += 1
    units = count * p.shares
    total = spec.m if p.dim == "m" else spec.n
    if c is None and needs_c(spec.k, p.blk):
        raise AssertionError(f"{k.node.label}: K={spec.k} takes several blocks, the product needs a C array")
    widths = [_elem_bytes(buf) for buf in operands] + [4]
    with k.parallel_loop(0, p.slots, "igemm") as slot:
        b = k.b
        lo = b.sdiv(b.mul(slot, _c(units)), _c(p.slots))
        hi = b.sdiv(b.mul(b.add(slot, _c(1)), _c(units)), _c(p.slots))
        bases = [b.bitcast(buf.ptr, I8P) for buf in operands]
        bases.append(b.bitcast(c.ptr, I8P) if c is not None else ir.Constant(I8P, None))
        work = b.gep(b.bitcast(scratch.ptr, I8P), [b.mul(slot, _c(p.per))], inbounds=True)
        with for_range(b, lo, hi, name="unit") as u:
            rest, part = b.udiv(u, _c(p.shares)), b.urem(u, _c(p.shares))
            offsets = [_c(0)] * len(bases)
            for d in reversed(range(len(batch))):
                idx = b.urem(rest, _c(batch[d])) if d else rest
                rest = b.udiv(rest, _c(batch[d]))
                offsets = [off if not st[d] else b.add(off, b.mul(idx, _c(st[d] * wb)))
                           for off, st, wb in zip(offsets, strides, widths)]
            ptrs = [b.gep(base, [off], inbounds=True) for base, off in zip(bases, offsets)]
            ptrs[-1] = b.bitcast(ptrs[-1], I32P) if c is not None else ir.Constant(I32P, None)
            p0 = b.mul(part, _c(p.share))
            p1 = _min(b, b.add(p0, _c(p.share)), _c(total))
            ranges = [p0, p1, _c(0), _c(spec.n)] if p.dim == "m" else [_c(0), _c(spec.m), p0, p1]
            b.call(fn, [*ptrs, work, *ranges])


def _elem_bytes(buf: Buffer) -> int:
    return int(np.dtype(buf.type.dtype).itemsize)


# -- requantization -----------------------------------------------------------------------------

def multipliers(x_scale: float, w_scale: np.ndarray, y_scale: float, count: int) -> np.ndarray:
    """Per output channel ``float32(x_s · w_s[c]) / y_s`` in float32 (onnxruntime's order)."""
    ws = np.broadcast_to(np.asarray(w_scale, np.float32).reshape(-1), (count,)) if np.size(w_scale) == 1 \
        else np.asarray(w_scale, np.float32).reshape(-1)
    return (np.float32(x_scale) * ws).astype(np.float32) / np.float32(y_scale)
