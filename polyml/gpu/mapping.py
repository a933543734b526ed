"""Mapping a nest's parallel band onto the CUDA grid, decided and checked with islpy.

A recorded nest (:class:`~polyml.gpu.builder.NestRecord`) is a SCoP of rectangular loops.  Each
access instance lives in one *schedule space* ``[t0, ..., t(2D)]`` (the ``2d+1`` form: ``t(2d+1)``
is the counter of the loop at depth ``d``, ``t(2d)`` the textual position at that level), so the
access relations of all statements are maps ``[t] -> A<root>[flat offset]``.  Then

* **dependences** (RAW, WAR, WAW) are ``{t -> u : A(t) = A(u), t ≺ u}`` for each pair of
  accesses to one array with at least one write;
* the **outer band** is the chain of loops from the root in which each loop's body is exactly its
  one child loop (the last one may hold anything), so mapping band loops neither duplicates nor
  drops statement instances;
* a band loop at depth ``d`` is **coincident** (parallel) when no dependence changes its counter:
  ``deps ∩ {t -> u : t(2d+1) ≠ u(2d+1)} = ∅``.  All instances with equal counters of the mapped
  loops run in one thread in their original order, so the mapped set only needs each member to
  be coincident; unmapped loops (reductions, sequential remainders) stay loops in the kernel.

Up to three coincident band loops, innermost first, become ``x``, ``y``, ``z``: loop ``i`` of
``[lo, hi)`` is strip-mined by a tile ``T`` into ``i = lo + T·blockIdx + threadIdx`` (outer tile
loop → block index, point loop → thread index) with the guard ``i < hi``.
:func:`grid_relation` builds the map from ``(blockIdx, threadIdx, sequential counters)`` to the
band's domain and :func:`check_bijective` proves it executes each domain point exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyml.gpu.builder import AccessRecord, NestRecord

#: threads per block the tile sizes aim at
THREADS = 256
MAX_GRID = (2**31 - 1, 65535, 65535)
AXES = "xyz"


@dataclass
class NestMapping:
    """Which band loops of a nest became grid dimensions, with their tile sizes."""

    band: list[tuple[int, ...]]  # the outer band, outermost first
    coincident: list[tuple[int, ...]]  # band loops no dependence crosses
    extents: dict[tuple[int, ...], tuple[int, int]]  # (lo, hi) of every band loop
    axes: dict[tuple[int, ...], int] = field(default_factory=dict)  # mapped loop -> 0/1/2 (x/y/z)
    tiles: dict[tuple[int, ...], int] = field(default_factory=dict)
    names: dict[tuple[int, ...], str] = field(default_factory=dict)
    why_serial: str = ""
    #: loops below the band (they run inside the thread), outermost first
    inner: list[str] = field(default_factory=list)
    #: shared-memory promotion (a :class:`polyml.gpu.shared.SharedPlan`), if one applies
    shared: object | None = None
    #: why a promotion that was asked for does not apply
    shared_note: str = ""

    def axis_of(self, key: tuple[int, ...]) -> int | None:
        return self.axes.get(key)

    def tile_of(self, key: tuple[int, ...]) -> int:
        return self.tiles[key]

    @property
    def block(self) -> tuple[int, int, int]:
        dims = [1, 1, 1]
        for k, a in self.axes.items():
            dims[a] = self.tiles[k]
        return tuple(dims)

    @property
    def grid(self) -> tuple[int, int, int]:
        dims = [1, 1, 1]
        for k, a in self.axes.items():
            lo, hi = self.extents[k]
            dims[a] = -(-(hi - lo) // self.tiles[k])
        return tuple(dims)

    def describe(self) -> dict:
        """The mapping as the manifest and ``polyml gpu-map`` show it."""
        dims = []
        for k in self.band:
            lo, hi = self.extents[k]
            entry = {"loop": self.names.get(k, "?"), "range": [lo, hi], "parallel": k in self.coincident}
            if k in self.axes:
                a = AXES[self.axes[k]]
                entry["to"] = f"blockIdx.{a}*{self.tiles[k]}+threadIdx.{a}"
            else:
                entry["to"] = "loop"
            dims.append(entry)
        out = {"band": dims, "grid": list(self.grid), "block": list(self.block), "inner_loops": list(self.inner),
               **({"serial": self.why_serial} if self.why_serial else {})}
        if self.shared is not None:
            out["shared"] = self.shared.describe()
        elif self.shared_note:
            out["shared_note"] = self.shared_note
        return out


# -- the polyhedral model of a recorded nest ------------------------------------------------------

def _depth(rec: NestRecord) -> int:
    return max((len(a.loops) for a in rec.accesses), default=0)


def _tnames(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def access_map(rec: NestRecord, acc: AccessRecord, sizes: list[int], ctx: isl.Context | None = None) -> isl.Map:
    """``{ [t] -> A<root>[o] }`` of one access, in the nest's schedule space."""
    n = 2 * _depth(rec) + 1
    t = _tnames("t", n)
    cons = []
    for d in range(n):
        level = d // 2
        if d % 2 == 0:
            cons.append(f"{t[d]} = {acc.ordinals[level] if level < len(acc.ordinals) else 0}")
        elif level < len(acc.loops):
            lp = rec.loops[acc.loops[level]]
            cons.append(f"{lp.lo} <= {t[d]} < {lp.hi}")
        else:
            cons.append(f"{t[d]} = 0")
    pos = {key: 2 * i + 1 for i, key in enumerate(acc.loops)}
    if acc.offset is None:
        cons.append(f"0 <= o < {sizes[acc.root]}")
    else:
        terms = [f"{c}*{t[pos[k]]}" for k, c in acc.offset.items() if k != 1 and c]
        cons.append(f"o = {' + '.join([*terms, str(acc.offset.get(1, 0))])}")
    s = f"{{ [{', '.join(t)}] -> A{acc.root}[o] : {' and '.join(cons)} }}"
    try:
        return isl.Map(s, context=ctx)
    except isl.Error:
        raise ValueError(s) from None


