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
from dataclasses import dataclass

import numpy as np

from polyml.errors import GraphError, PolymlError, ShapeError, UnsupportedError
from polyml.frontends.tensorflow.convert import Unsupported, patterns
from polyml.frontends.tensorflow.convert import registry as converters
from polyml.frontends.tensorflow.loader import TF_DTYPE_NAMES, TF_DTYPES, attr_value
from polyml.frontends.tensorflow.rewrites import optimize
from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Operand, registry

#: the ONNX opset whose attribute conventions the emitted nodes follow
OPSET = 18
#: the permutation holding an NHWC tensor in NCHW order (IR dim i is TF dim NCHW[i])
NCHW = (0, 3, 1, 2)
LAYOUTS = ("nchw", "nhwc")
#: sinks that are not outputs
NOT_OUTPUTS = {"NoOp", "Const", "Placeholder", "Assert", "SaveV2", "RestoreV2"}


@dataclass(frozen=True)
class Val:
    """A TF tensor held in the IR: ``IR tensor = np.transpose(TF tensor, perm)`` (None: same order)."""

    name: str
    perm: tuple[int, ...] | None = None


Value = Val | np.ndarray


def norm_perm(p: Sequence[int] | None) -> tuple[int, ...] | None:
    if p is None:
        return None
    p = tuple(int(i) for i in p)
    return None if p == tuple(range(len(p))) else p


def compose(p: tuple[int, ...] | None, rank: int) -> tuple[int, ...]:
    return p if p is not None else tuple(range(rank))


def drop_dims(perm: tuple[int, ...] | None, ir_axes: Sequence[int]) -> tuple[int, ...] | None:
    """The permutation left after removing IR dims ``ir_axes`` (and their TF dims)."""
    if perm is None:
        return None
    rest = [perm[i] for i in range(len(perm)) if i not in ir_axes]
    order = sorted(rest)
    return norm_perm([order.index(t) for t in rest])


def tag(perm: tuple[int, ...]) -> str:
    return "nchw" if perm == NCHW else "p" + "".join(map(str, perm))


def tensor_name(t: str) -> str:
    """Canonical TF tensor name: ``X`` for ``X:0``, ``X:k`` otherwise."""
    base, sep, idx = t.rpartition(":")
    if sep and idx.isdigit():
        return base if idx == "0" else t
    return t


def split_name(t: str) -> tuple[str, int]:
    base, sep, idx = t.rpartition(":")
    if sep and idx.isdigit():
        return base, int(idx)
    return t, 0


