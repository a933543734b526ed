"""A statement's iteration domain as a picture: integer points, tiles, execution order, dependences.

Polyhedral view.  A statement ``S`` has the domain ``D_S = { S[i0, …, i(n-1)] : … }`` (with
parameters), a schedule ``θ_S : D_S → ℤ^m`` (instances run in the lexicographic order of
``θ_S``) and dependences ``R ⊆ D × D`` (flow ``raw``, anti ``war``, output ``waw``; computed
on the *original* schedule by :mod:`polyml.scop.dependences`).  A picture shows the 2-D slice

    P = { S[i] ∈ D_S : i_k = c_k for every k not plotted, p = c_p for every parameter,
                      lo_a ≤ i_a < lo_a + W_a for the two plotted dimensions a }

with every integer point of ``P`` (``isl_set_count_val(P)`` marks), each coloured by its
*tile* — the values of the schedule dimensions that contain an integer division
(``⌊i/32⌋``, as the ``tile`` pass writes them); a schedule without one is a single tile — and
joined by a path in execution order (rank of ``θ(x)`` among ``θ(P)``, shaded light → dark;
small slices number their points), and one arrow per dependence pair ``(x, y) ∈ R ∩ (P × P)``.
Dependences that leave the slice (to other values of the fixed dimensions, or to other
statements) are not drawn: the picture says so.  With a transformed schedule (``--after``)
the original and the new schedule are drawn side by side over the same points and
dependences: an arrow whose source is visited after its target in the new order is illegal
(the legality check refuses such schedules before they are drawn).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import islpy as isl

from polyml.errors import PolymlError
from polyml.scop import jscop as J
from polyml.scop.dependences import DESCRIPTION, KINDS, Dependences

#: arrow style of each dependence kind: colour, line style, arc (pairs of two kinds stay apart)
DEP_STYLE = {"raw": ("#222222", "solid", 0.25), "war": ("#d95f02", "dashed", -0.25), "waw": ("#7570b3", "dotted", 0.45)}
NUMBER_POINTS_UP_TO = 64  # slices with at most this many points get their execution rank written on each
ORDER_SHADES = 16  # the execution path is drawn in this many shades


@dataclass(frozen=True)
class SliceSpec:
    """Which 2-D slice to draw: the plotted dimensions (names as in the domain, default the
    innermost pair), values for the other dimensions and the parameters (default: the smallest
    in the domain), and at most ``window`` values of each plotted dimension from its smallest."""

    dims: tuple[str, ...] = ()
    fix: Mapping[str, int] = field(default_factory=dict)
    window: tuple[int, int] = (32, 32)


@dataclass
class Panel:
    """One schedule's view of the slice."""

    title: str
    schedule: str
    rank: list[int]  # execution rank of each point (0 first)
    tile: list[int]  # tile index of each point, tiles numbered in execution order
    tile_dims: list[int]  # the schedule dimensions with integer divisions

    @property
    def n_tiles(self) -> int:
        return len(set(self.tile))


@dataclass
class DomainSlice:
    """The data of one picture: the slice's points, its dependence pairs, one panel per schedule."""

    statement: str
    op: str
    plotted: tuple[str, ...]  # domain dimension names, outer first
    fixed: dict[str, int]  # the other dimensions and the parameters
    slice_set: isl.Set
    points: list[tuple[int, ...]]  # full domain coordinates
    deps: list[tuple[str, int, int]]  # (kind, source point index, target point index)
    panels: list[Panel]
    other_deps: int = 0  # dependence pairs with one end in the slice and the other outside it
    window: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)  # see slice_of

    def xy(self, k: int) -> tuple[int, int]:
        """Plot coordinates of point ``k``: x the inner plotted dimension, y the outer one (0 for a 1-D domain)."""
        idx = self._plotted_index()
        p = self.points[k]
        return (p[idx[-1]], p[idx[0]] if len(idx) > 1 else 0)

    def _plotted_index(self) -> list[int]:
        names = _dim_names(self.slice_set)
        return [names.index(n) for n in self.plotted]


