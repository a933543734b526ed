"""The convolution family: ONNX Conv (one image, one group, two spatial dimensions) as a plain
nest, and its schedule — the GEMM's (:func:`polyml.schedule.gemm.blis`) seen through im2col.

The nest (:func:`nest`) is the convolution as written::

    Z[m, oh, ow]:             Y[m, OW·oh + ow] = 0
    S[m, oh, ow, c, kh, kw]:  Y[m, OW·oh + ow] += W[m, c, kh, kw] · X[c, sh·oh + dh·kh - ph, sw·ow + dw·kw - pw]
    E[m, oh, ow]:             Y[m, OW·oh + ow] = chain(Y[m, OW·oh + ow] + bias[m], R0.., ...)

``X`` is zero-padded (:attr:`polyml.schedule.nest.Array.padding`: S reads 0 where the window
leaves the input); ``E`` (with a bias or a fused elementwise chain) is the finishing statement.

Its GEMM view (:data:`View` rows, and S's :attr:`~polyml.schedule.nest.Statement.view`) is
``i = m``, ``j = OW·oh + ow``, ``k = KH·KW·c + KW·kh + kw``: output channels × output
positions × (input channels, taps).  The schedule (:func:`schedule`) lays the weights out at
compile time as the GEMM's constant A (:func:`polyml.schedule.tree.pack_constant`), packs the
im2col matrix ``B[k, j] = X[...]`` — a virtual operand whose elements repeat the input's —
block by block into ``nr``-wide panels (:func:`polyml.schedule.tree.pack` with a view; each
panel's copy tensorized onto ``im2col.f32.<nr>``, which gathers it through a table of source
offsets; a 1x1 unstrided window's copy is plain), and blocks, orders, threads and tensorizes as
the GEMM does, E fused into each register tile after its last reduction block.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import islpy as isl
import llvmlite.ir as ir

from polyml.schedule import codegen, legality
from polyml.schedule import tree as T
from polyml.schedule.gemm import PARAMS, Plan, View, blis, multiply_add, pack_panels, zero
from polyml.schedule.intrinsics import Im2colPanel
from polyml.schedule.nest import Access, Array, Nest, Program, Statement


@dataclass(frozen=True)
class Shape:
    """One image's convolution: ``filters`` output channels over ``channels`` input channels,
    ``size`` → ``out`` (height, width) through ``kernel`` at ``strides``/``dilations`` with
    ``pads`` before."""

    channels: int
    filters: int
    size: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]
    out: tuple[int, int]

    @property
    def taps(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def m(self) -> int:
        return self.filters

    @property
    def n(self) -> int:
        return self.out[0] * self.out[1]

    @property
    def k(self) -> int:
        return self.channels * self.taps

    @property
    def pointwise(self) -> bool:
        """A 1x1 unstrided window inside the input: its im2col matrix is X itself."""
        return self.kernel == (1, 1) and self.strides == (1, 1) and self.pads == (0, 0) and self.out == self.size

    @property
    def sizes(self) -> dict[str, int]:
        return {"M": self.m, "N": self.n, "K": self.k}

    def _exprs(self) -> tuple[str, str, str]:
        """The GEMM view of S's index ``[m, oh, ow, c, kh, kw]``: ``(i, j, k)``."""
        return "m", f"{self.out[1]}*oh + ow", f"{self.taps}*c + {self.kernel[1]}*kh + kw"

    def view(self) -> View:
        i, j, k = self._exprs()
        return View((("S", "[m, oh, ow, c, kh, kw]", i, j, k), ("E", "[m, oh, ow]", i, j, "K - 1")))

    def x_index(self, oh: str, ow: str, kh: str, kw: str) -> str:
        """The input element of output ``(oh, ow)`` at tap ``(kh, kw)`` (outside X in the padding)."""
        if self.pointwise:
            return f"{self.out[1]}*{oh} + {ow}"
        (sh, sw), (dh, dw), (ph, pw) = self.strides, self.dilations, self.pads
        return f"{sh}*{oh} + {dh}*{kh} - {ph}, {sw}*{ow} + {dw}*{kw} - {pw}"

    def im2col(self, nr: int) -> Im2colPanel:
        """The copy intrinsic of this convolution's ``nr``-wide im2col panels."""
        return Im2colPanel(self.size, self.kernel, self.out[1], self.n, self.strides, self.dilations, self.pads, nr)


