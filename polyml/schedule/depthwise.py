"""The depthwise family: ONNX Conv with ``group`` = input channels = output channels (one image,
two spatial dimensions) as a plain nest, and its schedule.

The nest (:func:`nest`) is the convolution as written, one plane per channel::

    Z[m, oh, ow]:           Y[m, OW·oh + ow] = 0
    S[m, oh, ow, kh, kw]:   Y[m, OW·oh + ow] += W[m, kh, kw] · X[m, sh·oh + dh·kh - ph, sw·ow + dw·kw - pw]
    E[m, j]:                Y[m, j] = chain(Y[m, j] + bias[m], R0.., ...)

``X`` is zero-padded (:attr:`polyml.schedule.nest.Array.padding`); ``E`` (a bias or a fused
elementwise chain) is the finishing statement, over the plane's flat positions ``j`` (as the
output tensor is stored).

The schedule (:func:`schedule`) has one parallel band over *units* — groups of planes, or for
large planes at several threads bands of output rows of every plane (the 1x1 products around a
depthwise layer split the positions between the threads, so a row band keeps both on the core
that wrote them) — and below it:

1. the data-layout transformation of the input: :func:`polyml.schedule.tree.pack` copies the
   unit's footprint of ``X`` (pads included) into a per-thread buffer split into ``sh × sw``
   stride phases, ``Xph[((r mod sh)·sw + q mod sw)·R·P + ⌊r/sh⌋·P + ⌊q/sw⌋]`` for padded
   ``(r, q)`` (:class:`polyml.codegen.depthwise.Geometry`), in which every tap of an output row
   reads a unit-stride run at a constant offset; each plane's copy is tensorized onto
   ``dwcopy.f32.<sh>x<sw>`` (:class:`~polyml.schedule.intrinsics.DepthwisePhaseCopy`);
2. per plane (and output row, where a row holds at least one vector) S's instances tensorized
   onto ``dw.f32.<L>`` (:class:`~polyml.schedule.intrinsics.DepthwiseTile`: one vector of
   outputs per step from all the taps, the weights broadcast once per plane), Z folded (it
   stores its first sums) and E folded where it is a bias and ReLU/Clip (in registers), else
   E after each row or plane with its columns under ``vectorize``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import islpy as isl

from polyml.codegen.depthwise import Geometry
from polyml.schedule import codegen, legality
from polyml.schedule import tree as T
from polyml.schedule.conv import finishing
from polyml.schedule.gemm import LAYOUT_PARAMS, PARAMS, multiply_add, zero
from polyml.schedule.nest import Access, Array, Nest, Program, Statement


@dataclass(frozen=True)
class Shape:
    """One image's depthwise convolution of ``channels`` planes, ``size`` → ``out`` (height,
    width) through ``kernel`` at ``strides``/``dilations`` with ``pads_begin`` before (a window
    :class:`~polyml.codegen.depthwise.Geometry` reads)."""

    channels: int
    size: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads_begin: tuple[int, int]
    out: tuple[int, int]

    @property
    def required(self) -> tuple[int, int]:
        """How far the last window reaches in padded coordinates."""
        return tuple((o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(self.out, self.strides, self.kernel,
                                                                            self.dilations))

    @property
    def sizes(self) -> dict[str, int]:
        return {"M": self.channels, "N": self.out[0] * self.out[1], "K": self.kernel[0] * self.kernel[1]}

    def x_index(self, oh: str, ow: str, kh: str, kw: str) -> str:
        (sh, sw), (dh, dw), (ph, pw) = self.strides, self.dilations, self.pads_begin
        return f"{sh}*{oh} + {dh}*{kh} - {ph}, {sw}*{ow} + {dw}*{kw} - {pw}"


def nest(shape: Shape, bias: bool = False, extras: tuple[str, ...] = (), chain: bool = False) -> Nest:
    """The depthwise convolution of ``shape`` as its plain nest (module docstring); ``bias``,
    ``extras`` (:data:`polyml.schedule.conv.EXTRA_INDEX`) and ``chain`` as for
    :func:`polyml.schedule.conv.nest`."""
    (oh_, ow_), (kh_, kw_), c = shape.out, shape.kernel, shape.channels
    out = f"Y[m, {ow_}*oh + ow]"
    arrays = [Array("X", (c, *shape.size), padding=0.0), Array("W", (c, kh_, kw_)), Array("Y", (c, oh_ * ow_))]
    plane = f"0 <= m < M and 0 <= oh < {oh_} and 0 <= ow < {ow_}"
    window = f"{plane} and 0 <= kh < {kh_} and 0 <= kw < {kw_}"
    stmts = [
        Statement("Z", f"{PARAMS} -> {{ Z[m, oh, ow] : {plane} }}",
                  (Access("Y", f"{PARAMS} -> {{ Z[m, oh, ow] -> {out} }}", "write"),), zero),
        Statement("S", f"{PARAMS} -> {{ S[m, oh, ow, kh, kw] : {window} }}",
                  (Access("Y", f"{PARAMS} -> {{ S[m, oh, ow, kh, kw] -> {out} }}", "update"),
                   Access("W", f"{PARAMS} -> {{ S[m, oh, ow, kh, kw] -> W[m, kh, kw] }}"),
                   Access("X", f"{PARAMS} -> {{ S[m, oh, ow, kh, kw] -> X[m, {shape.x_index('oh', 'ow', 'kh', 'kw')}] }}")),
                  multiply_add)]
    if bias or extras or chain:
        finish, more = finishing("E[m, j]", "0 <= m < M and 0 <= j < N", "Y[m, j]", "j", shape.sizes, bias, extras)
        stmts.append(finish)
        arrays += more
    sizes = shape.sizes
    ctx = f"{PARAMS} -> {{ : M = {sizes['M']} and N = {sizes['N']} and K = {sizes['K']} }}"
    return Nest("depthwise", ("M", "N", "K"), tuple(arrays), tuple(stmts), context=ctx)


@dataclass(frozen=True)
class Plan:
    """The schedule's sizes: ``lanes`` floats a vector, ``threads`` sharing the units, each unit
    ``group`` planes (copied in before any is computed: the accumulation's vector loads then
    never read the copy's narrow stores just made) or, with ``band``, ``band`` output rows of
    every plane (``group`` 1)."""

    shape: Shape
    lanes: int
    threads: int
    group: int = 1
    band: int = 0
    #: the unit size the cost model chose where imported tiles replaced it
    #: (:func:`polyml.schedule.exchange.with_depthwise_tiles`); empty: the cost model's
    cost_model_tiles: tuple[tuple[str, int], ...] = ()

    @property
    def geometry(self) -> Geometry:
        return Geometry(self.shape, self.lanes)

    @property
    def plane_floats(self) -> int:
        """One plane's phase-split copy (whole vectors, so every plane starts on a vector boundary)."""
        return self.geometry.in_floats

    @property
    def thread_floats(self) -> int:
        return self.group * self.plane_floats

    @property
    def scratch_floats(self) -> int:
        return self.threads * self.thread_floats

    @property
    def units(self) -> int:
        return -(-self.shape.out[0] // self.band) if self.band else -(-self.shape.channels // self.group)


def phase_layout(p: Plan, copy: str, m: str, r: str, q: str) -> str:
    """The phase-split buffer's index of the copy ``copy`` (its element ``X[m, r, q]``, padded
    coordinates ``r + ph``, ``q + pw``): the thread's slot, the plane's within it, then its phase."""
    g = p.geometry
    (sh, sw), (ph, pw) = p.shape.strides, p.shape.pads_begin
    rr, qq = f"({r} + {ph})", f"({q} + {pw})"
    phase = (f"(({rr}) mod {sh})*{sw * g.rows * g.pitch} + (({qq}) mod {sw})*{g.rows * g.pitch}"
             f" + floor({rr}/{sh})*{g.pitch} + floor({qq}/{sw})")
    return (f"{LAYOUT_PARAMS} -> {{ {copy} -> Xph[T*{p.thread_floats} + (({m}) mod {p.group})*{p.plane_floats}"
            f" + {phase}] }}")


def tile_name(p: Plan) -> str:
    return f"dw.f32.{p.lanes}" + ("" if p.geometry.rowwise else ".flat")


def copy_name(p: Plan) -> str:
    return f"dwcopy.f32.{p.shape.strides[0]}x{p.shape.strides[1]}"


def schedule(p: Plan, program: Program, finish_in_registers: bool = False, copy_intrinsic: bool = True) -> Program:
    """The depthwise schedule of ``program`` (:func:`nest` of ``p.shape``; module docstring),
    legality-checked with E after each row's (or plane's) S; ``finish_in_registers``: E folded
    into the tile intrinsic; ``copy_intrinsic`` False: the phase copy by the loops isl
    generates for the copy statement instead of ``dwcopy``."""
    program = T.fold_init(program, "Z")
    names = {s.name for s in program.nest.statements}
    rowwise = p.geometry.rowwise
    unit = f"floor(oh/{p.band})" if p.band else f"floor(m/{p.group})"
    inner = ([] if p.band else ["m"]) + (["oh"] if rowwise else [])
    ow_ = p.shape.out[1]
    tile = (["ow"] if rowwise else ["oh", "ow"]) + ["kh", "kw"]
    tuples = {"S": "[m, oh, ow, kh, kw]", "E": "[m, j]"}

    def band(node: isl.ScheduleNode, exprs: dict[str, list[str]]) -> isl.ScheduleNode:
        members = []
        for d in range(len(next(iter(exprs.values())))):
            parts = "; ".join(f"{s}{tuples[s]} -> [({e[d]})]" for s, e in exprs.items() if s in names)
            members.append(isl.UnionPwAff(f"{PARAMS} -> {{ {parts} }}"))
        return T.with_members(node, members, permutable=False)

    def tree() -> isl.ScheduleNode:
        """The unit band (and the plane band with row bands), below it S's bands — planes,
        rows where rowwise, the tile — then E over the unit's outputs flattened (a group's
        planes are contiguous in Y: one loop of whole vectors, not one per row); returns the
        node of S's tile band."""
        node = isl.Schedule.from_domain(program.tree.get_domain()).get_root().child(0)
        node = band(node, {"S": [unit], "E": [f"floor(j/{p.band * ow_})" if p.band else unit]})
        if p.band:
            node = band(node.child(0), {"S": ["m"], "E": ["m"]})
        node = node.child(0)
        if "E" in names:
            filters = isl.UnionSetList.alloc(node.get_ctx(), 2)
            for s in ("S", "E"):
                filters = filters.add(isl.UnionSet(f"{PARAMS} -> {{ {s}{tuples[s]} }}"))
            node = node.insert_sequence(filters)
            node = band(node.child(1).child(0), {"E": ["j"] if p.band else ["m", "j"]})
            node = T.mark(node.band_split(1).child(0) if not p.band else node, "vectorize")
            while node.get_type() != isl.schedule_node_type.sequence:
                node = node.parent()
            node = node.child(0).child(0)
        for member in inner:
            node = band(node, {"S": [member]}).child(0)
        return band(node, {"S": tile})

    if not legality.is_legal(tree().get_schedule(), legality.dependences(program.nest)):
        raise ValueError(f"depthwise schedule for {p}: the unit band violates the nest's dependences")
    fold = "E" in names and finish_in_registers
    if fold:  # legal with E after each row's S: the intrinsic does E's work at that point
        program = T.fold_init(program, "E")
        names.discard("E")
    point = T.mark(tree(), T.tensorize_text(tile_name(p), "S", init="Z", finish="E" if fold else ""))
    node = point.get_schedule().get_root().child(0)
    if p.threads > 1 and p.units > 1:
        node = T.mark(node, f"parallel threads={min(p.threads, p.units)}").child(0)
    # the phase copy before the unit's planes (plane split) or before each plane's rows of the band
    node = node.child(0).child(0) if p.band else node.child(0)
    copy = "Pack_Xph[" + ", ".join(f"p{d}" for d in range(2 if p.band else 1)) + ", e0, e1, e2]"
    program, _ = T.pack(Program(program.nest, node.get_schedule()), node, "S", "X", Array("Xph", (p.scratch_floats,)),
                        phase_layout(p, copy, "e0", "e1", "e2"), inner=2 if copy_intrinsic else 0,
                        inner_mark=T.tensorize_text(copy_name(p), "Pack_Xph"))
    return program


@functools.lru_cache(maxsize=64)
def built(p: Plan, bias: bool = False, extras: tuple[str, ...] = (), chain: bool = False,
          finish_in_registers: bool = False) -> tuple[Program, object]:
    """The scheduled program of :func:`nest` and its AST, once per distinct convolution."""
    program = schedule(p, Program.of(nest(p.shape, bias, extras, chain)), finish_in_registers)
    return program, codegen.ast_of(program, p.shape.sizes)
