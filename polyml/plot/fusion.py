"""The graph after fusion as a picture: fused nests as boxes around their ops, refused edges labelled.

Data: the graph as the frontend read it (before fusion) and the build's fusion report
(``manifest.json`` ``fusion``, what ``polyml build`` prints: ``groups``, ``blocked``,
``folded``).  Each fused nest (a group whose kind is not ``concat-in-place``) is one unit
drawn as a box listing its ops; every other op is a unit of its own; ops folded into a
convolution's weights belong to the convolution's unit.  Edges are the producer→consumer
edges of the graph between units; each refused candidate (a ``blocked`` entry) is one edge in
another style labelled with a short form of its reason (the full reason is the SVG title in
the DOT form); a concat input stored in place is an edge marked "in place".

Rendering: matplotlib always draws the SVG/PNG (layers = longest path from the graph's
inputs, top to bottom, long graphs wrapped into columns), so the extra stays pip-only and the
same command draws the same picture on every host.  :func:`to_dot` writes the same picture as
Graphviz DOT (``--emit fusion-dot``; clusters for nests) through the ``graphviz`` package,
for people who have Graphviz's ``dot`` to lay it out (``dot -Tsvg fusion.dot``).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polyml.graph import Graph

#: (pattern, short form) for the reasons fusion and the lowering give; first match wins
_SHORT: list[tuple[str, str]] = [
    (r"^attention not fused: (?:.*?)(?:the )?probabilities are not read", "attention: P not read by one MatMul"),
    (r"^attention not fused: .*is read by other nodes", "attention: scores read elsewhere"),
    (r"^attention not fused: .*combines several", "attention: several score tensors"),
    (r"^attention not fused: .*batch dims", "attention: batch dims differ"),
    (r"^attention not fused: ", "attention: dependence"),
    (r"^Conv\w* reads .* through a (\d+)-tap window .*sums over all its channels", "channel reduction ({1}-tap)"),
    (r"^\w+ reads .* through a (\d+)-tap window \(stride (\d+)", "{1}-tap window, stride {2}"),
    (r"^(\w+) reduces over whole", "{1} reduction"),
    (r"is needed elsewhere \((\d+) consumers, graph output\)", "graph output"),
    (r"is needed elsewhere \((\d+) consumers\): no prologue", "{1} consumers (no prologue)"),
    (r"is needed elsewhere \((\d+) consumers\)", "{1} consumers"),
    (r"^(\w+) has no fused form", "{1}: no fused form"),
    (r"no fused form for this pair", "no fused form"),
    (r"^dependence: ", "dependence violated"),
    (r"^loop domains differ", "broadcast read"),
    (r"^Concat only places its inputs", "reads the assembled Concat"),
    (r"^concat input .*: dims .* are not all 1", "concat copy: strided"),
    (r"^concat input .*: a graph input or constant", "concat copy: input/constant"),
    (r"^concat input .*: a graph output", "concat copy: graph output"),
    (r"^concat input .*: read by (\d+) Concats", "concat copy: {1} Concats"),
    (r"^concat input .*: a view", "concat copy: view"),
]


def short_reason(reason: str, width: int = 30) -> str:
    """A few words for an edge label from a full refusal reason."""
    for pattern, short in _SHORT:
        m = re.search(pattern, reason)
        if m:
            return short.format(*([m.group(0)] + list(m.groups())))
    first = re.split(r"[;:(]", reason, maxsplit=1)[0].strip()
    first = re.sub(r"'[^']*'", "·", first)
    return first if len(first) <= width else first[: width - 1].rstrip() + "…"


@dataclass
class Unit:
    """One box of the picture: a fused nest (``kind`` its fusion kind) or a single op."""

    key: str
    ops: list[str]  # "label (OpType)" lines
    #: "op", "tensor", or the nest's kind (epilogue, elementwise, pool-prologue, attention, conv-input-scale, depthwise-product)
    kind: str = "op"

    @property
    def is_nest(self) -> bool:
        return self.kind not in ("op", "tensor")


@dataclass
class FusionPicture:
    units: list[Unit]
    edges: list[tuple[int, int]] = field(default_factory=list)  # plain producer → consumer
    in_place: list[tuple[int, int]] = field(default_factory=list)  # concat inputs stored in place
    refused: list[tuple[int, int, str, str]] = field(default_factory=list)  # (producer, consumer, short, full)

    @property
    def nests(self) -> list[int]:
        return [i for i, u in enumerate(self.units) if u.is_nest]


def fusion_picture(graph: Graph, fusion: Mapping) -> FusionPicture:
    """The units and edges of the picture from the unfused ``graph`` and the fusion report."""
    op_type = {n.label: n.op_type for n in graph.nodes}
    units: list[Unit] = []
    unit_of: dict[str, int] = {}

    def line(label: str) -> str:
        return f"{label} ({op_type[label]})" if label in op_type else label

    for g in fusion.get("groups", []):
        if g.get("kind") == "concat-in-place":
            continue
        ops = list(dict.fromkeys(g["ops"]))
        unit_of.update({op: len(units) for op in ops})
        unit_of.setdefault(g["nest"], len(units))
        units.append(Unit(f"nest:{g['nest']}", [line(op) for op in ops], g.get("kind", "nest")))
    for n in graph.nodes:
        if n.label not in unit_of:
            unit_of[n.label] = len(units)
            units.append(Unit(n.label, [line(n.label)]))
    for f in fusion.get("folded", []):
        into = unit_of.get(f["into"])
        if into is not None and f["op"] in unit_of and unit_of[f["op"]] != into:
            old = unit_of[f["op"]]
            units[into].ops.append(f"{line(f['op'])} folded")
            unit_of[f["op"]] = into
            units[old].kind = "folded"

    def unit(label: str) -> int:
        if label not in unit_of:
            unit_of[label] = len(units)
            units.append(Unit(label, [label], "tensor"))
        return unit_of[label]

    pic = FusionPicture(units)
    special: set[tuple[int, int]] = set()
    for b in fusion.get("blocked", []):
        a, c = unit(b["producer"]), unit(b["consumer"])
        pic.refused.append((a, c, short_reason(b["reason"]), b["reason"]))
        special.add((a, c))
    for g in fusion.get("groups", []):
        if g.get("kind") == "concat-in-place" and len(g["ops"]) == 2:
            e = (unit(g["ops"][0]), unit(g["ops"][1]))
            if e not in special:
                pic.in_place.append(e)
                special.add(e)
    producer = {t: n.label for n in graph.nodes for t in n.outputs if t}
    seen: set[tuple[int, int]] = set()
    for n in graph.nodes:
        for t in n.inputs:
            if t in producer:
                e = (unit_of[producer[t]], unit_of[n.label])
                if e[0] != e[1] and e not in special and e not in seen:
                    seen.add(e)
                    pic.edges.append(e)
    # folded ops leave empty units behind: drop them, renumbering edges
    keep = [i for i, u in enumerate(units) if u.kind != "folded"]
    new = {old: k for k, old in enumerate(keep)}
    pic.units = [units[i] for i in keep]
    pic.edges = [(new[a], new[b]) for a, b in pic.edges if a in new and b in new]
    pic.in_place = [(new[a], new[b]) for a, b in pic.in_place if a in new and b in new]
    pic.refused = [(new[a], new[b], s, r) for a, b, s, r in pic.refused if a in new and b in new]
    return pic


# -- layout -------------------------------------------------------------------------------------

def layers(pic: FusionPicture) -> list[int]:
    """Each unit's layer: the longest path to it from a unit without predecessors."""
    preds: dict[int, list[int]] = {i: [] for i in range(len(pic.units))}
    for a, b in [*pic.edges, *pic.in_place, *((a, b) for a, b, _, _ in pic.refused)]:
        if a != b:
            preds[b].append(a)
    layer: dict[int, int] = {}

    def depth(i: int, stack: frozenset[int] = frozenset()) -> int:
        if i in layer:
            return layer[i]
        ps = [p for p in preds[i] if p not in stack]
        layer[i] = 0 if not ps else 1 + max(depth(p, stack | {i}) for p in ps)
        return layer[i]

    import sys

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(pic.units) + 100))
    return [depth(i) for i in range(len(pic.units))]


