"""Constant Clip bounds as attributes: ``Clip(x, min, max)`` whose bounds are scalar constants
(opset ≥ 11 passes them as inputs) keeps them as its ``min``/``max`` attributes (the opset < 11
form, which the Clip kernel reads too) and reads only ``x``.

Why.  A chain fused as a convolution's epilogue (:mod:`polyml.passes.fuse`) with no inputs of
its own can run in the GEMM micro-kernel's registers (:class:`polyml.codegen.gemm.RegisterEpilogue`);
with its bounds as inputs, MobileNet's ReLU6 read two one-element tensors per element instead.

Legality.  Value-preserving: the bounds are the same numbers; only scalar float32 constants are
taken (a bound that is a computed tensor stays an input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from polyml.graph import Graph, Node
from polyml.passes.graph import GraphPass, GraphReport, register_graph_pass


def fold_clip_bounds(g: Graph) -> list[dict]:
    """Move every Clip's constant scalar bounds of ``g`` into its attributes; returns the Clips
    rewritten."""
    done: list[dict] = []
    for i, n in enumerate(g.nodes):
        if n.op_type != "Clip" or len(n.inputs) < 2:
            continue
        attrs = dict(n.attrs)
        inputs = list(n.inputs)
        for pos, key in ((1, "min"), (2, "max")):
            name = inputs[pos] if pos < len(inputs) else ""
            value = g.constants.get(name) if name else None
            if value is None or value.size != 1 or value.dtype != np.float32:
                continue
            attrs[key] = float(value.reshape(()))
            inputs[pos] = ""
        while len(inputs) > 1 and not inputs[-1]:
            inputs.pop()
        if inputs == list(n.inputs):
            continue
        g.nodes[i] = Node(n.name, n.op_type, inputs, list(n.outputs), attrs, source=n.source, opset=n.opset)
        done.append({"into": n.source or n.label, "op_type": "Clip bounds→attributes"})
    return done


@register_graph_pass
@dataclass(frozen=True)
class FoldClipBounds(GraphPass):
    """A Clip's constant scalar bounds become attributes: a chain with no inputs of its own."""

    name: ClassVar[str] = "clip-bounds"

    def rewrite(self, g: Graph) -> GraphReport:
        return GraphReport(rewritten=fold_clip_bounds(g), passes=[self.name])
