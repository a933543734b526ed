"""1x1 expansions into the depthwise convolution that reads them: ``DW(e(Conv1x1(x)))`` (``e``
the expansion's fused ReLU/Clip chain) becomes one ``polyml.DepthwiseProduct`` node reading
``x``, which computes each row of the expanded tensor where the depthwise copy-in would load
it (:mod:`polyml.kernels.depthwise_product`): the expanded tensor is never stored.

Legality.  The product ``P[c, h, w]`` is a pure function of ``x`` and the constant-shaped
weights; the fused schedule computes each instance before the first depthwise instance that
reads it and keeps it (in a ring of phase rows) until the last, so every ``P -> DW``
dependence is preserved, and no other statement reads ``P`` (its only consumer is the
depthwise Conv, it is not a graph output).  Values are the same float32 sums as the unfused
product's, up to the order of the ``K`` terms.

Applied where the intermediate has that one reader; the expansion is a 2-D 1x1 Conv, stride 1,
unpadded, undilated, ungrouped, with no input scale and no inputs of its own past the bias;
the reader is a depthwise Conv (``group = C``); both chains are ReLUs/constant Clips; and
:func:`polyml.kernels.depthwise_product.product_plan` has a plan (host, AVX-512, row-wise
planes, batch 1, ``K ≤ 64``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from polyml.graph import Graph, Node
from polyml.kernels.depthwise_product import DEPTHWISE_PRODUCT_OP, chains_fit, product_plan
from polyml.options import CodegenConfig
from polyml.passes.conv_scale import pointwise_conv
from polyml.passes.graph import GraphPass, GraphReport, register_graph_pass


def fold_depthwise_products(g: Graph, config: CodegenConfig) -> list[dict]:
    """Fuse every eligible expansion and depthwise pair of ``g`` (module docstring) that the
    kernels of a build of ``config`` take; returns what was fused."""
    consumers = g.consumers()
    producers = g.producer_map()
    dropped: set[int] = set()  # id() of the fused expansions
    done: list[dict] = []
    for i, dw in enumerate(g.nodes):
        if dw.op_type != "Conv" or len(dw.inputs) < 2 or "input_scale" in dw.attrs:
            continue
        t = dw.inputs[0]
        exp = producers.get(t)
        if exp is None or id(exp) in dropped or t in g.outputs or len(consumers.get(t, [])) != 1:
            continue
        if not pointwise_conv(g, exp, exp.inputs[0]) or any(exp.inputs[3:]):  # no inputs past the bias
            continue
        start = int(dw.attrs.get("epilogue_start", len(dw.inputs)))
        extras = [name for name in dw.inputs[start:] if name]
        if not chains_fit(exp.attrs.get("epilogue"), dw.attrs.get("epilogue"), extras):
            continue
        if product_plan(config, dw, g.types[exp.inputs[0]], g.types[exp.inputs[1]], g.types[dw.inputs[1]]) is None:
            continue
        e_in = list(exp.inputs[:3]) + [""] * (3 - len(exp.inputs[:3]))
        d_in = list(dw.inputs[:3]) + [""] * (3 - len(dw.inputs[:3]))
        attrs = {a: v for a, v in dw.attrs.items() if a != "epilogue_start"}
        attrs["product_epilogue"] = exp.attrs.get("epilogue")
        attrs["epilogue_start"] = 5
        g.nodes[i] = Node(dw.name, DEPTHWISE_PRODUCT_OP, [e_in[0], e_in[1], e_in[2], d_in[1], d_in[2], *dw.inputs[start:]],
                          list(dw.outputs), attrs, source=dw.source, opset=dw.opset)
        dropped.add(id(exp))
        done.append({"nest": dw.label, "ops": [exp.source or exp.label, dw.source or dw.label],
                     "kind": "depthwise-product", "nests": [exp.label, dw.label]})
    g.nodes = [n for n in g.nodes if id(n) not in dropped]
    return done


def absorb_groups(groups: list[dict], fused: list[dict]) -> list[dict]:
    """The fusion report's groups with each fused pair's two epilogue nests (the expansion's and
    the depthwise Conv's, by nest label) replaced by the pair's group, holding all their ops."""
    by_nest = {grp["nest"]: grp for grp in groups}
    gone: set[int] = set()
    out = []
    for entry in fused:
        ops: list[str] = []
        for nest in entry.pop("nests"):
            grp = by_nest.get(nest)
            if grp is not None:
                gone.add(id(grp))
            ops.extend(grp["ops"] if grp is not None else [])
        out.append({**entry, "ops": list(dict.fromkeys(ops or entry["ops"]))})
    return [grp for grp in groups if id(grp) not in gone] + out


@register_graph_pass
@dataclass(frozen=True)
class FoldDepthwiseProducts(GraphPass):
    """A 1x1 expansion computed inside the depthwise Conv that reads it."""

    name: ClassVar[str] = "depthwise-products"
    #: the build's code generation settings: the fused form exists for some kernel plans only
    config: CodegenConfig = CodegenConfig()

    def rewrite(self, g: Graph) -> GraphReport:
        return GraphReport(groups=fold_depthwise_products(g, self.config), passes=[self.name])
