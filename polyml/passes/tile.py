"""Rectangular tiling of permutable bands, tile sizes from a cache model of the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import dependences
from polyml.scop import jscop as J
from polyml.scop import schedule as sched

#: uniform tile sizes the cache model tries, largest first
CANDIDATES = (256, 128, 64, 32, 16, 8)
#: fraction of the L2 a tile's data may fill (the rest: the next tile's data, other arrays)
L2_SHARE = 0.5
ELEMENT_BYTES = {"double": 8, "float": 4, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "half": 2}


@register
@dataclass(frozen=True)
class Tile(Pass):
    """Tile every permutable band with rectangular tiles: a member t becomes ⌊t/T⌋ … t.

    The schedule tree is the one an earlier pass (``schedule``) left, or the flat schedule read
    as a tree (:mod:`polyml.scop.schedule`); in each band the leading members along which no
    dependence left unordered by the outer dimensions has a negative distance form a
    permutable band, and isl's ``band_tile`` splits it into a tile band ``[⌊t0/T0⌋, ⌊t1/T1⌋,
    …]`` and a point band ``[t0, t1, …]``: the tiles are executed in the band's lexicographic
    order, each one's points in the original order.  On a skewed band (a stencil's
    ``[t, 2t+i, 2t+j]``) the tiles are parallelograms in (t, i, j): time tiling.

    ``sizes=T0,T1,…`` (or ``T0xT1``) gives the tile sizes of a band's leading members; a band
    with more permutable members than sizes keeps the rest untiled inside the point band.
    Without ``sizes`` a cache model picks them: the largest uniform size (256 … 8, the
    innermost member doubled while it fits) whose tile touches at most ``l2_share`` of the
    host's L2 (sysfs, :func:`polyml.codegen.tiling.cache_sizes`; ``l2=BYTES`` overrides),
    counted as the bounding box of each array's elements that one tile in the middle of the
    iteration space accesses; bands with a single permutable member are then left alone.  A
    band whose bounds are parameters gets 32 per member, except a time-skewed band of four or
    more members (a 3-D stencil), whose outer members get 16 and whose innermost stays whole
    (:func:`parametric_skewed_sizes`).
    """

    name: ClassVar[str] = "tile"
    sizes: tuple[int, ...] = ()
    l2: int = 0
    l2_share: float = L2_SHARE

    def apply(self, scop: dict) -> dict:
        if any(s < 1 for s in self.sizes):
            raise PassError(f"tile: sizes must be positive ({','.join(map(str, self.sizes))})")
        deps = dependences.compute(scop).all()
        budget = int((self.l2 or _host_l2()) * self.l2_share)
        ctx = isl.DEFAULT_CONTEXT
        saved = ctx.get_tile_scale_tile_loops(), ctx.get_tile_shift_point_loops()
        ctx.set_tile_scale_tile_loops(0)  # tile dimension ⌊t/T⌋, not T·⌊t/T⌋
        ctx.set_tile_shift_point_loops(0)  # point dimension t, not t - T·⌊t/T⌋
        try:
            tree = sched.map_bands(sched.tree(scop), lambda node: self._tile(node, deps, scop, budget))
        finally:
            ctx.set_tile_scale_tile_loops(saved[0])
            ctx.set_tile_shift_point_loops(saved[1])
        return sched.with_tree(scop, tree)

    def _tile(self, node: isl.ScheduleNode, deps: isl.UnionMap, scop: dict, budget: int) -> tuple[isl.ScheduleNode, int]:
        if _is_tiled(node):
            return node, 0
        n = sched.permutable_prefix(node, deps)
        if self.sizes:
            n = min(n, len(self.sizes))
        elif n < 2:
            return node, 0
        if n == 0:
            return node, 0
        kept = None
        if not self.sizes:
            kept = parametric_skewed_sizes(node, n, deps)
            if kept is not None:  # the innermost member stays in the point band, untiled
                n = len(kept)
        split = n < node.band_n_member()
        if split:
            node = node.band_split(n)
        node = node.band_set_permutable(1)
        sizes = list(self.sizes[:n]) if self.sizes else kept or model_sizes(node, scop, budget)
        mv = isl.MultiVal.zero(node.band_get_space())
        for i, s in enumerate(sizes):
            mv = mv.set_val(i, isl.Val.int_from_si(node.get_ctx(), s))
        node = node.band_tile(mv)  # the tile band; its child is the point band
        node = _mark(node.child(0), "point").parent()
        node = _mark(node, "tile")
        node = node.child(0)
        if split:
            return node.child(0), 2  # continue below the untiled rest of the band
        return node, 1


# -- which bands are tiles: isl keeps a band's AST options, polyml marks tile/point bands there

def _mark(node: isl.ScheduleNode, kind: str) -> isl.ScheduleNode:
    return node.band_set_ast_build_options(isl.UnionSet(f"{{ polyml_{kind}[] }}"))


def band_kind(node: isl.ScheduleNode) -> str:
    """``tile`` or ``point`` for the bands :class:`Tile` made, else ``""``."""
    opts = str(node.band_get_ast_build_options())
    for kind in ("tile", "point"):
        if f"polyml_{kind}" in opts:
            return kind
    return ""


def _is_tiled(node: isl.ScheduleNode) -> bool:
    return band_kind(node) in ("tile", "point")


# -- the cache model -----------------------------------------------------------------------------

def _host_l2() -> int:
    from polyml.codegen.tiling import cache_sizes

    return cache_sizes()[2]


def _value(pa: isl.PwAff) -> int | None:
    """The constant value of a piecewise affine expression without parameters (None if not)."""
    if pa.dim(isl.dim_type.param) or not pa.is_cst():
        return None
    vals: list[int] = []
    pa.foreach_piece(lambda _s, aff: vals.append(int(aff.get_constant_val().to_python())))
    return vals[0] if len(vals) == 1 else None


def footprint(node: isl.ScheduleNode, scop: dict, sizes: list[int]) -> int | None:
    """Bytes one tile of band ``node`` with ``sizes`` touches: for each array the bounding box
    of the elements a tile in the middle of the band's range accesses (outer dimensions fixed
    to their first value).  None where bounds are parametric."""
    dom = node.get_domain()
    prefix = node.get_prefix_schedule_union_map().intersect_domain(dom)
    members = sched.band_members(node)
    inst = dom
    if not prefix.is_empty():
        times = prefix.range()
        if not isl.Set.from_union_set(times).is_bounded():
            return None
        inst = inst.intersect(prefix.intersect_range(times.lexmin()).domain())
    for m, size in zip(members, sizes):
        vals = m.intersect_domain(inst).range()
        if vals.is_empty():
            return 0
        lo = _value(isl.Set.from_union_set(vals).dim_min(0))
        hi = _value(isl.Set.from_union_set(vals).dim_max(0))
        if lo is None or hi is None:
            return None
        start = max(lo, (lo + hi) // 2 - size // 2)
        window = isl.UnionSet.from_set(isl.Set(f"{{ [v] : {start} <= v < {start + size} }}"))
        inst = inst.intersect(m.intersect_range(window).domain())
    types = {a["name"]: a.get("type", "double") for a in scop.get("arrays", [])}
    touched = J.accesses(scop, ["read", "write", "may_write"]).intersect_domain(inst).range()
    total = 0
    boxes: list[isl.Set] = []
    touched.foreach_set(boxes.append)
    for s in boxes:
        n = 1
        for d in range(s.dim(isl.dim_type.set)):
            lo, hi = _value(s.dim_min(d)), _value(s.dim_max(d))
            if lo is None or hi is None:
                return None
            n *= hi - lo + 1
        total += n * ELEMENT_BYTES.get(types.get(s.get_tuple_name(), "double"), 8)
    return total


def model_sizes(node: isl.ScheduleNode, scop: dict, budget: int) -> list[int]:
    """Tile sizes for band ``node``: the largest uniform size whose tile fits ``budget`` bytes,
    then the innermost member doubled while the tile still fits (long stride-1 rows)."""
    n = node.band_n_member()
    extents = [_extent(m.intersect_domain(node.get_domain())) for m in sched.band_members(node)]

    def clamp(sizes: list[int]) -> list[int]:  # no tile larger than the member's range
        return [min(s, e) if e else s for s, e in zip(sizes, extents)]

    for t in CANDIDATES:
        fp = footprint(node, scop, clamp([t] * n))
        if fp is None:
            return [32] * n
        if fp <= budget:
            sizes = clamp([t] * n)
            while sizes[-1] < 4 * t and (not extents[-1] or sizes[-1] < extents[-1]):
                wider = clamp([*sizes[:-1], sizes[-1] * 2])
                fw = footprint(node, scop, wider)
                if fw is None or fw > budget:
                    break
                sizes = wider
            return sizes
    return clamp([CANDIDATES[-1]] * n)


#: tile size of the outer members of a parametric time-skewed band of four or more members
SKEWED_TILE = 16


def parametric_skewed_sizes(node: isl.ScheduleNode, n: int, deps: isl.UnionMap) -> list[int] | None:
    """Tile sizes for the ``n - 1`` outer members of a parametric band of ``n ≥ 4`` permutable
    members whose outermost carries a dependence (a 3-D stencil's time-skewed band ``[t, 2t+i,
    2t+j, 2t+k]``), the innermost left untiled; None for every other band.

    Without bounds the cache model cannot size such a band (:func:`model_sizes` falls back to 32
    per member), and a 32⁴ skewed tile is far over any L2: its space footprint spans
    ``(32 + 2·32)³`` elements per array, 14 MiB for two grids of doubles, while its stride-1 rows
    are cut to 32 elements.  Tiling t, i, j at 16 and keeping each row whole measured best on
    heat-3d (120³, 2 threads, clang -O3 at 0.28 s: 32⁴ tiles 0.35 s at one thread and 0.27 at
    two; 32,32,32 with rows whole 0.28 and 0.22; 16,16,16 0.28 and 0.16; 16,16,16,64 0.30 and
    0.17).  Three-member bands (2-D stencils) keep their rows tiled: jacobi-2d ran 1.9x slower
    with them whole."""
    if n < 4 or n != node.band_n_member() or any(_extent(m.intersect_domain(node.get_domain()))
                                                  for m in sched.band_members(node)):
        return None
    if sched.member_parallel(node, 0, deps):  # not a time band: its outer member carries nothing
        return None
    return [SKEWED_TILE] * (n - 1)


def _extent(member: isl.UnionMap) -> int:
    """How many values a band member takes (0: unknown, parametric)."""
    vals = member.range()
    if vals.is_empty() or not isl.Set.from_union_set(vals).is_bounded():
        return 0
    s = isl.Set.from_union_set(vals)
    lo, hi = _value(s.dim_min(0)), _value(s.dim_max(0))
    return hi - lo + 1 if lo is not None and hi is not None else 0
