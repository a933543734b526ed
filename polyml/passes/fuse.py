"""Operator fusion: producer–consumer fusion of loop nests, decided on the graph, checked with isl.

Polyhedral view.  Every elementwise op is one statement ``S[i] : 0 ≤ i < d`` writing
``T[i]``; an op reading ``T`` through the access ``{ S'[i] -> T[f(i)] }`` depends on ``S``
(read-after-write).  Fusing the two nests means the schedule ``S[i] -> [i, 0]``,
``S'[i] -> [i, 1]`` (one loop, producer first in the body) instead of ``S[i] -> [0, i]``,
``S'[i] -> [1, i]``; it is legal iff every dependence still runs source before target
(checked by :func:`polyml.scop.legality.violations` on the two schedules), which holds when
``f`` is the identity on the same domain and fails for broadcast or reduction reads.  After
fusion the intermediate ``T`` is read only in the iteration that wrote it, so it is
*contracted* to a scalar in a register and never allocated.

What fuses (the groups are decided on the networkx graph, in topological order):

* chains of elementwise ops (Add, Mul, Relu, Clip, ... and BatchNormalization turned into a
  per-channel multiply-add) become one ``polyml.Elementwise`` nest;
* a Conv's per-channel multiply and add (batch norm after conv) fold into its weights and bias;
* a Conv followed by such a chain (bias, activation, residual add) runs the chain as an
  *epilogue* on its output block, in the conv's function.

* a run-time per-channel scale (a squeeze-excitation gate) whose only reader is a 1x1
  convolution is applied by the convolution as it reads its input (:mod:`polyml.passes.conv_scale`);
* an elementwise chain whose only reader is a MaxPool/AveragePool becomes the pool's
  *prologue*: the pool evaluates the chain on each window element it loads (in the padded copy
  when the pool pads, per tap otherwise).  Legality: the pool statement reads
  ``T[n, c, o*s + j*d - pb]`` only at in-range positions; padded positions read the
  reduction's identity (``-inf``/``0``) which the unfused pool also never passes through the
  chain, so replacing each in-range read by ``f(x)`` at the same index computes the same value
  (``count_include_pad`` counts pads as 0 either way).  It holds for every chain and both pools;
  the alternative, moving a monotone activation after a MaxPool (``max∘relu = relu∘max``), only
  holds for MaxPool with non-decreasing chains, so the prologue was chosen.  Cost: the
  intermediate ``T`` (one write + one read per element) disappears; the chain is recomputed
  ``taps/stride²`` times per element when the pool does not pad (2.25x for 3x3/2, a handful of
  flops for ReLU/affine chains), once per element when it pads.

After fusion every remaining producer→consumer edge between two nests is reported with what
blocked it: a window or reduction read (the isl check of the window access, which fused on the
output loop reads elements not yet written), several consumers, no fused form; Concat inputs
not stored in place are reported by the lowering (:func:`polyml.codegen.lower.plan_concat_in_place`).

A candidate is refused, and the refusal reported, when the intermediate has other consumers
or is a graph output, when the consumer reads it through a non-identity access (isl finds the
violated dependence), or when the producer is an op with no fusable form.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from polyml.graph import Graph, Node, TensorType
from polyml.kernels.elementwise import elementwise_ops
from polyml.options import CodegenConfig
from polyml.passes.attention import FuseAttention
from polyml.passes.clip_bounds import FoldClipBounds
from polyml.passes.conv_scale import FoldConvInputScales
from polyml.passes.depthwise_product import FoldDepthwiseProducts, absorb_groups
from polyml.passes.graph import GraphPass, GraphReport, register_graph_pass
from polyml.passes.silu import FoldSilu

#: producers that can run an elementwise chain as an epilogue on their output
EPILOGUE_HOSTS = frozenset(["Conv"])
ELEMENTWISE_OP = "polyml.Elementwise"


#: the fusion's report: nests formed, edges left and why, constants folded (one type for every graph pass)
FusionReport = GraphReport


@register_graph_pass
@dataclass(frozen=True)
class FuseOperators(GraphPass):
    """Fold batch norms, then fuse elementwise chains, conv epilogues, attention heads and pool prologues."""

    name: ClassVar[str] = "fuse-operators"
    fold_into_conv: bool = True
    #: ``Mul(x, Sigmoid(x))`` as ``Swish(x)`` first (:mod:`polyml.passes.silu`)
    silu: bool = True
    #: fuse each head's MatMul → chain → Softmax → MatMul (:mod:`polyml.passes.attention`)
    attention: bool = True
    #: a run-time per-channel scale before a 1x1 Conv read by the Conv (:mod:`polyml.passes.conv_scale`)
    conv_scales: bool = True
    #: a 1x1 expansion computed inside the depthwise Conv reading it (:mod:`polyml.passes.depthwise_product`)
    depthwise_products: bool = True
    #: the build's code generation settings: some fused forms exist for some kernel plans only
    config: CodegenConfig = CodegenConfig()

    def rewrite(self, g: Graph) -> GraphReport:
        report = GraphReport(passes=[self.name])

        def run(part: GraphPass) -> GraphReport:
            sub = part.rewrite(g)
            report.passes.extend(sub.passes)
            report.blocked.extend(sub.blocked)
            report.folded.extend(sub.folded)
            report.rewritten.extend(sub.rewritten)
            return sub

        _batchnorm_to_affine(g)
        if self.silu:
            run(FoldSilu())  # x·sigmoid(x) read once, so it can be a conv epilogue
        run(FoldClipBounds())  # constant bounds: a chain with no inputs of its own
        if self.fold_into_conv:
            _fold_affine_into_conv(g, report)
        if self.attention:
            report.groups.extend(run(FuseAttention()).groups)
        _fuse_chains(g, report)
        if self.conv_scales:
            report.groups.extend(run(FoldConvInputScales()).groups)
        if self.depthwise_products:
            report.groups = absorb_groups(report.groups, run(FoldDepthwiseProducts(self.config)).groups)
        _fuse_pool_prologues(g, report)
        _report_edges(g, report)
        g.prune()
        return report


# -- batch norm → per-channel multiply-add ----------------------------------------------------

def _per_channel(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """``(C,)`` → ``(C, 1, ..., 1)`` broadcasting against NC... of ``rank`` dims."""
    return (shape[0], *([1] * (rank - 2)))


def _batchnorm_to_affine(g: Graph) -> None:
    """BatchNormalization (inference, constant parameters) → Mul(x, a) then Add(·, b) with
    ``a = scale/√(var+ε)`` and ``b = B − mean·a`` folded at compile time."""
    nodes = []
    for n in g.nodes:
        params = n.inputs[1:5]
        if (n.op_type != "BatchNormalization" or len(params) != 4 or not all(p in g.constants for p in params)
                or any(g.constants[p].ndim != 1 for p in params) or len(n.outputs) > 1):
            nodes.append(n)  # spatial=0 (per-element statistics) keeps its own kernel
            continue
        scale, bias, mean, var = (g.constants[p].astype(np.float64) for p in params)
        a = scale / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
        b = bias - mean * a
        rank = len(g.types[n.inputs[0]].shape)
        shape = _per_channel(a.shape, rank) if rank >= 2 else a.shape
        an, bn, mid = f"{n.label}.bn_a", f"{n.label}.bn_b", f"{n.label}.bn_mid"
        g.constants[an] = a.astype(np.float32).reshape(shape)
        g.constants[bn] = b.astype(np.float32).reshape(shape)
        g.types[an] = g.types[bn] = TensorType(shape, "float32")
        g.types[mid] = g.types[n.outputs[0]]
        nodes.append(Node(f"{n.label}.mul", "Mul", [n.inputs[0], an], [mid], source=n.label, opset=n.opset))
        nodes.append(Node(f"{n.label}.add", "Add", [mid, bn], [n.outputs[0]], source=n.label, opset=n.opset))
    g.nodes = nodes


def _channel_vector(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``value`` as a length-``channels`` vector if it broadcasts per channel over N,C,...."""
    v = np.asarray(value)
    if v.size == 1:
        return np.full(channels, float(v.reshape(-1)[0]), np.float64)
    shape = v.shape
    while len(shape) > rank - 1 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) == rank - 1 and shape[0] == channels and all(d == 1 for d in shape[1:]):
        return v.reshape(channels).astype(np.float64)
    return None