def add_bias(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    """E's body with a bias and no chain: ``y += bias[m]``."""
    b.store(b.fadd(b.load(ptrs[0]), b.load(ptrs[1])), ptrs[0])


#: how E reads a fused chain's operand: one value per output channel, per output element, or one
EXTRA_INDEX = {"channel": ("[m]", ("M",)), "element": ("[m, {j}]", ("M", "N")), "scalar": ("[0]", (1,))}


def nest(shape: Shape, bias: bool = False, extras: tuple[str, ...] = (), chain: bool = False) -> Nest:
    """The convolution of ``shape`` as its plain nest (see the module docstring).  ``bias``:
    E adds ``bias[m]``; ``extras``: E reads one more operand ``R<t>`` each (a fused chain's
    inputs, :data:`EXTRA_INDEX`: ``channel``, ``element`` or ``scalar``); ``chain``: E applies
    a fused chain (its body is bound when emitting).  No E without any of them."""
    (oh_, ow_), (kh_, kw_) = shape.out, shape.kernel
    c = shape.channels
    x_shape = (c, shape.n) if shape.pointwise else (c, *shape.size)
    out = f"Y[m, {ow_}*oh + ow]"
    arrays = [Array("X", x_shape, padding=None if shape.pointwise else 0.0),
              Array("W", (shape.m, c, kh_, kw_)), Array("Y", (shape.m, shape.n))]
    plane = f"0 <= m < M and 0 <= oh < {oh_} and 0 <= ow < {ow_}"
    window = f"{plane} and 0 <= c < {c} and 0 <= kh < {kh_} and 0 <= kw < {kw_}"
    i, j, k = shape._exprs()
    stmts = [
        Statement("Z", f"{PARAMS} -> {{ Z[m, oh, ow] : {plane} }}",
                  (Access("Y", f"{PARAMS} -> {{ Z[m, oh, ow] -> {out} }}", "write"),), zero),
        Statement("S", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] : {window} }}",
                  (Access("Y", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> {out} }}", "update"),
                   Access("W", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> W[m, c, kh, kw] }}"),
                   Access("X", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> X[c, {shape.x_index('oh', 'ow', 'kh', 'kw')}] }}")),
                  multiply_add, view=f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> [{i}, {j}, {k}] }}")]
    if bias or extras or chain:
        finish, more = finishing("E[m, oh, ow]", plane, out, j, shape.sizes, bias, extras)
        stmts.append(finish)
        arrays += more
    ctx = f"{PARAMS} -> {{ : M = {shape.m} and N = {shape.n} and K = {shape.k} }}"
    return Nest("conv", ("M", "N", "K"), tuple(arrays), tuple(stmts), context=ctx)


def finishing(instance: str, domain: str, out: str, j: str, sizes: dict[str, int], bias: bool,
              extras: tuple[str, ...]) -> tuple[Statement, list[Array]]:
    """The finishing statement ``E`` of a convolution-like nest over ``instance`` (e.g.
    ``E[m, oh, ow]``, constrained by ``domain``): it updates ``out`` (``Y[m, j]`` with ``j`` the
    flat position, as an expression of the instance), adding ``Cb[m]`` with ``bias`` and
    reading one operand ``R<t>`` per ``extras`` kind (:data:`EXTRA_INDEX`); with the arrays it adds."""
    accesses = [Access("Y", f"{PARAMS} -> {{ {instance} -> {out} }}", "update")]
    arrays = []
    if bias:
        arrays.append(Array("Cb", (sizes["M"],)))
        accesses.append(Access("Cb", f"{PARAMS} -> {{ {instance} -> Cb[m] }}"))
    for t, kind in enumerate(extras):
        at, dims = EXTRA_INDEX[kind]
        arrays.append(Array(f"R{t}", tuple(sizes.get(d, d) for d in dims)))
        accesses.append(Access(f"R{t}", f"{PARAMS} -> {{ {instance} -> R{t}{at.format(j=j)} }}"))
    return Statement("E", f"{PARAMS} -> {{ {instance} : {domain} }}", tuple(accesses), add_bias if bias else _keep), arrays


