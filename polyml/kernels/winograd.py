"""Winograd convolution F(m×m, 3×3) (Lavin & Gray) for 3×3 stride-1 undilated convolutions with
constant weights, on polyml's packed GEMM.

With ``α = m + 2`` and the output split into ``m × m`` tiles ``t = (ti, tj)`` (``T`` of them; the
last row and column of tiles may cross the output's border), each tile of output channel ``k`` is

    Y[k, t] = Aᵀ · ( Σ_c  (G g[k, c] Gᵀ) ⊙ (Bᵀ d[c, t] B) ) · A

where ``d[c, t]`` is the ``α × α`` input patch under the tile (zero outside the input) and
``g[k, c]`` the 3×3 filter.  Written per transform-domain point ``(ξ, ν)`` the sum over ``c`` is
a matrix product, so the convolution becomes four stages:

1. weight transform, at compile time (:meth:`Kernel.constants`):
   ``U[ξν][k][c] = (G g[k, c] Gᵀ)[ξ][ν]``, each of the ``α²`` matrices pre-packed in the GEMM's
   panel order (:func:`polyml.codegen.gemm.prepack_a`);
2. input transform, an affine nest over ``{[c, ti, tj]}`` (parallel over ``c``) reading a
   zero-padded copy of x: ``V[ξν][c][t] = (Bᵀ d[c, t] B)[ξ][ν]`` (constant coefficients, unrolled);
3. ``α²`` independent products ``M[ξν] = U[ξν] (K×C) · V[ξν] (C×T)`` on the packed GEMM,
   the batch spread over the threads (:func:`polyml.kernels.matmul.batched_product`);
4. output transform, a nest over ``{[k, ti, tj]}`` (parallel over ``k``):
   ``y[k][ti·m + a][tj·m + b] = chain((Aᵀ M[·][k][t] A)[a][b] + bias[k])`` with the fused chain
   (activation, residual add) when the tiles cover the output exactly; otherwise into ``Ypad``,
   then cropped to y with the bias and chain in one nest.

Multiply-adds per output: ``C·9`` directly, ``C·α²/m²`` in the products (4 for F(2×2), 2.25 for
F(4×4)), plus transforms linear in ``C·T`` and ``K·T``.  F(4×4)'s transforms have larger
coefficients, so its rounding error is larger; tests/test_kernels_winograd.py bounds both against
the direct convolution per layer shape.  Which tile size runs where is :func:`choose_tile`'s rule,
measured per layer shape (``scripts/bench_models.py layers``); ``POLYML_WINOGRAD=0|2|4`` forces it
for experiments.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32, Buffer, KernelBuilder, load_lanes, pointer_type, skip_polly, splat, store_lanes
from polyml.errors import PolymlError
from polyml.graph import Node, TensorType
from polyml.kernels import _window
from polyml.kernels._window import Window, affine, nest, padded_source
from polyml.kernels.fused import evaluate_chain
from polyml.options import CodegenConfig
from polyml.schedule import gemm as scheduled_gemm

F = Fraction
#: the transform matrices (Bᵀ, G, Aᵀ) of F(m×m, 3×3), interpolation points 0, ±1 (, ±2), ∞
MATRICES: dict[int, tuple[list[list[Fraction]], list[list[Fraction]], list[list[Fraction]]]] = {
    2: (
        [[F(1), F(0), F(-1), F(0)], [F(0), F(1), F(1), F(0)], [F(0), F(-1), F(1), F(0)], [F(0), F(1), F(0), F(-1)]],
        [[F(1), F(0), F(0)], [F(1, 2), F(1, 2), F(1, 2)], [F(1, 2), F(-1, 2), F(1, 2)], [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(0)], [F(0), F(1), F(-1), F(-1)]],
    ),
    4: (
        [[F(4), F(0), F(-5), F(0), F(1), F(0)], [F(0), F(-4), F(-4), F(1), F(1), F(0)],
         [F(0), F(4), F(-4), F(-1), F(1), F(0)], [F(0), F(-2), F(-1), F(2), F(1), F(0)],
         [F(0), F(2), F(-1), F(-2), F(1), F(0)], [F(0), F(4), F(0), F(-5), F(0), F(1)]],
        [[F(1, 4), F(0), F(0)], [F(-1, 6), F(-1, 6), F(-1, 6)], [F(-1, 6), F(1, 6), F(-1, 6)],
         [F(1, 24), F(1, 12), F(1, 6)], [F(1, 24), F(-1, 12), F(1, 6)], [F(0), F(0), F(1)]],
        [[F(1), F(1), F(1), F(1), F(1), F(0)], [F(0), F(1), F(-1), F(2), F(-2), F(0)],
         [F(0), F(1), F(1), F(4), F(4), F(0)], [F(0), F(1), F(-1), F(8), F(-8), F(1)]],
    ),
}


@dataclass(frozen=True)
class WinogradPlan:
    """Geometry of one Winograd convolution: output tile ``m``, tiles, and the scratch layout
    ``[xpad | V (α²·C·T) | M (α²·K·T) | Ypad (K·TH·m·TW·m) | GEMM packing]`` per batch item."""

    m: int
    win: Window
    batch: int
    c: int
    k: int
    #: the output transform stores through Ypad and the crop (a chain :func:`_vector_output`
    #: does not take), else straight into y
    scalar_output: bool = False
    #: the build's code generation settings (the GEMM's blocking and plan)
    config: CodegenConfig = CodegenConfig()

    @property
    def blocking(self) -> packed.Blocking:
        return packed.blocking_for_host(self.config.gemm_blocking)

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def tiles(self) -> tuple[int, int]:
        return -(-self.win.out[0] // self.m), -(-self.win.out[1] // self.m)

    @property
    def t(self) -> int:
        return self.tiles[0] * self.tiles[1]

    @property
    def exact(self) -> bool:
        """Whether the tiles cover the output exactly (then no tile crosses its border)."""
        return all(o % self.m == 0 for o in self.win.out)

    @property
    def pad_window(self) -> Window:
        """The window whose padded copy covers every tile's α×α patch (``TH·m + 2`` rows)."""
        th, tw = self.tiles
        w = self.win
        return Window(w.size, w.kernel, w.strides, w.dilations, w.pads_begin, w.pads_end, (th * self.m, tw * self.m))

    @property
    def xpad(self) -> TensorType:
        return TensorType(self.pad_window.padded_shape((self.batch, self.c)))

    @property
    def scheduled(self) -> bool:
        """Whether the α² products run as the batched GEMM nest under its schedule
        (:mod:`polyml.schedule.gemm`, ``U`` in its layout) rather than on the packed GEMM."""
        from polyml.kernels.matmul import scheduled_plan

        return scheduled_plan(self.config, self.k, self.t, self.c, False, batch=self.alpha ** 2, a_constant=True) \
            is not None

    def schedule_plan(self, parallel: bool = True):  # noqa: ANN201  (polyml.schedule.gemm.Plan)
        from polyml.kernels.matmul import scheduled_plan

        return scheduled_plan(self.config, self.k, self.t, self.c, False, parallel, self.alpha ** 2, True)

    @property
    def sizes(self) -> dict[str, int]:
        from polyml.kernels.matmul import batched_temps, scheduled_scratch

        a2, (th, tw) = self.alpha ** 2, self.tiles
        if self.scheduled:
            gemm = scheduled_scratch(self.config, self.k, self.t, self.c, False, a2, True)
        else:
            temps = batched_temps(self.config, a2, self.k, self.t, self.c)
            gemm = temps[0].size if temps else 0
        return {"xpad": self.xpad.size, "v": a2 * self.c * self.t, "m": a2 * self.k * self.t,
                "ypad": self.k * th * self.m * tw * self.m if self.scalar_output and not self.exact else 0,
                "gemm": gemm}

    @property
    def scratch(self) -> TensorType:
        return TensorType((sum(self.sizes.values()),))