def _fold_affine_into_conv(g: Graph, report: FusionReport) -> None:
    """Conv → Mul(per-channel const) → Add(per-channel const) folds into W and B:
    ``(W∗x + B)·a + b = (a·W)∗x + (a·B + b)``."""
    changed = True
    while changed:
        changed = False
        consumers = g.consumers()
        producers = g.producer_map()
        for n in list(g.nodes):
            if n.op_type not in ("Mul", "Add") or len(n.inputs) != 2:
                continue
            src, other = n.inputs
            if src not in producers and other in producers:
                src, other = other, src
            conv = producers.get(src)
            if conv is None or conv.op_type != "Conv" or other not in g.constants or "epilogue" in conv.attrs:
                continue
            if len(consumers.get(src, [])) != 1 or src in g.outputs or conv.inputs[1] not in g.constants:
                continue
            if g.types[n.outputs[0]].shape != g.types[src].shape:
                continue
            w = g.constants[conv.inputs[1]].astype(np.float64)
            rank = len(g.types[src].shape)
            vec = _channel_vector(g.constants[other], w.shape[0], rank)
            if vec is None:
                continue
            bias_name = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else ""
            b = g.constants[bias_name].astype(np.float64) if bias_name in g.constants else np.zeros(w.shape[0])
            if bias_name and bias_name not in g.constants:
                continue
            if n.op_type == "Mul":
                w = w * vec.reshape(-1, *([1] * (w.ndim - 1)))
                b = b * vec
            else:
                b = b + vec
            wn, bn = f"{conv.label}.w_fold{len(report.folded)}", f"{conv.label}.b_fold{len(report.folded)}"
            g.constants[wn] = w.astype(np.float32)
            g.constants[bn] = b.astype(np.float32)
            g.types[wn] = TensorType(w.shape, "float32")
            g.types[bn] = TensorType(b.shape, "float32")
            conv.inputs = [conv.inputs[0], wn, bn]
            conv.outputs = [n.outputs[0]]
            g.nodes.remove(n)
            report.folded.append({"into": conv.label, "op": n.source or n.label, "op_type": n.op_type})
            changed = True
            break


