"""Schedules as files: what a build's scheduled functions ran, written out and read back.

A GEMM-family schedule (MatMul, Gemm, a convolution through im2col, Winograd's products:
:func:`polyml.schedule.gemm.blis`) is made from a :class:`~polyml.schedule.gemm.Plan`.  Its
register tile is the intrinsic's (``fma.f32.<mr>x<nr>``, fixed by the target) and its thread
shares come from the thread count; its **cache tiles** ``mc``, ``kc``, ``nc`` — the
strip-mining sizes of the ``i``, ``k`` and ``j`` members, which also size the packed blocks —
are the schedule's free choice.  ``polyml build --emit schedules`` writes one file per
scheduled function into ``schedules/``::

    {"function", "node", "op_type", "family": "gemm",
     "tiles": {"mc", "kc", "nc"},         <- edit these
     "fixed": {...},                      <- the rest of the plan, for reading
     "trees": [isl block YAML, ...], "loops": [isl's AST as C, ...]}

``--import-schedules DIR`` reads them back: the build replaces those nodes' cache tiles (every
call that sizes buffers, lays out constants or emits code sees the same plan), builds the
schedule tree from them and checks it against the nest's dependences as always.  A file equal
to the build's own export changes nothing (the same ``model.so``, byte for byte).  ``trees``
and ``loops`` are derived from the tiles: an edited tree with unchanged tiles is refused rather
than ignored.  A depthwise schedule's tile is its unit (:func:`record_depthwise`): ``group``
planes, or ``band`` output rows of every plane.  Rows schedules have no editable tiles and are
written for reading only.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import islpy as isl

from polyml.codegen.identical import callers
from polyml.errors import PolymlError
from polyml.schedule import depthwise, gemm

FOLDER = "schedules"
#: the editable members of a GEMM plan
TILES = ("mc", "kc", "nc")
#: the members of ``fixed`` that say which product a file is for (checked on import)
SHAPE = ("m", "n", "k", "batch", "mr", "nr")
#: the same for a depthwise convolution
DEPTHWISE_SHAPE = ("channels", "size", "kernel", "strides", "dilations", "pads_begin", "out", "lanes")
#: families whose files carry editable tiles
EDITABLE = ("gemm", "depthwise")


def tiles_of(p: gemm.Plan) -> dict[str, int]:
    return {"mc": p.blk.mc, "kc": p.kc, "nc": p.nc}


def record(p: gemm.Plan) -> dict:
    """A GEMM plan as the file's ``tiles`` (editable) and ``fixed`` (the rest)."""
    fixed = dataclasses.asdict(p)
    blk = fixed.pop("blk")
    fixed = {"mr": blk["mr"], "nr": blk["nr"], "width": blk["width"],
             **{k: v for k, v in fixed.items() if k not in ("kc", "nc", "cost_model_tiles")}}
    chosen = {"cost_model_tiles": dict(p.cost_model_tiles)} if p.cost_model_tiles else {}
    return {"family": "gemm", "tiles": tiles_of(p), "fixed": fixed, **chosen}


def record_depthwise(p: depthwise.Plan) -> dict:
    """A depthwise plan as the file's ``tiles``: ``band`` (output rows of every plane per
    unit) where the units are row bands, else ``group`` (planes per unit); ``fixed``: the
    convolution and the thread count."""
    fixed = {**{k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(p.shape).items()},
             "lanes": p.lanes, "threads": p.threads}
    chosen = {"cost_model_tiles": dict(p.cost_model_tiles)} if p.cost_model_tiles else {}
    return {"family": "depthwise", "tiles": {"band": p.band} if p.band else {"group": p.group}, "fixed": fixed,
            **chosen}


