"""The GEMM family: ``C = A · B`` (MatMul, Gemm) as a plain nest, and the schedule that makes it fast.

The nest (:func:`nest`) is what ONNX means: ``Z[i, j]: C[i, j] = 0`` then
``S[i, j, k]: C[i, j] += A[i, k] · B[k, j]`` over ``M × N × K`` (isl parameters; a transposed
operand is the access ``A[k, i]`` / ``B[j, k]``), and for Gemm's ``alpha`` and ``beta · C``
``E[i, j]: C[i, j] = alpha · C[i, j] + beta · Cb[i?, j?]``.

The schedule (:func:`schedule`) is BLIS's loop nest, written as transforms of that nest in the
way Polly's MatMul optimizer builds it: the band ``(i, j, k)`` of S and E (E at ``k = K - 1``)
is strip-mined into thread shares, cache blocks ``mc × nc × kc`` and register tiles
``mr × nr`` and permuted to ``(share, jc, pc, ic, jr, ir | i, j, k)``, each tile's S before its
E; B's ``kc × nc`` block is packed into ``nr``-wide panels before the ``ic`` loop (a constant B
once, at compile time: :func:`constant_b`) and A's ``mc × kc`` block into ``mr``-high panels
before the register tiles (per-thread buffers); the share loop is marked ``parallel``; S's
register tile is tensorized onto ``fma.f32.<mr>x<nr>`` with Z folded into its first reduction
step.  Sizes come from the host's cache model (:func:`polyml.codegen.gemm.host_blocking`,
``block_kc``, ``block_nc``, ``split``), so this path and the hand-written packed GEMM block alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl
import llvmlite.ir as ir
import numpy as np

from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32
from polyml.schedule import codegen, layout, legality
from polyml.schedule import tree as T
from polyml.schedule.intrinsics import FmaTile
from polyml.schedule.nest import Access, Array, Nest, Program, Statement

PARAMS = "[M, N, K]"
#: the packing buffers' layouts also name the thread (:data:`polyml.schedule.codegen.THREAD`)
LAYOUT_PARAMS = "[M, N, K, T]"


def zero(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    """An initialisation's body: ``c = 0``."""
    b.store(ir.Constant(F32, 0.0), ptrs[0])