def band_access_map(rec: NestRecord, band: list[tuple[int, ...]], acc: AccessRecord, sizes: list[int]) -> isl.Map:
    """``{ [i_band] -> A<root>[o] }``: the elements one access touches per band point (the
    counters of its loops inside the band are existentially quantified)."""
    iv = _tnames("i", len(band))
    inner = [k for k in acc.loops if k not in band]
    ev = _tnames("e", len(inner))
    name = {k: iv[j] for j, k in enumerate(band)} | {k: ev[j] for j, k in enumerate(inner)}
    cons = [f"{rec.loops[k].lo} <= {name[k]} < {rec.loops[k].hi}" for k in (*band, *inner)]
    if acc.offset is None:
        cons.append(f"0 <= o < {sizes[acc.root]}")
    else:
        terms = [f"{c}*{name[k]}" for k, c in acc.offset.items() if k != 1 and c]
        cons.append(f"o = {' + '.join([*terms, str(acc.offset.get(1, 0))])}")
    body = " and ".join(cons)
    if ev:
        body = f"exists ({', '.join(ev)} : {body})"
    return isl.Map(f"{{ [{', '.join(iv)}] -> A{acc.root}[o] : {body} }}")


def conflicts(rec: NestRecord, band: list[tuple[int, ...]], sizes: list[int]) -> isl.Set:
    """Distance vectors between band points whose instances touch one element, one of them
    writing: ``deltas({ i -> j : W(i) ∩ A(j) ≠ ∅ })``.  Every dependence of the nest projects to
    one of these (in one direction or the other), so a band loop whose component is 0 in all of
    them is carried by no dependence."""
    n = len(band)
    out = isl.Set.empty(isl.Space.create_from_names(isl.DEFAULT_CONTEXT, set=_tnames("d", n)))
    per_array: dict[int, dict[str, isl.Map]] = {}
    seen: set = set()
    for acc in rec.accesses:
        sig = (acc.kind, acc.root, tuple(acc.loops), None if acc.offset is None else tuple(sorted(acc.offset.items(), key=str)))
        if sig in seen:
            continue
        seen.add(sig)
        m = band_access_map(rec, band, acc, sizes)
        slot = per_array.setdefault(acc.root, {})
        for kind in {acc.kind, "any"}:
            slot[kind] = slot[kind].union(m) if kind in slot else m
    for maps in per_array.values():
        if "write" not in maps:
            continue
        w, a = maps["write"].coalesce(), maps["any"].coalesce()
        out = out.union(w.apply_range(a.reverse()).deltas())
    return out.coalesce()


def dependences(rec: NestRecord, sizes: list[int]) -> isl.Map:
    """All RAW/WAR/WAW dependences ``{ [t] -> [u] }`` in the nest's ``2d+1`` schedule space
    (exact but quadratic in the accesses: for reports and tests, not for mapping)."""
    n = 2 * _depth(rec) + 1
    space = isl.Space.create_from_names(isl.DEFAULT_CONTEXT, set=_tnames("t", n))
    deps = isl.Map.empty(isl.Space.map_from_domain_and_range(space, space))
    by_array: dict[int, dict[str, isl.Map]] = {}
    for acc in rec.accesses:
        m = access_map(rec, acc, sizes)
        slot = by_array.setdefault(acc.root, {})
        slot[acc.kind] = slot[acc.kind].union(m) if acc.kind in slot else m
    for rw in by_array.values():
        w, r = rw.get("write"), rw.get("read")
        if w is None:
            continue
        same = w.apply_range(w.reverse())
        if r is not None:
            same = same.union(w.apply_range(r.reverse())).union(r.apply_range(w.reverse()))
        deps = deps.union(same)
    return deps.intersect(isl.Map.lex_lt(space)).coalesce()


