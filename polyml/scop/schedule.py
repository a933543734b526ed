"""Flat schedules (what a JSCoP holds) as isl schedule trees, bands and their permutability.

Polly exports one flat map per statement, e.g. ``S[i, j] -> [i, 0, j, 0]`` and
``T[i, k, j] -> [i, 1, k, j]``.  Read as a tree: a schedule dimension on which every statement
is constant splits the statements into a *sequence* (ordered by that constant); the other
dimensions are *band* members, and consecutive members form one band::

    band [i] ─ sequence ─┬─ filter {S}: band [j]
                         └─ filter {T}: band [k, j]

A band member is permutable with the others when no dependence that the outer dimensions
leave unordered goes backwards along it; the members of a permutable band can be tiled
rectangularly (:mod:`polyml.passes.tile`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import islpy as isl

from polyml.scop import jscop as J


@dataclass(frozen=True)
class _Stmt:
    name: str
    domain: isl.Set
    sched: isl.Map  # padded to the SCoP's width


def _constant(st: _Stmt, d: int) -> int | None:
    """The value of schedule dimension ``d`` if it is constant over the statement's domain."""
    m = st.sched.intersect_domain(st.domain)
    n = m.dim(isl.dim_type.out)
    r = m.range().project_out(isl.dim_type.set, d + 1, n - d - 1).project_out(isl.dim_type.set, 0, d)
    if r.is_empty() or not r.is_singleton():
        return None
    return int(r.sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python())


def _members(stmts: list[_Stmt], dims: list[int]) -> isl.MultiUnionPwAff:
    u = isl.UnionMap("{ }")
    for st in stmts:
        m = st.sched.intersect_domain(st.domain)
        n = m.dim(isl.dim_type.out)
        keep = set(dims)
        for d in reversed(range(n)):
            if d not in keep:
                m = m.project_out(isl.dim_type.out, d, 1)
        u = u.union(isl.UnionMap.from_map(m))
    return isl.MultiUnionPwAff.from_union_map(u)


def _build(stmts: list[_Stmt], d: int, width: int) -> isl.Schedule:
    dom = isl.UnionSet("{ }")
    for st in stmts:
        dom = dom.union(isl.UnionSet.from_set(st.domain))
    if d >= width:
        return isl.Schedule.from_domain(dom)
    consts = [_constant(st, d) for st in stmts]
    if all(c is not None for c in consts):
        groups: dict[int, list[_Stmt]] = {}
        for st, c in zip(stmts, consts):
            groups.setdefault(int(c), []).append(st)
        if len(groups) == 1:
            return _build(stmts, d + 1, width)
        children = [_build(groups[c], d + 1, width) for c in sorted(groups)]
        seq = children[0]
        for ch in children[1:]:
            seq = seq.sequence(ch)
        return seq
    band = [d]
    e = d + 1
    while e < width:
        c = [_constant(st, e) for st in stmts]
        if all(v is not None for v in c):
            if len(set(c)) > 1:
                break  # a sequence split ends the band
            e += 1  # the same constant for all: orders nothing
            continue
        band.append(e)
        e += 1
    child = _build(stmts, e, width)
    return child.insert_partial_schedule(_members(stmts, band))


def constant_dims(stmt: Mapping, width: int) -> set[int]:
    """The schedule dimensions on which ``stmt`` is constant (after padding to ``width``)."""
    st = _Stmt(stmt["name"], J.domain(stmt), J.pad_map(J.schedule_map(stmt), width))
    return {d for d in range(width) if _constant(st, d) is not None}


def to_tree(jscop: Mapping) -> isl.Schedule:
    """The schedule tree of a JSCoP's flat schedule (sequences at all-constant dimensions)."""
    width = J.schedule_width(jscop)
    stmts = [_Stmt(s["name"], J.domain(s), J.pad_map(J.schedule_map(s), width)) for s in jscop["statements"]]
    return _build(stmts, 0, width)


def from_tree(jscop: Mapping, tree: isl.Schedule) -> dict:
    """A copy of ``jscop`` with the (flattened, padded) schedule of ``tree``."""
    flat = tree.get_map()
    maps: dict[str, isl.Map] = {}
    flat.foreach_map(lambda m: maps.__setitem__(m.get_tuple_name(isl.dim_type.in_), m))
    width = max((m.dim(isl.dim_type.out) for m in maps.values()), default=0)
    out = {}
    for s in jscop["statements"]:
        m = maps.get(s["name"])
        if m is None:  # an empty domain: keep the old schedule
            continue
        # the tree's map carries the domain's constraints: Polly intersects with the domain itself
        out[s["name"]] = J.pad_map(m, width).gist_domain(J.domain(s)).coalesce()
    return J.with_schedules(jscop, out)


def map_bands(tree: isl.Schedule, fn: Callable[[isl.ScheduleNode], tuple[isl.ScheduleNode, int]]) -> isl.Schedule:
    """Rewrite every band of ``tree`` top-down with ``fn(band) -> (node, depth)``: ``node`` is
    where the walk continues (its children are visited next), ``depth`` how many levels below
    the original band it lies (a tiled band returns its point band and 1)."""

    def walk(node: isl.ScheduleNode) -> isl.ScheduleNode:
        depth = 0
        if node.get_type() == isl.schedule_node_type.band:
            node, depth = fn(node)
        for i in range(node.n_children()):
            node = walk(node.child(i)).parent()
        for _ in range(depth):
            node = node.parent()
        return node

    return walk(tree.get_root()).get_schedule()


def bands(tree: isl.Schedule) -> list[isl.ScheduleNode]:
    """All band nodes of ``tree`` in pre-order (outer bands first)."""
    found: list[isl.ScheduleNode] = []

    def collect(node: isl.ScheduleNode) -> tuple[isl.ScheduleNode, int]:
        found.append(node)
        return node, 0

    map_bands(tree, collect)
    return found


def permutable_prefix(node: isl.ScheduleNode, deps: isl.UnionMap) -> int:
    """How many leading members of band ``node`` are permutable: along each of them no
    dependence between instances the outer dimensions leave unordered has a negative distance."""
    dom = node.get_domain()
    live = deps.intersect_domain(dom).intersect_range(dom)
    prefix = node.get_prefix_schedule_union_map()
    if not prefix.is_empty():
        live = live.intersect(prefix.apply_range(prefix.reverse()))
    if live.is_empty():
        return node.band_n_member()
    part = node.band_get_partial_schedule()
    n = 0
    for k in range(node.band_n_member()):
        member = isl.UnionMap.from_union_pw_aff(part.get_union_pw_aff(k))
        times = live.apply_domain(member).apply_range(member)
        backwards = isl.UnionMap("{ [a] -> [b] : b < a }")
        if not times.intersect(backwards).is_empty():
            break
        n += 1
    return n