# -- chains and epilogues ---------------------------------------------------------------------

def _fusion_violations(shape: tuple[int, ...], read_shape: tuple[int, ...]) -> list[str]:
    """Check with isl that fusing producer ``P`` (writes ``T`` over ``shape``) and consumer
    ``C`` (domain ``shape``, reads ``T`` with numpy broadcasting from ``read_shape``) into one
    loop respects every dependence. Returns the violations (empty: legal)."""
    from polyml.scop.legality import violations

    r = len(shape)
    ivs = [f"i{d}" for d in range(r)]
    dom = " and ".join(f"0 <= {v} < {d}" for v, d in zip(ivs, shape)) or "true"
    tail = ivs[r - len(read_shape):] if read_shape else []
    sub = [("0" if d == 1 and full != 1 else v) for v, d, full in zip(tail, read_shape, shape[r - len(read_shape):])]
    it = ", ".join(ivs)
    wr = ", ".join(ivs[r - len(read_shape):]) if read_shape else ""
    p_dom = " and ".join(f"0 <= {v} < {d}" for v, d in zip(ivs[r - len(read_shape):], read_shape)) or "true"

    def scop(order: str) -> dict:
        sched = {"seq": ("[0, {it}]", "[1, {it}]"), "fused": ("[{it}, 0]", "[{it}, 1]")}[order]
        p_it = wr
        return {
            "context": "{  :  }",
            "name": "fusion-candidate",
            "arrays": [],
            "statements": [
                {"name": "P", "domain": f"{{ P[{p_it}] : {p_dom} }}",
                 "schedule": "{ P[" + p_it + "] -> " + _pad(sched[0].format(it=p_it), r) + " }",
                 "accesses": [{"kind": "write", "relation": f"{{ P[{p_it}] -> MemRef_T[{p_it}] }}"}]},
                {"name": "C", "domain": f"{{ C[{it}] : {dom} }}",
                 "schedule": "{ C[" + it + "] -> " + _pad(sched[1].format(it=it), r) + " }",
                 "accesses": [{"kind": "read", "relation": f"{{ C[{it}] -> MemRef_T[{', '.join(sub)}] }}"}]},
            ],
        }

    return [str(v) for v in violations(scop("seq"), scop("fused"))]


