"""Floating-point operation counts of a graph's compute-bound ops (for GFLOP/s figures)."""

from __future__ import annotations

from polyml.graph import Graph


def graph_flops(graph: Graph) -> float:
    """2 × multiply-adds of Conv, Gemm and MatMul nodes (the usual GFLOP convention)."""
    total = 0.0
    for n in graph.nodes:
        if n.op_type == "Conv":
            w = graph.types[n.inputs[1]].shape
            total += 2.0 * graph.types[n.outputs[0]].size * w[1] * _prod(w[2:])
        elif n.op_type == "Gemm":
            a = graph.types[n.inputs[0]].shape
            k = a[0] if n.attrs.get("transA", 0) else a[1]
            total += 2.0 * graph.types[n.outputs[0]].size * k
        elif n.op_type == "MatMul":
            k = graph.types[n.inputs[0]].shape[-1]
            total += 2.0 * graph.types[n.outputs[0]].size * k
    return total


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p
