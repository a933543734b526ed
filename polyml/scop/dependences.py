"""Data dependences of a SCoP with isl's dataflow analysis (``isl_union_access_info``).

From the access relations and the *original* schedule of a JSCoP:

* ``raw`` (flow): each read instance → the last write instance of the same element before it
  (value-based: sinks are reads, must-sources writes, may-sources may-writes);
* ``waw`` (output): each write → the previous write of the same element;
* ``war`` (anti): each write → the reads of the element since the previous write.

These are direct dependences: a schedule that orders every pair of each relation orders the
transitive (memory-based) ones too.  Polly's ``print<polly-dependences>`` computes the same
three relations.  Access relations are coalesced first (polyml's register-blocked convolutions
have hundreds of accesses per statement that coalesce into a few boxes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyml.scop import jscop as J

KINDS = ("raw", "war", "waw")
DESCRIPTION = {"raw": "read-after-write (flow)", "war": "write-after-read (anti)", "waw": "write-after-write (output)"}


@dataclass(frozen=True)
class Dependences:
    """The three dependence relations of one SCoP, statement instance → statement instance."""

    raw: isl.UnionMap
    war: isl.UnionMap
    waw: isl.UnionMap

    def items(self) -> list[tuple[str, isl.UnionMap]]:
        return [(k, getattr(self, k)) for k in KINDS]

    def all(self) -> isl.UnionMap:
        return self.raw.union(self.war).union(self.waw).coalesce()

    def to_json(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.items()}


def compute(jscop: Mapping, access_kinds: list[list[str]] | None = None) -> Dependences:
    """raw/war/waw of ``jscop`` under its own schedule (see the module docstring)."""
    sched = J.schedule(jscop)
    reads = J.accesses(jscop, ["read"], access_kinds)
    must = J.accesses(jscop, ["write"], access_kinds)
    may = J.accesses(jscop, ["may_write"], access_kinds)

    raw = (
        isl.UnionAccessInfo.from_sink(reads).set_must_source(must).set_may_source(may)
        .set_schedule_map(sched).compute_flow().get_may_dependence()
    )
    # war and waw in one analysis whose sinks are the writes: reads are may-sources (they do
    # not kill); accesses are tagged with what they do so the two kinds can be told apart even
    # where one statement instance both reads and writes the element (y += ...)
    t_reads, t_must, t_may = _tag(reads, "rd"), _tag(must, "wr"), _tag(may, "wr")
    t_writes = t_must.union(t_may)
    tagged_domains = t_reads.domain().union(t_writes.domain())
    t_sched = tagged_domains.unwrap().domain_map().apply_range(sched)
    deps = (
        isl.UnionAccessInfo.from_sink(t_writes).set_must_source(t_must).set_may_source(t_may.union(t_reads))
        .set_schedule_map(t_sched).compute_flow().get_may_dependence()
    )
    waw = _untag(deps.intersect_domain(t_writes.domain()))
    war = _untag(deps.intersect_domain(t_reads.domain()))
    return Dependences(raw.coalesce(), war.coalesce(), waw.coalesce())


def _tag(acc: isl.UnionMap, tag: str) -> isl.UnionMap:
    """``{ S[i] -> A[e] }`` → ``{ [S[i] -> tag[]] -> A[e] }``."""
    if acc.is_empty():
        return acc
    tags = isl.UnionMap.from_domain_and_range(isl.UnionSet(f"{{ {tag}[] }}"), acc.range().universe())
    return acc.domain_product(tags)


def _untag(deps: isl.UnionMap) -> isl.UnionMap:
    return deps.domain_factor_domain().range_factor_domain()


def arrays_between(kind: str, pairs: isl.UnionMap, jscop: Mapping, access_kinds: list[list[str]] | None = None) -> list[str]:
    """Arrays through which the instance pairs ``pairs`` are a ``kind`` dependence."""
    reads = J.accesses(jscop, ["read"], access_kinds)
    writes = J.accesses(jscop, ["write", "may_write"], access_kinds)
    src, dst = {"raw": (writes, reads), "war": (reads, writes), "waw": (writes, writes)}[kind]
    names: list[str] = []
    arrays: set[str] = set()
    src.range().foreach_set(lambda s: arrays.add(s.get_tuple_name()))
    for a in sorted(arrays):
        only = isl.UnionSet.from_set(isl.Set(f"{{ {a}[{', '.join(f'e{i}' for i in range(_rank(src, a)))}] }}"))
        shared = src.intersect_range(only).apply_range(dst.intersect_range(only).reverse())
        if not shared.intersect(pairs).is_empty():
            names.append(a)
    return names


def _rank(acc: isl.UnionMap, array: str) -> int:
    dims: list[int] = []

    def visit(s: isl.Set) -> None:
        if s.get_tuple_name() == array:
            dims.append(s.dim(isl.dim_type.set))

    acc.range().foreach_set(visit)
    return dims[0] if dims else 0