def _keep(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001, ARG001
    """E's body where only the kernel's chain (bound at emission) changes Y."""


def schedule(p: Plan, shape: Shape, program: Program, copy_intrinsic: bool = True,
             finish_in_registers: bool = False) -> Program:
    """The GEMM's BLIS schedule of the convolution ``program`` (:func:`nest` of ``shape``)
    for the sizes of ``p`` (a plan with a constant A, reduction blocks of whole channels);
    ``copy_intrinsic`` False: the im2col panels copied by the loops isl generates for the copy
    statement (reading the padded input element by element) rather than by the intrinsic;
    ``finish_in_registers``: E folded into the FMA intrinsic (a bias and ReLU/Clip applied to
    the tile's registers: :func:`polyml.schedule.gemm.blis`)."""
    program = T.fold_init(program, "Z")
    i, j, k = shape._exprs()
    program = T.pack_constant(program, "S", "W", Array("Ac", (p.a_floats,)), p.a_layout("W[m, c, kh, kw]", i, k))
    taps, kw_, ow_ = shape.taps, shape.kernel[1], shape.out[1]
    view = f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> B[{k}, {j}] }}"
    if shape.pointwise:
        source = f"{PARAMS} -> {{ B[k, j] -> X[k, j] }}"
    else:
        at = shape.x_index(f"floor(j/{ow_})", f"(j mod {ow_})", f"floor((k mod {taps})/{kw_})", f"(k mod {kw_})")
        source = f"{PARAMS} -> {{ B[k, j] -> X[floor(k/{taps}), {at}] }}"
    copy_mark = "" if shape.pointwise or not copy_intrinsic else T.tensorize_text(shape.im2col(p.blk.nr).name, "Pack_Bp")

    def pack_b(program: Program, node: isl.ScheduleNode, by_rows: bool) -> tuple[Program, isl.ScheduleNode]:
        return pack_panels(program, node, "X", "Bp", 3, "e1", "e0", p.blk.nr, "N",
                           "e1 - p1" if by_rows else "e1 - p0 - p1", "p2", 0, p, unroll=1, view=view, source=source,
                           copy_mark=copy_mark, by_rows=shape.pointwise)

    return blis(program, p, shape.view(), pack_b, None, finish_in_registers)


@functools.lru_cache(maxsize=64)
def built(p: Plan, shape: Shape, bias: bool = False, extras: tuple[str, ...] = (), chain: bool = False,
          finish_in_registers: bool = False) -> tuple[Program, object]:
    """The scheduled program of :func:`nest` and its AST, once per distinct convolution (a
    CNN repeats a few shapes; E's body is bound per node when emitting)."""
    program = schedule(p, shape, Program.of(nest(shape, bias, extras, chain)), finish_in_registers=finish_in_registers)
    return program, codegen.ast_of(program, shape.sizes)


# -- output rows as register tiles (small maps) ------------------------------------------------

#: output channels per rows tile (two AVX-512 vectors: :data:`polyml.codegen.gemm_rows.CHANNELS`)
ROW_CHANNELS = 32


@dataclass(frozen=True)
class Rows:
    """The rows form of a convolution (:mod:`polyml.codegen.gemm_rows`): output positions in
    rows of ``width`` (the output's width, or for a 1x1 window without padding any width that
    cuts the flat run of positions), ``stack`` rows per register tile, read from a source ``P``
    — the input itself (``planes`` None: row ``r`` at ``pitch·r``) or its stride-phase copy
    (``planes = (qh, qw)``: plane ``(c, kh·dh mod sh, kw·dw mod sw)`` of ``qh × qw``, pitch ``qw``)."""

    width: int
    rows: int
    pitch: int
    stack: int
    planes: tuple[int, int] | None = None
    #: floats of the source (the phase copy with its run-out, or the input)
    size: int = 0

    @property
    def tiles(self) -> int:
        return -(-self.rows // self.stack)


def _row_exprs(shape: Shape, rows: Rows) -> tuple[str, str]:
    """``(r, col)``: S's output position as the rows form's row and column."""
    if rows.width == shape.out[1]:
        return "oh", "ow"
    j = f"({shape.out[1]}*oh + ow)"
    return f"floor({j}/{rows.width})", f"({j} mod {rows.width})"


def _source_offset(shape: Shape, rows: Rows) -> str:
    """The source position of reduction row ``(c, kh, kw)`` (the phase planes' offsets)."""
    if rows.planes is None:
        return f"{shape.size[0] * shape.size[1]}*c"
    (sh, sw), (dh, dw) = shape.strides, shape.dilations
    qh, qw = rows.planes
    return (f"{qh * qw}*(({sh}*c + ({dh}*kh) mod {sh})*{sw} + ({dw}*kw) mod {sw})"
            f" + {qw}*floor({dh}*kh/{sh}) + floor({dw}*kw/{sw})")


def rows_nest(shape: Shape, rows: Rows, bias: bool = False, extras: tuple[str, ...] = (), chain: bool = False) -> Nest:
    """The convolution's nest (:func:`nest`) reading its source ``P`` (the input or its phase
    copy, which holds the padding's zeros) in the rows form's terms: ``S[m, oh, ow, c, kh, kw]``
    reads ``P[offset(c, kh, kw) + pitch·r + col]``; S's view is ``[m, r, col, k]``, the rows
    intrinsic's iteration space."""
    base = nest(shape, bias, extras, chain)
    r, col = _row_exprs(shape, rows)
    i, _, k = shape._exprs()
    s = base.statement("S")
    at = f"{_source_offset(shape, rows)} + {rows.pitch}*{r} + {col}"
    accesses = tuple(Access("P", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> P[{at}] }}") if a.array == "X" else a
                     for a in s.accesses)
    view = f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> [{i}, {r}, {col}, {k}] }}"
    arrays = tuple(Array("P", (rows.size,)) if a.name == "X" else a for a in base.arrays)
    return replace(base.with_statement(replace(s, accesses=accesses, view=view)), arrays=arrays)