def _dim_names(s: isl.Set) -> list[str]:
    return [s.get_dim_name(isl.dim_type.set, k) or f"i{k}" for k in range(s.dim(isl.dim_type.set))]


def _param_names(s: isl.Set) -> list[str]:
    return [s.get_dim_name(isl.dim_type.param, k) or f"p{k}" for k in range(s.dim(isl.dim_type.param))]


def _value(v: isl.Val) -> int:
    return int(v.to_python())


def _smallest(s: isl.Set, k: int, where: str) -> int:
    """The smallest value of set dimension ``k`` in ``s`` (whose parameters are fixed)."""
    n = s.dim(isl.dim_type.set)
    one = s.project_out(isl.dim_type.set, k + 1, n - k - 1).project_out(isl.dim_type.set, 0, k)
    one = one.project_out(isl.dim_type.param, 0, one.dim(isl.dim_type.param))
    low = one.lexmin()
    if low.is_empty():
        raise PolymlError(f"{where}: the slice is empty (choose other --plot-fix values)")
    return _value(low.sample_point().get_coordinate_val(isl.dim_type.set, 0))


def _smallest_params(s: isl.Set) -> dict[str, int]:
    """Parameter values for a parametric domain: the lexicographically smallest that leave it non-empty."""
    names = _param_names(s)
    if not names:
        return {}
    params = s.params()
    as_set = isl.Set.from_params(params).move_dims(isl.dim_type.set, 0, isl.dim_type.param, 0, len(names))
    natural = isl.Set(f"{{ [{', '.join(f'p{i}' for i in range(len(names)))}] : "
                      f"{' and '.join(f'p{i} >= 0' for i in range(len(names)))} }}")
    # parameters are mostly sizes and bounds (an outlined loop's [lb, ub)): the smallest
    # non-negative values first, then any smallest, then any values that leave the domain non-empty
    for candidate in (as_set.intersect(natural), as_set):
        try:
            low = candidate.lexmin()
        except isl.Error:  # unbounded below
            continue
        if not low.is_empty():
            pt = low.sample_point()
            return {n: _value(pt.get_coordinate_val(isl.dim_type.set, i)) for i, n in enumerate(names)}
    pt = as_set.sample_point()
    if pt.is_void():
        return {}
    return {n: _value(pt.get_coordinate_val(isl.dim_type.set, i)) for i, n in enumerate(names)}


def _largest(s: isl.Set, k: int) -> int:
    n = s.dim(isl.dim_type.set)
    one = s.project_out(isl.dim_type.set, k + 1, n - k - 1).project_out(isl.dim_type.set, 0, k)
    one = one.project_out(isl.dim_type.param, 0, one.dim(isl.dim_type.param))
    return _value(one.lexmax().sample_point().get_coordinate_val(isl.dim_type.set, 0))


