"""Ops that pass their inputs through unchanged: no IR node, each output is its input's value."""

from __future__ import annotations

from polyml.frontends.tensorflow.convert import converter
from polyml.frontends.tensorflow.values import TFValues, Value

#: ops that pass their input through unchanged
PASS_THROUGH = {"Identity", "StopGradient", "Snapshot", "PreventGradient", "CheckNumerics", "EnsureShape",
                "PlaceholderWithDefault"}


@converter(*PASS_THROUGH)
def _pass_through(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    return [imp.vals[ts[0]]]


@converter("IdentityN")
def _identity_n(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    return [imp.vals[t] for t in ts]
