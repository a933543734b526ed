"""Wavefront parallelism for permutable bands without a parallel member (time-tiled stencils)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import dependences
from polyml.scop import schedule as sched


@register
@dataclass(frozen=True)
class Wavefront(Pass):
    """Skew a permutable band ``[m0, m1, …]`` into ``[m0 + m1, m1, …]``: a wavefront.

    In a permutable band every dependence has non-negative distances ``(d0, d1, …)``; after the
    skew two instances with the same ``m0 + m1`` and a dependence between them would need
    ``d0 + d1 = 0``, so ``d0 = d1 = 0``: the second member becomes parallel (coincident).  Applied
    to the tile band of a time-tiled stencil (``schedule`` makes ``[t, 2t+i, 2t+j]`` permutable,
    ``tile`` cuts it into parallelograms) the tiles along a wavefront ``T + I`` run concurrently.
    Only bands with no parallel member, not below a band with one, at least two members, and
    (``bands=tile``, the default) made by ``tile`` are skewed; ``bands=all`` skews point and
    untiled bands too (fine-grained: a barrier per wavefront).
    """

    name: ClassVar[str] = "wavefront"
    bands: str = "tile"

    def __post_init__(self) -> None:
        if self.bands not in ("tile", "all"):
            raise PassError(f"wavefront: bands={self.bands!r}, expected 'tile' or 'all'")

    def apply(self, scop: dict) -> dict:
        from polyml.passes.tile import band_kind

        deps = dependences.compute(scop).all()

        def one(node: isl.ScheduleNode) -> tuple[isl.ScheduleNode, int]:
            if self.bands == "tile" and band_kind(node) != "tile":
                return node, 0
            return skew_outer(node, deps), 0

        return sched.with_tree(scop, sched.map_bands(sched.tree(scop), one))


def skew_outer(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.ScheduleNode:
    """``[m0, m1, …]`` → ``[m0 + m1, m1, …]`` where that buys a parallel member (see above)."""
    from polyml.passes.parallel import _outer_parallel

    n = node.band_n_member()
    if n < 2 or _outer_parallel(node) or not sched.band_is_permutable(node, deps):
        return node
    if any(sched.member_parallel(node, k, deps) for k in range(n)):
        return node
    part = node.band_get_partial_schedule()
    members = [part.get_union_pw_aff(k) for k in range(n)]
    members[0] = members[0].add(members[1])
    node = sched.replace_band(node, members, True, [False] * n)
    return sched.mark_parallel(node, deps)
