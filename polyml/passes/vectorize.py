"""Prepare the innermost parallel stride-1 loop for LLVM's loop vectorizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import dependences
from polyml.scop import jscop as J
from polyml.scop import schedule as sched


@register
@dataclass(frozen=True)
class Vectorize(Pass):
    """Make a parallel member with unit-stride accesses the innermost loop of each innermost
    band, and strip-mine it to the vector width.

    For every band with no band below it, each member is scored by the accesses of its
    statements: moving one step along the member (the other members fixed) must move an
    access by one element in its last dimension (*stride 1*, counts +r for an array of rank r),
    not at all (*invariant*, 0) or otherwise (*strided*, −r).  The best-scoring member that is parallel
    (coincident: no dependence between its iterations, so LLVM may run them in any order) goes
    innermost — legal because the band is permutable — and with ``width`` > 1 it is
    strip-mined, ``j → ⌊j/W⌋, j``, so the innermost loop runs W iterations (the vector
    width: ``width=0`` takes the host's, 64-byte registers with AVX-512, else 32, divided by
    the widest element; ``width=1`` leaves the loop whole).  Polly's code generation marks an
    innermost parallel loop ``llvm.loop.parallel_accesses`` with alias scopes, so LLVM's loop
    vectorizer takes it without run-time checks.  Gemm's point band ``[i, j, k]`` becomes
    ``[i, k, ⌊j/W⌋, j]``.
    """

    name: ClassVar[str] = "vectorize"
    width: int = 0

    def apply(self, scop: dict) -> dict:
        if self.width < 0:
            raise PassError(f"vectorize: width={self.width} must be >= 0")
        deps = dependences.compute(scop).all()
        accesses = _accesses(scop)
        order = J.statement_names(scop)
        own = _self_dependences(deps)
        width = self.width or host_vector_width(scop)

        def one(node: isl.ScheduleNode) -> tuple[isl.ScheduleNode, int]:
            if _has_band_below(node):
                return node, 0
            node = stride_one_innermost(node, deps, own, accesses)
            split = separate_statements(node, deps, order)
            if split is not None:
                return split, 0  # the walk goes on into each statement's own inner band
            return strip_mine(node, deps, width)

        return sched.with_tree(scop, sched.map_bands(sched.tree(scop), one))


def _statements(node: isl.ScheduleNode) -> list[str]:
    sets: list[isl.Set] = []
    node.get_domain().foreach_set(sets.append)
    return [s.get_tuple_name() for s in sets]


def separate_statements(node: isl.ScheduleNode, deps: isl.UnionMap, order: list[str]) -> isl.ScheduleNode | None:
    """Give each statement of an innermost band its own innermost loops where legal.

    A fused band runs several statements in one loop body, shifted against each other
    (jacobi-2d's ``B[i][j] = …`` and ``A[i-1][j-1] = …``): isl's code then guards each
    statement inside the innermost loop, which LLVM does not vectorize.  Split the band after
    its first ``k`` members and put a sequence of the statements (in source order) below, the
    largest ``k`` for which every dependence is still respected (checked on the whole tree);
    the outer members stay fused (the tile's rows are shared).  None when nothing is legal or
    the band runs one statement."""
    names = [n for n in order if n in set(_statements(node))]
    n = node.band_n_member()
    if len(names) < 2 or n < 2:
        return None
    dom = node.get_domain()
    filters = isl.UnionSetList.alloc(node.get_ctx(), len(names))
    for name in names:
        filters = filters.add(dom.intersect(isl.UnionSet(f"{{ {name}[{', '.join(f'i{d}' for d in range(_rank(dom, name)))}] }}")))
    for k in range(n - 1, 0, -1):
        inner = node.band_split(k).child(0).insert_sequence(filters)
        if sched.is_legal(inner.get_schedule(), deps):
            return inner.parent()
    return None


def _rank(dom: isl.UnionSet, name: str) -> int:
    sets: list[isl.Set] = []
    dom.foreach_set(sets.append)
    return next(s.dim(isl.dim_type.set) for s in sets if s.get_tuple_name() == name)


def host_vector_width(scop: dict) -> int:
    """Elements of the widest array type in one vector register of the host."""
    from polyml.driver.toolchain import host_target
    from polyml.passes.tile import ELEMENT_BYTES

    reg = 64 if "+avx512f" in host_target().features else 32
    widest = max((ELEMENT_BYTES.get(a.get("type", "double"), 8) for a in scop.get("arrays", [])), default=8)
    return max(1, reg // widest)


def _has_band_below(node: isl.ScheduleNode) -> bool:
    for i in range(node.n_children()):
        ch = node.child(i)
        if ch.get_type() == isl.schedule_node_type.band or _has_band_below(ch):
            return True
    return False


def _accesses(scop: dict) -> dict[str, list[isl.Map]]:
    """Per statement, its access relations restricted to its domain."""
    out: dict[str, list[isl.Map]] = {}
    for s in scop["statements"]:
        dom = J.domain(s)
        out[s["name"]] = [J.parse(isl.Map, a["relation"], s["name"]).intersect_domain(dom) for a in s["accesses"]]
    return out


def stride_score(node: isl.ScheduleNode, k: int, accesses: dict[str, list[isl.Map]]) -> int:
    """+r per stride-1 access, −r per strided one (r: the array's rank), when member ``k`` of
    band ``node`` steps by one."""
    members = sched.band_members(node)
    n = len(members)
    band = members[0]
    for m in members[1:]:
        band = band.flat_range_product(m)
    prefix = node.get_prefix_schedule_union_map()
    names = [f"m{i}" for i in range(n)]
    shift = isl.Map(f"{{ [{', '.join(names)}] -> [{', '.join(f'{v} + 1' if i == k else v for i, v in enumerate(names))}] }}")
    score = 0
    maps: list[isl.Map] = []
    band.foreach_map(maps.append)
    for p in maps:
        stmt = p.get_tuple_name(isl.dim_type.in_)
        pre = [x for x in _maps(prefix) if x.get_tuple_name(isl.dim_type.in_) == stmt]
        full = p if not pre else pre[0].flat_range_product(p)  # time of an instance: prefix, then band
        npre = full.dim(isl.dim_type.out) - n
        step = shift if not npre else isl.Map(
            f"{{ [{', '.join(f'p{i}' for i in range(npre))}, {', '.join(names)}] -> "
            f"[{', '.join(f'p{i}' for i in range(npre))}, "
            f"{', '.join(f'{v} + 1' if i == k else v for i, v in enumerate(names))}] }}")
        for acc in accesses.get(stmt, []):
            rank = acc.dim(isl.dim_type.out)
            if rank == 0:
                continue
            at = full.reverse().apply_range(acc)  # time -> element
            moved = at.reverse().apply_range(step).apply_range(at)  # element -> element one step later
            if moved.is_empty():
                continue
            d = moved.deltas()
            arr = d.get_tuple_name() or ""
            zero = isl.Set(f"{{ {arr}[{', '.join(['0'] * rank)}] }}")
            unit = isl.Set(f"{{ {arr}[{', '.join(['0'] * (rank - 1) + ['1'])}] }}")
            if d.is_subset(zero):
                continue
            score += rank if d.is_subset(unit) else -rank  # a matrix walked badly costs more than a vector
    return score


def _maps(u: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    if not u.is_empty():
        u.foreach_map(out.append)
    return out


def _self_dependences(deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences between instances of one statement."""
    out = isl.UnionMap("{ }")
    for m in _maps(deps):
        if m.get_tuple_name(isl.dim_type.in_) == m.get_tuple_name(isl.dim_type.out):
            out = out.union(isl.UnionMap.from_map(m))
    return out


def stride_one_innermost(node: isl.ScheduleNode, deps: isl.UnionMap, own: isl.UnionMap,
                         accesses: dict[str, list[isl.Map]]) -> isl.ScheduleNode:
    """Band ``node`` with its best stride-1 member innermost: the highest :func:`stride_score`
    among members that are parallel as far as each statement's own dependences go (the
    statements may still be separated below it, :func:`separate_statements`); only a
    permutable band is permuted."""
    from polyml.passes.parallel import permute

    n = node.band_n_member()
    if n < 2 or not sched.band_is_permutable(node, deps):
        return node
    scores = {k: stride_score(node, k, accesses) for k in range(n)}
    for k in sorted(scores, key=lambda k: (-scores[k], k != n - 1)):
        if scores[k] <= 0:
            break
        cand = node if k == n - 1 else permute(node, [*(i for i in range(n) if i != k), k], deps)
        if sched.member_parallel(cand, n - 1, own):
            return cand
    return node


def strip_mine(node: isl.ScheduleNode, deps: isl.UnionMap, width: int) -> tuple[isl.ScheduleNode, int]:
    """Strip-mine the innermost member of band ``node`` by ``width`` if it is parallel."""
    n = node.band_n_member()
    if width <= 1 or not sched.member_parallel(node, n - 1, deps):
        return node, 0
    if n > 1:
        node = node.band_split(n - 1).child(0)
    ctx = isl.DEFAULT_CONTEXT
    saved = ctx.get_tile_scale_tile_loops(), ctx.get_tile_shift_point_loops()
    ctx.set_tile_scale_tile_loops(0)
    ctx.set_tile_shift_point_loops(0)
    try:
        mv = isl.MultiVal.zero(node.band_get_space()).set_val(0, isl.Val.int_from_si(node.get_ctx(), width))
        node = node.band_tile(mv)
    finally:
        ctx.set_tile_scale_tile_loops(saved[0])
        ctx.set_tile_shift_point_loops(saved[1])
    return node.child(0), 2 if n > 1 else 1


def innermost_score(scop: dict) -> int:
    """How well the schedule's innermost loops walk memory: for every statement, its innermost
    loop (the last schedule dimension not constant on it) stepped by one with the outer ones
    fixed, +r per stride-1 access, −r per strided one (r: the array's rank), summed (the
    default policy compares schedules with it)."""
    width = J.schedule_width(scop)
    accesses = _accesses(scop)
    total = 0
    for s in scop["statements"]:
        m = J.pad_map(J.schedule_map(s), width).intersect_domain(J.domain(s))
        const = sched.constant_dims(s, width)
        loops = [d for d in range(width) if d not in const]
        if not loops:
            continue
        d = loops[-1]
        names = [f"t{i}" for i in range(width)]
        step = isl.Map(f"{{ [{', '.join(names)}] -> [{', '.join(f'{v} + 1' if i == d else v for i, v in enumerate(names))}] }}")
        for acc in accesses[s["name"]]:
            rank = acc.dim(isl.dim_type.out)
            if rank == 0:
                continue
            at = m.reverse().apply_range(acc)
            moved = at.reverse().apply_range(step).apply_range(at)
            if moved.is_empty():
                continue
            delta = moved.deltas()
            arr = delta.get_tuple_name() or ""
            if delta.is_subset(isl.Set(f"{{ {arr}[{', '.join(['0'] * rank)}] }}")):
                continue
            unit = isl.Set(f"{{ {arr}[{', '.join(['0'] * (rank - 1) + ['1'])}] }}")
            total += rank if delta.is_subset(unit) else -rank
    return total