def _forced(v: str) -> int | None:
    """The tile ``POLYML_WINOGRAD`` (:attr:`polyml.options.CodegenConfig.winograd`) forces."""
    if not v:
        return None
    if v not in ("0", "2", "4"):
        raise PolymlError(f"POLYML_WINOGRAD={v!r}: expected 0 (off), 2 (F(2x2,3x3)) or 4 (F(4x4,3x3))")
    return int(v)


@dataclass(frozen=True)
class WinogradRule:
    """Where Winograd beats the packed GEMM on one ISA: F(4×4) from ``f4_channels`` input and
    output channels on maps of at least ``f4_map`` (both sides), else F(2×2) from
    ``f2_channels`` on maps of at least ``f2_map`` (in a one-thread build ``serial_f2_map``,
    0: ``f2_map``)."""

    f4_channels: int
    f4_map: int
    f2_channels: int
    f2_map: int
    serial_f2_map: int = 0


#: AVX-512 (per-layer tables in docs/PERFORMANCE.md; 2 threads, loaded host, Winograd
#: / packed GEMM): maps of 24 and more with 32+ channels gain most from F(4×4) (0.17-0.67:
#: 128->128 @28 0.17, 256->256 @56 0.39, 32->128 @27 0.49, 64->64 @56 0.67), 14×14 maps with 96+
#: channels from F(2×2) (0.24-0.75; F(4×4)'s 16 tiles fill half a register tile of columns),
#: while 7×7 maps (1.0-4× slower: 16 or 4 tiles) kept the GEMM.  With the transforms on
#: explicit vectors (:data:`VECTOR_TRANSFORMS`; per step of whole models,
#: minimum of 12, Winograd / the path taken without it): F(4×4) from 16 channels (SqueezeNet's 16->64
#: @55 0.82-0.97 at 2 threads, against the im2col GEMM; one-thread builds take it with scalar transforms too), F(2×2)
#: from 48 channels on maps from 12x12 (against the ``rows`` tiles: SqueezeNet's 48->192 and
#: 64->256 @13 0.84-0.90 at 2 threads and 0.72-0.76 at 1, Inception-v1's 96->208 .. 160->320 @13
#: 0.78-0.80 and 0.64-0.75, Inception-v2's 64->96 @14 0.85 and 0.79, ZFNet's 256->512 and
#: 512->512 @12 0.66-0.67 and 0.61-0.67, AlexNet's 256->384 @12 0.72 and 0.67), and in
#: one-thread builds on 7x7 maps too (ResNet-50's 512->512 @7 0.81-0.82, Inception-v2's 7x7
#: steps 0.98 in sum; at 2 threads 0.93-1.14); 6x6 maps keep the GEMM (Inception-v1's 160->320
#: and 192->384 @6: 1.13-1.48).  AVX2 (Zen 1 EPYC, single layers
#: with ReLU, 1 thread CPU time, minimum of 30-40 alternating blocks, against the path taken
#: without Winograd): F(4×4) from 13×13 (64->256 @13 0.58, 384->384 @13 0.45, 48->192 @13 0.55, 256->256
#: @14 0.69 of F(2×2), 96->208 @14 0.82 of F(2×2)); F(2×2) on 7×7 maps (512->512 0.53, 160->320
#: 0.54, 128->32 0.65; F(4×4) 1.1-1.3) and from 16 channels (16->64 @55 0.86 and 16->16 @56 0.36
#: of the direct nests; F(4×4) 1.0-1.1): the 6×16 GEMM tile runs at a third of AVX-512's
#: rate per core, so the transforms' memory passes are cheap next to the multiplications saved.
WINOGRAD_RULES = {"avx512": WinogradRule(16, 24, 48, 12, serial_f2_map=7), "avx": WinogradRule(32, 13, 16, 7),
                  "other": WinogradRule(32, 24, 96, 14)}


