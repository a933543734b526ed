"""Run the outermost parallel (coincident) loop of each nest with OpenMP threads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import dependences
from polyml.scop import schedule as sched


@register
@dataclass(frozen=True)
class Parallel(Pass):
    """Make the outermost coincident band member of each nest its outermost loop and run it in
    parallel: a member along which every dependence the outer loops leave unordered has
    distance 0 is a ``doall`` loop.

    In a permutable band any order of the members is legal, so the first parallel member moves
    to the band's front (the gemm tile band ``[I, K, J]`` with ``I``, ``J`` parallel stays, a
    band ``[K, I]`` becomes ``[I, K]``); in a band that is not permutable the members stay and
    the first parallel one is the parallel loop.  The JSCoP's metadata asks for OpenMP code
    (``parallel.threads``: 0 = the OpenMP default): ``polyml opt`` then imports with Polly's
    ``-polly-parallel``, which re-checks each loop against its own dependences on the imported
    schedule and outlines the outermost parallel one into a ``GOMP_parallel_loop_*`` call.
    Nests without a parallel loop (a time-tiled stencil) need ``wavefront`` first.
    """

    name: ClassVar[str] = "parallel"
    threads: int = 0

    def apply(self, scop: dict) -> dict:
        if self.threads < 0:
            raise PassError(f"parallel: threads={self.threads} must be >= 0")
        deps = dependences.compute(scop).all()
        tree = sched.map_bands(sched.tree(scop), lambda node: (outermost_parallel(node, deps), 0))
        return sched.with_meta(sched.with_tree(scop, tree), parallel={"threads": self.threads})


def _outer_parallel(node: isl.ScheduleNode) -> bool:
    """Does a band above ``node`` already have a coincident member?"""
    for depth in range(1, node.get_tree_depth() + 1):
        up = node.ancestor(depth)
        if up.get_type() == isl.schedule_node_type.band and any(
                up.band_member_get_coincident(k) for k in range(up.band_n_member())):
            return True
    return False


def outermost_parallel(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.ScheduleNode:
    """Band ``node`` with its coincident flags recomputed and, if it is permutable and no outer
    band is parallel, its first parallel member moved to the front."""
    node = sched.mark_parallel(node, deps)
    if _outer_parallel(node):
        return node
    n = node.band_n_member()
    flags = [bool(node.band_member_get_coincident(k)) for k in range(n)]
    if not any(flags) or flags[0] or not sched.band_is_permutable(node, deps):
        return node
    k = flags.index(True)
    moved = permute(node, [k, *(i for i in range(n) if i != k)], deps)
    return moved if moved.band_member_get_coincident(0) else node


def permute(node: isl.ScheduleNode, order: list[int], deps: isl.UnionMap) -> isl.ScheduleNode:
    """The members of permutable band ``node`` in ``order`` (legal for a permutable band), with
    the coincident flags recomputed for the new positions."""
    part = node.band_get_partial_schedule()
    members = [part.get_union_pw_aff(i) for i in order]
    node = sched.replace_band(node, members, True, [False] * len(order))
    return sched.mark_parallel(node, deps)
