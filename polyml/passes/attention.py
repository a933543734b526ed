"""Attention fusion: ``MatMul → elementwise chain (scale, mask) → Softmax → MatMul`` of each head
becomes one ``polyml.Attention`` nest (:mod:`polyml.kernels.attention`).

Polyhedral view.  With ``z`` the flattened batch × head index, the three nests are
``S1[z, i, j, d]`` (``Sc[z, i, j] += Q[z, i, d]·K'[z, d, j]``), ``S2[z, i, j, j']`` (chain and
softmax: ``P[z, i, j]`` from the whole row ``Sc[z, i, j']``) and ``S3[z, i, e, j]``
(``O[z, i, e] += P[z, i, j]·V[z, j, e]``).  The sequential schedule runs them one after
another over all heads; the fused one ``S1 -> [z, 0, i, j, d]``, ``S2 -> [z, 1, i, j, j']``,
``S3 -> [z, 2, i, e, j]`` runs all three per head.  The pass asks isl
(:func:`polyml.scop.legality.violations`) whether every flow, anti and output dependence of the
sequential schedule still runs source before target, and fuses only then; the score and
probability arrays are then contracted to one tile per thread.

What matches: a Softmax along the last axis whose probabilities reach a MatMul's left operand,
directly or through elementwise ops read nowhere else (the exporters' ``Where(IsNaN(p), 0, p)``
guard of fully masked rows); between the Softmax and a first MatMul, a chain of elementwise float ops each read
only by the next, whose other inputs broadcast into the score shape (a scalar scale, an additive
or ``Where`` mask); the first MatMul's right operand may come from a Transpose of the last two
axes read by nothing else (then K is read in place, transposed).  Q, K and V must have the
score's batch dimensions exactly (no broadcasting of heads).  Every candidate that does not
fuse is reported with its reason.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

from polyml.graph import Graph, Node
from polyml.kernels.attention import ATTENTION_OP
from polyml.kernels.elementwise import elementwise_ops
from polyml.passes.graph import GraphPass, GraphReport, register_graph_pass

SOFTMAX = "Softmax"


@dataclass
class Candidate:
    """The nodes of one head's attention, from the scores product to the output product."""

    scores: Node  # MatMul Q·K'
    chain: list[Node]  # elementwise ops between the scores and the softmax
    softmax: Node
    post: list[Node]  # elementwise ops between the softmax and the second product (NaN guards)
    output: Node  # MatMul P·V
    transpose: Node | None  # Transpose producing K' from K (absorbed), if any
    k_transposed: bool = False


def legality_violations(z: int, s: int, sk: int, d: int, dv: int) -> list[str]:
    """isl: fusing the three nests per head (module docstring) breaks no dependence; returns
    the violated dependences (empty: legal)."""
    from polyml.scop.legality import violations

    doms = {
        "S1": f"0 <= z < {z} and 0 <= i < {s} and 0 <= j < {sk} and 0 <= d < {d}",
        "S2": f"0 <= z < {z} and 0 <= i < {s} and 0 <= j < {sk} and 0 <= jj < {sk}",
        "S3": f"0 <= z < {z} and 0 <= i < {s} and 0 <= e < {dv} and 0 <= j < {sk}",
    }

    def scop(fused: bool) -> dict:
        t = ({"S1": "[z, 0, i, j, d]", "S2": "[z, 1, i, j, jj]", "S3": "[z, 2, i, e, j]"} if fused else
             {"S1": "[0, z, i, j, d]", "S2": "[1, z, i, j, jj]", "S3": "[2, z, i, e, j]"})
        return {"context": "{  :  }", "name": "attention-candidate", "arrays": [], "statements": [
            {"name": "S1", "domain": f"{{ S1[z, i, j, d] : {doms['S1']} }}", "schedule": f"{{ S1[z, i, j, d] -> {t['S1']} }}",
             "accesses": [{"kind": "read", "relation": "{ S1[z, i, j, d] -> MemRef_Sc[z, i, j] }"},
                          {"kind": "write", "relation": "{ S1[z, i, j, d] -> MemRef_Sc[z, i, j] }"}]},
            {"name": "S2", "domain": f"{{ S2[z, i, j, jj] : {doms['S2']} }}", "schedule": f"{{ S2[z, i, j, jj] -> {t['S2']} }}",
             "accesses": [{"kind": "read", "relation": "{ S2[z, i, j, jj] -> MemRef_Sc[z, i, jj] }"},
                          {"kind": "write", "relation": "{ S2[z, i, j, jj] -> MemRef_P[z, i, j] }"}]},
            {"name": "S3", "domain": f"{{ S3[z, i, e, j] : {doms['S3']} }}", "schedule": f"{{ S3[z, i, e, j] -> {t['S3']} }}",
             "accesses": [{"kind": "read", "relation": "{ S3[z, i, e, j] -> MemRef_P[z, i, j] }"},
                          {"kind": "read", "relation": "{ S3[z, i, e, j] -> MemRef_O[z, i, e] }"},
                          {"kind": "write", "relation": "{ S3[z, i, e, j] -> MemRef_O[z, i, e] }"}]},
        ]}

    return [str(v) for v in violations(scop(False), scop(True))]