def _pad(tup: str, rank: int) -> str:
    """Schedules of different statements must have equal width: pad with zeros."""
    items = [x.strip() for x in tup.strip("[]").split(",") if x.strip()]
    items += ["0"] * (rank + 1 - len(items))
    return "[" + ", ".join(items) + "]"


def _fuse_chains(g: Graph, report: FusionReport) -> None:
    consumers = g.consumers()
    producers = g.producer_map()
    group_of: dict[str, int] = {}  # node name -> group index
    groups: list[list[Node]] = []
    for n in g.nodes:
        if n.op_type not in elementwise_ops() or not n.outputs or g.types[n.outputs[0]].dtype != "float32":
            continue
        out_shape = g.types[n.outputs[0]].shape
        joined = False
        for t in [t for t in n.inputs if t]:
            p = producers.get(t)
            if p is None:
                continue
            fusable_producer = p.name in group_of or p.op_type in EPILOGUE_HOSTS
            if not fusable_producer:
                if p.op_type not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout", "Concat"):
                    report.blocked.append({"producer": p.label, "consumer": n.label,
                                           "reason": f"{p.op_type} has no fused form (its nest is not elementwise)"})
                continue
            if t in g.outputs or len(consumers.get(t, [])) != 1:
                report.blocked.append({"producer": p.label, "consumer": n.label,
                                       "reason": f"{t!r} is needed elsewhere ({len(consumers.get(t, []))} consumers"
                                       + (", graph output" if t in g.outputs else "") + ")"})
                continue
            read_shape = g.types[t].shape
            bad = _fusion_violations(out_shape, read_shape)
            if bad or read_shape != out_shape:
                reason = f"dependence: {bad[0]}" if bad else (
                    f"loop domains differ: {t!r} {read_shape} is read broadcast over {out_shape}")
                report.blocked.append({"producer": p.label, "consumer": n.label, "reason": reason})
                continue
            if p.name not in group_of:
                group_of[p.name] = len(groups)
                groups.append([p])
            gi = group_of[p.name]
            groups[gi].append(n)
            group_of[n.name] = gi
            joined = True
            break
        if not joined and n.name not in group_of:
            group_of[n.name] = len(groups)
            groups.append([n])
    _rewrite(g, groups, report)


def _rewrite(g: Graph, groups: list[list[Node]], report: FusionReport) -> None:
    """Replace each group of ≥ 2 nodes by one node placed where its last member was."""
    last_of = {grp[-1].name: grp for grp in groups if len(grp) > 1}
    members = {n.name for grp in groups if len(grp) > 1 for n in grp}
    nodes = []
    for n in g.nodes:
        if n.name in last_of:
            nodes.append(_group_node(g, last_of[n.name], report))
        elif n.name not in members:
            nodes.append(n)
    g.nodes = nodes


