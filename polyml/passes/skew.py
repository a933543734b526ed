"""Loop skewing of flat schedules (the unimodular step that makes a stencil's band permutable)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import dependences
from polyml.scop import jscop as J
from polyml.scop import schedule as sched


@register
@dataclass(frozen=True)
class Skew(Pass):
    """Skew schedule dimension ``b`` by dimension ``a``: θ'_b = θ_b + f·θ_a (``dims=a,b``,
    ``factor=f``), other dimensions unchanged — a unimodular change of basis, so every instance
    keeps a distinct time.

    A stencil's dependence (1, −1) in (t, i) runs backwards along ``i``; after ``i' = i + t``
    it is (1, 0) and the band ``[t, i']`` is permutable, so ``tile`` can tile it in time
    (parallelograms).  Without ``factor`` the smallest f ≥ 0 that makes every dependence
    carried at ``a`` non-negative along ``b`` is computed (dependences with a zero distance at
    ``a`` are left to the outer loops); without ``dims`` the two outermost loop dimensions.
    ``stmts``: a regular expression selecting statements (default all).  The result is
    checked like every schedule on import; ``schedule`` (isl) finds skews by itself.
    """

    name: ClassVar[str] = "skew"
    dims: tuple[int, ...] = ()
    factor: int = -1
    stmts: str = ""

    def apply(self, scop: dict) -> dict:
        if self.dims and len(self.dims) != 2:
            raise PassError(f"skew: dims={','.join(map(str, self.dims))} must name two dimensions")
        width = J.schedule_width(scop)
        chosen = [s for s in scop["statements"] if not self.stmts or re.fullmatch(self.stmts, s["name"])]
        if not chosen:
            return J.with_schedules(scop, {})
        if self.dims:
            a, b = self.dims
        else:
            const = set(range(width))
            for s in chosen:
                const &= sched.constant_dims(s, width)
            loops = [d for d in range(width) if d not in const]
            if len(loops) < 2:
                raise PassError("skew: fewer than two loop dimensions")
            a, b = loops[0], loops[1]
        if not (0 <= a < width and 0 <= b < width) or a == b:
            raise PassError(f"skew: dims {a},{b} invalid (the schedule has {width} dimensions)")
        f = self.factor if self.factor >= 0 else _min_factor(scop, a, b, width)
        t = [f"t{i}" for i in range(width)]
        skewed = [f"{v} + {f}*t{a}" if i == b else v for i, v in enumerate(t)]
        m = isl.Map(f"{{ [{', '.join(t)}] -> [{', '.join(skewed)}] }}")
        return J.with_schedules(scop, {s["name"]: J.pad_map(J.schedule_map(s), width).apply_range(m) for s in chosen})


def _min_factor(scop: dict, a: int, b: int, width: int) -> int:
    """The least f with d_b + f·d_a ≥ 0 for every dependence distance d with d_a > 0 and equal
    dimensions before ``a`` (those are the ones a skew at ``a`` has to fix)."""
    deps = dependences.compute(scop).all()
    theta = J.schedule(scop, width)
    dist = deps.apply_domain(theta).apply_range(theta).deltas()
    eq = " and ".join(f"d{i} = 0" for i in range(a)) or "true"
    names = ", ".join(f"d{i}" for i in range(width))
    for f in range(0, 65):
        bad = isl.UnionSet.from_set(isl.Set(f"{{ [{names}] : {eq} and d{a} > 0 and d{b} + {f}*d{a} < 0 }}"))
        if dist.intersect(bad).is_empty():
            return f
    raise PassError(f"skew: no factor up to 64 makes dimension {b} non-negative under {a}")
