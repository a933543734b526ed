"""Is a new schedule legal?  Every dependence must still run its source before its target.

For a dependence relation ``D ⊆ S × T`` and new schedules ``θ_S``, ``θ_T`` the violated pairs
are ``D ∩ (θ_S ⪰ θ_T)``: ``{ s -> t ∈ D : θ_S(s) ⪰ θ_T(t) }`` with ``⪰`` lexicographic (equal
times count as violations: the two instances would be unordered).  isl computes this per
dependence kind and statement pair; a violation is reported with the arrays that carry it and
one example instance pair.

Before that, :func:`check_same_scop` makes sure the edited JSCoP still describes the same
SCoP: same statements in the same order, same domains and accesses (polyml transforms
schedules only), and schedules that are functions defined on the whole domain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyml.errors import PolymlError
from polyml.scop import dependences as D
from polyml.scop import jscop as J


@dataclass(frozen=True)
class Violation:
    """One dependence the new schedule breaks: kind, statement pair, arrays, an example."""

    kind: str
    source: str
    target: str
    arrays: tuple[str, ...]
    example: tuple[str, str]  # (source instance, target instance)
    times: tuple[str, str]  # their times under the new schedule

    def __str__(self) -> str:
        when = "at the same time" if self.times[0] == self.times[1] else "after it"
        on = f" on array {', '.join(self.arrays)}" if self.arrays else ""
        return (
            f"{D.DESCRIPTION[self.kind]} dependence {self.source} -> {self.target}{on}: "
            f"{self.example[0]} must run before {self.example[1]}, but the new schedule runs it {when} "
            f"({self.times[0]} vs {self.times[1]})"
        )


class IllegalScheduleError(PolymlError):
    """A new schedule violates dependences; the message names each (kind, statements, array)."""

    def __init__(self, where: str, violations: list[Violation]):
        self.violations = violations
        lines = "\n".join(f"  - {v}" for v in violations)
        super().__init__(f"{where}: illegal schedule, {len(violations)} violated dependence(s):\n{lines}")


def _point_str(name: str, pt: isl.Point, n: int, offset: int = 0) -> str:
    vals = [pt.get_coordinate_val(isl.dim_type.set, offset + i).to_python() for i in range(n)]
    return f"{name}[{', '.join(str(v) for v in vals)}]"


def _time_str(sched: isl.Map, inst: str) -> str:
    t = isl.Set(f"{{ {inst} }}").apply(sched)
    pt = t.sample_point()
    return _point_str("", pt, t.dim(isl.dim_type.set))


def violations(original: Mapping, new: Mapping, deps: D.Dependences | None = None,
               access_kinds: list[list[str]] | None = None) -> list[Violation]:
    """The dependences of ``original`` that ``new``'s schedule breaks (one entry per kind and
    statement pair)."""
    deps = deps or D.compute(original, access_kinds)
    width = max(J.schedule_width(original), J.schedule_width(new))
    theta = {s["name"]: J.pad_map(J.schedule_map(s), width).intersect_domain(J.domain(s)) for s in new["statements"]}
    found: list[Violation] = []
    for kind, rel in deps.items():
        pieces: list[isl.Map] = []
        rel.foreach_map(pieces.append)
        for m in sorted(pieces, key=str):
            src, dst = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            ts, tt = theta[src], theta[dst]
            later_or_same = ts.apply_range(isl.Map.lex_ge(ts.get_space().range())).apply_range(tt.reverse())
            bad = m.intersect(later_or_same)
            if bad.is_empty():
                continue
            pt = bad.wrap().lexmin().sample_point()  # the first violated pair
            n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
            s_inst, t_inst = _point_str(src, pt, n_in), _point_str(dst, pt, n_out, n_in)
            arrays = D.arrays_between(kind, isl.UnionMap.from_map(bad), original, access_kinds)
            found.append(Violation(kind, src, dst, tuple(arrays), (s_inst, t_inst), (_time_str(ts, s_inst), _time_str(tt, t_inst))))
    return found


def check_same_scop(original: Mapping, new: Mapping, where: str) -> None:
    """Raise :class:`~polyml.scop.jscop.JscopError` unless ``new`` is ``original`` with other
    schedules (Polly matches statements and accesses by position)."""
    J.check_structure(new, where)
    names, got = J.statement_names(original), J.statement_names(new)
    if names != got:
        raise J.JscopError(f"{where}: the statements must stay {names} in this order (found {got})")
    ctx_old = J.parse(isl.Set, original["context"], f"{where}: original context")
    if not J.parse(isl.Set, new["context"], f"{where}: context").is_equal(ctx_old):
        raise J.JscopError(f"{where}: the context changed ({original['context']!r} → {new['context']!r})")
    for old_s, new_s in zip(original["statements"], new["statements"]):
        name = old_s["name"]
        dom = J.domain(old_s)
        if not J.parse(isl.Set, new_s["domain"], f"{where}: statement {name}: domain").is_equal(dom):
            raise J.JscopError(f"{where}: statement {name}: the domain changed ({old_s['domain']} → {new_s['domain']}); "
                               "only schedules may be edited")
        theta = J.parse(isl.Map, new_s["schedule"], f"{where}: statement {name}: schedule")
        if theta.get_tuple_name(isl.dim_type.in_) != name or theta.dim(isl.dim_type.in_) != dom.dim(isl.dim_type.set):
            raise J.JscopError(f"{where}: statement {name}: the schedule {new_s['schedule']} must map {name} "
                               f"instances ({dom.dim(isl.dim_type.set)} dimensions)")
        theta = theta.intersect_domain(dom)
        if not dom.is_subset(theta.domain()):
            raise J.JscopError(f"{where}: statement {name}: the schedule does not give every instance a time "
                               f"(no time for {dom.subtract(theta.domain()).sample_point()})")
        if not theta.is_single_valued():
            raise J.JscopError(f"{where}: statement {name}: the schedule gives an instance several times")
        if len(old_s["accesses"]) != len(new_s["accesses"]):
            raise J.JscopError(f"{where}: statement {name}: the accesses changed; only schedules may be edited")
        for k, (a, b) in enumerate(zip(old_s["accesses"], new_s["accesses"])):
            rel = J.parse(isl.Map, b["relation"], f"{where}: statement {name}: access {k}")
            if a["kind"] != b["kind"] or not rel.is_equal(isl.Map(a["relation"])):
                raise J.JscopError(f"{where}: statement {name}: access {k} changed ({a['relation']} → {b['relation']}); "
                                   "only schedules may be edited")


def check(original: Mapping, new: Mapping, where: str, deps: D.Dependences | None = None,
          access_kinds: list[list[str]] | None = None) -> None:
    """Raise unless ``new`` is ``original`` with a legal new schedule."""
    check_same_scop(original, new, where)
    bad = violations(original, new, deps, access_kinds)
    if bad:
        raise IllegalScheduleError(where, bad)