def slice_of(domain: isl.Set, spec: SliceSpec, where: str,
             window: dict[str, tuple[int, int, int, int]] | None = None) -> tuple[isl.Set, tuple[str, ...], dict[str, int]]:
    """The plotted slice ``P`` of ``domain`` (see the module docstring), the plotted dimension
    names and the values the others were fixed at; ``window`` receives, per plotted dimension,
    the drawn range and the range the fixed values leave (lo, hi, all_lo, all_hi)."""
    names = _dim_names(domain)
    pnames = _param_names(domain)
    unknown = [k for k in spec.fix if k not in names and k not in pnames]
    if unknown:
        raise PolymlError(f"{where}: --plot-fix names {unknown}, not dimensions {names} or parameters {pnames}")
    if spec.dims:
        bad = [d for d in spec.dims if d not in names]
        if bad or len(spec.dims) not in (1, 2) or len(set(spec.dims)) != len(spec.dims):
            raise PolymlError(f"{where}: --plot-dims {','.join(spec.dims)}: give one or two of the dimensions {names}")
        plotted = tuple(sorted(spec.dims, key=names.index))
    else:
        plotted = tuple(names[-2:])
    if not plotted:
        raise PolymlError(f"{where}: a statement without loops has no domain to draw")
    s = domain
    fixed: dict[str, int] = {}
    given_params = {n: int(spec.fix[n]) for n in pnames if n in spec.fix}
    for n, v in given_params.items():
        s = s.fix_val(isl.dim_type.param, pnames.index(n), isl.Val.int_from_si(s.get_ctx(), v))
    for n, v in _smallest_params(s).items():
        if n not in given_params:
            s = s.fix_val(isl.dim_type.param, pnames.index(n), isl.Val.int_from_si(s.get_ctx(), v))
        fixed[n] = given_params.get(n, v)
    for k, n in enumerate(names):
        if n in plotted:
            continue
        v = int(spec.fix[n]) if n in spec.fix else _smallest(s, k, where)
        s = s.fix_val(isl.dim_type.set, k, isl.Val.int_from_si(s.get_ctx(), v))
        fixed[n] = v
    sizes = spec.window if len(plotted) == 2 else spec.window[1:]  # HxW: rows (outer), columns (inner)
    for n, w in zip(plotted, sizes):
        if w < 1:
            raise PolymlError(f"{where}: --plot-window sizes must be positive")
        k = names.index(n)
        lo = _smallest(s, k, where)
        if window is not None:
            window[n] = (lo, lo + w - 1, lo, _largest(s, k) if s.dim_has_upper_bound(isl.dim_type.set, k) else lo + w - 1)
        s = s.lower_bound_val(isl.dim_type.set, k, isl.Val.int_from_si(s.get_ctx(), lo))
        s = s.upper_bound_val(isl.dim_type.set, k, isl.Val.int_from_si(s.get_ctx(), lo + w - 1))
    if s.is_empty():
        raise PolymlError(f"{where}: the slice is empty (choose other --plot-fix values)")
    return s.coalesce(), plotted, fixed


def _points(s: isl.Set) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    n = s.dim(isl.dim_type.set)
    s.foreach_point(lambda p: out.append(tuple(_value(p.get_coordinate_val(isl.dim_type.set, k)) for k in range(n))))
    return sorted(out)


def tile_dims(schedule: isl.Map) -> list[int]:
    """The schedule dimensions that contain an integer division (a tile loop such as ``⌊i/32⌋``)."""
    found: set[int] = set()

    def piece(_: isl.Set, ma: isl.MultiAff) -> None:
        for k in range(ma.dim(isl.dim_type.out)):
            if ma.get_at(k).dim(isl.dim_type.div) > 0:
                found.add(k)

    try:
        isl.PwMultiAff.from_map(schedule).foreach_piece(piece)
    except isl.Error:
        return []
    return sorted(found)


def _times(schedule: isl.Map, s: isl.Set) -> dict[tuple[int, ...], tuple[int, ...]]:
    """``{point: θ(point)}`` over the slice."""
    m = schedule.intersect_domain(s)
    n_in, n_out = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
    out: dict[tuple[int, ...], tuple[int, ...]] = {}

    def visit(p: isl.Point) -> None:
        c = [_value(p.get_coordinate_val(isl.dim_type.set, k)) for k in range(n_in + n_out)]
        out[tuple(c[:n_in])] = tuple(c[n_in:])

    m.wrap().foreach_point(visit)
    return out


def panel(stmt: Mapping, s: isl.Set, points: Sequence[tuple[int, ...]], title: str) -> Panel:
    """Execution ranks and tiles of the slice's points under ``stmt``'s schedule."""
    sched = J.schedule_map(stmt)
    times = _times(sched, s)
    missing = [p for p in points if p not in times]
    if missing:
        raise PolymlError(f"statement {stmt['name']}: the schedule does not cover point {list(missing[0])}")
    order = sorted(range(len(points)), key=lambda k: times[points[k]])
    rank = [0] * len(points)
    for r, k in enumerate(order):
        rank[k] = r
    tdims = tile_dims(sched)
    tile_ids: dict[tuple[int, ...], int] = {}
    for k in order:
        tile_ids.setdefault(tuple(times[points[k]][d] for d in tdims), len(tile_ids))
    tile = [tile_ids[tuple(times[p][d] for d in tdims)] for p in points]
    return Panel(title, J.map_str(sched), rank, tile, tdims)


