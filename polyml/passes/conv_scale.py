"""Squeeze-excitation scales into the next 1x1 convolution: ``Conv(Mul(x, s))`` with ``s`` a
per-channel tensor computed at run time (``[1, C, 1, 1]``, the SE block's gate) becomes a
Conv reading ``x`` with the scale as an extra input (``attrs["input_scale"]``: its index).

Why.  In EfficientNet's MBConv blocks the feature map is read by the SE pool, then read and
written by the ``Mul``, then read again by the projection; with the scale folded into the
projection the map is read once by the pool and once by the projection, which scales each
element as it packs it into the GEMM's B panels (:func:`polyml.kernels.conv._convolve_gemm`;
other lowerings of the Conv scale x into a copy first).

Legality.  A 1x1 convolution with stride 1 and no padding is ``y[m, p] = Σ_c w[m, c] ·
x'[c, p]``; every element ``x'[c, p] = x[c, p] · s[c]`` is read exactly once, at the position
where it was computed, so computing it at the read is value-preserving (the same float32
product, rounded once, as the ``Mul`` computes it).  Applied only when the ``Mul``'s result has
no other reader and is not a graph output, ``x`` has the result's shape, ``s`` is constant
over the spatial dims, both are float32, and the Conv is 2-D, 1x1, stride 1, unpadded,
undilated, ungrouped, batch 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from polyml.graph import Graph, Node
from polyml.passes.graph import GraphPass, GraphReport, register_graph_pass


def _is_channel_gate(shape: tuple[int, ...], rank: int, channels: int) -> bool:
    """Whether a tensor of ``shape`` holds one value per channel of an ``N=1, C, ...`` tensor of ``rank`` dims."""
    full = (1,) * (rank - len(shape)) + tuple(shape)
    return len(full) == rank and full[0] == 1 and full[1] == channels and all(d == 1 for d in full[2:])


def pointwise_conv(g: Graph, conv: Node, x_name: str) -> bool:
    """Whether ``conv`` reading ``x_name`` is a 2-D 1x1 Conv of batch 1: stride 1, unpadded,
    undilated, ungrouped, with no input scale folded in yet."""
    x = g.types[x_name]
    w = g.types.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if conv.op_type != "Conv" or len(x.shape) != 4 or x.shape[0] != 1 or w is None or w.shape[2:] != (1, 1):
        return False
    attrs = conv.attrs
    return (int(attrs.get("group", 1)) == 1 and all(int(v) == 1 for v in attrs.get("strides", [1, 1]))
            and all(int(v) == 1 for v in attrs.get("dilations", [1, 1])) and not any(attrs.get("pads", [0] * 4))
            and attrs.get("auto_pad", "NOTSET") in ("NOTSET", "VALID", "") and "input_scale" not in attrs)


def fold_conv_input_scales(g: Graph) -> list[dict]:
    """Fold every eligible ``Conv(Mul(x, s))`` of ``g`` (module docstring); returns what was folded."""
    consumers = g.consumers()
    producers = g.producer_map()
    dropped: set[str] = set()
    done: list[dict] = []
    for conv in g.nodes:
        if conv.op_type != "Conv" or not conv.inputs:
            continue
        t = conv.inputs[0]
        mul = producers.get(t)
        if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2 or t in g.outputs:
            continue
        if len(consumers.get(t, [])) != 1 or g.types[t].dtype != "float32":
            continue
        out = g.types[t]
        for x_name, s_name in (mul.inputs, mul.inputs[::-1]):
            x, s = g.types.get(x_name), g.types.get(s_name)
            if x is None or s is None or x != out or s.dtype != "float32" or s_name in g.constants:
                continue
            if not _is_channel_gate(s.shape, len(out.shape), out.shape[1]) or not pointwise_conv(g, conv, x_name):
                continue
            base = list(conv.inputs) + [""] * (3 - len(conv.inputs))
            start = int(conv.attrs.get("epilogue_start", len(base)))
            conv.inputs = [x_name, *base[1:3], s_name, *base[3:]]
            conv.attrs = {**conv.attrs, "input_scale": 3}
            if "epilogue_start" in conv.attrs:
                conv.attrs["epilogue_start"] = start + 1
            dropped.add(mul.name)
            done.append({"nest": conv.label, "ops": [mul.source or mul.label, conv.source or conv.label],
                         "kind": "conv-input-scale"})
            break
    g.nodes = [n for n in g.nodes if n.name not in dropped]
    return done


@register_graph_pass
@dataclass(frozen=True)
class FoldConvInputScales(GraphPass):
    """A run-time per-channel scale whose only reader is a 1x1 Conv is applied by the Conv as it reads."""

    name: ClassVar[str] = "conv-scales"

    def rewrite(self, g: Graph) -> GraphReport:
        return GraphReport(groups=fold_conv_input_scales(g), passes=[self.name])
