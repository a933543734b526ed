"""Shared-memory promotion of reused input tiles, decided and checked with islpy.

A mapped nest (:class:`~polyml.gpu.mapping.NestMapping`) runs one *block* of threads per tile of
its grid loops.  Pick the first loop ``r`` below the outermost grid loop that stays a loop in the
thread (the reduction: ``k`` of a GEMM, the input channel ``c`` of a convolution) and strip-mine
it by ``TK``: ``r = lo + TK·q + u``.  For one block and one ``q`` the *footprint* of a read
``A[f(x)]`` is the image of the block's tile of the loop counters:

* grid loops ``x = lo + T·blockIdx + threadIdx`` with ``0 ≤ threadIdx < T`` (the block's tile),
* ``r`` in ``[lo + TK·q, lo + TK·q + TK)``,
* loops enclosing ``r`` that stay loops (``f``): one value, fixed while the tile is in use,
* loops inside ``r`` that stay loops: their whole range.

The flat offset ``f`` is *delinearized* by the strides of the buffer's shape (each loop's
coefficient goes to the outermost dimension whose stride divides it; constant terms go to the
last dimension, stride 1), so ``f = Σ s_d·sub_d`` and each subscript ``sub_d`` ranges over an
interval ``[origin_d, origin_d + W_d)`` whose origin is affine in ``(blockIdx, q, f)`` and
whose width is a constant.  That box is the copy: the block's threads load it cooperatively
into a ``[Π W_d]`` array in ``addrspace(3)`` (elements outside ``[0, size)`` of the buffer are
skipped: they are never read, the box is a superset), ``bar.sync``, the tile's iterations read
``S[Σ (sub_d − origin_d)·pitch_d]``, ``bar.sync``.

An array is promoted when it is only read in the nest, all its reads inside ``r`` share one
linear part (the register blocks of a convolution differ only in constants), every element of
its footprint is read by more than one thread of the block (isl: the footprint relation
``threadIdx → A`` has no element with a single reader), and the boxes of all promoted arrays fit
the shared-memory budget.  :func:`check_cover` proves with isl that the copied box contains every
element the block reads (``footprint ⊆ copy``, in flat offsets and in subscripts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from polyml.gpu.builder import AccessRecord, NestRecord
from polyml.gpu.mapping import AXES, NestMapping, map_nest

#: default shared-memory budget per block (the static limit of every SM since sm_20)
SHARED_BYTES = 48 * 1024
#: x tile of nests mapped for promotion: square 16x16 blocks give both operands of a product reuse
SHARED_MAX_X = 16
TK_CHOICES = (32, 16, 8, 4, 2, 1)

Key = tuple[int, ...]
Sym = object  # ("b", axis) | ("q",) | ("f", key) | 1: the terms of a box origin


@dataclass
class PromotedArray:
    """The box of buffer argument ``root`` one block copies per tile of the reduction loop."""

    root: int
    size: int  # elements of the buffer: the copy skips offsets outside [0, size)
    strides: list[int]  # element strides of the dimensions (row-major, last is 1)
    coeffs: list[dict[Key, int]]  # per dimension: loop -> coefficient in its subscript
    consts: list[int]  # constant terms of the promoted reads
    widths: list[int] = field(default_factory=list)
    origin: list[dict] = field(default_factory=list)  # per dimension: affine form over Sym
    name: str = ""

    @property
    def elems(self) -> int:
        return math.prod(self.widths)

    @property
    def nbytes(self) -> int:
        return 4 * self.elems

    def digits(self, c: int) -> list[int]:
        """``c − min(consts)`` split over the dimensions (greedy by stride, all ≥ 0); the
        subscripts of a read with constant ``c`` are ``Σ coeffs·x + digits(c)`` (the last one
        also ``+ min(consts)``)."""
        rest, out = c - min(self.consts), []
        for s in self.strides:
            out.append(rest // s)
            rest -= out[-1] * s
        return out

    def digit_boxes(self) -> list[list[tuple[int, int]]]:
        """The digits of the constants as a few boxes (exactly their set): consecutive runs
        merged along each dimension, last first (a register block's 32 lanes over rows of 14
        columns: 2 boxes)."""
        boxes = [[(d, d) for d in self.digits(c)] for c in sorted(set(self.consts))]
        for dim in reversed(range(len(self.strides))):
            groups: dict[tuple, list[tuple[int, int]]] = {}
            for bx in boxes:
                groups.setdefault(tuple(bx[:dim] + bx[dim + 1:]), []).append(bx[dim])
            boxes = []
            for rest, spans in groups.items():
                spans.sort()
                merged = [list(spans[0])]
                for lo, hi in spans[1:]:
                    if lo <= merged[-1][1] + 1:
                        merged[-1][1] = max(merged[-1][1], hi)
                    else:
                        merged.append([lo, hi])
                boxes.extend([*rest[:dim], (lo, hi), *rest[dim:]] for lo, hi in merged)
        return boxes

    @property
    def spread(self) -> list[tuple[int, int]]:
        """Per dimension, the range of :meth:`digits` over the reads' constants."""
        ds = [self.digits(c) for c in self.consts]
        return [(min(d[i] for d in ds), max(d[i] for d in ds)) for i in range(len(self.strides))]

    @property
    def linear(self) -> dict[Key, int]:
        """The reads' flat offset without its constant: ``{loop: coefficient}``."""
        out: dict[Key, int] = {}
        for s, co in zip(self.strides, self.coeffs):
            for k, c in co.items():
                out[k] = out.get(k, 0) + s * c
        return {k: c for k, c in out.items() if c}

    @property
    def pitches(self) -> list[int]:
        return [math.prod(self.widths[d + 1:]) for d in range(len(self.widths))]


