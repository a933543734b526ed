"""The identity transformation."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

from polyml.passes import Pass, register


@register
@dataclass(frozen=True)
class Identity(Pass):
    """Keep every schedule: θ'(S) = θ(S).

    Importing its result regenerates the SCoP's code from the unchanged schedule: a check of
    the export/import round trip, and the baseline any other transform is measured against.
    """

    name: ClassVar[str] = "identity"

    def apply(self, scop: dict) -> dict:
        return copy.deepcopy(scop)