STYLE = {
    "edge": {"color": "0.35", "linestyle": "solid"},
    "in_place": {"color": "#1b9e77", "linestyle": "dashdot"},
    "refused": {"color": "#d62728", "linestyle": "dashed"},
}
NEST_FACE = {"epilogue": "#deebf7", "elementwise": "#e5f5e0", "pool-prologue": "#fee6ce", "attention": "#efedf5",
             "conv-input-scale": "#fde0ef"}
ROWS_PER_COLUMN = 14


def _all_edges(pic: FusionPicture) -> list[tuple[int, int]]:
    return [*pic.edges, *pic.in_place, *((a, b) for a, b, _, _ in pic.refused)]


def columns_of(pic: FusionPicture, lay: list[int], rows: int = ROWS_PER_COLUMN) -> list[int]:
    """The first layer of each column: a long graph wraps into columns of about ``rows``
    layers, broken after a layer with a single unit that no edge passes over (so one edge
    crosses to the next column)."""
    n_layers = max(lay, default=0) + 1
    if n_layers <= rows:
        return [0]
    per = -(-n_layers // -(-n_layers // rows))
    count = [0] * n_layers
    for li in lay:
        count[li] += 1
    spans = [(lay[a], lay[b]) for a, b in _all_edges(pic)]

    def clean(li: int) -> bool:  # a break after layer li
        return count[li] == 1 and not any(x <= li < y and not (x == li) for x, y in spans)

    starts = [0]
    while n_layers - starts[-1] > per + 2:
        s = starts[-1]
        want = s + per - 1
        options = [li for li in range(s + max(2, per // 2), min(n_layers - 2, s + per + 2) + 1) if clean(li)]
        cut = min(options, key=lambda li: abs(li - want)) if options else want
        starts.append(cut + 1)
    return starts


def draw(pic: FusionPicture, path: str | Path, fmt: str | None = None, title: str = "") -> Path:
    """Draw the picture.  SVG ids: ``nest-K`` (one box per fused nest), ``op-K`` (other ops),
    ``refused-K`` (one edge per refused candidate, its label ``refused-K-label``), ``edge-K``, ``inplace-K``."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    from matplotlib.path import Path as MPath

    from polyml.plot import _extra

    plt = _extra.pyplot("the fusion picture")
    lay = layers(pic)
    starts = columns_of(pic, lay)
    n_layers = max(lay, default=0) + 1
    bounds = [*starts, n_layers]
    rows = max(b - a for a, b in zip(bounds, bounds[1:]))

    def place(li: int) -> tuple[int, int]:
        col = max(k for k, s in enumerate(starts) if s <= li)
        return col, li - starts[col]

    by_layer: dict[int, list[int]] = {}
    for i, li in enumerate(lay):
        by_layer.setdefault(li, []).append(i)
    width_of = max((len(v) for v in by_layer.values()), default=1)
    box_w, box_gap, row_h = 2.3, 0.45, 1.15  # inches
    col_w = width_of * (box_w + box_gap) + 0.8
    pos: dict[int, tuple[float, float]] = {}
    heights: dict[int, float] = {}
    column: dict[int, int] = {}
    for li, members in by_layer.items():
        col, row = place(li)
        x0 = col * col_w + (col_w - len(members) * (box_w + box_gap)) / 2 + (box_w + box_gap) / 2
        for k, i in enumerate(sorted(members, key=lambda i: pic.units[i].key)):
            pos[i] = (x0 + k * (box_w + box_gap), -row * row_h)
            heights[i] = 0.2 + 0.16 * (len(pic.units[i].ops) + pic.units[i].is_nest)
            column[i] = col
    fig_w, fig_h = len(starts) * col_w + 0.4, rows * row_h + 1.2
    fig = plt.figure(figsize=(fig_w, fig_h))
    ax = fig.add_axes((0, 0, 1, 1 - 0.9 / fig_h))
    ax.set_xlim(0, fig_w)
    ax.set_ylim(-(rows - 0.5) * row_h - 0.1, 0.6)
    ax.set_axis_off()
    nest_k = op_k = 0
    for i, u in enumerate(pic.units):
        x, y = pos[i]
        h = heights[i]
        face = NEST_FACE.get(u.kind, "#f0f0f0") if u.is_nest else ("white" if u.kind == "op" else "#fafafa")
        box = FancyBboxPatch((x - box_w / 2, y - h / 2), box_w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                             facecolor=face, edgecolor="#08519c" if u.is_nest else "0.5",
                             linewidth=1.4 if u.is_nest else 0.7, linestyle="solid" if u.kind != "tensor" else "dotted")
        if u.is_nest:
            box.set_gid(f"nest-{nest_k}")
            nest_k += 1
        else:
            box.set_gid(f"op-{op_k}")
            op_k += 1
        ax.add_patch(box)
        text = "\n".join(textwrap.shorten(o, 34, placeholder="…") for o in u.ops)
        if u.is_nest:
            text = f"[{u.kind}]\n{text}"
        ax.text(x, y, text, ha="center", va="center", fontsize=7.5, linespacing=1.05)

    def label_at(x: float, y: float, text: str, colour: str, right: bool, gid: str) -> None:
        t = ax.text(x + (0.06 if right else -0.06), y, text, fontsize=6.5, color=colour, ha="left" if right else "right",
                va="center", zorder=6,
                bbox={"boxstyle": "round,pad=0.12", "facecolor": "white", "edgecolor": "none", "alpha": 0.85})
        t.set_gid(f"{gid}-label")

    def connect(a: int, b: int, style: dict, gid: str, label: str = "") -> None:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        start = (xa, ya - heights[a] / 2)
        end = (xb, yb + heights[b] / 2)
        common = {"arrowstyle": "-|>", "mutation_scale": 9, "linewidth": 1.0, "shrinkA": 1, "shrinkB": 1, **style}
        if column[b] != column[a]:  # to the next column: down, over the gutter, up, across, down
            gutter = (column[a] + 1) * col_w - 0.25
            top = 0.45
            verts = [start, (start[0], start[1] - 0.3), (gutter, start[1] - 0.3), (gutter, top), (end[0], top), end]
            arrow = FancyArrowPatch(path=MPath(verts, [MPath.MOVETO] + [MPath.LINETO] * 5), **common)
            if label:
                label_at(end[0], (top + end[1]) / 2, label, style["color"], True, gid)
        else:
            skip = lay[b] - lay[a] > 1  # passes over other layers: bow out around their boxes
            # the arc's middle lies 0.5·rad·|chord| off the chord: clear half a box and a margin
            chord = max(1e-6, ((end[0] - start[0]) ** 2 + (end[1] - start[1]) ** 2) ** 0.5)
            rad = min(0.9, 2 * (box_w / 2 + 0.25) / chord) if skip else 0.0
            arrow = FancyArrowPatch(start, end, connectionstyle=f"arc3,rad={rad}", **common)
            if label:
                dx, dy = end[0] - start[0], end[1] - start[1]
                mx, my = (start[0] + end[0]) / 2 + 0.5 * rad * dy, (start[1] + end[1]) / 2 - 0.5 * rad * dx
                label_at(mx, my, label, style["color"], dx >= 0 if not skip else rad * dy > 0, gid)
        arrow.set_gid(gid)
        ax.add_patch(arrow)

    for k, (a, b) in enumerate(pic.edges):
        connect(a, b, STYLE["edge"], f"edge-{k}")
    for k, (a, b) in enumerate(pic.in_place):
        connect(a, b, STYLE["in_place"], f"inplace-{k}", "in place")
    for k, (a, b, short, _) in enumerate(pic.refused):
        connect(a, b, STYLE["refused"], f"refused-{k}", short)
    handles = [Line2D([], [], label=f"fused nest ({len(pic.nests)})", color="#08519c", linewidth=3),
               Line2D([], [], label="data edge", **STYLE["edge"]),
               Line2D([], [], label=f"refused candidate ({len(pic.refused)}): short reason", **STYLE["refused"]),
               Line2D([], [], label=f"concat input stored in place ({len(pic.in_place)})", **STYLE["in_place"])]
    fig.legend(handles=handles, loc="upper center", ncol=2, fontsize=7, frameon=False, bbox_to_anchor=(0.5, 1.0))
    if title:
        fig.text(0.01, 1.0, title, fontsize=8, va="top", ha="left")
    return _extra.save(fig, path, fmt)


def to_dot(pic: FusionPicture, title: str = "") -> str:
    """The picture as Graphviz DOT text (clusters ``nest_K`` for nests, refused edges red and
    labelled, with the full reason as tooltip), through the ``graphviz`` package."""
    from polyml.plot import _extra

    gv = _extra.graphviz("--emit fusion-dot")
    dot = gv.Digraph("fusion", graph_attr={"rankdir": "TB", "fontsize": "10", "label": title, "labelloc": "t"},
                     node_attr={"shape": "box", "fontsize": "9", "style": "rounded"})
    node_of: dict[int, str] = {}
    nest_k = 0
    for i, u in enumerate(pic.units):
        if u.is_nest:
            with dot.subgraph(name=f"cluster_nest_{nest_k}") as c:
                c.attr(label=f"{u.kind}", id=f"nest-{nest_k}", color="#08519c", style="rounded,filled",
                       fillcolor=NEST_FACE.get(u.kind, "#f0f0f0"))
                for j, op in enumerate(u.ops):
                    c.node(f"u{i}_{j}", op, style="rounded,filled", fillcolor="white")
            node_of[i] = f"u{i}_0"
            nest_k += 1
            for j in range(1, len(u.ops)):
                dot.edge(f"u{i}_{j - 1}", f"u{i}_{j}", color="#08519c")
        else:
            dot.node(f"u{i}", u.ops[0], style="rounded,dotted" if u.kind == "tensor" else "rounded")
            node_of[i] = f"u{i}"

    def last(i: int) -> str:
        u = pic.units[i]
        return f"u{i}_{len(u.ops) - 1}" if u.is_nest else node_of[i]

    for k, (a, b) in enumerate(pic.edges):
        dot.edge(last(a), node_of[b], id=f"edge-{k}")
    for k, (a, b) in enumerate(pic.in_place):
        dot.edge(last(a), node_of[b], id=f"inplace-{k}", label="in place", color="#1b9e77", style="dashed")
    for k, (a, b, short, full) in enumerate(pic.refused):
        dot.edge(last(a), node_of[b], id=f"refused-{k}", label=short, tooltip=full, color="#d62728",
                 fontcolor="#d62728", style="dashed", fontsize="8")
    return dot.source


def write(graph: Graph, fusion: Mapping | None, path: str | Path, title: str = "") -> Path:
    """``fusion.svg``/``fusion.png`` (matplotlib) or ``fusion.dot`` (DOT text) for a build."""
    path = Path(path)
    pic = fusion_picture(graph, fusion or {"groups": [], "blocked": [], "folded": []})
    if path.suffix == ".dot":
        path.write_text(to_dot(pic, title))
        return path
    return draw(pic, path, title=title)