def choose_tile(config: CodegenConfig, c: int, k: int, out: tuple[int, int]) -> int:
    """The output tile ``m`` (2 or 4) for a C→K 3×3/1 convolution with this output, 0: no
    Winograd (:data:`WINOGRAD_RULES` for this host's ISA; ``config.winograd`` forces)."""
    forced = _forced(config.winograd)
    if forced is not None:
        return forced
    rule = WINOGRAD_RULES[_window._isa()]  # through the module: one seam pins the ISA (tests)
    f2_map = rule.f2_map if config.threaded else (rule.serial_f2_map or rule.f2_map)
    if min(c, k) >= rule.f4_channels and min(out) >= rule.f4_map:
        return 4
    if min(c, k) >= rule.f2_channels and min(out) >= f2_map:
        return 2
    return 0


def winograd_plan(config: CodegenConfig, node: Node, x: TensorType, w: TensorType, win: Window) -> WinogradPlan | None:
    """The plan when this Conv runs as Winograd: 3×3, stride 1, dilation 1, one group, two
    spatial dims, a host build with the packed GEMM and ``conv=auto``, and :func:`choose_tile`
    picks a tile; else None.  (Only called for constant weights.)"""
    if (win.rank != 2 or win.kernel != (3, 3) or win.strides != (1, 1) or win.dilations != (1, 1)
            or int(node.attrs.get("group", 1)) != 1):
        return None
    if not config.packed or config.conv != "auto":
        return None
    m = choose_tile(config, x.shape[1], w.shape[0], win.out)
    if not m:
        return None
    plan = WinogradPlan(m, win, x.shape[0], x.shape[1], w.shape[0], _vector_output(node) is None, config)
    from polyml.kernels.matmul import batched_plan

    return plan if batched_plan(config, plan.alpha ** 2, plan.k, plan.t, plan.c) is not None else None


