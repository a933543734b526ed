"""Dependences of a plain nest and whether a schedule tree respects them.

The dependences are isl's exact dataflow over the nest's initial schedule (the program as
written): read-after-write, write-after-read and write-after-write between statement
instances.  A tree is legal when, in its flat schedule, every dependence's source instance
runs before its sink.  The check applies to reordering transforms (strip-mine, permute,
split); the copy statements of :func:`polyml.schedule.tree.pack` read only arrays that no
statement writes (checked there), so they add no dependence of their own.
"""

from __future__ import annotations

import islpy as isl

from polyml.schedule.nest import Nest


def dependences(nest: Nest) -> isl.UnionMap:
    """Every RAW, WAR and WAW dependence of ``nest`` as written."""
    sched = nest.initial_schedule()
    reads, writes = nest.accesses(False), nest.accesses(True)

    def flow(sink: isl.UnionMap, source: isl.UnionMap) -> isl.UnionMap:
        info = isl.UnionAccessInfo.from_sink(sink).set_may_source(source).set_schedule(sched)
        return info.compute_flow().get_may_dependence()

    return flow(reads, writes).union(flow(writes, reads)).union(flow(writes, writes)).coalesce()


def violated(tree: isl.Schedule, deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences that ``tree`` runs sink-first or at the same time (empty: legal)."""
    sched = tree.get_map()
    deps = deps.intersect_domain(tree.get_domain()).intersect_range(tree.get_domain())
    bad = isl.UnionMap.empty(deps.get_space())
    maps: list[isl.Map] = []
    deps.apply_domain(sched).apply_range(sched).foreach_map(maps.append)
    for m in maps:
        forward = isl.Map.lex_lt(m.get_space().domain())
        late = m.subtract(forward)
        if not late.is_empty():
            bad = bad.union(isl.UnionMap.from_map(late))
    return bad


def is_legal(tree: isl.Schedule, deps: isl.UnionMap) -> bool:
    return violated(tree, deps).is_empty()
