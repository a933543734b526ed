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


# -- the band tree carried between passes -------------------------------------------------------
#
# A JSCoP holds one flat map per statement; the isl scheduler's answer is a schedule *tree*
# whose bands say which members are permutable and which coincident (parallel).  Passes that
# produce or read that tree keep it in the JSCoP under META (``{"tree": <isl schedule text>,
# "parallel": {...}}``) next to the flat maps they also write; the key is stripped before a
# file goes to Polly.  A pass that only rewrites flat maps leaves a stale tree behind: ``tree``
# notices (the tree's map differs from the flat schedule) and rebuilds from the flat maps.

META = J.META


def meta(jscop: Mapping) -> dict:
    """polyml's metadata of a JSCoP (empty when it has none)."""
    m = jscop.get(META)
    return dict(m) if isinstance(m, dict) else {}


def with_meta(jscop: Mapping, **items: object) -> dict:
    """A copy with ``items`` merged into polyml's metadata (``None`` removes a key)."""
    out = dict(jscop)
    m = meta(jscop)
    for k, v in items.items():
        if v is None:
            m.pop(k, None)
        else:
            m[k] = v
    out[META] = m
    return out


def _flat_maps(tree: isl.Schedule) -> dict[str, isl.Map]:
    maps: dict[str, isl.Map] = {}
    tree.get_map().foreach_map(lambda m: maps.__setitem__(m.get_tuple_name(isl.dim_type.in_), m))
    return maps


def _matches(jscop: Mapping, tree: isl.Schedule) -> bool:
    """Does ``tree`` order every statement instance as the flat schedules do (same maps)?"""
    maps = _flat_maps(tree)
    width = max([J.schedule_width(jscop), *(m.dim(isl.dim_type.out) for m in maps.values())])
    for s in jscop["statements"]:
        dom = J.domain(s)
        m = maps.get(s["name"])
        if m is None:
            if not dom.is_empty():
                return False
            continue
        flat = J.pad_map(J.schedule_map(s), width).intersect_domain(dom)
        if not J.pad_map(m, width).intersect_domain(dom).is_equal(flat):
            return False
    return True


def tree(jscop: Mapping) -> isl.Schedule:
    """The schedule tree of a JSCoP: the one a pass left in its metadata if it still matches
    the flat schedules, else the flat schedules read as a tree (:func:`to_tree`)."""
    text = meta(jscop).get("tree")
    if isinstance(text, str):
        try:
            t = isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, text)
        except isl.Error:
            t = None
        if t is not None and _matches(jscop, t):
            return t
    return to_tree(jscop)


def with_tree(jscop: Mapping, tree: isl.Schedule) -> dict:
    """A copy of ``jscop`` with the flat schedules of ``tree`` and the tree in its metadata."""
    return with_meta(from_tree(jscop, tree), tree=str(tree))


def band_members(node: isl.ScheduleNode) -> list[isl.UnionMap]:
    """The members of band ``node`` as maps statement instance → [value]."""
    part = node.band_get_partial_schedule()
    return [isl.UnionMap.from_union_pw_aff(part.get_union_pw_aff(k)) for k in range(node.band_n_member())]


def live_dependences(node: isl.ScheduleNode, deps: isl.UnionMap, members: int = 0) -> isl.UnionMap:
    """The dependences between instances of ``node``'s subtree that the outer schedule and the
    first ``members`` members of band ``node`` leave unordered (run at the same time)."""
    dom = node.get_domain()
    live = deps.intersect_domain(dom).intersect_range(dom)
    prefix = node.get_prefix_schedule_union_map()
    if not prefix.is_empty() and not live.is_empty():
        live = live.intersect(prefix.apply_range(prefix.reverse()))
    for m in band_members(node)[:members]:
        if live.is_empty():
            break
        live = live.intersect(m.apply_range(m.reverse()))
    return live


def member_parallel(node: isl.ScheduleNode, k: int, deps: isl.UnionMap) -> bool:
    """Is member ``k`` of band ``node`` a parallel loop where it stands: every dependence the
    outer dimensions (outer bands and members 0..k-1) leave unordered has distance 0 along it?"""
    live = live_dependences(node, deps, k)
    if live.is_empty():
        return True
    m = band_members(node)[k]
    times = live.apply_domain(m).apply_range(m)
    return times.intersect(isl.UnionMap("{ [a] -> [b] : b != a }")).is_empty()


def band_is_permutable(node: isl.ScheduleNode, deps: isl.UnionMap) -> bool:
    """All members of band ``node`` permutable (no live dependence backwards along any)."""
    return permutable_prefix(node, deps) == node.band_n_member()


def replace_band(node: isl.ScheduleNode, members: list[isl.UnionPwAff], permutable: bool,
                 coincident: list[bool]) -> isl.ScheduleNode:
    """Band ``node`` with a new partial schedule (``members``) and flags; returns the new band."""
    mupa = node.band_get_partial_schedule()
    for k, upa in enumerate(members):
        mupa = mupa.set_union_pw_aff(k, upa)
    options = node.band_get_ast_build_options()
    node = node.delete().insert_partial_schedule(mupa).band_set_ast_build_options(options)
    node = node.band_set_permutable(1 if permutable else 0)
    for k, c in enumerate(coincident):
        node = node.band_member_set_coincident(k, 1 if c else 0)
    return node


def mark_parallel(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.ScheduleNode:
    """Band ``node`` with every member's coincident flag recomputed from ``deps``."""
    for k in range(node.band_n_member()):
        node = node.band_member_set_coincident(k, 1 if member_parallel(node, k, deps) else 0)
    return node


def describe(tree: isl.Schedule) -> list[dict]:
    """The bands of ``tree``, outer first: statements, members, permutable, coincident."""
    out = []
    for node in bands(tree):
        sets: list[isl.Set] = []
        node.get_domain().foreach_set(sets.append)
        out.append({"statements": sorted(s.get_tuple_name() for s in sets), "members": [str(m) for m in band_members(node)],
                    "permutable": bool(node.band_get_permutable()),
                    "coincident": [bool(node.band_member_get_coincident(k)) for k in range(node.band_n_member())]})
    return out


def flat_union(tree: isl.Schedule) -> isl.UnionMap:
    """The tree's schedule as one union map, every statement's range padded to one width."""
    maps = _flat_maps(tree)
    width = max((m.dim(isl.dim_type.out) for m in maps.values()), default=0)
    u = isl.UnionMap("{ }")
    for m in maps.values():
        u = u.union(isl.UnionMap.from_map(J.pad_map(m, width)))
    return u


def is_legal(tree: isl.Schedule, deps: isl.UnionMap) -> bool:
    """Does ``tree`` run the source of every dependence strictly before its target?"""
    flat = flat_union(tree)
    return deps.intersect(flat.lex_ge_union_map(flat)).is_empty()
