"""Loop distribution (fission) of a SCoP's statements, legality-checked."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import jscop as J
from polyml.scop import legality


@register
@dataclass(frozen=True)
class Distribute(Pass):
    """Split the loops shared by several statements into one nest per statement group:
    θ'(S) = [θ(S)₀ … θ(S)_{at-1}, g(S), θ(S)_at …] with g(S) the group's position.

    ``at`` is the flat schedule dimension (as ``polyml scops`` prints it) where the new
    sequence dimension goes: the loops before it stay shared, the ones from it on are
    distributed (0: fully separate nests).  Groups: every statement alone, in source order,
    or with ``stmts=REGEX`` the matching statements in one group after the others.  A
    distribution that would run a dependence's target before its source (a statement that
    reads, in the same iteration of the shared loops, what a later statement writes) is
    refused with the violated dependences.
    """

    name: ClassVar[str] = "distribute"
    at: int = 0
    stmts: str = ""

    def apply(self, scop: dict) -> dict:
        width = J.schedule_width(scop)
        if not 0 <= self.at <= width:
            raise PassError(f"distribute: at={self.at} out of range (the schedule has {width} dimensions)")
        names = J.statement_names(scop)
        group = {n: (1 if re.fullmatch(self.stmts, n) else 0) if self.stmts else i for i, n in enumerate(names)}
        new = {}
        for s in scop["statements"]:
            m = J.pad_map(J.schedule_map(s), width)
            m = m.insert_dims(isl.dim_type.out, self.at, 1).fix_val(
                isl.dim_type.out, self.at, isl.Val.int_from_si(m.get_ctx(), group[s["name"]]))
            new[s["name"]] = m
        out = J.with_schedules(scop, new)
        return refuse_illegal("distribute", scop, out)


def refuse_illegal(pass_name: str, scop: dict, out: dict) -> dict:
    """``out`` if its schedule respects ``scop``'s dependences, else a :class:`PassError`
    naming each violated dependence (kind, statements, array, first instance pair)."""
    bad = legality.violations(scop, out)
    if bad:
        lines = "\n".join(f"  - {v}" for v in bad)
        raise PassError(f"{pass_name}: illegal, {len(bad)} violated dependence(s):\n{lines}")
    return out