def _group_node(g: Graph, grp: list[Node], report: FusionReport) -> Node:
    head = grp[0]
    chain = [copy.copy(n) for n in (grp[1:] if head.op_type in EPILOGUE_HOSTS else grp)]
    internal = {t for n in grp for t in n.outputs}
    external: list[str] = []
    for n in chain:
        for t in n.inputs:
            if t and t not in internal and t not in external:
                external.append(t)
    final = grp[-1].outputs[0]
    report.groups.append({"nest": grp[-1].label if head.op_type not in EPILOGUE_HOSTS else head.label,
                          "ops": [n.source or n.label for n in grp],
                          "kind": "epilogue" if head.op_type in EPILOGUE_HOSTS else "elementwise"})
    if head.op_type in EPILOGUE_HOSTS:
        host = copy.copy(head)
        base = list(head.inputs) + [""] * (3 - len(head.inputs))
        host.inputs = base + external
        host.attrs = {**head.attrs, "epilogue": chain, "epilogue_acc": head.outputs[0], "epilogue_start": 3}
        host.outputs = [final]
        return host
    return Node(f"fused_{final}", ELEMENTWISE_OP, external, [final], {"body": chain}, source=grp[-1].label, opset=head.opset)


# -- pooling prologues and the remaining edges ---------------------------------------------------