def with_depthwise_tiles(p: depthwise.Plan, tiles: Mapping[str, int], where: str) -> depthwise.Plan:
    """``p`` with its unit size replaced: ``group`` planes per unit (1 to the channels) or, for
    row bands, ``band`` output rows (1 to the output's rows).  Each unit's input footprint is
    copied into its thread's slot, so the scratch grows with the group (sized from this plan).
    The other name is ignored: a row-band plan's one-thread variant (which sizes the scratch
    too) runs groups of planes."""
    name = "band" if p.band else "group"
    unknown = sorted(set(tiles) - {"band", "group"})
    if unknown:
        raise PolymlError(f"{where}: tiles {unknown} are not tiles of a depthwise schedule (editable: {name})")
    v = tiles.get(name, p.band or p.group)
    limit = p.shape.out[0] if p.band else p.shape.channels
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= limit:
        raise PolymlError(f"{where}: tile {name}={v!r} must be an integer from 1 to {limit}")
    if v == (p.band or p.group):
        return p
    before = (("band", p.band),) if p.band else (("group", p.group),)
    return dataclasses.replace(p, **{name: v}, cost_model_tiles=before)


def with_tiles(p: gemm.Plan, tiles: Mapping[str, int], where: str) -> gemm.Plan:
    """``p`` with its cache tiles replaced by ``tiles`` (a subset of :data:`TILES`).

    A tile must be a positive multiple of what the schedule's other bands assume: ``mc`` of
    the register tile's ``mr`` (the A panels are ``mr`` rows high), ``nc`` of ``nr``, ``kc`` of
    ``kc_step`` (a convolution's reduction blocks hold whole input channels, every tap of one)
    or all of ``k``.  Sizes past the problem are clamped as the cost model's are."""
    unknown = sorted(set(tiles) - set(TILES))
    if unknown:
        raise PolymlError(f"{where}: tiles {unknown} are not cache tiles of the GEMM schedule (editable: {', '.join(TILES)})")
    for name, v in tiles.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise PolymlError(f"{where}: tile {name}={v!r} must be a positive integer")
    mc, kc, nc = ({**tiles_of(p), **tiles}[t] for t in TILES)
    if mc % p.blk.mr:
        raise PolymlError(f"{where}: mc={mc} must be a multiple of the register tile's mr={p.blk.mr} "
                          f"(the intrinsic fma.f32.{p.blk.mr}x{p.blk.nr})")
    if nc % p.blk.nr:
        raise PolymlError(f"{where}: nc={nc} must be a multiple of the register tile's nr={p.blk.nr} "
                          f"(the intrinsic fma.f32.{p.blk.mr}x{p.blk.nr})")
    kc = min(kc, p.k)
    if kc % p.kc_step and kc != p.k:
        raise PolymlError(f"{where}: kc={kc} must be a multiple of {p.kc_step} (the reduction blocks hold whole "
                          f"input channels) or all of k={p.k}")
    if (mc, kc, nc) == (p.blk.mc, p.kc, p.nc):
        return p
    return dataclasses.replace(p, blk=dataclasses.replace(p.blk, mc=mc), kc=kc, nc=nc,
                               cost_model_tiles=tuple(tiles_of(p).items()))


def write(folder: Path, steps: Sequence) -> list[str]:  # noqa: ANN001 - codegen.lower.Step
    """One file per function with schedules into ``folder``; returns the names written.  A
    function that several ops call (their bodies were identical: :mod:`polyml.codegen.identical`)
    has one file, written from the first of them, listing them all in ``nodes``: its tiles,
    imported, apply to each."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = callers(steps)
    names = []
    for s in steps:
        if not s.schedules or s.shared:
            continue
        plans = [p for p in s.plans if p.get("family") in EDITABLE]
        entry = {"function": s.function, "node": s.node, "nodes": nodes[s.function], "op_type": s.op_type,
                 "family": plans[0]["family"] if plans else "other",
                 **({"tiles": plans[0]["tiles"], "fixed": plans[0]["fixed"]} if plans else {}),
                 "trees": list(s.schedules), "loops": [loops(t) for t in s.schedules]}
        name = f"{s.function}.json"
        (folder / name).write_text(json.dumps(entry, indent=1) + "\n")
        names.append(name)
    return names


def loops(tree_text: str) -> str:
    """The loops isl's AST generator makes of a tree (C text; the intrinsics as marks)."""
    tree = isl.Schedule(tree_text)
    build = isl.AstBuild.from_context(isl.Set.universe(tree.get_domain().get_space().params()))
    return build.node_from_schedule(tree).to_C_str()


