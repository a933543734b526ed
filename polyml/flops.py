"""Floating-point operation counts of a graph's compute-bound ops (for GFLOP/s figures)."""

from __future__ import annotations

from collections.abc import Mapping

from polyml.graph import Graph, Node, TensorType


def graph_flops(graph: Graph) -> float:
    """2 × multiply-adds of Conv, Gemm and MatMul nodes (the usual GFLOP convention)."""
    return sum(node_flops(graph.types, n) for n in graph.nodes)


def node_flops(types: Mapping[str, TensorType], n: Node) -> float:
    """2 × multiply-adds of one Conv, Gemm or MatMul node (0 for other ops)."""
    if n.op_type == "Conv":
        w = types[n.inputs[1]].shape
        return 2.0 * types[n.outputs[0]].size * w[1] * _prod(w[2:])
    if n.op_type == "Gemm":
        a = types[n.inputs[0]].shape
        k = a[0] if n.attrs.get("transA", 0) else a[1]
        return 2.0 * types[n.outputs[0]].size * k
    if n.op_type == "MatMul":
        return 2.0 * types[n.outputs[0]].size * types[n.inputs[0]].shape[-1]
    return 0.0


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p
