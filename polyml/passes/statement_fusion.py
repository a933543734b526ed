"""Loop fusion of a SCoP's statements at the JSCoP level, legality-checked (the graph-level
operator fusion is passes/fuse.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.passes.distribute import refuse_illegal
from polyml.scop import jscop as J
from polyml.scop.schedule import constant_dims


@register
@dataclass(frozen=True)
class Fuse(Pass):
    """Fuse the loops that follow a sequence dimension: move the sequence dimension ``at``
    ``depth`` loop dimensions inwards, θ'(S) = [… θ_{at+1} … θ_{at+depth}, θ_at, …], so
    statements that ran one nest after the other share those ``depth`` loops (their bodies
    interleave, in the old order, inside the fused loops).

    ``at``: the flat dimension of the sequence (default: the outermost one on which the
    selected statements — ``stmts=REGEX``, default all — take different constants);
    ``depth``: how many loops to fuse (default: as many as every selected statement has
    after it).  No shifting: a fusion that would run a dependence's target before its source
    (``B[i]`` read by the second nest at ``i`` but written by the first at ``i+1``) is refused
    with the violated dependences; ``schedule{fusion=max}`` finds shifted fusions.
    """

    name: ClassVar[str] = "fuse"
    at: int = -1
    depth: int = 0
    stmts: str = ""

    def apply(self, scop: dict) -> dict:
        chosen = [s for s in scop["statements"] if not self.stmts or re.fullmatch(self.stmts, s["name"])]
        if len(chosen) < 2:
            raise PassError(f"fuse: needs two statements (selected: {', '.join(s['name'] for s in chosen) or 'none'})")
        width = J.schedule_width(scop)
        maps = {s["name"]: J.pad_map(J.schedule_map(s), width).intersect_domain(J.domain(s)) for s in chosen}
        at = self.at if self.at >= 0 else _sequence_dim(maps, width)
        if at is None or not 0 <= at < width:
            raise PassError("fuse: no sequence dimension separates the selected statements")
        loops = min(_loops_after(s, at, width) for s in chosen)
        depth = self.depth or loops
        if depth < 1 or depth > loops:
            raise PassError(f"fuse: depth={depth}, but the selected statements have {loops} loop(s) after dimension {at}")
        perm = [*range(at), *range(at + 1, at + 1 + depth), at, *range(at + 1 + depth, width)]
        t = ", ".join(f"t{i}" for i in range(width))
        move = isl.Map(f"{{ [{t}] -> [{', '.join(f't{i}' for i in perm)}] }}")
        out = J.with_schedules(scop, {n: J.pad_map(J.schedule_map(s), width).apply_range(move)
                                      for n, s in ((s["name"], s) for s in chosen)})
        return refuse_illegal("fuse", scop, out)


def _sequence_dim(maps: dict[str, isl.Map], width: int) -> int | None:
    for d in range(width):
        vals = set()
        for m in maps.values():
            r = m.range().project_out(isl.dim_type.set, d + 1, width - d - 1).project_out(isl.dim_type.set, 0, d)
            if not r.is_singleton():
                vals = set()
                break
            vals.add(int(r.sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python()))
        if len(vals) > 1:
            return d
    return None


def _loops_after(stmt: dict, at: int, width: int) -> int:
    """How many consecutive loop (non-constant) dimensions ``stmt`` has right after ``at``."""
    const = constant_dims(stmt, width)
    n = 0
    for d in range(at + 1, width):
        if d in const:
            break
        n += 1
    return n
