"""polyml's graph IR: a static-shape dataflow graph of ONNX-style operators.

Frontends (ONNX, TensorFlow) produce a :class:`Graph`; the lowering walks its nodes in
topological order.  Every tensor has a static shape and a dtype; constant tensors carry their
value.  The graph is kept as a networkx ``DiGraph`` over node names (edges carry the tensor
names) so that passes that reason about producers and consumers (fusion, memory planning) can
use networkx's algorithms.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np

from polyml.errors import GraphError

#: dtypes polyml understands; data is float32, shape-like operands are int64.
DTYPES = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}


@dataclass(frozen=True)
class TensorType:
    """Static type of a tensor: a shape of non-negative ints and a numpy dtype name."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{'x'.join(map(str, self.shape))}]"


@dataclass
class Node:
    """One operator application. ``inputs`` may contain "" for an omitted optional input."""

    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: the name of the node in the source framework (for error messages and SCoP dumps)
    source: str = ""
    #: the ONNX opset the node's semantics follow (attribute defaults changed across opsets)
    opset: int = 0

    @property
    def label(self) -> str:
        """What a person calls this node: its name, or its first output when it has none."""
        return self.name or (self.outputs[0] if self.outputs else self.op_type)


@dataclass
class Graph:
    """A model: nodes in topological order, typed tensors, constants and the interface."""

    name: str
    nodes: list[Node]
    types: dict[str, TensorType]
    constants: dict[str, np.ndarray]
    inputs: list[str]
    outputs: list[str]

    def producer_map(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs if out}

    def consumers(self) -> dict[str, list[Node]]:
        uses: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    uses.setdefault(i, []).append(n)
        return uses

    def to_networkx(self) -> nx.DiGraph:
        """Producer→consumer graph over node names; edge attribute ``tensors`` lists the names."""
        g = nx.DiGraph()
        producers = self.producer_map()
        for n in self.nodes:
            g.add_node(n.name, node=n)
        for n in self.nodes:
            for t in n.inputs:
                p = producers.get(t)
                if p is not None:
                    if g.has_edge(p.name, n.name):
                        g.edges[p.name, n.name]["tensors"].append(t)
                    else:
                        g.add_edge(p.name, n.name, tensors=[t])
        return g

    def toposort(self) -> None:
        """Reorder ``nodes`` topologically (stable: keeps the file's order where it can)."""
        g = self.to_networkx()
        if not nx.is_directed_acyclic_graph(g):
            cycle = nx.find_cycle(g)
            raise GraphError(f"graph has a cycle through nodes {[e[0] for e in cycle]}")
        order = {n.name: i for i, n in enumerate(self.nodes)}
        names = list(nx.lexicographical_topological_sort(g, key=lambda k: order[k]))
        by_name = {n.name: n for n in self.nodes}
        self.nodes = [by_name[k] for k in names]

    def prune(self) -> None:
        """Drop nodes and constants that no graph output depends on."""
        producers = self.producer_map()
        live: set[str] = set()
        stack = list(self.outputs)
        while stack:
            t = stack.pop()
            if t in live:
                continue
            live.add(t)
            p = producers.get(t)
            if p is not None:
                stack.extend(i for i in p.inputs if i)
        self.nodes = [n for n in self.nodes if any(o in live for o in n.outputs)]
        self.constants = {k: v for k, v in self.constants.items() if k in live}

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for n in self.nodes:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        body = ", ".join(f"{k}×{v}" for k, v in sorted(ops.items()))
        return f"graph {self.name!r}: {len(self.nodes)} nodes ({body})"
