"""Floating-point operation counts of a graph's compute-bound ops (for GFLOP/s figures)."""

from __future__ import annotations

from collections.abc import Mapping

from polyml.graph import Graph, Node, TensorType


def graph_flops(graph: Graph) -> float:
    """2 × multiply-adds of the products and convolutions (the usual GFLOP convention)."""
    return sum(node_flops(graph.types, n) for n in graph.nodes)


def node_flops(types: Mapping[str, TensorType], n: Node) -> float:
    """2 × multiply-adds of one Conv, ConvTranspose, Gemm, MatMul, Einsum, fused attention or
    fused expansion and depthwise node (0 for other ops)."""
    if n.op_type == "Conv":
        w = types[n.inputs[1]].shape
        return 2.0 * types[n.outputs[0]].size * w[1] * _prod(w[2:])
    if n.op_type == "Gemm":
        a = types[n.inputs[0]].shape
        k = a[0] if n.attrs.get("transA", 0) else a[1]
        return 2.0 * types[n.outputs[0]].size * k
    if n.op_type == "MatMul":
        return 2.0 * types[n.outputs[0]].size * types[n.inputs[0]].shape[-1]
    if n.op_type == "ConvTranspose":
        w = types[n.inputs[1]].shape  # (C_in, C_out / group, k...)
        return 2.0 * types[n.inputs[0]].size * w[1] * _prod(w[2:])
    if n.op_type == "polyml.Attention":  # Q·Kᵀ then P·V
        q, v, o = types[n.inputs[0]].shape, types[n.inputs[2]].shape, types[n.outputs[0]]
        return 2.0 * _prod(q) * v[-2] + 2.0 * o.size * v[-2]
    if n.op_type == "polyml.DepthwiseProduct":  # the 1x1 expansion, then the depthwise Conv
        x, w_e, w_d = types[n.inputs[0]], types[n.inputs[1]].shape, types[n.inputs[3]].shape
        return 2.0 * x.size * w_e[0] + 2.0 * types[n.outputs[0]].size * _prod(w_d[2:])
    if n.op_type == "Einsum" and len([i for i in n.inputs if i]) == 2:
        return 2.0 * _prod(_einsum_sizes(n, types).values())
    return 0.0


def _einsum_sizes(n: Node, types: Mapping[str, TensorType]) -> dict[str, int]:
    """Each label's extent (``...`` counted as one label per broadcast dim)."""
    lhs = str(n.attrs.get("equation", "")).replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for term, t in zip(lhs.split(","), n.inputs):
        shape = types[t].shape
        if "..." in term:
            head, tail = term.split("...")
            labels = list(head) + [f"...{i}" for i in range(len(shape) - len(head) - len(tail))] + list(tail)
        else:
            labels = list(term)
        for label, d in zip(labels, shape):
            sizes[label] = max(sizes.get(label, 1), int(d))
    return sizes


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p
