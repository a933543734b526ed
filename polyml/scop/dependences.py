"""Data dependences of a SCoP with isl's dataflow analysis (``isl_union_access_info``).

From the access relations and the *original* schedule of a JSCoP:

* ``raw`` (flow): each read instance ← the last write of the element before it (value-based:
  must-writes kill, may-writes do not);
* ``waw`` (output): each write ← the previous write of the element;
* ``war`` (anti): each read → the next write of the element, computed as the last write
  before the read when time runs backwards (all schedule dimensions negated).

These are direct dependences: a schedule that orders every pair of each relation orders the
transitive (memory-based) ones too.  Polly's ``print<polly-dependences>`` computes the same
three kinds.  Access relations are parsed and coalesced per statement first (polyml's
register-blocked convolutions have hundreds of accesses per statement that coalesce into a few
boxes); an earlier formulation of ``war`` with tagged accesses and reads as may-sources gave the
same relations on squeezenet's SCoPs but took 90 s on a parametric (OpenMP-outlined) one.
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
    writes = must.union(may)

    def last_source(sinks: isl.UnionMap, schedule: isl.UnionMap) -> isl.UnionMap:
        info = isl.UnionAccessInfo.from_sink(sinks).set_must_source(must).set_may_source(may)
        return info.set_schedule_map(schedule).compute_flow().get_may_dependence()

    raw = last_source(reads, sched)
    waw = last_source(writes, sched)
    # war: each read → the next write of its element, i.e. the last write before it when time
    # runs backwards (negating every schedule dimension reverses the lexicographic order)
    width = J.schedule_width(jscop)
    t = ", ".join(f"t{i}" for i in range(width))
    backwards = sched.apply_range(isl.UnionMap(f"{{ [{t}] -> [{', '.join(f'-t{i}' for i in range(width))}] }}"))
    war = last_source(reads, backwards).reverse()
    return Dependences(raw.coalesce(), war.coalesce(), waw.coalesce())


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