def outer_band(rec: NestRecord) -> list[tuple[int, ...]]:
    """Loops from the root while each loop's body is just its single child loop."""
    if len(rec.roots) != 1 or any(not a.loops for a in rec.accesses):
        return []
    band = [rec.roots[0]]
    while True:
        lp = rec.loops[band[-1]]
        if lp.direct_access or len(lp.children) != 1:
            return band
        band.append(lp.children[0])


def coincident_loops(band: list[tuple[int, ...]], deltas: isl.Set) -> list[tuple[int, ...]]:
    """Band loops whose component is zero in every conflict distance (see :func:`conflicts`)."""
    d = _tnames("d", len(band))
    out = []
    for j, key in enumerate(band):
        crossing = isl.Set(f"{{ [{', '.join(d)}] : {d[j]} < 0 or {d[j]} > 0 }}")
        if deltas.intersect(crossing).is_empty():
            out.append(key)
    return out


def _pow2ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def map_nest(rec: NestRecord, sizes: list[int], threads: int = THREADS, max_x: int | None = None) -> NestMapping:
    """Decide the grid mapping of one nest (``sizes``: elements of each op buffer; ``max_x``:
    cap on the x tile when another loop can take the rest of the block, for 2-D blocks)."""
    band = outer_band(rec)
    extents = {k: (rec.loops[k].lo, rec.loops[k].hi) for k in band}
    names = {k: rec.loops[k].name for k in band}
    inner = [lp.name for k, lp in sorted(rec.loops.items()) if k not in band]
    if rec.opaque:
        return NestMapping(band, [], extents, names=names, why_serial="; ".join(rec.opaque), inner=inner)
    if not band:
        return NestMapping(band, [], extents, names=names, why_serial="no loop band encloses every statement", inner=inner)
    par = coincident_loops(band, conflicts(rec, band, sizes))
    m = NestMapping(band, par, extents, names=names, inner=inner)
    budget = threads
    axis = 0
    for key in reversed(par):
        if axis == 3:
            break
        lo, hi = extents[key]
        cap = max_x if axis == 0 and max_x and sum(1 for k in par if extents[k][1] - extents[k][0] > 1) > 1 else budget
        tile = max(1, min(_pow2ceil(hi - lo), budget, cap))
        if -(-(hi - lo) // tile) > MAX_GRID[axis]:
            continue
        m.axes[key], m.tiles[key] = axis, tile
        budget = max(1, budget // tile)
        axis += 1
    if not m.axes:
        m.why_serial = "a dependence crosses every band loop"
    return m


# -- the check that the grid covers the domain exactly once ---------------------------------------

def band_domain(m: NestMapping) -> isl.Set:
    """``{ [i0, ..., ik] : lo_j <= i_j < hi_j }`` over the band loops."""
    iv = _tnames("i", len(m.band))
    cons = [f"{m.extents[k][0]} <= {iv[j]} < {m.extents[k][1]}" for j, k in enumerate(m.band)]
    return isl.Set(f"{{ [{', '.join(iv)}] : {' and '.join(cons) or '1 = 1'} }}")


def grid_relation(m: NestMapping) -> isl.Map:
    """``{ [bx, by, bz, tx, ty, tz, s...] -> [i...] }``: which band point each thread, at which
    values of the unmapped band counters ``s``, executes (guards included)."""
    iv = _tnames("i", len(m.band))
    seq = [k for k in m.band if k not in m.axes]
    s = _tnames("s", len(seq))
    grid, block = m.grid, m.block
    cons = []
    for a in range(3):
        cons.append(f"0 <= b{AXES[a]} < {grid[a]} and 0 <= t{AXES[a]} < {block[a]}")
    for j, k in enumerate(m.band):
        lo, hi = m.extents[k]
        if k in m.axes:
            a = AXES[m.axes[k]]
            cons.append(f"{iv[j]} = {lo} + {m.tiles[k]}*b{a} + t{a} and {iv[j]} < {hi}")
        else:
            v = s[seq.index(k)]
            cons.append(f"{lo} <= {v} < {hi} and {iv[j]} = {v}")
    src = ["bx", "by", "bz", "tx", "ty", "tz", *s]
    return isl.Map(f"{{ [{', '.join(src)}] -> [{', '.join(iv)}] : {' and '.join(cons)} }}")


def check_bijective(m: NestMapping) -> None:
    """Raise AssertionError unless the grid executes every band point exactly once."""
    rel = grid_relation(m)
    dom = band_domain(m)
    if not rel.range().is_equal(dom):
        raise AssertionError(f"grid misses or exceeds the domain: range {rel.range()} vs {dom}")
    if not rel.reverse().is_single_valued():
        raise AssertionError(f"a band point is executed by two threads: {rel}")
    if not rel.is_single_valued():
        raise AssertionError(f"a thread executes two points at once: {rel}")


__all__ = ["NestMapping", "access_map", "band_access_map", "band_domain", "check_bijective", "coincident_loops", "conflicts",
           "dependences",
           "grid_relation", "map_nest", "outer_band"]
