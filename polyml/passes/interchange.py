"""Loop interchange on flat schedules."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import jscop as J
from polyml.scop.schedule import constant_dims


@register
@dataclass(frozen=True)
class Interchange(Pass):
    """Swap two schedule dimensions: θ'(S) = P·θ(S), P the permutation of dims a and b.

    ``dims=a,b`` index the flat schedule's output dimensions, as ``polyml scops`` prints them
    (``S[i0, i1, i2] -> [0, i0, i1, i2]``: ``dims=1,2`` interchanges the loops of i0 and i1).
    Without ``dims``, the two outermost dimensions that are loops (not constant) for every
    selected statement.  ``stmts``: a regular expression selecting statements by name
    (default: all).  Statements whose schedule has fewer dimensions are padded with zeros.
    """

    name: ClassVar[str] = "interchange"
    dims: tuple[int, ...] = ()
    stmts: str = ""

    def apply(self, scop: dict) -> dict:
        if self.dims and len(self.dims) != 2:
            raise PassError(f"interchange: dims={','.join(map(str, self.dims))} must name two dimensions")
        chosen = [s for s in scop["statements"] if not self.stmts or re.fullmatch(self.stmts, s["name"])]
        if not chosen:
            return J.with_schedules(scop, {})
        width = J.schedule_width(scop)
        a, b = self.dims or _outer_loops(chosen, width)
        if a == b or a is None:
            return J.with_schedules(scop, {})
        if max(a, b) >= width:
            raise PassError(f"interchange: dims {a},{b} out of range (the schedule has {width} dimensions)")
        perm = list(range(width))
        perm[a], perm[b] = perm[b], perm[a]
        t = ", ".join(f"t{i}" for i in range(width))
        swap = isl.Map(f"{{ [{t}] -> [{', '.join(f't{i}' for i in perm)}] }}")
        return J.with_schedules(scop, {s["name"]: J.pad_map(J.schedule_map(s), width).apply_range(swap) for s in chosen})


def _outer_loops(stmts: list[dict], width: int) -> tuple[int | None, int | None]:
    const = set(range(width))
    for s in stmts:
        const &= constant_dims(s, width)
    loops = [d for d in range(width) if d not in const]
    return (loops[0], loops[1]) if len(loops) >= 2 else (None, None)