def _pairs(rel: isl.UnionMap, s: isl.Set) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    us = isl.UnionSet.from_set(s)
    inside = rel.intersect_domain(us).intersect_range(us)
    n = s.dim(isl.dim_type.set)
    out: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def visit(p: isl.Point) -> None:
        c = [_value(p.get_coordinate_val(isl.dim_type.set, k)) for k in range(2 * n)]
        out.append((tuple(c[:n]), tuple(c[n:])))

    inside.wrap().foreach_point(visit)
    return sorted(out)


def _params_fixed(rel: isl.UnionMap, s: isl.Set) -> isl.UnionMap:
    """``rel`` with the slice's parameter values (so that pairs can be enumerated)."""
    ctx = s.params()
    return rel.intersect_params(ctx) if ctx.dim(isl.dim_type.param) else rel


def domain_slice(stmt: Mapping, deps: Dependences, spec: SliceSpec, op: str = "",
                 transformed: Mapping | None = None, after: str = "") -> DomainSlice:
    """The picture data of one statement: slice, points, dependence pairs, the original
    schedule's panel and, with ``transformed`` (the same statement after passes), its panel."""
    where = f"statement {stmt['name']}"
    window: dict[str, tuple[int, int, int, int]] = {}
    s, plotted, fixed = slice_of(J.domain(stmt), spec, where, window)
    points = _points(s)
    index = {p: k for k, p in enumerate(points)}
    pairs: list[tuple[str, int, int]] = []
    leaving = 0
    us = isl.UnionSet.from_set(s)
    for kind, rel in deps.items():
        rel = _params_fixed(rel, s)
        for a, b in _pairs(rel, s):
            pairs.append((kind, index[a], index[b]))
        touching = rel.intersect_domain(us).union(rel.intersect_range(us))
        leaving += _count_union(touching) - _count_union(rel.intersect_domain(us).intersect_range(us))
    panels = [panel(stmt, s, points, "original schedule")]
    if transformed is not None:
        panels.append(panel(transformed, s, points, f"after {after}" if after else "transformed schedule"))
    return DomainSlice(stmt["name"], op, plotted, fixed, s, points, pairs, panels, leaving, window)


def _count_union(u: isl.UnionMap) -> int:
    """Pairs in a union map (bounded: parameters fixed, one side in a bounded slice)."""
    total = 0

    def add(m: isl.Map) -> None:
        nonlocal total
        total += _value(m.wrap().count_val())

    u.foreach_map(add)
    return total


# -- drawing ------------------------------------------------------------------------------------

