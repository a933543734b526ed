"""Can Polly's JSCoP importer (LLVM 19) take a schedule?  Checked before ``opt`` runs.

isl (and so polyml's legality check) aligns parameters by name; Polly's importer does not.  It
parses each statement's schedule on its own and renames the map's first *k* parameters to the
*k* parameters of the statement's domain, by position (``JSONImporter.cpp``, ``importSchedule``).
Measured on opt-19 with a SCoP over ``[n, m]``:

* a schedule with fewer parameters (``{ S[i0, i1] -> [i1, i0] }``, no ``[n, m] ->``) aborts opt:
  ``isl/check_type_range_templ.c:18: position or range out of bounds``;
* a parameter the SCoP does not have (``[n, m, T] -> { S[i0, i1] -> [i0, i1 + T] }``, e.g. a
  symbolic tile size) aborts its AST generator: ``band node is not allowed to introduce new
  parameters``;
* the SCoP's parameters in another order (``[m, n] -> ...``) are silently renamed by position.

So :func:`prepare` gives every schedule exactly its domain's parameters, in the domain's order
(unambiguous: isl already knows which is which by name), and refuses parameters the SCoP does
not have with a reason.  It also drops a name on the schedule's range tuple (Polly needs all
statements' times in one space) and pads the ranges to one length.
"""

from __future__ import annotations

from collections.abc import Mapping

import islpy as isl

from polyml.scop import jscop as J


def _params(space: isl.Space) -> list[str]:
    return [space.get_dim_name(isl.dim_type.param, i) for i in range(space.dim(isl.dim_type.param))]


def prepare(new: Mapping, where: str) -> dict:
    """``new`` with schedules Polly's importer reads as isl does; raise
    :class:`~polyml.scop.jscop.JscopError` for a parameter the SCoP does not have."""
    schedules: dict[str, isl.Map] = {}
    for s in new["statements"]:
        name = s["name"]
        theta = J.schedule_map(s)
        dom = J.domain(s)
        known = _params(dom.get_space())
        extra = [p for p in _params(theta.get_space()) if p not in known]
        if extra:
            raise J.JscopError(
                f"{where}: statement {name}: the schedule uses parameter(s) {', '.join(extra)} that the SCoP does not "
                f"have (its parameters: {', '.join(known) or 'none'}); Polly's importer binds a schedule's parameters "
                "to the SCoP's by position and its code generator aborts on new ones ('band node is not allowed to "
                "introduce new parameters'): use a constant (e.g. a tile size) instead")
        theta = theta.align_params(dom.get_space().params())
        if theta.has_tuple_id(isl.dim_type.out):
            theta = theta.reset_tuple_id(isl.dim_type.out)
        schedules[name] = theta
    width = max((m.dim(isl.dim_type.out) for m in schedules.values()), default=0)
    return J.with_schedules(new, {n: J.pad_map(m, width) for n, m in schedules.items()})


def same_schedules(a: Mapping, b: Mapping) -> bool:
    """Do ``a`` and ``b`` (the same SCoP) order every statement instance the same way: equal
    schedules on the domains, shorter ranges padded with zeros?"""
    if J.statement_names(a) != J.statement_names(b):
        return False
    width = max(J.schedule_width(a), J.schedule_width(b))
    for sa, sb in zip(a["statements"], b["statements"]):
        dom = J.domain(sa)
        ma = J.pad_map(J.schedule_map(sa), width).intersect_domain(dom)
        mb = J.pad_map(J.schedule_map(sb), width).intersect_domain(dom)
        if not ma.reset_tuple_id(isl.dim_type.out).is_equal(mb.reset_tuple_id(isl.dim_type.out)):
            return False
    return True
