"""An affine scheduler over the SCoP's exact dependences (isl's Pluto-style scheduler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import islpy as isl

from polyml.passes import Pass, PassError, register
from polyml.scop import dependences
from polyml.scop import jscop as J
from polyml.scop import schedule as sched

FUSION = ("min", "smart", "max")


@register
@dataclass(frozen=True)
class Schedule(Pass):
    """Compute a new schedule θ(S) = bands of affine functions with isl's scheduler.

    The constraints are the SCoP's exact (value-based) dependences D: *validity* = D (every
    dependence keeps a non-negative distance, carried somewhere), *proximity* = D (Pluto's cost:
    minimise the dependence distances, i.e. reuse close in time), *coincidence* = D, or only
    the flow dependences with ``coincidence=raw`` (members along which every dependence has
    distance 0 are parallel loops).  isl builds bands outermost first, each as many linearly
    independent members with non-negative distances as it can find (a *permutable* band: it can
    be tiled), skewing and shifting statements where needed (a stencil's time loop becomes a
    band ``[t, 2t+i, 2t+j]``), and marks the *coincident* members.  The resulting tree is kept
    in the JSCoP's metadata for the passes after this one (tile, parallel, vectorize).

    ``fusion``: ``min`` separates the strongly connected components of the dependence graph
    (isl's ``schedule_serialize_sccs``: loop distribution), ``smart`` lets isl cluster
    components whose fusion keeps bands deep and parallel (its default), ``max`` schedules each
    component as a whole (``schedule_whole_component``: as much fusion as legal).
    ``outer_coincidence``: require the outermost member of each band to be parallel where
    possible; ``max_coefficient`` / ``max_constant_term`` bound the schedule coefficients
    (-1: unbounded; 20 as in Polly); ``maximize_band_depth``; ``algorithm``: ``isl`` (Pluto-
    like) or ``feautrier``; ``max_operations``: isl's budget (past it the schedule is kept).
    """

    name: ClassVar[str] = "schedule"
    fusion: str = "smart"
    coincidence: str = "all"
    outer_coincidence: bool = False
    maximize_band_depth: bool = True
    max_coefficient: int = 20
    max_constant_term: int = 20
    algorithm: str = "isl"

    def __post_init__(self) -> None:
        if self.fusion not in FUSION:
            raise PassError(f"schedule: fusion={self.fusion!r}, expected one of {', '.join(FUSION)}")
        if self.coincidence not in ("all", "raw"):
            raise PassError(f"schedule: coincidence={self.coincidence!r}, expected 'all' or 'raw'")
        if self.algorithm not in ("isl", "feautrier"):
            raise PassError(f"schedule: algorithm={self.algorithm!r}, expected 'isl' or 'feautrier'")

    max_operations: int = 20_000_000

    def apply(self, scop: dict) -> dict:
        deps = dependences.compute(scop)
        tree = self.compute(J.domains(scop), deps)
        if tree is None:  # isl ran out of operations: keep θ (the passes after this one still apply)
            return sched.with_meta(J.with_schedules(scop, {}), schedule_note="isl's scheduler gave up; kept the schedule")
        return sched.with_tree(scop, tree)

    def compute(self, domain: isl.UnionSet, deps: dependences.Dependences) -> isl.Schedule | None:
        """isl's schedule of ``domain`` under ``deps`` with this pass's options (None: isl
        needed more than ``max_operations``).  The dependences are simplified in the context of
        the domains first (``gist``: constraints the domains imply are dropped, as Polly does;
        heat-3d's scheduling went from minutes to 0.1 s)."""

        def simple(d: isl.UnionMap) -> isl.UnionMap:
            return d.gist_domain(domain).gist_range(domain).coalesce()

        alld = simple(deps.all())
        sc = (isl.ScheduleConstraints.on_domain(domain).set_validity(alld).set_proximity(alld)
              .set_coincidence(alld if self.coincidence == "all" else simple(deps.raw)))
        ctx = isl.DEFAULT_CONTEXT
        options = {
            "serialize_sccs": int(self.fusion == "min"),
            "whole_component": int(self.fusion == "max"),
            "outer_coincidence": int(self.outer_coincidence),
            "maximize_band_depth": int(self.maximize_band_depth),
            "max_coefficient": self.max_coefficient,
            "max_constant_term": self.max_constant_term,
            "algorithm": 0 if self.algorithm == "isl" else 1,
        }
        saved = {k: getattr(ctx, f"get_schedule_{k}")() for k in options}
        saved_ops = ctx.get_max_operations()
        try:
            for k, v in options.items():
                getattr(ctx, f"set_schedule_{k}")(v)
            ctx.reset_operations()
            ctx.set_max_operations(self.max_operations)
            try:
                return sc.compute_schedule()
            except isl.Error as e:
                if "operations" in str(e) or ctx.get_max_operations() and "quota" in str(e):
                    return None
                raise PassError(f"schedule: isl's scheduler failed ({e})") from None
        finally:
            ctx.set_max_operations(saved_ops)
            ctx.reset_operations()
            for k, v in saved.items():
                getattr(ctx, f"set_schedule_{k}")(v)