@dataclasses.dataclass(frozen=True)
class Edit:
    """One imported file: the node whose schedule takes ``tiles``; ``trees``: the file's trees
    (compared with the build's where the tiles are unchanged)."""

    path: str
    node: str
    function: str
    tiles: tuple[tuple[str, int], ...]
    trees: tuple[str, ...]
    #: the product or convolution the file was written for (:data:`SHAPE` or
    #: :data:`DEPTHWISE_SHAPE` of its ``fixed``)
    shape: tuple[tuple[str, object], ...] = ()


def load(folder: str | Path) -> dict[str, Edit]:
    """The files of ``folder`` (from ``--emit schedules``), by node; files without ``tiles``
    (schedules that have none to edit) are read for the tree check only."""
    root = Path(folder)
    if not root.is_dir():
        raise PolymlError(f"--import-schedules {folder}: not a folder")
    edits: dict[str, Edit] = {}
    for path in sorted(root.glob("*.json")):
        try:
            entry = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise PolymlError(f"{path}: not a schedule file ({e})") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("node"), str):
            raise PolymlError(f"{path}: not a schedule file (expected an object with 'node', from --emit schedules)")
        tiles = entry.get("tiles", {})
        if not isinstance(tiles, dict):
            raise PolymlError(f"{path}: 'tiles' must be an object like {{\"mc\": 96, \"kc\": 256, \"nc\": 1024}}")
        trees = entry.get("trees", [])
        if not isinstance(trees, list) or not all(isinstance(t, str) for t in trees):
            raise PolymlError(f"{path}: 'trees' must be a list of schedule trees")
        nodes = entry.get("nodes", [entry["node"]])
        if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
            raise PolymlError(f"{path}: 'nodes' must be a list of node names")
        fixed = entry.get("fixed", {})
        keys = DEPTHWISE_SHAPE if entry.get("family") == "depthwise" else SHAPE
        shape = tuple((k, fixed[k]) for k in keys if isinstance(fixed, dict) and k in fixed)
        for node in dict.fromkeys([entry["node"], *nodes]):  # the function's callers take its tiles
            if node in edits:
                raise PolymlError(f"{path}: node {node!r} also has {edits[node].path}")
            edits[node] = Edit(str(path), node, str(entry.get("function", "")), tuple(sorted(tiles.items())),
                               tuple(trees), shape)
    if not edits:
        raise PolymlError(f"--import-schedules {folder}: no schedule files (*.json from --emit schedules) there")
    return edits


def check_applied(edits: Mapping[str, Edit], steps: Sequence) -> None:  # noqa: ANN001
    """Every imported file met a function of this build on the schedule it edits, and a file
    whose tiles are the build's own holds the build's trees (an edited tree is not imported)."""
    by_node = {s.node: s for s in steps if s.schedules}
    missing = [e for e in edits.values() if e.node not in by_node]
    if missing:
        raise PolymlError("--import-schedules: no function of this build is on a schedule for "
                          + "; ".join(f"{e.path} (node {e.node!r})" for e in missing))
    for e in edits.values():
        s = by_node[e.node]
        plans = [p for p in s.plans if p.get("family") in EDITABLE]
        if e.tiles and not plans:
            raise PolymlError(f"{e.path}: node {e.node!r} runs a schedule without cache tiles to edit "
                              f"({s.op_type}, {s.detail}); remove 'tiles'")
        extra = sorted(set(dict(e.tiles)) - set(plans[0]["tiles"])) if plans and e.tiles else []
        if extra:  # e.g. a group for a plane whose units are row bands in this build
            raise PolymlError(f"{e.path}: tiles {extra} do not apply to node {e.node!r}'s schedule here "
                              f"(its tiles: {', '.join(plans[0]['tiles'])})")
        if plans and e.shape:
            other = {k: (v, plans[0]["fixed"].get(k)) for k, v in e.shape if plans[0]["fixed"].get(k) != v}
            if other:
                raise PolymlError(f"{e.path}: written for another product than node {e.node!r} runs here ("
                                  + ", ".join(f"{k}={a} in the file, {b} here" for k, (a, b) in other.items()) + ")")
        retiled = bool(plans) and "cost_model_tiles" in plans[0]
        if not retiled and e.trees and tuple(e.trees) != tuple(s.schedules):
            raise PolymlError(f"{e.path}: the trees differ from the build's, but trees are derived from the tiles: "
                              "edit 'tiles' instead")