def tile_colours(n: int) -> list[str]:
    """``n`` distinct colours, neighbours contrasting: tab10, then tab10's light shades, then
    golden-angle hues (distinct as the hex the SVG writes)."""
    import matplotlib.colors as mc
    from matplotlib import colormaps

    tab20 = colormaps["tab20"].colors
    base = [mc.to_hex(tab20[2 * i]) for i in range(10)] + [mc.to_hex(tab20[2 * i + 1]) for i in range(10)]
    out: list[str] = []
    seen: set[str] = set()
    k = 0
    while len(out) < n:
        if k < len(base):
            c = base[k]
        else:
            j = k - len(base)
            c = mc.to_hex(mc.hsv_to_rgb(((j * 0.618034) % 1.0, 0.45 + 0.35 * (j % 2), 0.95 - 0.25 * ((j // 2) % 2))))
        k += 1
        if c not in seen:
            seen.add(c)
            out.append(c)
    return out


def _shorten(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False)) or text


def draw(data: DomainSlice, path: str | Path, fmt: str | None = None) -> Path:
    """Draw ``data`` into ``path`` (SVG or PNG).  SVG ids: ``p{panel}-tile-{k}`` (the points
    of tile k, one mark per point), ``p{panel}-order`` (the execution path),
    ``p{panel}-dep-{kind}-{k}`` (one arrow per dependence pair)."""
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch
    from matplotlib.ticker import MaxNLocator

    from polyml.plot import _extra

    plt = _extra.pyplot("polyml scops --plot")
    xs = [data.xy(k)[0] for k in range(len(data.points))]
    ys = [data.xy(k)[1] for k in range(len(data.points))]
    xspan, yspan = max(xs) - min(xs) + 1.6, max(ys) - min(ys) + 1.6
    numbered = len(data.points) <= NUMBER_POINTS_UP_TO
    side = 5.6  # inches of the longer side of a panel
    pw, ph = (side, max(side * yspan / xspan, 1.4)) if yspan <= xspan else (max(side * xspan / yspan, 2.8), side)
    fig_w = (pw + 0.9) * len(data.panels) + 0.3
    fixed = ", ".join(f"{k}={v}" for k, v in data.fixed.items()) or "nothing"
    head = f"{data.statement}" + (f"  (op {data.op})" if data.op and data.op not in data.statement else "")
    cut = [f"{n} {lo}–{min(hi, end)} of {all_lo}–{end}" for n, (lo, hi, all_lo, end) in data.window.items() if hi < end]
    note = _shorten(f"{len(data.points)} points; fixed: {fixed}" + (f"; window: {', '.join(cut)}" if cut else "")
                    + (f"; {data.other_deps} dependence pairs with one end outside the slice (not drawn)"
                       if data.other_deps else ""), max(40, int(fig_w * 13)))
    schedules = [_shorten(pan.schedule, max(28, int(pw * 12.5))) for pan in data.panels]
    # inches above the axes: the suptitle's lines, the panel titles' lines, the x label and ticks on top
    top = 0.2 + 0.19 * (2 + note.count("\n")) + 0.15 * (2 + max(t.count("\n") for t in schedules)) + 0.75
    bottom = 0.7  # the legend
    fig_h = ph + top + bottom
    fig, axes = plt.subplots(1, len(data.panels), figsize=(fig_w, fig_h), squeeze=False)
    pitch = min(pw / xspan, ph / yspan) * 72  # points between neighbours
    size = min(pitch * (0.62 if numbered else 0.5), 18.0) ** 2
    counts = {k: sum(1 for d in data.deps if d[0] == k) for k in KINDS}
    for pi, (ax, pan) in enumerate(zip(axes[0], data.panels)):
        colours = tile_colours(pan.n_tiles)
        for t in range(pan.n_tiles):
            ks = [k for k in range(len(data.points)) if pan.tile[k] == t]
            sc = ax.scatter([xs[k] for k in ks], [ys[k] for k in ks], s=size, c=colours[t], edgecolors="none", zorder=3)
            sc.set_gid(f"p{pi}-tile-{t}")
        order = sorted(range(len(data.points)), key=lambda k: pan.rank[k])
        # the path in execution order, in ORDER_SHADES pieces shaded light → dark (one SVG path each)
        pieces = [order[i * len(order) // ORDER_SHADES: (i + 1) * len(order) // ORDER_SHADES + 1] for i in range(ORDER_SHADES)]
        lines = [[(xs[k], ys[k]) for k in piece] for piece in pieces if len(piece) > 1]
        if lines:
            shade = [0.25 + 0.7 * i / max(1, len(lines) - 1) for i in range(len(lines))]
            lc = LineCollection(lines, cmap="Greys", norm=plt.Normalize(0, 1), linewidths=0.8, alpha=0.75, zorder=2)
            lc.set_array(shade)
            lc.set_gid(f"p{pi}-order")
            ax.add_collection(lc)
        if numbered:
            for k in range(len(data.points)):
                ax.text(xs[k], ys[k], str(pan.rank[k]), ha="center", va="center", fontsize=6, color="white",
                        fontweight="bold", zorder=4)
        kind_k = dict.fromkeys(KINDS, 0)
        for kind, a, b in data.deps:
            colour, style, rad = DEP_STYLE[kind]
            arrow = FancyArrowPatch((xs[a], ys[a]), (xs[b], ys[b]), arrowstyle="-|>", mutation_scale=7,
                                    connectionstyle=f"arc3,rad={rad}", color=colour, linestyle=style, linewidth=0.8,
                                    shrinkA=size ** 0.5 / 2 + 1.5, shrinkB=size ** 0.5 / 2 + 1.5, zorder=5)
            arrow.set_gid(f"p{pi}-dep-{kind}-{kind_k[kind]}")
            kind_k[kind] += 1
            ax.add_patch(arrow)
        pad = 0.8
        ax.set_xlim(min(xs) - pad, max(xs) + pad)
        ax.set_ylim(max(ys) + pad, min(ys) - pad)  # outer dimension downwards, as a matrix
        ax.set_aspect("equal")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
        ax.xaxis.tick_top()
        ax.xaxis.set_label_position("top")
        ax.set_xlabel(data.plotted[-1])
        ax.set_ylabel(data.plotted[0] if len(data.plotted) > 1 else "(1-D domain)")
        ax.tick_params(labelsize=8)
        tiles = f"{pan.n_tiles} tile{'s' if pan.n_tiles != 1 else ''}" + (
            f" (schedule dims {','.join(map(str, pan.tile_dims))} ⌊·⌋)" if pan.tile_dims else " (untiled)")
        ax.set_title(f"{pan.title}: {tiles}\n{schedules[pi]}", fontsize=8, loc="left", pad=22)
    handles = [Line2D([], [], color=DEP_STYLE[k][0], linestyle=DEP_STYLE[k][1], label=f"{DESCRIPTION[k]}: {counts[k]}")
               for k in KINDS]
    handles.append(Line2D([], [], color="0.45", label="execution order (light → dark)"))
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"{head}\n{note}", fontsize=9, y=1 - 0.1 / fig_h, va="top")
    fig.subplots_adjust(left=0.9 / fig.get_figwidth() * len(data.panels) / 1.5, right=0.98, top=1 - top / fig_h,
                        bottom=bottom / fig_h, wspace=0.25)
    return _extra.save(fig, path, fmt)


def file_stem(function: str, statement: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{function}.{statement}")


def plot_scop(jscop: Mapping, deps: Dependences, out_dir: str | Path, spec: SliceSpec, function: str,
              ops: Sequence[str] = (), transformed: Mapping | None = None, after: str = "",
              fmt: str = "svg", taken: set[str] | None = None) -> list[Path]:
    """One picture per statement of ``jscop`` (``ops``: each statement's graph op) into
    ``out_dir``; statements without loops, or without the dimensions ``spec.dims`` names, are skipped.  ``taken``: file names already written
    (another SCoP of the same function) get a numeric suffix."""
    out_dir = Path(out_dir)
    written: list[Path] = []
    taken = taken if taken is not None else set()
    for k, stmt in enumerate(jscop["statements"]):
        dom = J.domain(stmt)
        if dom.dim(isl.dim_type.set) == 0 or not set(spec.dims) <= set(_dim_names(dom)):
            continue  # no loops, or not the dimensions asked for
        stem = file_stem(function, stmt["name"])
        name, n = stem, 1
        while name in taken:
            n += 1
            name = f"{stem}.{n}"
        taken.add(name)
        data = domain_slice(stmt, deps, spec, ops[k] if k < len(ops) else "",
                            transformed["statements"][k] if transformed is not None else None, after)
        written.append(draw(data, out_dir / f"{name}.{fmt}", fmt))
    return written


def parse_fix(text: str) -> dict[str, int]:
    """``i0=3,n=64`` → ``{"i0": 3, "n": 64}``."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            sep = ""
        if not sep or not name.strip():
            raise PolymlError(f"--plot-fix {text!r}: expected NAME=INT[,NAME=INT...]")
    return out


def parse_window(text: str) -> tuple[int, int]:
    """``32x32`` (or one number for both) → (32, 32)."""
    parts = text.lower().replace(",", "x").split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) == 1:
        sizes = sizes * 2
    if len(sizes) != 2 or min(sizes) < 1:
        raise PolymlError(f"--plot-window {text!r}: expected HxW with positive sizes, e.g. 32x32")
    return sizes[0], sizes[1]