@dataclass
class SharedPlan:
    """Promotion of one nest: reduction loop ``loop`` strip-mined by ``tile``, arrays copied per tile."""

    loop: Key
    name: str
    lo: int
    hi: int
    tile: int
    kinds: dict[Key, str]  # "grid" | "reduction" | "fixed" | "inner" for every loop of a promoted read
    extents: dict[Key, tuple[int, int]]
    arrays: list[PromotedArray]

    @property
    def tiles(self) -> int:
        return -(-(self.hi - self.lo) // self.tile)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def array(self, root: int) -> PromotedArray | None:
        return next((a for a in self.arrays if a.root == root), None)

    def describe(self) -> dict:
        return {"loop": self.name, "tile": self.tile, "bytes": self.nbytes,
                "arrays": [{"name": a.name or f"arg{a.root}", "box": a.widths} for a in self.arrays]}


# -- choosing the reduction loop and the arrays ----------------------------------------------------

def reduction_loop(rec: NestRecord, m: NestMapping) -> Key | None:
    """The first loop below the outermost grid loop that stays a loop in the thread: in the band
    (a GEMM's ``k`` between ``i`` and ``j``), else the single child loop of the band's last loop
    (a convolution's ``c`` below its block loops)."""
    if not m.axes or not m.band:
        return None
    first = min(m.band.index(k) for k in m.axes)
    for k in m.band[first + 1:]:
        if k not in m.axes:
            return k
    children = rec.loops[m.band[-1]].children
    return children[0] if len(children) == 1 else None


def _inside(key: Key, r: Key) -> bool:
    return key[:len(r)] == r


def _kind(key: Key, r: Key, m: NestMapping) -> str:
    if key in m.axes:
        return "grid"
    if key == r:
        return "reduction"
    return "fixed" if _inside(r, key) else "inner"


def delinearize(linear: dict[Key, int], strides: list[int]) -> list[dict[Key, int]]:
    """Split a flat offset's terms into subscripts: each coefficient to the outermost dimension
    whose stride divides it (any split is exact, ``Σ s_d·sub_d`` is the offset; this one makes
    the per-dimension intervals tight for row-major accesses)."""
    dims: list[dict[Key, int]] = [{} for _ in strides]
    for k, c in linear.items():
        d = next(d for d, s in enumerate(strides) if s and c % s == 0)
        dims[d][k] = c // strides[d]
    return dims


def _bounds(key: Key, kind: str, m: NestMapping, plan_lo: int, tile: int, extents: dict) -> tuple[dict, dict]:
    """Lowest and highest value of loop ``key`` over one block and one reduction tile (affine in Sym)."""
    lo, hi = extents[key]
    if kind == "grid":
        t = m.tiles[key]
        low = {("b", m.axes[key]): t, 1: lo}
        return low, {**low, 1: lo + t - 1}
    if kind == "reduction":
        low = {("q",): tile, 1: plan_lo}
        return low, {**low, 1: plan_lo + tile - 1}
    if kind == "fixed":
        return {("f", key): 1}, {("f", key): 1}
    return {1: lo}, {1: hi - 1}


def _affine_add(a: dict, c: dict, s: int = 1) -> dict:
    out = dict(a)
    for k, v in c.items():
        out[k] = out.get(k, 0) + s * v
    return out


def size_box(arr: PromotedArray, plan: SharedPlan, m: NestMapping) -> None:
    """Fill ``arr.origin`` and ``arr.widths`` for ``plan.tile``."""
    arr.origin, arr.widths = [], []
    for d, (co, (dlo, dhi)) in enumerate(zip(arr.coeffs, arr.spread)):
        origin: dict = {1: dlo}
        width = 1 + dhi - dlo
        for k, c in co.items():
            low, high = _bounds(k, plan.kinds[k], m, plan.lo, plan.tile, plan.extents)
            origin = _affine_add(origin, low if c > 0 else high, c)
            width += abs(c) * (high.get(1, 0) - low.get(1, 0))
        if d == len(arr.coeffs) - 1:
            origin = _affine_add(origin, {1: min(arr.consts)})
        arr.origin.append(origin)
        arr.widths.append(width)


def plan_shared(rec: NestRecord, m: NestMapping, shapes: list[tuple[int, ...]], dtypes: list[str],
                budget: int = SHARED_BYTES, names: list[str] | None = None) -> tuple[SharedPlan | None, str]:
    """The promotion of nest ``rec`` under mapping ``m`` (``shapes``/``dtypes`` of the op's
    buffer arguments), or None and why not."""
    if rec.opaque or not m.axes:
        return None, "no grid mapping"
    if rec.branches:
        return None, "the nest branches (a barrier needs every thread of the block)"
    r = reduction_loop(rec, m)
    if r is None:
        return None, "no loop stays in the thread below the grid loops"
    written = {a.root for a in rec.accesses if a.kind == "write"}
    reads: dict[int, list[AccessRecord]] = {}
    for a in rec.accesses:
        if a.kind == "read" and r in a.loops and a.root not in written:
            reads.setdefault(a.root, []).append(a)
    lp = rec.loops[r]
    extents = {k: (rec.loops[k].lo, rec.loops[k].hi) for k in rec.loops}
    arrays: list[PromotedArray] = []
    kinds: dict[Key, str] = {}
    for root, accs in sorted(reads.items()):
        if dtypes[root] != "float32" or any(a.offset is None for a in accs):
            continue
        lin = {k: c for k, c in accs[0].offset.items() if k != 1 and c}
        if any({k: c for k, c in a.offset.items() if k != 1 and c} != lin for a in accs):
            continue
        shape = shapes[root] or (1,)
        strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
        arr = PromotedArray(root, math.prod(shape), strides, delinearize(lin, strides),
                            sorted({a.offset.get(1, 0) for a in accs}), name=names[root] if names else "")
        for k in lin:
            kinds[k] = _kind(k, r, m)
        kinds[r] = "reduction"
        arrays.append(arr)
    if not arrays:
        return None, "no read-only float array is read inside the reduction loop"
    kinds.update({k: "grid" for k in m.axes})
    plan = SharedPlan(r, lp.name, lp.lo, lp.hi, 1, kinds, extents, [])
    reused = []
    for arr in arrays:
        plan.arrays = [arr]
        size_box(arr, plan, m)
        if every_element_shared(plan, m, arr):
            reused.append(arr)
    if not reused:
        return None, "no element of an input tile is read by two threads of a block"
    while reused:
        for tk in sorted({min(t, lp.hi - lp.lo) for t in TK_CHOICES}, reverse=True):
            plan.tile, plan.arrays = tk, reused
            for arr in reused:
                size_box(arr, plan, m)
            if plan.nbytes <= budget:
                return plan, ""
        plan.tile = 1
        for arr in reused:
            size_box(arr, plan, m)
        reused = sorted(reused, key=lambda a: a.nbytes)[:-1]
    return None, f"the input tiles do not fit {budget} bytes of shared memory"


# -- isl: the relations of one block's reads and of its copies --------------------------------------

def _names(plan: SharedPlan, m: NestMapping) -> tuple[list[str], dict, list[str]]:
    """(parameter dims, Sym -> isl name, constraints on the parameters) of one tile."""
    params, sym, cons = [], {}, []
    grid = m.grid
    for a in sorted({m.axes[k] for k in plan.kinds if plan.kinds[k] == "grid"}):
        params.append(f"b{AXES[a]}")
        sym[("b", a)] = f"b{AXES[a]}"
        cons.append(f"0 <= b{AXES[a]} < {grid[a]}")
    params.append("q")
    sym[("q",)] = "q"
    cons.append(f"0 <= q < {plan.tiles}")
    for j, k in enumerate(sorted(k for k, v in plan.kinds.items() if v == "fixed")):
        params.append(f"f{j}")
        sym[("f", k)] = f"f{j}"
        lo, hi = plan.extents[k]
        cons.append(f"{lo} <= f{j} < {hi}")
    return params, sym, cons


def _form(aff: dict, sym: dict) -> str:
    terms = [f"{v}*{sym[k]}" for k, v in aff.items() if k != 1 and v]
    return " + ".join([*terms, str(aff.get(1, 0))])


def _read_constraints(plan: SharedPlan, m: NestMapping, sym: dict) -> tuple[list[str], list[str], dict[Key, str]]:
    """(thread dims, constraints, loop -> isl name): the loop counters of one block and one tile,
    inside the nest's domain."""
    threads = [f"t{AXES[a]}" for a in range(3)]
    block = m.block
    cons = [f"0 <= t{AXES[a]} < {block[a]}" for a in range(3)]
    var = {}
    for j, (k, kind) in enumerate(sorted(plan.kinds.items())):
        x = var[k] = f"x{j}"
        lo, hi = plan.extents[k]
        if kind == "grid":
            a = AXES[m.axes[k]]
            cons.append(f"{x} = {lo} + {m.tiles[k]}*b{a} + t{a} and {x} < {hi}")
        elif kind == "reduction":
            cons.append(f"{lo} + {plan.tile}*q <= {x} < {lo} + {plan.tile}*q + {plan.tile} and {x} < {hi}")
        elif kind == "fixed":
            cons.append(f"{x} = {sym[('f', k)]}")
        else:
            cons.append(f"{lo} <= {x} < {hi}")
    return threads, cons, var


def _subscripts(arr: PromotedArray, var: dict[Key, str]) -> tuple[list[str], list[str], list[str]]:
    """(subscript expressions, digit variables, their bounds) of the reads of ``arr``."""
    subs, cs = [], []
    last = len(arr.coeffs) - 1
    for d, (co, (dlo, dhi)) in enumerate(zip(arr.coeffs, arr.spread)):
        terms = [f"{c}*{var[k]}" for k, c in co.items()]
        if dhi > dlo:
            cs.append(d)
            terms.append(f"c{d}")
        elif dlo:
            terms.append(str(dlo))
        if d == last:
            terms.append(str(min(arr.consts)))
        subs.append(" + ".join(terms) or "0")
    boxes = {tuple(bx[d] for d in cs) for bx in arr.digit_boxes()}
    alts = [" and ".join(f"{lo} <= c{d} <= {hi}" for d, (lo, hi) in zip(cs, bx)) for bx in boxes]
    cons = [f"(({') or ('.join(alts)}))"] if cs else []
    return subs, [f"c{d}" for d in cs], cons


def footprint(plan: SharedPlan, m: NestMapping, arr: PromotedArray, per_thread: bool = False, flat: bool = True) -> isl.Map:
    """``{ [blockIdx, q, f] -> A[o] }``: the elements one block reads during one reduction tile
    (``per_thread``: ``{ [blockIdx, q, f, threadIdx] -> A[...] }``; ``flat=False``: as
    subscripts ``A[sub_0, ...]`` instead of the flat offset).  Reads that differ only in their
    constant term are covered by the box of their constants' digits (exact for the register
    blocks of a convolution: consecutive lanes and channels)."""
    params, sym, pcons = _names(plan, m)
    threads, cons, var = _read_constraints(plan, m, sym)
    subs, cs, ccons = _subscripts(arr, var)
    if flat:
        out = "o"
        cons.append("o = " + " + ".join(f"{s}*({e})" for s, e in zip(arr.strides, subs)))
    else:
        out = ", ".join(f"o{d}" for d in range(len(subs)))
        cons.extend(f"o{d} = {e}" for d, e in enumerate(subs))
    ex = list(var.values()) + cs + ([] if per_thread else threads)
    dom = params + (threads if per_thread else [])
    body = " and ".join([*pcons, *cons, *ccons])
    return isl.Map(f"{{ [{', '.join(dom)}] -> A{arr.root}[{out}] : exists ({', '.join(ex)} : {body}) }}")


def copied(plan: SharedPlan, m: NestMapping, arr: PromotedArray) -> isl.Map:
    """``{ [blockIdx, q, f] -> A[o] }``: the box the block copies (``o = Σ s_d (origin_d + e_d)``,
    ``0 ≤ e_d < W_d``), inside the buffer."""
    params, sym, pcons = _names(plan, m)
    e = [f"e{d}" for d in range(len(arr.widths))]
    flat = " + ".join(f"{s}*({_form(o, sym)} + {e[d]})" for d, (s, o) in enumerate(zip(arr.strides, arr.origin)))
    cons = [*pcons, *(f"0 <= {e[d]} < {w}" for d, w in enumerate(arr.widths)), f"o = {flat}", f"0 <= o < {arr.size}"]
    return isl.Map(f"{{ [{', '.join(params)}] -> A{arr.root}[o] : exists ({', '.join(e)} : {' and '.join(cons)}) }}")


def subscripts_in_box(plan: SharedPlan, m: NestMapping, arr: PromotedArray) -> bool:
    """Whether every read's shared-memory coordinates ``sub_d − origin_d`` lie in ``[0, W_d)``."""
    params, sym, _ = _names(plan, m)
    n = len(arr.widths)
    o, e = [f"o{d}" for d in range(n)], [f"e{d}" for d in range(n)]
    shift = " and ".join(f"e{d} = o{d} - ({_form(arr.origin[d], sym)})" for d in range(n))
    local = isl.Map(f"{{ [[{', '.join(params)}] -> A{arr.root}[{', '.join(o)}]] -> [{', '.join(e)}] : {shift} }}")
    box = isl.Set(f"{{ [{', '.join(e)}] : {' and '.join(f'0 <= e{d} < {w}' for d, w in enumerate(arr.widths))} }}")
    return footprint(plan, m, arr, flat=False).wrap().apply(local).is_subset(box)


def check_cover(plan: SharedPlan, m: NestMapping) -> None:
    """Raise AssertionError unless each promoted box holds every element its block reads."""
    for arr in plan.arrays:
        f, c = footprint(plan, m, arr), copied(plan, m, arr)
        if not f.is_subset(c):
            raise AssertionError(f"shared copy of arg{arr.root} misses elements: {f.subtract(c)}")
        if not subscripts_in_box(plan, m, arr):
            raise AssertionError(f"a read of arg{arr.root} falls outside its shared box {arr.widths}")


def every_element_shared(plan: SharedPlan, m: NestMapping, arr: PromotedArray) -> bool:
    """Whether, in the first block and tile, each element read is read by at least two threads."""
    full = footprint(plan, m, arr, per_thread=True, flat=False)
    params, _, _ = _names(plan, m)
    first = []
    for p in params:
        if p.startswith("f"):
            k = sorted(k for k, v in plan.kinds.items() if v == "fixed")[int(p[1:])]
            first.append(f"{p} = {plan.extents[k][0]}")
        else:
            first.append(f"{p} = 0")
    dom = [*params, "tx", "ty", "tz"]
    fix = isl.Set(f"{{ [{', '.join(dom)}] : {' and '.join(first)} }}")
    rel = full.intersect_domain(fix).project_out(isl.dim_type.in_, 0, len(params)).coalesce()
    readers = rel.reverse()  # A[o] -> thread
    order = isl.Map.lex_lt(rel.get_space().domain())
    shared = readers.apply_range(order).intersect(readers).domain()
    return not rel.range().is_empty() and rel.range().is_subset(shared)


# -- mapping with promotion ----------------------------------------------------------------------

def map_nest_shared(rec: NestRecord, sizes: list[int], shapes: list[tuple[int, ...]], dtypes: list[str],
                    budget: int = SHARED_BYTES, names: list[str] | None = None) -> NestMapping:
    """:func:`~polyml.gpu.mapping.map_nest` with square-ish blocks and a promotion plan where one
    applies (``m.shared``); otherwise the plain mapping, with the reason in ``m.shared_note``."""
    m = map_nest(rec, sizes, max_x=SHARED_MAX_X)
    plan, why = plan_shared(rec, m, shapes, dtypes, budget, names)
    if plan is not None:
        m.shared = plan
        return m
    plain = map_nest(rec, sizes)
    plain.shared_note = why
    return plain


__all__ = ["SHARED_BYTES", "PromotedArray", "SharedPlan", "check_cover", "copied", "delinearize", "every_element_shared",
           "footprint", "map_nest_shared", "plan_shared", "reduction_loop", "size_box", "subscripts_in_box"]