POOLS = frozenset(["MaxPool", "AveragePool"])
#: consumers whose access is a sliding window over the spatial dims (isl-checked reason)
WINDOW_READERS = frozenset(["Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "LRN"])
#: consumers that reduce over whole rows/planes of their input
REDUCTION_READERS = frozenset(["Gemm", "MatMul", "GlobalAveragePool", "GlobalMaxPool", "Softmax", "LogSoftmax",
                               "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "InstanceNormalization",
                               "LayerNormalization"])
#: ops that emit no nest (storage aliases); edges through them are followed
VIEWS = frozenset(["Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"])


def _fuse_pool_prologues(g: Graph, report: FusionReport) -> None:
    """An elementwise nest (a fused chain or a single elementwise op) whose only reader is a
    MaxPool/AveragePool runs as the pool's prologue (module docstring: legality and cost)."""
    consumers = g.consumers()
    producers = g.producer_map()
    removed: set[str] = set()
    for n in g.nodes:
        if n.op_type not in POOLS or not n.inputs or "prologue" in n.attrs:
            continue
        t = n.inputs[0]
        p = producers.get(t)
        if p is None or p.name in removed:
            continue
        if p.op_type == ELEMENTWISE_OP:
            chain = list(p.attrs["body"])
        elif p.op_type in elementwise_ops() and len(p.outputs) == 1 and g.types[t].dtype == "float32":
            chain = [copy.copy(p)]
        else:
            continue  # reported by _report_edges (window read)
        if t in g.outputs or len(consumers.get(t, [])) != 1:
            report.blocked.append({"producer": p.label, "consumer": n.label,
                                   "reason": f"{t!r} is needed elsewhere ({len(consumers.get(t, []))} consumers"
                                   + (", graph output" if t in g.outputs else "") + "): no prologue"})
            continue
        n.attrs = {**n.attrs, "prologue": chain, "prologue_type": g.types[t]}
        n.inputs = [x for x in p.inputs if x] + list(n.inputs[1:])
        removed.add(p.name)
        ops = [c.source or c.label for c in chain]
        for grp in report.groups:  # the chain's own group entry becomes the pool's
            if grp["kind"] == "elementwise" and grp["nest"] in (p.label, p.source):
                report.groups.remove(grp)
                break
        report.groups.append({"nest": n.label, "ops": [*ops, n.source or n.label], "kind": "pool-prologue"})
    g.nodes = [n for n in g.nodes if n.name not in removed]


def _window_violation(size: int, kernel: int, stride: int, pad: int) -> str:
    """isl: fuse producer ``P[i]`` (writes ``T[i]``, ``0 ≤ i < size``) with a window reader
    ``C[o, j]`` (reads ``T[o*stride + j - pad]``) on one loop ``P[i] -> [i, 0]``,
    ``C[o, j] -> [o, 1, j]``; returns the first violated dependence ('' when legal)."""
    from polyml.scop.legality import violations

    out = max((size + 2 * pad - kernel) // max(stride, 1) + 1, 1)
    c_dom = f"0 <= o < {out} and 0 <= j < {kernel} and 0 <= o*{stride} + j - {pad} < {size}"

    def scop(fused: bool) -> dict:
        ps, cs = ("[i, 0, 0]", "[o, 1, j]") if fused else ("[0, i, 0]", "[1, o, j]")
        return {"context": "{  :  }", "name": "window-candidate", "arrays": [], "statements": [
            {"name": "P", "domain": f"{{ P[i] : 0 <= i < {size} }}", "schedule": f"{{ P[i] -> {ps} }}",
             "accesses": [{"kind": "write", "relation": "{ P[i] -> MemRef_T[i] }"}]},
            {"name": "C", "domain": f"{{ C[o, j] : {c_dom} }}", "schedule": f"{{ C[o, j] -> {cs} }}",
             "accesses": [{"kind": "read", "relation": f"{{ C[o, j] -> MemRef_T[o*{stride} + j - {pad}] }}"}]},
        ]}

    bad = violations(scop(False), scop(True))
    return str(bad[0]) if bad else ""


def _edge_reason(g: Graph, p: Node, c: Node, t: str, consumers: dict[str, list]) -> str:
    """Why the nests of ``p`` and ``c`` (``c`` reads ``t``) stay separate."""
    if c.op_type in WINDOW_READERS and len(g.types[t].shape) >= 3:
        ks = c.attrs.get("kernel_shape")
        if not ks and c.op_type.startswith("Conv") and len(c.inputs) > 1 and c.inputs[1] in g.types:
            ks = g.types[c.inputs[1]].shape[2:]
        kernel = int(ks[-1]) if ks else 1
        stride = int((c.attrs.get("strides") or [1])[-1])
        pads = c.attrs.get("pads") or []
        pad = int(pads[len(pads) // 2 - 1]) if pads else 0
        size = g.types[t].shape[-1]
        bad = _window_violation(size, kernel, stride, pad)
        what = (f"{c.op_type} reads {t!r} through a {kernel}-tap window (stride {stride}, pad {pad})"
                + (" and sums over all its channels" if c.op_type.startswith("Conv") else ""))
        return f"{what}; fused on one loop: {bad}" if bad else f"{what}: every output needs a whole channel range, " \
            "so the producer's nest must finish first (reduction over the input channel)"
    if c.op_type in REDUCTION_READERS:
        return f"{c.op_type} reduces over whole rows/planes of {t!r}: no output element can be computed before its producer's nest ends"
    n_cons = len(consumers.get(t, []))
    if n_cons > 1 or t in g.outputs:
        return f"{t!r} is needed elsewhere ({n_cons} consumers" + (", graph output" if t in g.outputs else "") + ")"
    if p.op_type == "Concat":
        return (f"Concat only places its inputs (in place, or copies): {c.op_type} reads the assembled {t!r}, "
                "and moving it into each input's producer would split it by slice")
    return f"{p.op_type} → {c.op_type}: no fused form for this pair"


def _report_edges(g: Graph, report: FusionReport) -> None:
    """Give every producer→consumer edge between two separate nests a ``blocked`` entry, unless
    one was already recorded (Concat consumers: the lowering reports them)."""
    producers = g.producer_map()
    consumers = g.consumers()
    seen = {(b["producer"], b["consumer"]) for b in report.blocked}
    root: dict[str, str] = {}
    for n in g.nodes:
        if n.op_type in VIEWS and n.inputs:
            root[n.outputs[0]] = n.inputs[0]
    for c in g.nodes:
        if c.op_type in VIEWS or c.op_type == "Concat":
            continue
        for t in dict.fromkeys(x for x in c.inputs if x):
            src = t
            while src in root:
                src = root[src]
            p = producers.get(src)
            if p is None or p.op_type in VIEWS or (p.label, c.label) in seen:
                continue
            seen.add((p.label, c.label))
            report.blocked.append({"producer": p.label, "consumer": c.label, "reason": _edge_reason(g, p, c, src, consumers)})