def multiply_add(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    """A product's update: ``c += a · b`` (pointers of C, A, B: the GEMM's and the convolution's S)."""
    c, a, bb = ptrs
    b.store(b.fadd(b.load(c), b.fmul(b.load(a), b.load(bb))), c)


def nest(trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0, bias: tuple[bool, bool] | None = None,
         beta: float = 1.0, batch: int = 0) -> Nest:
    """``C (M×N) = A (M×K) · B (K×N)``, row-major, sizes as parameters; ``trans_a``/``trans_b``:
    the operand is stored transposed (``A[k, i]``, ``B[j, k]``).  With ``alpha != 1`` or a
    ``bias`` (ONNX Gemm's ``C``, broadcast: whether it has rows and columns), a finishing
    statement ``E[i, j]: C[i, j] = alpha · C[i, j] + beta · Cb[i?, j?]`` follows the product.
    ``batch``: that many independent products, a leading index ``l`` of every statement and
    array (``S[l, i, j, k]: C[l, i, j] += A[l, i, k] · B[l, k, j]``; untransposed, no E)."""
    if batch and (trans_a or trans_b or alpha != 1.0 or bias is not None):
        raise ValueError("GEMM nest: a batch of products is untransposed and has no finishing statement")
    a_idx, a_shape = ("[k, i]", ("K", "M")) if trans_a else ("[i, k]", ("M", "K"))
    b_idx, b_shape = ("[j, k]", ("N", "K")) if trans_b else ("[k, j]", ("K", "N"))
    lead, ix, dims = ((batch,), "l, ", f"0 <= l < {batch} and ") if batch else ((), "", "")
    arrays = [Array("A", (*lead, *a_shape)), Array("B", (*lead, *b_shape)), Array("C", (*lead, "M", "N"))]
    a_idx, b_idx = f"[{ix}{a_idx[1:]}", f"[{ix}{b_idx[1:]}"
    stmts = [
        Statement("Z", f"{PARAMS} -> {{ Z[{ix}i, j] : {dims}0 <= i < M and 0 <= j < N }}",
                  (Access("C", f"{PARAMS} -> {{ Z[{ix}i, j] -> C[{ix}i, j] }}", "write"),), zero),
        Statement("S", f"{PARAMS} -> {{ S[{ix}i, j, k] : {dims}0 <= i < M and 0 <= j < N and 0 <= k < K }}",
                  (Access("C", f"{PARAMS} -> {{ S[{ix}i, j, k] -> C[{ix}i, j] }}", "update"),
                   Access("A", f"{PARAMS} -> {{ S[{ix}i, j, k] -> A{a_idx} }}"),
                   Access("B", f"{PARAMS} -> {{ S[{ix}i, j, k] -> B{b_idx} }}")), multiply_add)]
    if alpha != 1.0 or bias is not None:
        accesses = [Access("C", f"{PARAMS} -> {{ E[i, j] -> C[i, j] }}", "update")]
        if bias is not None:
            rows, cols = bias
            arrays.append(Array("Cb", ("M" if rows else 1, "N" if cols else 1)))
            accesses.append(Access("Cb", f"{PARAMS} -> {{ E[i, j] -> Cb[{'i' if rows else 0}, {'j' if cols else 0}] }}"))
        stmts.append(Statement("E", f"{PARAMS} -> {{ E[i, j] : 0 <= i < M and 0 <= j < N }}", tuple(accesses),
                               _finish(alpha, beta if bias is not None else None)))
    return Nest("gemm", ("M", "N", "K"), tuple(arrays), tuple(stmts),
                context=f"{PARAMS} -> {{ : M > 0 and N > 0 and K > 0 }}")


def _finish(alpha: float, beta: float | None):  # noqa: ANN202
    """E's body: ``c = alpha · c (+ beta · bias)``, as the scalar Gemm computes it."""
    def body(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
        v = b.load(ptrs[0])
        if alpha != 1.0:
            v = b.fmul(v, ir.Constant(F32, alpha))
        if beta is not None:
            cv = b.load(ptrs[1])
            v = b.fadd(v, cv if beta == 1.0 else b.fmul(cv, ir.Constant(F32, beta)))
        b.store(v, ptrs[0])
    return body


@dataclass(frozen=True)
class Plan:
    """The sizes of one product's schedule: register tile, cache blocks, thread shares."""

    blk: packed.Blocking
    kc: int
    nc: int
    split: str  # "m": shares of rows, "n": of columns
    share: int
    parts: int
    #: the register tiles row panel by row panel (``ir`` outside ``jr``: :func:`polyml.codegen.gemm.rows_outer`)
    rows_outer: bool = False
    #: the product's sizes, and whether B / A is a constant (laid out at compile time:
    #: :func:`constant_b`, :func:`constant_a`)
    m: int = 0
    n: int = 0
    k: int = 0
    b_constant: bool = False
    a_constant: bool = False
    #: a batch of this many products (0: one), and each product's thread shares (``parts`` is
    #: then the number of threads, at most ``batch · shares``)
    batch: int = 0
    shares: int = 0
    #: the reduction blocks are multiples of this (a convolution's taps: whole input channels)
    kc_step: int = 1
    #: ``(("mc", ..), ("kc", ..), ("nc", ..))`` as the cost model chose them where imported
    #: tiles replaced them (:func:`polyml.schedule.exchange.with_tiles`); empty: the cost model's
    cost_model_tiles: tuple[tuple[str, int], ...] = ()

    @property
    def unit(self) -> int:
        """The batch index's step in the parallel member: one product's shares, laid end to end."""
        return max(self.shares, 1) * self.share

    @property
    def thread_floats(self) -> int:
        """One thread's packing buffers: ``[A block mc·kc][B block kc·nc]`` (none for a
        constant operand)."""
        return (0 if self.a_constant else self.blk.mc * self.kc) + (0 if self.b_constant else self.kc * self.nc)

    @property
    def n_pad(self) -> int:
        return _round_up(self.n, self.blk.nr)

    @property
    def m_pad(self) -> int:
        return _round_up(self.m, self.blk.mr)

    @property
    def b_layout(self) -> str:
        """A constant B's layout: ``kc × nr`` panels, ``kc`` blocks of all ``N`` (padded to
        whole panels) one after the other."""
        nr, kc = self.blk.nr, self.kc
        return (f"{{ B[k, j] -> Bc[{kc * self.n_pad}*floor(k/{kc}) + {nr * kc}*floor(j/{nr}) + {nr}*(k mod {kc})"
                f" + j mod {nr}] }}")

    def a_layout(self, index: str = "", i: str = "i", k: str = "k") -> str:
        """A constant A's layout (``index``: the array's element, whose row is ``i`` and
        reduction index ``k``; default ``A[i, k]``, batched ``A[l, i, k]``): ``mr × kc`` panels,
        ``kc`` blocks of all ``M`` (padded to whole panels) one after the other, one product's
        after another."""
        mr, kc = self.blk.mr, self.kc
        index = index or ("A[l, i, k]" if self.batch else "A[i, k]")
        lead = f"{self.a_floats}*l + " if self.batch else ""
        return (f"{{ {index} -> Ac[{lead}{kc * self.m_pad}*floor(({k})/{kc}) + {mr * kc}*floor(({i})/{mr})"
                f" + {mr}*(({k}) mod {kc}) + ({i}) mod {mr}] }}")

    @property
    def b_floats(self) -> int:
        return -(-self.k // self.kc) * self.kc * self.n_pad

    @property
    def a_floats(self) -> int:
        return -(-self.k // self.kc) * self.kc * self.m_pad

    @property
    def scratch_floats(self) -> int:
        return self.parts * self.thread_floats


def plan(m: int, n: int, k: int, blk: packed.Blocking, parts: int, b_constant: bool = False,
         a_constant: bool = False, kc_step: int = 1, batch: int = 0) -> Plan:
    """The sizes for an ``m × n × k`` product on ``parts`` threads: the packed GEMM's cost
    model (:mod:`polyml.codegen.gemm`), so both paths block alike; ``kc_step``: the reduction
    blocks are multiples of it (a convolution's taps: whole input channels per block).

    ``batch``: that many products; each is cut into the number of shares ``p ≤ parts`` that
    minimizes the busiest thread's work ``⌈batch·p/parts⌉ / p`` (ties: fewer shares), as the
    packed GEMM's batches (:func:`polyml.kernels.matmul.batched_plan`)."""
    spec = packed.GemmSpec(m, n, k, packed.matrix_loader(0, k), packed.matrix_loader(1, n), 2, prepacked_b=b_constant,
                           prepacked_a=a_constant, kc_step=kc_step)
    threads = parts
    if batch:
        def load(p: int) -> float:
            d, sh = packed.split(spec, blk, p)
            shares = -(-(m if d == "m" else n) // sh)
            return -(-batch * shares // threads) / shares
        parts = min(range(1, threads + 1), key=load)
    dim, share = packed.split(spec, blk, parts)
    kc = min(packed.block_kc(spec, blk), k)
    nc = min(packed.block_nc(spec, blk), _round_up(share if dim == "n" else n, blk.nr))
    total = m if dim == "m" else n
    count = -(-total // share)
    buffers = min(threads, batch * count) if batch else count
    return Plan(blk, kc, nc, dim, share, buffers, packed.rows_outer(spec, blk), m, n, k, b_constant, a_constant,
                batch, count, kc_step)


def constant_b(p: Plan, b: np.ndarray) -> np.ndarray:
    """A constant B (``k × n``) in :attr:`Plan.b_layout`, zeros in the padding."""
    return layout.evaluated(p.b_layout, b, p.b_floats)


def constant_a(p: Plan, a: np.ndarray) -> np.ndarray:
    """A constant A (``m × k``, batched ``batch × m × k``) in :meth:`Plan.a_layout`, zeros in
    the padding."""
    return layout.evaluated(p.a_layout(), a, max(p.batch, 1) * p.a_floats)


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def pack_panels(program: Program, node: isl.ScheduleNode, array: str, buffer: str, n_prefix: int, along: str,
                red: str, width: int, extent: str, rel: str, red_origin: str, at: int, p: Plan, unroll: int = 0,
                view: str = "", source: str = "", copy_mark: str = "", by_rows: bool = False, batch: bool = False
                ) -> tuple[Program, isl.ScheduleNode]:
    """S's operand ``array`` copied into ``width``-wide panels before ``node`` (:func:`T.pack`):
    the copy's element ``(e0, e1)`` has its panel axis in ``along`` (at ``rel`` from the block's
    start) and its reduction index in ``red`` (from ``red_origin``), and lands at
    ``T·thread_floats + at + ⌊rel/width⌋·kc·width + (red - red_origin)·width + rel mod width`` in the
    thread's buffer (``T``: :data:`polyml.schedule.codegen.THREAD`); the panels are padded to
    whole widths, reading the last element of the axis (``extent - 1``) there; the copy runs
    panel by panel, the reduction inside, the panel's ``width`` elements innermost (under an
    ``unroll`` mark with ``unroll``; with ``copy_mark``, each panel under that mark: a copy
    intrinsic).  ``by_rows``: the copy runs reduction index by reduction index instead, each
    one's run of the panel axis scattered over the panels (one contiguous stream of a
    row-major operand where panel by panel reads ``kc`` lines of it).  ``view``/``source``: the
    operand as S sees it (:func:`T.pack`), the copy's elements ``V[e0, e1]``.  ``batch``: the
    operand has a leading batch index, the copy's elements are ``[e0, e1, e2]`` (``along`` and
    ``red`` name two of the last two)."""
    ps = ", ".join(f"p{d}" for d in range(n_prefix))
    names = ["e0", "e1", "e2"] if batch else ["e0", "e1"]
    copy = f"Pack_{buffer}[{ps}, {', '.join(names)}]"
    held = isl.Map(view).get_tuple_name(isl.dim_type.out) if view else array
    layout = (f"{LAYOUT_PARAMS} -> {{ {copy} -> {buffer}[T*{p.thread_floats} + {at} + "
              f"floor(({rel})/{width})*{p.kc * width} + ({red} - {red_origin})*{width} + ({rel}) mod {width}] }}")
    lead = "l, " if batch else ""
    first = along == names[-2]  # the panel axis is the operand's row index
    pad = (f"{PARAMS} -> {{ {held}[{lead}a, b] -> {held}[{lead}a2, b] : floor(a2/{width}) = floor(a/{width}) }}" if first
           else f"{PARAMS} -> {{ {held}[{lead}a, b] -> {held}[{lead}a, b2] : floor(b2/{width}) = floor(b/{width}) }}")
    clamped = [*names]
    clamped[names.index(along)] = f"{extent} - 1"
    clamp = (f"{PARAMS} -> {{ {copy} -> {held}[{', '.join(names)}] : {along} < {extent}; "
             f"{copy} -> {held}[{', '.join(clamped)}] : {along} >= {extent} }}")
    inner, mark = (2, copy_mark) if copy_mark else (unroll, "unroll")
    return T.pack(program, node, "S", array, Array(buffer, (p.parts * p.thread_floats,)), layout, pad=pad, clamp=clamp,
                  order=(red, f"floor({along}/{width})", f"{along} mod {width}") if by_rows
                  else (f"floor({along}/{width})", red, f"{along} mod {width}"), inner=inner, inner_mark=mark,
                  view=view, source=source)


@dataclass(frozen=True)
class View:
    """The statements of a GEMM-like nest in the GEMM's coordinates: per statement its index
    tuple and the expressions of ``(i, j, k)`` in it (a finishing statement at ``k = K - 1``,
    its last reduction step)."""

    #: (name, "[i, j, k]", i, j, k), a batch of products also its batch index ``l``
    statements: tuple[tuple[str, ...], ...]

    def member(self, program: Program, which: int) -> isl.UnionPwAff:
        """``i`` (0), ``j`` (1), ``k`` (2) or the batch index (3) as one band member over the statements."""
        parts = [f"{name}{tup} -> [({exprs[which]})]" for name, tup, *exprs in self.statements]
        return isl.UnionPwAff(f"{PARAMS} -> {{ " + "; ".join(parts) + " }")

    def filter(self, name: str) -> isl.UnionSet:
        tup = next(t for n, t, *_ in self.statements if n == name)
        return isl.UnionSet(f"{PARAMS} -> {{ {name}{tup} }}")


GEMM_VIEW = View((("S", "[i, j, k]", "i", "j", "k"), ("E", "[i, j]", "i", "j", "K - 1")))
BATCHED_VIEW = View((("S", "[l, i, j, k]", "i", "j", "k", "l"),))

#: ``(program, node, by_rows) -> (program, node)``: an operand's pack before ``node``
Packer = Callable[[Program, isl.ScheduleNode, bool], tuple[Program, isl.ScheduleNode]]


def blis(program: Program, p: Plan, view: View, pack_b: Packer | None, pack_a: Packer | None,
         finish_in_registers: bool = False) -> Program:
    """BLIS's loop nest on a GEMM-like ``program`` seen through ``view``: the band ``(i, j, k)``
    of S and E is strip-mined into thread shares, cache blocks and register tiles and permuted
    to ``(share, jc, pc, ic, jr, ir | i, j, k)`` (each tile's S, then its E), legality-checked;
    ``pack_b`` runs before the ``ic`` band, ``pack_a`` before the register tiles (None: a
    constant operand, already in its layout); S's tile is tensorized onto ``fma.f32.<mr>x<nr>``.
    ``finish_in_registers``: E is folded into that intrinsic (:func:`T.fold_init`), which
    applies it to the tile's registers after the last reduction step (a bias and ReLU/Clip:
    :class:`polyml.codegen.gemm.RegisterEpilogue`) instead of E's pass over the stored tile."""
    nest_ = program.nest
    names = {s.name for s in nest_.statements}
    view = View(tuple(v for v in view.statements if v[0] in names))
    finish = "E" in names
    blk = p.blk
    mr, nr, mc, kc, nc, sh = blk.mr, blk.nr, blk.mc, p.kc, p.nc, p.share
    i, j, k = (view.member(program, w) for w in range(3))
    by_rows = p.split == "m"
    share, i_s, j_s = (T.origin(i, sh), T.offset(i, sh), j) if by_rows else (T.origin(j, sh), i, T.offset(j, sh))
    if p.batch:  # one parallel member over every product's shares: l · unit + the share's origin
        share = view.member(program, 3).scale_val(isl.Val(p.unit)).add(share)
    i_c, i_m = T.origin(i_s, mc), T.offset(i_s, mc)
    i_r, i_p = T.origin(i_m, mr), T.offset(i_m, mr)
    j_c, j_n = T.origin(j_s, nc), T.offset(j_s, nc)
    j_r, j_p = T.origin(j_n, nr), T.offset(j_n, nr)
    k_c, k_p = T.origin(k, kc), T.offset(k, kc)
    tiles = [i_r, j_r] if p.rows_outer else [j_r, i_r]
    node = isl.Schedule.from_domain(program.tree.get_domain()).get_root().child(0)
    node = T.with_members(node, [share, j_c, k_c, i_c, *tiles, i_p, j_p, k_p])
    node = T.split(node, [1, 2, 1, 2, 3])
    if finish:  # each tile's product, then its finish
        filters = isl.UnionSetList.alloc(node.get_ctx(), 2)
        for name in ("S", "E"):
            filters = filters.add(view.filter(name))
        node = node.child(0).child(0).child(0).child(0).insert_sequence(filters)
        for _ in range(4):
            node = node.parent()
    if not legality.is_legal(node.get_schedule(), legality.dependences(program.nest)):
        raise ValueError(f"GEMM schedule for {p}: the blocked band violates the nest's dependences")
    fold = finish and finish_in_registers
    if fold:  # legal with E after each tile's S: the intrinsic does E's work at that point
        program = T.fold_init(program, "E")
        node = isl.Schedule.from_domain(program.tree.get_domain()).get_root().child(0)
        node = T.split(T.with_members(node, [share, j_c, k_c, i_c, *tiles, i_p, j_p, k_p]), [1, 2, 1, 2, 3])
        finish = False
    if p.parts > 1:
        node = T.mark(node, f"parallel threads={p.parts}").child(0)
    node = node.child(0).child(0)  # the ic band, below (share) and (jc, pc)
    if pack_b is not None:
        program, node = pack_b(program, node, by_rows)
    node = node.child(0)  # the register tiles' band, below ic
    if pack_a is not None:
        program, node = pack_a(program, node, by_rows)
    point = node.child(0)
    if finish:  # the sequence: S's tile (tensorized), then E's, its columns as vectors
        finish_cols = T.mark(point.child(1).child(0).band_split(1).child(0), "vectorize")
        point = finish_cols.parent().parent().parent().child(0).child(0)
    node = T.mark(point, T.tensorize_text(FmaTile(blk).name, "S", init="Z", finish="E" if fold else ""))
    return Program(program.nest, node.get_schedule())


def schedule(p: Plan, program: Program | None = None) -> Program:
    """The BLIS schedule of ``program`` (default: :func:`nest`) for the sizes of ``p`` (see
    the module docstring); a finishing statement E runs on each register tile after the
    tile's last reduction block (fused into the tile loops).  With ``p.batch`` the products
    of a batched nest, every product's shares one parallel loop; with ``p.a_constant`` A is
    read in its compile-time layout (:func:`constant_a`)."""
    program = T.fold_init(program or Program.of(nest(batch=p.batch)), "Z")
    nest_ = program.nest
    trans_a = "A[k, i]" in nest_.statement("S").accesses[1].relation
    trans_b = "B[j, k]" in nest_.statement("S").accesses[2].relation
    if p.b_constant:
        if trans_b or p.batch:
            raise ValueError("GEMM schedule: a constant B is packed at compile time untransposed, unbatched")
        program = T.pack_constant(program, "S", "B", Array("Bc", (p.b_floats,)), p.b_layout)
    if p.a_constant:
        if trans_a:
            raise ValueError("GEMM schedule: a constant A is packed at compile time untransposed")
        program = T.pack_constant(program, "S", "A", Array("Ac", (max(p.batch, 1) * p.a_floats,)), p.a_layout())
    # per-thread buffers: thread t's at t · thread_floats, A's block first, then B's
    a_at, b_at = 0, (0 if p.a_constant else p.blk.mc * p.kc)
    lead = f" + {p.unit}*e0" if p.batch else ""  # the batch index's part of the parallel member

    def packer(array: str) -> Packer:
        """A's ``mc × kc`` block into ``mr``-high panels (before the tiles), B's ``kc × nc``
        block into ``nr``-wide ones (before ``ic``): the panel axis, the reduction index (the
        copy's element ``[l,] e..``, transposed where stored so) and the axis's start."""
        a = array == "A"
        if p.batch:  # A[l, i, k], B[l, k, j]
            along, red = ("e1", "e2") if a else ("e2", "e1")
        elif a:
            along, red = ("e1", "e0") if trans_a else ("e0", "e1")
        else:
            along, red = ("e0", "e1") if trans_b else ("e1", "e0")
        # the share's origin (p0, less the batch index's part) where the shares cut this axis
        shared = f" - p0{lead}"
        prefix, block = (4, "p3") if a else (3, "p1")

        def pack(program: Program, node: isl.ScheduleNode, by_rows: bool) -> tuple[Program, isl.ScheduleNode]:
            rel = f"{along}{shared if by_rows == a else ''} - {block}"
            return pack_panels(program, node, array, f"{array}p", prefix, along, red, p.blk.mr if a else p.blk.nr,
                               "M" if a else "N", rel, "p2", a_at if a else b_at, p, unroll=1 if a else 0,
                               batch=bool(p.batch))
        return pack

    return blis(program, p, BATCHED_VIEW if p.batch else GEMM_VIEW, None if p.b_constant else packer("B"),
                None if p.a_constant else packer("A"))


@functools.lru_cache(maxsize=64)
def built(p: Plan, trans_a: bool = False, trans_b: bool = False, alpha: float = 1.0,
          bias: tuple[bool, bool] | None = None, beta: float = 1.0) -> tuple[Program, object]:
    """The scheduled program of :func:`nest` with these arguments and its AST at the plan's
    sizes (:func:`polyml.schedule.codegen.ast_of`), made once per distinct product: a model's
    layers repeat a few shapes, and isl's work is most of a scheduled product's lowering."""
    program = schedule(p, Program.of(nest(trans_a, trans_b, alpha, bias, beta, p.batch)))
    return program, codegen.ast_of(program, {"M": p.m, "N": p.n, "K": p.k})