class Importer:
    """One GraphDef → Graph translation (see the module docstring)."""

    def __init__(self, gd, name: str, input_shapes: Mapping[str, Sequence[int]] | None,
                 outputs: Sequence[str] | None, layout: str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        self.gd = gd
        self.layout = layout
        self.name = name
        self.kernels = registry()
        self.converters = converters()
        self.patterns = patterns()
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.inputs: list[str] = []
        self.vals: dict[str, Value] = {}
        self.unknown: set[str] = set()
        self.problems: list[tuple[str, str, str]] = []
        self.node_names: set[str] = set()
        self.cache: dict[tuple, str] = {}
        self.cur = None  # the NodeDef being converted
        self.main_done = False
        self.by_name = {n.name: n for n in gd.node}
        self.readers: dict[str, list] = {}
        for n in gd.node:
            for t in n.input:
                if not t.startswith("^"):
                    self.readers.setdefault(tensor_name(t), []).append(n)
        #: SpaceToBatchND nodes of the dilated-convolution pattern → (input, dilations, pads)
        self.s2b: dict[str, tuple[str, list[int], list[int]]] = {}
        #: Conv nodes of that pattern whose BatchToSpaceND passes their output through
        self.b2s: set[str] = set()
        self.input_shapes = {split_name(k)[0]: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
        self.requested = [tensor_name(o) for o in outputs] if outputs else None

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

    # -- values and IR emission --------------------------------------------------------------
    def is_const(self, t: str) -> bool:
        return isinstance(self.vals[t], np.ndarray)

    def value(self, t: str) -> np.ndarray:
        v = self.vals[t]
        if not isinstance(v, np.ndarray):
            raise Unsupported(f"input {t!r} must be a compile-time constant")
        return v

    def tf_shape(self, t: str) -> tuple[int, ...]:
        v = self.vals[t]
        if isinstance(v, np.ndarray):
            return tuple(v.shape)
        s = self.types[v.name].shape
        if v.perm is None:
            return s
        out = [0] * len(s)
        for i, p in enumerate(v.perm):
            out[p] = s[i]
        return tuple(out)

    def dtype(self, t: str) -> str:
        v = self.vals[t]
        return v.dtype.name if isinstance(v, np.ndarray) else self.types[v.name].dtype

    def new_node_name(self, what: str) -> str:
        base = f"{self.cur.name}#{what}" if self.cur is not None else f"polyml#{what}"
        name, i = base, 1
        while name in self.node_names:
            i += 1
            name = f"{base}{i}"
        return name

    def new_tensor_name(self, base: str) -> str:
        name, i = base, 1
        while name in self.types:
            i += 1
            name = f"{base}#{i}"
        return name

    def const(self, arr: np.ndarray, hint: str) -> str:
        """Register a constant IR tensor (named ``hint`` or ``hint#k``)."""
        name = self.new_tensor_name(hint)
        arr = np.ascontiguousarray(arr)
        self.constants[name] = arr
        self.types[name] = TensorType(tuple(int(d) for d in arr.shape), arr.dtype.name)
        return name

    def ir(self, t: str, perm: tuple[int, ...] | None = None) -> str:
        """The IR tensor holding TF tensor ``t`` in layout ``perm`` (transposing where needed)."""
        perm = norm_perm(perm)
        key = (t, perm)
        if key in self.cache:
            return self.cache[key]
        v = self.vals[t]
        if isinstance(v, np.ndarray):
            arr = v if perm is None else np.transpose(v, perm)
            name = self.const(arr, t if perm is None else f"{t}#{tag(perm)}")
        elif v.perm == perm:
            name = v.name
        else:
            rank = len(self.types[v.name].shape)
            cur, want = compose(v.perm, rank), compose(perm, rank)
            q = [cur.index(want[i]) for i in range(rank)]
            out = t if perm is None else f"{t}#{tag(perm)}"
            what = f"to_{'tf' if perm is None else tag(perm)}"
            shape = self.types[v.name].shape
            big = [i for i in q if shape[i] != 1]
            if big == sorted(big):  # only size-1 dims move: the same elements in the same order, a view
                target = self.const(np.array([shape[i] for i in q], np.int64), "shape")
                name = self.emit("Reshape", [v.name, target], what=what, out=self.new_tensor_name(out))
            else:
                name = self.emit("Transpose", [v.name], {"perm": q}, what=what, out=self.new_tensor_name(out))
        self.cache[key] = name
        return name

    def tf_order(self, t: str) -> str:
        """An IR tensor with ``t``'s elements in TF's row-major order (a view where the
        permutation only moves size-1 dimensions)."""
        v = self.vals[t]
        if isinstance(v, Val) and v.perm is not None:
            shape = self.types[v.name].shape
            big = [v.perm[i] for i in range(len(shape)) if shape[i] != 1]
            if big == sorted(big):
                return v.name
        return self.ir(t, None)

    def emit(self, op: str, inputs: list[str], attrs: dict | None = None, *, main: bool = False,
             perm: tuple[int, ...] | None = None, what: str | None = None, out: str | None = None) -> str:
        """Append an IR node (shape-inferred by its kernel) and return its output tensor.

        ``main``: the node that computes the TF node's output 0 (named like the TF node; its
        output is the TF tensor name, with a layout tag where ``perm`` is not the identity).
        """
        kernel = self.kernels.get(op)
        assert kernel is not None, op
        src = self.cur.name if self.cur is not None else ""
        if main and not self.main_done and self.cur is not None and self.cur.name not in self.node_names:
            name = self.cur.name
            self.main_done = True
            base = self.cur.name if perm is None else f"{self.cur.name}#{tag(perm)}"
            out = out or self.new_tensor_name(base)
        else:
            name = self.new_node_name(what or op.lower())
            out = out or self.new_tensor_name(name)
        node = Node(name, op, list(inputs), [out], dict(attrs or {}), src, OPSET)
        ops = [Operand(t, self.types[t], self.constants.get(t)) if t else None for t in inputs]
        why = kernel.supports(node, ops)
        if why:
            raise Unsupported(why)
        tt = kernel.infer(node, ops)[0]  # optional further outputs (LayerNormalization's Mean, ...) are not used
        self.types[out] = TensorType(tuple(int(d) for d in tt.shape), tt.dtype)
        self.node_names.add(name)
        self.nodes.append(node)
        return out

    def finish(self, name: str, perm: tuple[int, ...] | None) -> Val:
        """The Val of a layout-bound op's output: kept in ``perm`` (``nchw`` layout) or
        transposed back to TF order at once (``nhwc``)."""
        perm = norm_perm(perm)
        if perm is None or self.layout == "nchw":
            return Val(name, perm)
        back = [perm.index(i) for i in range(len(perm))]
        return Val(self.emit("Transpose", [name], {"perm": back}, what="to_tf", out=self.new_tensor_name(self.cur.name)))

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