@register_graph_pass
@dataclass(frozen=True)
class FuseAttention(GraphPass):
    """Each head's MatMul → chain → Softmax → MatMul becomes one nest."""

    name: ClassVar[str] = "attention"

    def rewrite(self, g: Graph) -> GraphReport:
        """Rewrite ``g`` in place; the fused heads and the refusals are the report."""
        report = GraphReport(passes=[self.name])
        replaced: dict[str, Node] = {}  # output MatMul name -> fused node
        removed: set[str] = set()
        for sm in g.nodes:
            if sm.op_type != SOFTMAX:
                continue
            cand, why = self._match(g, sm)
            if cand is None:
                if why:
                    report.blocked.append({"producer": why[0], "consumer": why[1], "reason": f"attention not fused: {why[2]}"})
                continue
            fused = self._fuse(g, cand, report)
            if fused is None:
                continue
            replaced[cand.output.name] = fused
            removed.update(n.name for n in (cand.scores, *cand.chain, cand.softmax, *cand.post))
            if cand.transpose is not None:
                removed.add(cand.transpose.name)
        if replaced:
            g.nodes = [replaced.get(n.name, n) for n in g.nodes if n.name not in removed]
        return report

    def _match(self, g: Graph, sm: Node) -> tuple[Candidate | None, tuple[str, str, str] | None]:
        producers, consumers = g.producer_map(), g.consumers()

        def only_reader(t: str) -> Node | None:
            users = consumers.get(t, [])
            return users[0] if len(users) == 1 and t not in g.outputs else None

        p = sm.outputs[0]
        shape = g.types[p].shape
        axis = int(sm.attrs.get("axis", -1))
        if len(shape) < 2 or axis not in (-1, len(shape) - 1):
            return None, None
        ew = elementwise_ops()
        post, out = self._post_chain(g, p, ew)
        if out is None:
            return None, (sm.label, p, "the probabilities are not read by exactly one MatMul as its left operand "
                                       "(directly or through elementwise ops read nowhere else)")
        chain: list[Node] = []
        t = sm.inputs[0]
        while True:
            n = producers.get(t)
            if n is None:
                return None, None
            if only_reader(t) is None:
                return None, (n.label, sm.label, f"{t!r} is read by other nodes too, so the scores must be stored")
            if n.op_type == "MatMul":
                break
            if n.op_type not in ew or g.types[n.outputs[0]].dtype != "float32":
                return None, None  # not an attention chain
            # the chain value must flow through exactly one input; the others broadcast into it
            flows = [x for x in n.inputs if x and g.types[x].shape == shape and producers.get(x) is not None
                     and (producers[x].op_type == "MatMul" or producers[x].op_type in ew)]
            if len(flows) != 1:
                return None, (n.label, sm.label, f"{n.op_type} combines several score-shaped tensors")
            chain.insert(0, n)
            t = flows[0]
        scores = producers[t]
        q, kt = scores.inputs[0], scores.inputs[1]
        transpose = producers.get(kt)
        rank = len(shape)
        k_transposed = False
        if (transpose is not None and transpose.op_type == "Transpose" and only_reader(kt) is scores
                and list(transpose.attrs.get("perm", [])) == [*range(rank - 2), rank - 1, rank - 2]):
            k_transposed = True
        else:
            transpose = None
        v = out.inputs[1]
        key = transpose.inputs[0] if k_transposed else kt
        batch = shape[:-2]
        for name in (q, key, v):
            if g.types[name].shape[:-2] != batch or g.types[name].dtype != "float32":
                return None, (scores.label, out.label, f"{name!r} {g.types[name]} does not have the scores' batch dims {batch}")
        return Candidate(scores, chain, sm, post, out, transpose, k_transposed), None

    @staticmethod
    def _post_chain(g: Graph, p: str, ew: frozenset[str]) -> tuple[list[Node], Node | None]:
        """The elementwise ops from the probabilities ``p`` to the second product's left operand
        (exporters guard fully masked rows with ``Where(IsNaN(p), 0, p)``), in graph order, and
        that product; ``([], None)`` unless every op's outputs stay inside this set."""
        consumers = g.consumers()
        inside: list[Node] = []
        names: set[str] = set()
        frontier = [p]
        end: Node | None = None
        while frontier:
            t = frontier.pop()
            if t in g.outputs:
                return [], None
            for n in consumers.get(t, []):
                if n.op_type == "MatMul" and n.inputs[0] == t and n.inputs[1] != t:
                    if end is not None and end is not n:
                        return [], None
                    end = n
                elif n.op_type in ew and n.name not in names:
                    names.add(n.name)
                    inside.append(n)
                    frontier.extend(o for o in n.outputs if o)
                elif n.name not in names:
                    return [], None
        if end is None:
            return [], None
        produced = {o for n in inside for o in n.outputs} | {p}
        if end.inputs[0] not in produced or g.types[end.inputs[0]].dtype != "float32":
            return [], None
        order = {n.name: i for i, n in enumerate(g.nodes)}
        inside.sort(key=lambda n: order[n.name])
        if inside and inside[-1].outputs[0] != end.inputs[0]:
            return [], None
        return inside, end

    def _fuse(self, g: Graph, c: Candidate, report: GraphReport) -> Node | None:
        kt = c.k_transposed
        q = c.scores.inputs[0]
        key = c.transpose.inputs[0] if kt else c.scores.inputs[1]
        v = c.output.inputs[1]
        qs, vs, ss = g.types[q].shape, g.types[v].shape, g.types[c.softmax.outputs[0]].shape
        z = 1
        for n in ss[:-2]:
            z *= n
        bad = legality_violations(z, ss[-2], ss[-1], qs[-1], vs[-1])
        if bad:
            report.blocked.append({"producer": c.scores.label, "consumer": c.output.label,
                                   "reason": f"attention not fused: {bad[0]}"})
            return None
        internal = {c.scores.outputs[0], c.softmax.outputs[0], *(n.outputs[0] for n in (*c.chain, *c.post))}
        side: list[str] = []
        for n in (*c.chain, *c.post):
            for t in n.inputs:
                if t and t not in internal and t not in side:
                    side.append(t)
        members = [c.scores, *([c.transpose] if c.transpose else []), *c.chain, c.softmax, *c.post, c.output]
        report.groups.append({"nest": c.output.label, "ops": [n.source or n.label for n in members], "kind": "attention"})
        return Node(f"attention_{c.output.name}", ATTENTION_OP, [q, key, v, *side], list(c.output.outputs),
                    {"k_transposed": kt, "chain": [copy.copy(n) for n in c.chain], "acc": c.scores.outputs[0],
                     "post": [copy.copy(n) for n in c.post], "probabilities": c.softmax.outputs[0]},
                    source=c.output.label, opset=c.output.opset)
