"""Leave a SCoP to Polly's own optimizer."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

from polyml.passes import Pass, register
from polyml.scop import schedule as sched


@register
@dataclass(frozen=True)
class Polly(Pass):
    """Keep θ and hand the SCoP's function to Polly's own pipeline instead of importing it.

    Polly's optimizer (``opt -O3 -polly``) reschedules with isl, tiles, and on matrix products
    applies its GEMM pattern optimizer (packed panels of A and B, a register-tiled micro-kernel)
    that no JSCoP schedule can express (it adds copy statements and arrays).  ``polyml opt``
    imports nothing into a function with such a SCoP and runs Polly on it (with
    ``-polly-parallel`` unless ``parallel=0`` or ``--threads 1``).
    """

    name: ClassVar[str] = "polly"
    parallel: bool = True

    def apply(self, scop: dict) -> dict:
        return sched.with_meta(copy.deepcopy(scop), polly={"parallel": self.parallel})