def transform_weights(w: np.ndarray, plan: WinogradPlan) -> np.ndarray:
    """``U[ξν] = (G g Gᵀ)[ξ][ν]`` as α² K×C matrices, each pre-packed for the GEMM, concatenated."""
    _, g_mat, _ = MATRICES[plan.m]
    g = np.array(g_mat, np.float64)
    u = np.einsum("xi,kcij,yj->xykc", g, w.astype(np.float64), g)  # α, α, K, C
    if plan.scheduled:  # the batched GEMM schedule's constant A
        return scheduled_gemm.constant_a(plan.schedule_plan(), u.reshape(-1, plan.k, plan.c).astype(np.float32))
    blk = plan.blocking
    return np.concatenate([packed.prepack_a(u[i, j].astype(np.float32), blk) for i in range(plan.alpha)
                           for j in range(plan.alpha)])


def packed_weight_floats(plan: WinogradPlan) -> int:
    """Floats of one pre-packed U[ξν] (rows padded to the register tile)."""
    mr = plan.blocking.mr
    return -(-plan.k // mr) * mr * plan.c


def _combine(b: ir.IRBuilder, coeffs: list[Fraction], vals: list[ir.Value]) -> ir.Value:
    """``Σ coeffs[i]·vals[i]`` with the zero terms dropped and ±1 as plain adds."""
    acc = None
    for cf, v in zip(coeffs, vals):
        if cf == 0:
            continue
        if abs(cf) == 1:
            term, neg = v, cf < 0
        else:
            term, neg = b.fmul(v, _constant(v.type, float(abs(cf)))), cf < 0
        if acc is None:
            acc = b.fneg(term) if neg else term
        else:
            acc = b.fsub(acc, term) if neg else b.fadd(acc, term)
    return acc if acc is not None else _constant(vals[0].type if vals else F32, 0.0)


def _constant(ty: ir.Type, value: float) -> ir.Constant:
    """``value`` as a float or as every lane of a float vector type."""
    return ir.Constant(ty, [value] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(F32, value)


#: the input and output transforms on explicit vectors along a row of tiles (:func:`_input_rows`,
#: :func:`_output_rows`); False: the scalar nests, which LLVM
#: vectorizes with gathers and scatters.  Per step of
#: whole models at 2 threads, minimum of 10-30, vectors / scalar nests: SqueezeNet's 3x3 32->128
#: @27 0.73-0.77 (output) and 0.95-0.99 more (input); ResNet-50's 64->64 @56 0.87-0.88,
#: 128->128 @28 0.91-0.92, 256->256 @14 0.96-0.99 (its Winograd steps 0.93 in sum, of which the
#: input transform 0.96); at 1 thread SqueezeNet's 16->64 @55 and 32->128 @27 0.74-0.81
VECTOR_TRANSFORMS = True


def _vector_output(node: Node) -> packed.RegisterEpilogue | bool | None:
    """How :func:`_output_rows` applies this Conv's fused chain in registers: its
    :class:`~polyml.codegen.gemm.RegisterEpilogue` (ReLUs and Clips), True without a chain,
    None where the scalar nest runs (:data:`VECTOR_TRANSFORMS` off, or a chain reading more
    operands at each output, such as a residual add)."""
    if not VECTOR_TRANSFORMS:
        return None
    chain = node.attrs.get("epilogue")
    if not chain:
        return True
    extras = [name for name in node.inputs[node.attrs["epilogue_start"]:] if name]
    return _window.register_epilogue(None, chain, extras)  # the bias: _output_rows adds it


def _interleave(b: ir.IRBuilder, vectors: list[ir.Value]) -> ir.Value:
    """One vector of ``len(vectors) · lanes`` lanes whose lane ``t·n + q`` is lane ``t`` of
    ``vectors[q]`` (``n = len(vectors)``, a power of two): tile ``t``'s ``n`` outputs of one
    row side by side, as they lie in the output row."""
    n, lanes = len(vectors), vectors[0].type.count
    i32 = ir.IntType(32)
    parts = list(vectors)
    while len(parts) > 1:  # concatenate pairwise: lane q·lanes + t is vectors[q][t]
        width = 2 * parts[0].type.count
        parts = [b.shuffle_vector(parts[i], parts[i + 1], ir.Constant(ir.VectorType(i32, width), list(range(width))))
                 for i in range(0, len(parts), 2)]
    whole = parts[0]
    order = [q * lanes + t for t in range(lanes) for q in range(n)]
    return b.shuffle_vector(whole, ir.Constant(whole.type, None), ir.Constant(ir.VectorType(i32, n * lanes), order))


def _output_rows(k: KernelBuilder, plan: WinogradPlan, mm: Buffer, y: Buffer, n: int, bias: Buffer | None,
                 epilogue: packed.RegisterEpilogue | None) -> None:
    """The output transform as explicit vectors, straight into ``y[n]``: per output channel and
    row of tiles, ``lanes`` tiles at a time, the ``α²`` values of each tile one vector load from
    ``M`` (contiguous along the tiles; the last group masked), ``Aᵀ M A`` on vectors, and each
    of the ``m`` output rows the ``m`` result vectors interleaved (:func:`_interleave`) into
    one contiguous run of the row, ``bias`` and ``epilogue`` applied in registers, stored up to
    the output's last column (masked) and for rows inside it (the last row of tiles may cross
    the border).  The scalar nest's stores, ``m`` apart along a row, became scatters (16 per
    16 tiles of F(4×4), spilling registers), and the crop from Ypad gathers and scatters: on
    SqueezeNet's 3x3 32->128 @27 they took longer than the products."""
    a, m, (th, tw) = plan.alpha, plan.m, plan.tiles
    height, width = plan.win.out
    _, _, at = MATRICES[m]
    lanes = plan.blocking.width
    vec = ir.VectorType(F32, lanes)
    row_vec = ir.VectorType(F32, m * lanes)

    with nest(k, [plan.k, th], names=["wk", "wyi"], parallel=1) as (ko, ti):
        b = k.b  # the parallel body's builder
        skip_polly(k.fn)  # explicit vectors; Polly 19 crashed exporting the masked accesses' SCoP
        bias_value = bias.load([ko]) if bias is not None else None
        for tj0 in range(0, tw, lanes):
            tix = affine(k, [(tw, ti)], tj0)
            tile = [[load_lanes(b, b.bitcast(mm.addr([i * a + j, ko, tix]), vec.as_pointer()), tw - tj0)
                     for j in range(a)] for i in range(a)]
            out = _sandwich(b, at, tile)
            for p in range(m):
                row = _interleave(b, out[p])
                if epilogue is not None:
                    row = epilogue.apply(b, row, bias_value)
                elif bias_value is not None:
                    row = b.fadd(row, splat(b, bias_value, row_vec))
                oh = affine(k, [(m, ti)], p)
                ptr = b.bitcast(y.addr([n, ko, oh, tj0 * m]), row_vec.as_pointer())
                if (th - 1) * m + p < height:  # inside the output in every row of tiles
                    store_lanes(b, row, ptr, width - tj0 * m)
                else:  # only above the last row of tiles
                    with b.if_then(b.icmp_signed("<", k.i64(oh), k.i64(height))):
                        store_lanes(b, row, ptr, width - tj0 * m)


def _input_rows(k: KernelBuilder, plan: WinogradPlan, src: Buffer, v: Buffer, n: int) -> None:
    """The input transform as explicit vectors (the output transform's mirror): per channel and
    row of tiles, ``lanes`` tiles at a time, each of the ``α`` input rows under them one
    contiguous load (masked at the copy's row end) whose lanes ``t·m + j`` are deinterleaved
    into the ``α`` vectors of tap column ``j``; ``Bᵀ d B`` on vectors; each of the ``α²``
    results one contiguous (masked) store into ``V``, along the tiles.  The scalar nest's
    stride-``m`` loads and stores had become gathers and scatters."""
    a, m, (th, tw) = plan.alpha, plan.m, plan.tiles
    bt, _, _ = MATRICES[m]
    lanes = plan.blocking.width
    vec = ir.VectorType(F32, lanes)
    span = m * lanes + a - m  # input columns under ``lanes`` tiles
    run = ir.VectorType(F32, span)
    row_end = src.shape[-1]
    i32 = ir.IntType(32)
    with nest(k, [plan.c, th], names=["wc", "wti"], parallel=1) as (c, ti):
        b = k.b  # the parallel body's builder
        skip_polly(k.fn)  # as in _output_rows (here it segfaulted, on --emit jscop of SqueezeNet)
        for tj0 in range(0, tw, lanes):
            d = []
            for i in range(a):
                ptr = b.bitcast(src.addr([n, c, affine(k, [(m, ti)], i), tj0 * m]), run.as_pointer())
                row = load_lanes(b, ptr, row_end - tj0 * m)
                d.append([b.shuffle_vector(row, ir.Constant(run, None),
                                           ir.Constant(ir.VectorType(i32, lanes), [t * m + j for t in range(lanes)]))
                          for j in range(a)])
            tv = _sandwich(b, bt, d)
            tix = affine(k, [(tw, ti)], tj0)
            for i in range(a):
                for j in range(a):
                    store_lanes(b, tv[i][j], b.bitcast(v.addr([i * a + j, c, tix]), vec.as_pointer()), tw - tj0)


def _sandwich(b: ir.IRBuilder, left: list[list[Fraction]], tile: list[list[ir.Value]]) -> list[list[ir.Value]]:
    """``L · tile · Lᵀ`` with constant ``L`` (rows × n), ``tile`` n × n of IR values."""
    n = len(tile)
    half = [[_combine(b, row, [tile[i][j] for i in range(n)]) for j in range(n)] for row in left]
    return [[_combine(b, row, hrow) for row in left] for hrow in half]


def convolve_winograd(k: KernelBuilder, plan: WinogradPlan, scratch: Buffer) -> bool:
    """Emit the four stages (module docstring) into ``k``; True: the fused chain was applied."""
    from polyml.kernels.matmul import batched_product, scheduled_product

    x, y = k.inputs[0], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    u = k.constants[0]
    bt, _, at = MATRICES[plan.m]
    a, m, (th, tw), t = plan.alpha, plan.m, plan.tiles, plan.t
    sizes = plan.sizes
    base = k.b.bitcast(scratch.ptr, F32.as_pointer())
    offsets, at_ = {}, 0
    for name, size in sizes.items():
        offsets[name] = at_
        at_ += size

    def region(name: str, shape: tuple[int, ...]) -> Buffer:
        tt = TensorType(shape)
        ptr = k.b.bitcast(k.b.gep(base, [ir.Constant(ir.IntType(64), offsets[name])], inbounds=True), pointer_type(tt))
        return Buffer(k, ptr, tt, f"wino_{name}")

    xpad = region("xpad", plan.xpad.shape)
    v = region("v", (a * a, plan.c, t))
    mm = region("m", (a * a, plan.k, t))
    ypad = region("ypad", (plan.k, th * m, tw * m))
    work = region("gemm", (max(sizes["gemm"], 1),))
    src, _ = padded_source(k, x, plan.pad_window, xpad, 0.0)
    chain = k.node.attrs.get("epilogue")
    extras = {buf.name: buf for buf in k.inputs[k.node.attrs["epilogue_start"]:] if buf is not None} if chain else {}

    def finish(val: ir.Value, ix: list) -> ir.Value:
        """bias and the fused chain at output index ``[n, k, oh, ow]``"""
        if bias is not None:
            val = k.b.fadd(val, bias.load([ix[1]]))
        if chain:
            val = evaluate_chain(k, chain, {k.node.attrs["epilogue_acc"]: val}, extras, ix)
        return val

    how = _vector_output(k.node)
    epilogue = how if isinstance(how, packed.RegisterEpilogue) else None
    for n in range(plan.batch):
        # V[ξν][c][t] = (Bᵀ d B)[ξ][ν], d = xpad[n, c, ti·m + i, tj·m + j]
        if VECTOR_TRANSFORMS:
            _input_rows(k, plan, src, v, n)
        else:
            with nest(k, [plan.c, th, tw], names=["wc", "wti", "wtj"], parallel=1) as (c, ti, tj):
                d = [[src.load([n, c, affine(k, [(m, ti)], i), affine(k, [(m, tj)], j)]) for j in range(a)]
                     for i in range(a)]
                tv = _sandwich(k.b, bt, d)
                tix = affine(k, [(tw, ti), (1, tj)])
                for i in range(a):
                    for j in range(a):
                        v.store([i * a + j, c, tix], tv[i][j])
        # M[ξν] = U[ξν] · V[ξν], α² products: the batched GEMM nest under its schedule, or the packed GEMM
        if plan.scheduled:
            scheduled_product(k, {"Ac": u, "B": v, "C": mm}, plan.k, t, plan.c, work=work, a_constant=True,
                              batch=a * a)
        else:
            spec = packed.GemmSpec(plan.k, t, plan.c, packed.matrix_loader(0, plan.c), packed.matrix_loader(1, t), 2,
                                   prepacked_a=True)
            batched_product(k, spec, [u, v], mm, work, (a * a,),
                            [[packed_weight_floats(plan)], [plan.c * t], [plan.k * t]])
        # (Aᵀ M A)[p][q] of tile (ti, tj) is output (ti·m + p, tj·m + q): on vectors straight
        # into y; the scalar nest stores in y with the bias and chain when the tiles cover the
        # output exactly, else in Ypad, cropped with them
        if not plan.scalar_output:
            _output_rows(k, plan, mm, y, n, bias, epilogue)
        else:
            with nest(k, [plan.k, th, tw], names=["wk", "wyi", "wyj"], parallel=1) as (ko, ti, tj):
                tix = affine(k, [(tw, ti), (1, tj)])
                tile = [[mm.load([i * a + j, ko, tix]) for j in range(a)] for i in range(a)]
                out = _sandwich(k.b, at, tile)
                for p in range(m):
                    for q in range(m):
                        at_ = [ko, affine(k, [(m, ti)], p), affine(k, [(m, tj)], q)]
                        if plan.exact:
                            y.store([n, *at_], finish(out[p][q], [n, *at_]))
                        else:
                            ypad.store(at_, out[p][q])
        if not plan.exact and plan.scalar_output:
            with nest(k, [1, plan.k, *plan.win.out], names=["yn", "yk", "yh", "yw"], parallel=2) as ix:
                y.store([n, *ix[1:]], finish(ypad.load(ix[1:]), [n, *ix[1:]]))
    return bool(k.node.attrs.get("epilogue"))


__all__ = ["MATRICES", "WinogradPlan", "convolve_winograd", "transform_weights", "winograd_plan"]
