"""GraphDef → polyml :class:`~polyml.graph.Graph`: which nodes to translate, in which order, and
how TF tensors are held in the IR (layout tracking).  The per-op work is done by the converters
of :mod:`polyml.frontends.tensorflow.convert`; the exact rewrites that follow are in
:mod:`polyml.frontends.tensorflow.rewrites`.

Interface
    Inputs are the Placeholders the outputs depend on, named by their node names; an unknown
    batch (first) dimension becomes 1, other unknown dimensions must be given with
    ``input_shapes`` (``--input-shape NAME=1x224x224x3``).  Outputs are ``outputs`` or the
    graph's sinks: nodes no data edge reads, other than NoOp, Const, Placeholder and nodes read
    only through control edges.  Output 0 of node ``X`` is the IR tensor ``X`` (so npz keys are
    node names: ``input``, ``Identity``), output ``k > 0`` is ``X:k``; ``X:0`` is accepted for
    ``X`` wherever a name is given.  IR node names are the TF node names; nodes the translation
    adds (layout transposes, the second half of a decomposed op) are named ``X#what``.

Constants
    Nodes whose data inputs are all constants are evaluated with numpy at import (the
    Keras 3 batch-norm arithmetic on frozen variables, shape computations, folded Reshapes),
    and so are shape-only ops of tensors with static shapes (Shape, ZerosLike, ...).

Layout
    TensorFlow is NHWC, polyml's Conv and pooling kernels are NCHW.  Each TF tensor is held in
    the IR with a permutation of its dimensions (``IR = np.transpose(TF, perm)``): a Conv2D
    produces its output in NCHW and the layout is carried through elementwise ops, pads,
    reductions, concatenations and TF Transposes (absorbed into the permutation); constant
    operands are permuted at compile time.  A Transpose is emitted only where an op needs TF's
    element order (Reshape, ExpandDims, MatMul, a graph output) and the permutation moves a
    dimension larger than 1.  ``layout="nhwc"`` instead converts back to NHWC after every
    layout-bound op (the measured alternative, see docs/TENSORFLOW.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import numpy as np

from polyml.errors import GraphError, PolymlError, ShapeError, UnsupportedError
from polyml.frontends.tensorflow.convert import patterns
from polyml.frontends.tensorflow.convert import registry as converters
from polyml.frontends.tensorflow.loader import TF_DTYPE_NAMES, TF_DTYPES, attr_value
from polyml.frontends.tensorflow.rewrites import optimize
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, split_name, tensor_name
from polyml.graph import Graph, TensorType

#: sinks that are not outputs
NOT_OUTPUTS = {"NoOp", "Const", "Placeholder", "Assert", "SaveV2", "RestoreV2"}


class Importer(TFValues):
    """One GraphDef → Graph translation (see the module docstring)."""

    def __init__(self, gd, name: str, input_shapes: Mapping[str, Sequence[int]] | None,
                 outputs: Sequence[str] | None, layout: str):
        super().__init__(gd, name, input_shapes, outputs, layout)
        self.converters = converters()
        self.patterns = patterns()

    # -- graph structure ---------------------------------------------------------------------
    def sinks(self) -> list[str]:
        data_read: set[str] = set()
        control_read: set[str] = set()
        for n in self.gd.node:
            for t in n.input:
                if t.startswith("^"):
                    control_read.add(t[1:])
                else:
                    data_read.add(split_name(t)[0])
        return [n.name for n in self.gd.node
                if n.name not in data_read and n.op not in NOT_OUTPUTS and n.name not in control_read]

    def output_tensors(self) -> list[str]:
        if self.requested is None:
            outs = self.sinks()
            if not outs:
                raise GraphError(f"graph {self.name!r} has no output (no sink other than NoOp/Const/Placeholder nodes); "
                                 "name them with --outputs")
            return outs
        bad = [o for o in self.requested if split_name(o)[0] not in self.by_name]
        if bad:
            raise GraphError(f"outputs {bad} name no node of the graph; its sinks are {self.sinks()[:10]}")
        return list(dict.fromkeys(self.requested))

    def needed_order(self, outs: list[str]) -> list:
        """The nodes the outputs depend on (data edges), in topological order."""
        needed: set[str] = set()
        stack = [split_name(o)[0] for o in outs]
        while stack:
            n = stack.pop()
            if n in needed:
                continue
            needed.add(n)
            stack.extend(split_name(t)[0] for t in self.by_name[n].input if not t.startswith("^"))
        order_idx = {n.name: i for i, n in enumerate(self.gd.node)}
        deps = {n: {split_name(t)[0] for t in self.by_name[n].input if not t.startswith("^")} for n in needed}
        users: dict[str, list[str]] = {n: [] for n in needed}
        for n, ds in deps.items():
            for d in ds:
                users[d].append(n)
        ready = [(order_idx[n], n) for n, ds in deps.items() if not ds]
        heapq.heapify(ready)
        remaining = {n: len(ds) for n, ds in deps.items()}
        order = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(self.by_name[n])
            for u in users[n]:
                remaining[u] -= 1
                if remaining[u] == 0:
                    heapq.heappush(ready, (order_idx[u], u))
        if len(order) != len(needed):
            cyc = sorted((n for n in needed if remaining[n] > 0), key=order_idx.get)
            ops = {n: self.by_name[n].op for n in sorted(needed, key=order_idx.get)}
            bad = [(n, op, "no lowering for this op type" + (" (in a cycle: control flow)" if n in cyc else ""))
                   for n, op in ops.items() if op not in self.converters and op != "Placeholder"]
            if bad:
                raise UnsupportedError(bad)
            raise GraphError(f"graph has a cycle through nodes {cyc[:8]}")
        return order

    # -- the conversion loop -----------------------------------------------------------------
    def placeholders(self, order: list) -> None:
        unused = sorted(set(self.input_shapes) - {n.name for n in order if n.op == "Placeholder"})
        if unused:
            names = [n.name for n in self.gd.node if n.op == "Placeholder"]
            raise GraphError(f"--input-shape names {unused}, which are not inputs the outputs depend on "
                             f"(Placeholders: {names})")
        dynamic = []
        for n in order:
            if n.op != "Placeholder":
                continue
            dt = n.attr["dtype"].type if "dtype" in n.attr else 1
            if dt not in TF_DTYPES or TF_DTYPES[dt].kind == "O":
                self.problems.append((n.name, n.op, f"inputs of dtype {TF_DTYPE_NAMES.get(dt, dt)} are not supported"))
                self.unknown.add(n.name)
                continue
            dtype = "float32" if dt == 14 else TF_DTYPES[dt].name
            dims = attr_value(n.attr["shape"]) if "shape" in n.attr else None
            if n.name in self.input_shapes:
                shape = self.input_shapes[n.name]
                if dims is not None and len(dims) != len(shape):
                    raise ShapeError(f"--input-shape {n.name}={'x'.join(map(str, shape))}: the Placeholder has rank "
                                     f"{len(dims)} (shape {dims})")
            elif dims is None:
                dynamic.append(f"{n.name} (unknown rank)")
                continue
            else:
                if dims and dims[0] < 0:
                    dims = [1, *dims[1:]]
                if any(d < 0 for d in dims):
                    dynamic.append(f"{n.name} {['?' if d < 0 else d for d in dims]}")
                    continue
                shape = tuple(dims)
            self.types[n.name] = TensorType(tuple(shape), dtype)
            self.inputs.append(n.name)
            self.node_names.add(n.name)
            self.vals[n.name] = Val(n.name)
        if dynamic:
            raise ShapeError(
                "polyml compiles static shapes; these Placeholders have unknown dimensions besides the batch "
                "dimension: " + "; ".join(dynamic) + ". Fix them with input_shapes / --input-shape NAME=1x224x224x3."
            )

    def convert(self, n) -> None:
        data = [tensor_name(t) for t in n.input if not t.startswith("^")]
        if n.op == "Placeholder":
            return
        if any(t in self.unknown for t in data):
            if n.op not in self.converters:
                self.problems.append((n.name, n.op, "no lowering for this op type"))
            self.unknown.update(self._outputs_of(n))
            return
        missing = [t for t in data if t not in self.vals]
        self.cur, self.main_done = n, False
        try:
            if missing:
                raise Unsupported(f"reads {missing}, an output polyml does not compute (only output 0 of "
                                  f"{sorted({self.by_name[split_name(t)[0]].op for t in missing})} is supported)")
            results = None
            for pat in self.patterns.get(n.op, ()):
                results = pat(self, n, data)
                if results is not None:
                    break
            if results is None:
                fn = self.converters.get(n.op)
                if fn is None:
                    raise Unsupported("no lowering for this op type")
                results = fn(self, n, data)
            for i, r in enumerate(results):
                if r is not None:
                    self.vals[n.name if i == 0 else f"{n.name}:{i}"] = r
        except Unsupported as e:
            self.problems.append((n.name, n.op, str(e)))
            self.unknown.update(self._outputs_of(n))
        except PolymlError as e:
            if isinstance(e, UnsupportedError) or repr(n.name) in str(e):
                raise
            raise type(e)(f"{n.op} node {n.name!r}: {e}") from None
        finally:
            self.cur = None

    def _outputs_of(self, n) -> list[str]:
        return [n.name] + [f"{n.name}:{i}" for i in range(1, 8)]

    def run(self) -> Graph:
        outs = self.output_tensors()
        order = self.needed_order(outs)
        self.placeholders(order)
        for n in order:
            self.convert(n)
        if self.problems:
            raise UnsupportedError(self.problems)
        for t in outs:
            if t not in self.vals:
                raise GraphError(f"output {t!r} is not computed by node {split_name(t)[0]!r} "
                                 f"({self.by_name[split_name(t)[0]].op}; only its output 0 is supported)")
            self.graph_output(t)
        graph = Graph(self.name, self.nodes, self.types, self.constants, self.inputs, outs)
        optimize(graph)
        graph.prune()
        return graph

    def graph_output(self, t: str) -> None:
        """Make the IR tensor named ``t`` hold TF tensor ``t`` in TF order."""
        v = self.vals[t]
        node = self.by_name[split_name(t)[0]]
        self.cur, self.main_done = node, False
        try:
            if isinstance(v, np.ndarray):
                if t in self.types:
                    if t in self.constants and np.array_equal(self.constants[t], v):
                        return
                    raise GraphError(f"output name {t!r} clashes with another tensor")
                self.const(v, t)
                return
            if v.perm is None and v.name == t:
                return
            src = v.name if v.perm is None else self.ir(t, None)
            if src == t:
                return
            self.emit("Identity", [src], main=True, out=t)
        finally:
            self.cur = None