def rows_layout(shape: Shape, flat: bool = False) -> str:
    """The weights' layout for the rows tiles: 32-channel panels, ``[panel][k][32]`` (zeros
    past M); ``flat``: of the weights as an ``M × K`` matrix ``A[m, k]`` (as evaluated at
    compile time)."""
    c = ROW_CHANNELS
    index, k = ("A[m, k]", "k") if flat else ("W[m, c, kh, kw]", shape._exprs()[2])
    return f"{{ {index} -> Wr[{shape.k * c}*floor(m/{c}) + {c}*({k}) + m mod {c}] }}"


def rows_schedule(shape: Shape, rows: Rows, program: Program, threads: int) -> Program:
    """The rows form's schedule: the weights ``pack_constant``ed into 32-channel panels; one
    band over the units ``⌊m/32⌋·tiles + ⌊r/stack⌋`` (a panel of channels × a tile of rows),
    parallel over ``threads``; each unit's ``32 × stack·width × K`` block tensorized onto
    ``rows.f32.<width>x32`` with Z and E folded into it (it stores the tile once, through E)."""
    program = T.fold_init(program, "Z")
    program = T.pack_constant(program, "S", "W", Array("Wr", (-(-shape.m // ROW_CHANNELS) * ROW_CHANNELS * shape.k,)),
                              rows_layout(shape))
    r, col = _row_exprs(shape, rows)
    unit = f"{rows.tiles}*floor(m/{ROW_CHANNELS}) + floor(({r})/{rows.stack})"
    names = [s.name for s in program.nest.statements]
    parts = [f"S[m, oh, ow, c, kh, kw] -> [({unit})]"] + ([f"E[m, oh, ow] -> [({unit})]"] if "E" in names else [])
    band = isl.UnionPwAff(f"{PARAMS} -> {{ {'; '.join(parts)} }}")
    k = shape._exprs()[2]
    inner = {"S": ("[m, oh, ow, c, kh, kw]", (f"m mod {ROW_CHANNELS}", f"({r}) mod {rows.stack}", col, k)),
             "E": ("[m, oh, ow]", (f"m mod {ROW_CHANNELS}", f"({r}) mod {rows.stack}", col))}

    def tile(node: isl.ScheduleNode, name: str) -> isl.ScheduleNode:
        tup, exprs = inner[name]
        return T.with_members(node, [isl.UnionPwAff(f"{PARAMS} -> {{ {name}{tup} -> [({e})] }}") for e in exprs])

    # legal: every output's reduction inside one unit, in order, E after it (checked with E in the tree)
    node = T.with_members(isl.Schedule.from_domain(program.tree.get_domain()).get_root().child(0), [band])
    if "E" in names:
        filters = isl.UnionSetList.alloc(node.get_ctx(), 2)
        for name, (tup, _) in inner.items():
            filters = filters.add(isl.UnionSet(f"{PARAMS} -> {{ {name}{tup} }}"))
        node = node.child(0).insert_sequence(filters)
        node = tile(node.child(0).child(0), "S").parent().parent().child(1).child(0)
        node = tile(node, "E").parent().parent().parent()
    else:
        node = tile(node.child(0), "S").parent()
    if not legality.is_legal(node.get_schedule(), legality.dependences(program.nest)):
        raise ValueError(f"rows schedule for {shape}: the unit band violates the nest's dependences")
    program = T.fold_init(program, "E")
    node = T.with_members(isl.Schedule.from_domain(program.tree.get_domain()).get_root().child(0), [band])
    units = -(-shape.m // ROW_CHANNELS) * rows.tiles
    if threads > 1 and units > 1:
        node = T.mark(node, f"parallel threads={min(threads, units)}").child(0)
    finish = "E" if "E" in names else ""
    node = T.mark(tile(node.child(0), "S"), T.tensorize_text(f"rows.f32.{rows.width}x{ROW_CHANNELS}", "S", init="Z",
                                                              finish=finish))
    return Program(program.nest, node.get_schedule())


@functools.lru_cache(maxsize=64)
def rows_built(shape: Shape, rows: Rows, threads: int, bias: bool = False, extras: tuple[str, ...] = (),
               chain: bool = False) -> tuple[Program, object]:
    program = rows_schedule(shape, rows, Program.of(rows_nest(shape, rows, bias, extras, chain)), threads)
    return program, codegen.ast_of(program, shape.sizes)
