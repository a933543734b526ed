"""Rectangular tiling of permutable bands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import islpy as isl
from polyml.passes import Pass, PassError, register

from polyml.scop import dependences
from polyml.scop import schedule as sched


@register
@dataclass(frozen=True)
class Tile(Pass):
    """Tile every permutable band with rectangular tiles: a member t becomes ⌊t/T⌋ … t.

    The flat schedule is read as a schedule tree (:mod:`polyml.scop.schedule`); in each band
    the leading members along which no dependence left unordered by the outer dimensions has a
    negative distance form a permutable band, and isl's ``band_tile`` splits it into a tile
    band ``[⌊t0/T0⌋, ⌊t1/T1⌋, …]`` and a point band ``[t0, t1, …]``: the tiles are executed in
    the band's lexicographic order, each one's points in the original order.  ``sizes=T0,T1,…``
    (or ``T0xT1``) gives the tile sizes of a band's leading members; a band with more permutable
    members than sizes keeps the rest untiled inside the point band.  Without ``sizes`` every
    permutable member is tiled by 32.  Bands without a permutable leading member are left alone.
    """

    name: ClassVar[str] = "tile"
    sizes: tuple[int, ...] = ()

    def apply(self, scop: dict) -> dict:
        if any(s < 1 for s in self.sizes):
            raise PassError(f"tile: sizes must be positive ({','.join(map(str, self.sizes))})")
        deps = dependences.compute(scop).all()
        ctx = isl.DEFAULT_CONTEXT
        saved = ctx.get_tile_scale_tile_loops(), ctx.get_tile_shift_point_loops()
        ctx.set_tile_scale_tile_loops(0)  # tile dimension ⌊t/T⌋, not T·⌊t/T⌋
        ctx.set_tile_shift_point_loops(0)  # point dimension t, not t - T·⌊t/T⌋
        try:
            tree = sched.map_bands(sched.to_tree(scop), lambda node: self._tile(node, deps))
        finally:
            ctx.set_tile_scale_tile_loops(saved[0])
            ctx.set_tile_shift_point_loops(saved[1])
        return sched.from_tree(scop, tree)

    def _tile(self, node: isl.ScheduleNode, deps: isl.UnionMap) -> tuple[isl.ScheduleNode, int]:
        n = sched.permutable_prefix(node, deps)
        if self.sizes:
            n = min(n, len(self.sizes))
        if n == 0:
            return node, 0
        split = n < node.band_n_member()
        if split:
            node = node.band_split(n)
        node = node.band_set_permutable(1)
        sizes = list(self.sizes[:n]) if self.sizes else [32] * n
        space = node.band_get_space()
        mv = isl.MultiVal.zero(space)
        for i, s in enumerate(sizes):
            mv = mv.set_val(i, isl.Val.int_from_si(node.get_ctx(), s))
        node = node.band_tile(mv)  # the tile band; its child is the point band
        node = node.child(0)
        if split:
            return node.child(0), 2  # continue below the untiled rest of the band
        return node, 1
