"""TensorFlow frontend: a frozen GraphDef (``.pb`` binary, ``.pbtxt`` text) → polyml's graph IR.

Reading needs no TensorFlow: the GraphDef schema comes from ``tensorboard.compat.proto`` (the
same messages as ``tensorflow.core.framework``; the wire and text formats do not depend on the
package name).  Problems follow the ONNX frontend's contract: a missing, truncated or
non-GraphDef file is a :class:`ModelFormatError`; every node whose op (or use of an op) polyml
cannot lower is listed in one :class:`UnsupportedError` with its TF node name and op type.

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

Graph rewrites after the translation (all exact up to float rounding): a zero Pad of the
spatial dims only, read by a Conv alone, becomes the Conv's padding; per-channel Add, Sub, Mul,
Div and BatchNormalization after a Conv (or a Transpose of one) fold into its weights and bias;
a MatMul followed by a bias Add becomes a Gemm; back-to-back Transposes compose.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyml.errors import GraphError, ModelFormatError, PolymlError, ShapeError, UnsupportedError
from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Operand, registry

#: the ONNX opset whose attribute conventions the emitted nodes follow
OPSET = 18
#: the permutation holding an NHWC tensor in NCHW order (IR dim i is TF dim NCHW[i])
NCHW = (0, 3, 1, 2)
LAYOUTS = ("nchw", "nhwc")

#: TF DataType enum → numpy dtype (DT_BFLOAT16 is widened to float32 when read)
TF_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.float64),
    3: np.dtype(np.int32),
    4: np.dtype(np.uint8),
    5: np.dtype(np.int16),
    6: np.dtype(np.int8),
    7: np.dtype(object),
    9: np.dtype(np.int64),
    10: np.dtype(np.bool_),
    14: np.dtype(np.float32),
    17: np.dtype(np.uint16),
    19: np.dtype(np.float16),
    22: np.dtype(np.uint32),
    23: np.dtype(np.uint64),
}
TF_DTYPE_NAMES = {1: "float", 2: "double", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string", 8: "complex64",
                  9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 18: "complex128", 19: "half", 20: "resource",
                  21: "variant", 22: "uint32", 23: "uint64"}
#: ops that pass their input through unchanged
PASS_THROUGH = {"Identity", "StopGradient", "Snapshot", "PreventGradient", "CheckNumerics", "EnsureShape",
                "PlaceholderWithDefault"}
#: sinks that are not outputs
NOT_OUTPUTS = {"NoOp", "Const", "Placeholder", "Assert", "SaveV2", "RestoreV2"}


def _protos():
    """The GraphDef protobuf modules (tensorboard's copy of TensorFlow's schema)."""
    try:
        from tensorboard.compat.proto import graph_pb2
    except ImportError as e:  # pragma: no cover - a dependency of polyml
        raise ModelFormatError(f"reading TensorFlow graphs needs the 'tensorboard' package ({e})") from None
    return graph_pb2


# -- reading ---------------------------------------------------------------------------------

def load_graphdef(path: str | os.PathLike):
    """Read a frozen GraphDef (binary ``.pb`` or text ``.pbtxt``) with one clear error per way it can be bad."""
    from google.protobuf import message, text_format

    graph_pb2 = _protos()
    p = Path(path)
    if not p.is_file():
        raise ModelFormatError(f"{p}: no such model file")
    data = p.read_bytes()
    gd = graph_pb2.GraphDef()
    if p.suffix.lower() == ".pbtxt":
        try:
            text_format.Parse(data.decode("utf-8"), gd)
        except (text_format.ParseError, UnicodeDecodeError) as e:
            raise ModelFormatError(f"{p}: not a readable text GraphDef ({type(e).__name__}: {e})") from None
    else:
        try:
            gd.ParseFromString(data)
        except (message.DecodeError, RuntimeError, ValueError) as e:
            raise ModelFormatError(f"{p}: not a readable GraphDef (truncated or another format?) ({type(e).__name__}: {e})") from None
        # TensorFlow writes `versions` after all nodes: a file cut between two nodes parses
        # but has lost it (and every node after the cut)
        if gd.node and not gd.HasField("versions"):
            raise ModelFormatError(f"{p}: GraphDef without its 'versions' field: the file is truncated "
                                   "(or was not written by TensorFlow)")
    check_graphdef(gd, str(p))
    return gd


def check_graphdef(gd, where: str = "graph") -> None:
    """Structural checks: nodes exist, have names and ops, names are unique, inputs resolve."""
    if not gd.node:
        hint = ""
        if len(gd.library.function):
            hint = " (it holds only a function library: a SavedModel's graph? freeze it with convert_variables_to_constants_v2)"
        raise ModelFormatError(f"{where}: not a TensorFlow GraphDef (no nodes; truncated or another format?){hint}")
    names: set[str] = set()
    for i, n in enumerate(gd.node):
        if not n.name or not n.op:
            raise ModelFormatError(f"{where}: node #{i} has no {'name' if not n.name else 'op'}: not a TensorFlow GraphDef?")
        if n.name in names:
            raise ModelFormatError(f"{where}: two nodes are named {n.name!r}")
        names.add(n.name)
    missing = []
    for n in gd.node:
        for t in n.input:
            src = t[1:] if t.startswith("^") else t.split(":")[0]
            if src not in names:
                missing.append(f"{n.name!r} reads {t!r}")
    if missing:
        raise ModelFormatError(f"{where}: inputs of nodes name no node of the graph (truncated file?): "
                               + "; ".join(missing[:8]) + (f"; and {len(missing) - 8} more" if len(missing) > 8 else ""))


def tensor_to_numpy(t) -> np.ndarray:
    """A TensorProto as a numpy array (``tensor_content`` or the typed ``*_val`` fields; fewer
    values than elements repeat the last one, as TensorFlow does)."""
    dt = t.dtype
    if dt not in TF_DTYPES:
        raise PolymlError(f"constant of dtype {TF_DTYPE_NAMES.get(dt, dt)} is not supported")
    np_dt = TF_DTYPES[dt]
    if t.tensor_shape.unknown_rank:
        raise ModelFormatError("constant tensor with unknown rank")
    shape = tuple(int(d.size) for d in t.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise ModelFormatError(f"constant tensor with unknown dimensions {list(shape)}")
    size = int(np.prod(shape, dtype=np.int64))
    if t.tensor_content:
        if dt == 14:  # bfloat16: the upper half of a float32
            raw = np.frombuffer(t.tensor_content, dtype="<u2").astype(np.uint32) << 16
            arr = raw.view(np.float32)
        elif np_dt.kind == "O":
            raise PolymlError("string constants are not supported")
        else:
            if len(t.tensor_content) != size * np_dt.itemsize:
                raise ModelFormatError(f"constant tensor of shape {list(shape)}: {len(t.tensor_content)} content bytes, "
                                       f"expected {size * np_dt.itemsize}")
            arr = np.frombuffer(t.tensor_content, dtype=np_dt.newbyteorder("<")).astype(np_dt)
        return arr.reshape(shape).copy()
    if dt == 1:
        vals = np.asarray(t.float_val, np.float32)
    elif dt == 2:
        vals = np.asarray(t.double_val, np.float64)
    elif dt in (3, 4, 5, 6, 17):
        vals = np.asarray(t.int_val, np.int64).astype(np_dt)
    elif dt == 9:
        vals = np.asarray(t.int64_val, np.int64)
    elif dt == 10:
        vals = np.asarray(t.bool_val, np.bool_)
    elif dt == 19:
        vals = np.asarray(t.half_val, np.uint16).view(np.float16)
    elif dt == 14:
        vals = (np.asarray(t.half_val, np.uint32) << 16).view(np.float32)
    elif dt == 22:
        vals = np.asarray(t.uint32_val, np.uint32)
    elif dt == 23:
        vals = np.asarray(t.uint64_val, np.uint64)
    else:
        vals = np.asarray([s for s in t.string_val], dtype=object)
    if vals.size > size:
        raise ModelFormatError(f"constant tensor of shape {list(shape)} has {vals.size} values")
    if vals.size == 0:
        return np.zeros(shape, np_dt)
    if vals.size < size:
        vals = np.concatenate([vals, np.full(size - vals.size, vals[-1], dtype=vals.dtype)])
    return vals.astype(np_dt).reshape(shape)


def attr_value(a):
    """An AttrValue as a Python value (lists as lists, tensors as arrays, shapes as dim lists)."""
    kind = a.WhichOneof("value")
    if kind == "s":
        return a.s.decode("utf-8", "replace")
    if kind in ("i", "f", "b", "type"):
        return getattr(a, kind)
    if kind == "shape":
        return None if a.shape.unknown_rank else [int(d.size) for d in a.shape.dim]
    if kind == "tensor":
        return tensor_to_numpy(a.tensor)
    if kind == "list":
        lv = a.list
        for f in ("i", "f", "b", "type"):
            if len(getattr(lv, f)):
                return list(getattr(lv, f))
        if len(lv.s):
            return [s.decode("utf-8", "replace") for s in lv.s]
        if len(lv.shape):
            return [None if s.unknown_rank else [int(d.size) for d in s.dim] for s in lv.shape]
        return []
    if kind == "func":
        return a.func.name
    return None


# -- the translation -------------------------------------------------------------------------

class _Unsupported(Exception):
    """A TF node polyml cannot lower (collected, reported together)."""


@dataclass(frozen=True)
class Val:
    """A TF tensor held in the IR: ``IR tensor = np.transpose(TF tensor, perm)`` (None: same order)."""

    name: str
    perm: tuple[int, ...] | None = None


Value = Val | np.ndarray


def _norm_perm(p: Sequence[int] | None) -> tuple[int, ...] | None:
    if p is None:
        return None
    p = tuple(int(i) for i in p)
    return None if p == tuple(range(len(p))) else p


def _compose(p: tuple[int, ...] | None, rank: int) -> tuple[int, ...]:
    return p if p is not None else tuple(range(rank))


def _drop_dims(perm: tuple[int, ...] | None, ir_axes: Sequence[int]) -> tuple[int, ...] | None:
    """The permutation left after removing IR dims ``ir_axes`` (and their TF dims)."""
    if perm is None:
        return None
    rest = [perm[i] for i in range(len(perm)) if i not in ir_axes]
    order = sorted(rest)
    return _norm_perm([order.index(t) for t in rest])


def _tag(perm: tuple[int, ...]) -> str:
    return "nchw" if perm == NCHW else "p" + "".join(map(str, perm))


def _tensor_name(t: str) -> str:
    """Canonical TF tensor name: ``X`` for ``X:0``, ``X:k`` otherwise."""
    base, sep, idx = t.rpartition(":")
    if sep and idx.isdigit():
        return base if idx == "0" else t
    return t


def _split(t: str) -> tuple[str, int]:
    base, sep, idx = t.rpartition(":")
    if sep and idx.isdigit():
        return base, int(idx)
    return t, 0


class _Importer:
    """One GraphDef → Graph translation (see the module docstring)."""

    def __init__(self, gd, name: str, input_shapes: Mapping[str, Sequence[int]] | None,
                 outputs: Sequence[str] | None, layout: str):
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
        self.gd = gd
        self.layout = layout
        self.name = name
        self.kernels = registry()
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
                    self.readers.setdefault(_tensor_name(t), []).append(n)
        #: SpaceToBatchND nodes of the dilated-convolution pattern → (input, dilations, pads)
        self.s2b: dict[str, tuple[str, list[int], list[int]]] = {}
        #: Conv nodes of that pattern whose BatchToSpaceND passes their output through
        self.b2s: set[str] = set()
        self.input_shapes = {_split(k)[0]: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
        self.requested = [_tensor_name(o) for o in outputs] if outputs else None

    # -- graph structure ---------------------------------------------------------------------
    def sinks(self) -> list[str]:
        data_read: set[str] = set()
        control_read: set[str] = set()
        for n in self.gd.node:
            for t in n.input:
                if t.startswith("^"):
                    control_read.add(t[1:])
                else:
                    data_read.add(_split(t)[0])
        return [n.name for n in self.gd.node
                if n.name not in data_read and n.op not in NOT_OUTPUTS and n.name not in control_read]

    def output_tensors(self) -> list[str]:
        if self.requested is None:
            outs = self.sinks()
            if not outs:
                raise GraphError(f"graph {self.name!r} has no output (no sink other than NoOp/Const/Placeholder nodes); "
                                 "name them with --outputs")
            return outs
        bad = [o for o in self.requested if _split(o)[0] not in self.by_name]
        if bad:
            raise GraphError(f"outputs {bad} name no node of the graph; its sinks are {self.sinks()[:10]}")
        return list(dict.fromkeys(self.requested))

    def needed_order(self, outs: list[str]) -> list:
        """The nodes the outputs depend on (data edges), in topological order."""
        needed: set[str] = set()
        stack = [_split(o)[0] for o in outs]
        while stack:
            n = stack.pop()
            if n in needed:
                continue
            needed.add(n)
            stack.extend(_split(t)[0] for t in self.by_name[n].input if not t.startswith("^"))
        order_idx = {n.name: i for i, n in enumerate(self.gd.node)}
        deps = {n: {_split(t)[0] for t in self.by_name[n].input if not t.startswith("^")} for n in needed}
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
                   for n, op in ops.items() if op not in CONVERTERS and op not in PASS_THROUGH and op != "Placeholder"]
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
            raise _Unsupported(f"input {t!r} must be a compile-time constant")
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
        perm = _norm_perm(perm)
        key = (t, perm)
        if key in self.cache:
            return self.cache[key]
        v = self.vals[t]
        if isinstance(v, np.ndarray):
            arr = v if perm is None else np.transpose(v, perm)
            name = self.const(arr, t if perm is None else f"{t}#{_tag(perm)}")
        elif v.perm == perm:
            name = v.name
        else:
            rank = len(self.types[v.name].shape)
            cur, want = _compose(v.perm, rank), _compose(perm, rank)
            q = [cur.index(want[i]) for i in range(rank)]
            out = t if perm is None else f"{t}#{_tag(perm)}"
            name = self.emit("Transpose", [v.name], {"perm": q}, what=f"to_{'tf' if perm is None else _tag(perm)}",
                             out=self.new_tensor_name(out))
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
            base = self.cur.name if perm is None else f"{self.cur.name}#{_tag(perm)}"
            out = out or self.new_tensor_name(base)
        else:
            name = self.new_node_name(what or op.lower())
            out = out or self.new_tensor_name(name)
        node = Node(name, op, list(inputs), [out], dict(attrs or {}), src, OPSET)
        ops = [Operand(t, self.types[t], self.constants.get(t)) if t else None for t in inputs]
        why = kernel.supports(node, ops)
        if why:
            raise _Unsupported(why)
        (tt,) = kernel.infer(node, ops)
        self.types[out] = TensorType(tuple(int(d) for d in tt.shape), tt.dtype)
        self.node_names.add(name)
        self.nodes.append(node)
        return out

    def finish(self, name: str, perm: tuple[int, ...] | None) -> Val:
        """The Val of a layout-bound op's output: kept in ``perm`` (``nchw`` layout) or
        transposed back to TF order at once (``nhwc``)."""
        perm = _norm_perm(perm)
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
        data = [_tensor_name(t) for t in n.input if not t.startswith("^")]
        if n.op == "Placeholder":
            return
        if any(t in self.unknown for t in data):
            if n.op not in CONVERTERS and n.op not in PASS_THROUGH:
                self.problems.append((n.name, n.op, "no lowering for this op type"))
            self.unknown.update(self._outputs_of(n))
            return
        missing = [t for t in data if t not in self.vals]
        self.cur, self.main_done = n, False
        try:
            if missing:
                raise _Unsupported(f"reads {missing}, an output polyml does not compute (only output 0 of "
                                   f"{sorted({self.by_name[_split(t)[0]].op for t in missing})} is supported)")
            if n.op in PASS_THROUGH:
                self.vals[n.name] = self.vals[data[0]]
                return
            if n.op == "IdentityN":
                for i, t in enumerate(data):
                    self.vals[n.name if i == 0 else f"{n.name}:{i}"] = self.vals[t]
                return
            fn = CONVERTERS.get(n.op)
            if fn is None:
                raise _Unsupported("no lowering for this op type")
            results = fn(self, n, data)
            for i, r in enumerate(results):
                if r is not None:
                    self.vals[n.name if i == 0 else f"{n.name}:{i}"] = r
        except _Unsupported as e:
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
                raise GraphError(f"output {t!r} is not computed by node {_split(t)[0]!r} "
                                 f"({self.by_name[_split(t)[0]].op}; only its output 0 is supported)")
            self.graph_output(t)
        graph = Graph(self.name, self.nodes, self.types, self.constants, self.inputs, outs)
        optimize(graph)
        graph.prune()
        return graph

    def graph_output(self, t: str) -> None:
        """Make the IR tensor named ``t`` hold TF tensor ``t`` in TF order."""
        v = self.vals[t]
        node = self.by_name[_split(t)[0]]
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


# -- op converters ---------------------------------------------------------------------------

Converter = Callable[[_Importer, object, list[str]], list[Value | None]]
CONVERTERS: dict[str, Converter] = {}


def converter(*ops: str):
    def wrap(fn: Converter) -> Converter:
        for op in ops:
            CONVERTERS[op] = fn
        return fn

    return wrap


def _attr(n, name: str, default=None):
    return attr_value(n.attr[name]) if name in n.attr else default


UNARY: dict[str, tuple[str | None, Callable[[np.ndarray], np.ndarray]]] = {
    "Relu": ("Relu", lambda x: np.maximum(x, 0)),
    "Sigmoid": ("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
    "Tanh": ("Tanh", np.tanh),
    "Sqrt": ("Sqrt", np.sqrt),
    "Exp": ("Exp", np.exp),
    "Neg": ("Neg", np.negative),
    "Abs": ("Abs", np.abs),
    "Reciprocal": ("Reciprocal", lambda x: 1 / x),
    "Inv": ("Reciprocal", lambda x: 1 / x),
    "Rsqrt": (None, lambda x: 1 / np.sqrt(x)),
    "Square": (None, lambda x: x * x),
    "Relu6": (None, lambda x: np.clip(x, 0, 6)),
    "LeakyRelu": (None, None),
}

BINARY: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "Add": ("Add", np.add),
    "AddV2": ("Add", np.add),
    "BiasAdd": ("Add", np.add),
    "BiasAddV1": ("Add", np.add),
    "Sub": ("Sub", np.subtract),
    "Mul": ("Mul", np.multiply),
    "RealDiv": ("Div", np.true_divide),
    "Div": ("Div", lambda a, b: np.floor_divide(a, b) if np.issubdtype(a.dtype, np.integer) else np.true_divide(a, b)),
    "Maximum": ("Max", np.maximum),
    "Minimum": ("Min", np.minimum),
    "Pow": ("Pow", np.power),
    "SquaredDifference": ("Sub", lambda a, b: np.square(a - b)),
}


def _same_dtype(x: np.ndarray, r) -> np.ndarray:
    r = np.asarray(r)
    return r.astype(x.dtype) if r.dtype != x.dtype and x.dtype.kind == r.dtype.kind == "f" else r


def _elementwise(imp: _Importer, op: str, ts: list[str], attrs: dict | None = None, *, main: bool = True) -> Val:
    """An n-ary broadcasting op in the layout of its highest-rank non-constant operand."""
    rank = max(len(imp.tf_shape(t)) for t in ts)
    live = [t for t in ts if not imp.is_const(t)]
    target = next((imp.vals[t].perm for t in live if len(imp.tf_shape(t)) == rank and imp.vals[t].perm), None)
    names = []
    for t in ts:
        shape = imp.tf_shape(t)
        if imp.is_const(t):
            if target is None:
                names.append(imp.ir(t, None))
            else:
                full = imp.value(t).reshape((1,) * (rank - len(shape)) + shape)
                names.append(imp.const(np.transpose(full, target), f"{t}#{_tag(target)}"))
        elif len(shape) == rank or target is None:
            names.append(imp.ir(t, target))
        else:
            flat = imp.tf_order(t)
            shaped = imp.emit("Reshape", [flat, imp.const(np.array((1,) * (rank - len(shape)) + shape, np.int64), "shape")],
                              what="rank")
            key = f"{t}#rank{rank}"
            imp.vals[key] = Val(shaped)
            names.append(imp.ir(key, target))
    return Val(imp.emit(op, names, attrs, main=main, perm=target), target)


@converter("Const")
def _const(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    if "value" not in n.attr:
        raise _Unsupported("Const without a value")
    try:
        return [attr_value(n.attr["value"])]
    except PolymlError as e:
        raise _Unsupported(str(e)) from None


@converter(*UNARY)
def _unary(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    op, fn = UNARY[n.op]
    x = ts[0]
    if n.op == "LeakyRelu":
        alpha = float(_attr(n, "alpha", 0.2))
        if imp.is_const(x):
            v = imp.value(x)
            return [np.where(v >= 0, v, v * np.float32(alpha)).astype(v.dtype)]
        return [_elementwise(imp, "LeakyRelu", [x], {"alpha": alpha})]
    if imp.is_const(x):
        v = imp.value(x)
        with np.errstate(all="ignore"):
            return [_same_dtype(v, fn(v))]
    if n.op == "Relu6":
        return [_elementwise(imp, "Clip", [x], {"min": 0.0, "max": 6.0})]
    if n.op == "Rsqrt":
        key = f"{n.name}#sqrt"
        imp.vals[key] = _elementwise(imp, "Sqrt", [x], main=False)
        return [_elementwise(imp, "Reciprocal", [key])]
    if n.op == "Square":
        return [_elementwise(imp, "Mul", [x, x])]
    return [_elementwise(imp, op, [x])]


@converter(*BINARY)
def _binary(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    op, fn = BINARY[n.op]
    a, b = ts[:2]
    if n.op.startswith("BiasAdd"):
        fmt = _attr(n, "data_format", "NHWC")
        rank = len(imp.tf_shape(a))
        if len(imp.tf_shape(b)) != 1:
            raise ShapeError(f"bias of shape {list(imp.tf_shape(b))} is not a vector")
        if fmt.startswith("NC") and rank > 2:
            if imp.is_const(b):
                imp.vals[f"{b}#bias"] = imp.value(b).reshape((-1,) + (1,) * (rank - 2))
            else:
                shaped = imp.emit("Reshape", [imp.ir(b), imp.const(np.array([-1] + [1] * (rank - 2), np.int64), "shape")],
                                  what="bias")
                imp.vals[f"{b}#bias"] = Val(shaped)
            b = f"{b}#bias"
    if imp.is_const(a) and imp.is_const(b):
        x, y = imp.value(a), imp.value(b)
        with np.errstate(all="ignore"):
            return [_same_dtype(x, fn(x, y))]
    if n.op == "SquaredDifference":
        key = f"{n.name}#diff"
        imp.vals[key] = _elementwise(imp, "Sub", [a, b], main=False)
        return [_elementwise(imp, "Mul", [key, key])]
    return [_elementwise(imp, op, [a, b])]


@converter("AddN")
def _addn(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    if all(imp.is_const(t) for t in ts):
        return [np.sum([imp.value(t) for t in ts], axis=0).astype(imp.value(ts[0]).dtype)]
    return [_elementwise(imp, "Sum", ts)]


# -- shape-only and constant-only ops --------------------------------------------------------

def _out_dtype(n, key: str = "out_type", default: int = 3) -> np.dtype:
    return TF_DTYPES.get(int(_attr(n, key, default)), np.dtype(np.int32))


@converter("Shape")
def _shape(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(imp.tf_shape(ts[0]), _out_dtype(n))]


@converter("ShapeN")
def _shape_n(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(imp.tf_shape(t), _out_dtype(n)) for t in ts]


@converter("Size")
def _size(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(int(np.prod(imp.tf_shape(ts[0]), dtype=np.int64)), _out_dtype(n))]


@converter("Rank")
def _rank(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(len(imp.tf_shape(ts[0])), np.int32)]


@converter("ZerosLike", "OnesLike")
def _fill_like(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    dt = np.dtype(imp.dtype(ts[0]))
    return [np.full(imp.tf_shape(ts[0]), 0 if n.op == "ZerosLike" else 1, dt)]


def _const_only(fn: Callable[..., np.ndarray]) -> Converter:
    def conv(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
        live = [t for t in ts if not imp.is_const(t)]
        if live:
            raise _Unsupported(f"only supported on constants (computed at compile time); {live[0]!r} is computed at run time")
        return [np.asarray(fn(n, *[imp.value(t) for t in ts]))]

    return conv


def _cast(n, x: np.ndarray) -> np.ndarray:
    return x.astype(TF_DTYPES.get(int(_attr(n, "DstT", 1)), np.dtype(np.float32)))


def _strided_slice(n, x: np.ndarray, begin: np.ndarray, end: np.ndarray, strides: np.ndarray) -> np.ndarray:
    masks = {k: int(_attr(n, k, 0)) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    index: list = []
    for i in range(len(begin)):
        bit = 1 << i
        if masks["ellipsis_mask"] & bit:
            index.append(Ellipsis)
        elif masks["new_axis_mask"] & bit:
            index.append(None)
        elif masks["shrink_axis_mask"] & bit:
            index.append(int(begin[i]))
        else:
            b = None if masks["begin_mask"] & bit else int(begin[i])
            e = None if masks["end_mask"] & bit else int(end[i])
            index.append(slice(b, e, int(strides[i])))
    return np.asarray(x[tuple(index)])


def _reduce_np(op: str):
    fn = {"Sum": np.sum, "Prod": np.prod, "Max": np.max, "Min": np.min, "Mean": np.mean, "All": np.all, "Any": np.any}[op]

    def f(n, x: np.ndarray, axes: np.ndarray) -> np.ndarray:
        ax = tuple(int(a) % max(x.ndim, 1) for a in np.asarray(axes).reshape(-1))
        r = fn(x, axis=ax, keepdims=bool(_attr(n, "keep_dims", False)))
        return np.asarray(r).astype(x.dtype)

    return f


CONVERTERS.update({
    "Cast": _const_only(_cast),
    "StridedSlice": _const_only(_strided_slice),
    "Pack": _const_only(lambda n, *xs: np.stack(xs, axis=int(_attr(n, "axis", 0)))),
    "Fill": _const_only(lambda n, dims, v: np.full([int(d) for d in dims], v, dtype=v.dtype)),
    "Range": _const_only(lambda n, a, b, d: np.arange(a, b, d).astype(np.result_type(a, b, d))),
    "Prod": _const_only(_reduce_np("Prod")),
    "All": _const_only(_reduce_np("All")),
    "Any": _const_only(_reduce_np("Any")),
    "GatherV2": _const_only(lambda n, x, i, axis: np.take(x, i, axis=int(axis))),
    "Slice": _const_only(lambda n, x, b, s: x[tuple(slice(int(bb), None if int(ss) < 0 else int(bb) + int(ss))
                                                     for bb, ss in zip(b, s))]),
    "Tile": _const_only(lambda n, x, m: np.tile(x, [int(v) for v in m])),
    "FloorDiv": _const_only(lambda n, a, b: np.floor_divide(a, b)),
    "FloorMod": _const_only(lambda n, a, b: np.mod(a, b)),
})


@converter("Cast")
def _cast_conv(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    if imp.is_const(ts[0]):
        return [_cast(n, imp.value(ts[0]))]
    dst = TF_DTYPES.get(int(_attr(n, "DstT", 1)))
    if dst is not None and dst.name == imp.dtype(ts[0]):
        return [imp.vals[ts[0]]]
    raise _Unsupported(f"Cast from {imp.dtype(ts[0])} to {TF_DTYPE_NAMES.get(int(_attr(n, 'DstT', 0)))} at run time")


# -- movement ---------------------------------------------------------------------------------

def _axis(axis: int, rank: int, n) -> int:
    if not -rank <= axis < max(rank, 1):
        raise GraphError(f"axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


@converter("Reshape")
def _reshape(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x, s = ts
    target = [int(d) for d in imp.value(s).reshape(-1)]
    shape = imp.tf_shape(x)
    total = int(np.prod(shape, dtype=np.int64))
    if target.count(-1) > 1:
        raise ShapeError(f"more than one -1 in the target shape {target}")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"cannot reshape {list(shape)} to {target}")
        target[target.index(-1)] = total // known
    if imp.is_const(x):
        return [imp.value(x).reshape(target)]
    attrs = {"allowzero": 1} if 0 in target else {}
    return [Val(imp.emit("Reshape", [imp.tf_order(x), imp.const(np.array(target, np.int64), "shape")], attrs, main=True))]


@converter("ExpandDims")
def _expand_dims(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x, a = ts
    shape = list(imp.tf_shape(x))
    axis = int(imp.value(a).reshape(-1)[0])
    axis = _axis(axis, len(shape) + 1, n)
    shape.insert(axis, 1)
    if imp.is_const(x):
        return [imp.value(x).reshape(shape)]
    return [Val(imp.emit("Reshape", [imp.tf_order(x), imp.const(np.array(shape, np.int64), "shape")], main=True))]


@converter("Squeeze")
def _squeeze(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    shape = imp.tf_shape(x)
    axes = [_axis(int(a), len(shape), n) for a in (_attr(n, "squeeze_dims", None) or _attr(n, "axis", None) or [])]
    if not axes:
        axes = [i for i, d in enumerate(shape) if d == 1]
    bad = [a for a in axes if shape[a] != 1]
    if bad:
        raise ShapeError(f"cannot squeeze dims {bad} of {list(shape)}")
    if imp.is_const(x):
        return [np.squeeze(imp.value(x), axis=tuple(axes)) if axes else imp.value(x)]
    v = imp.vals[x]
    if not axes:
        return [v]
    ir_axes = sorted(v.perm.index(a) for a in axes) if v.perm else sorted(axes)
    return [Val(imp.emit("Squeeze", [v.name], {"axes": ir_axes}, main=True, perm=_drop_dims(v.perm, ir_axes)),
                _drop_dims(v.perm, ir_axes))]


@converter("Transpose")
def _transpose(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x, p = ts
    q = [int(i) for i in imp.value(p).reshape(-1)]
    rank = len(imp.tf_shape(x))
    if sorted(q) != list(range(rank)):
        raise GraphError(f"perm {q} is not a permutation of {rank} axes")
    if imp.is_const(x):
        return [np.transpose(imp.value(x), q)]
    v = imp.vals[x]
    # IR = transpose(TF_in, p); TF_out = transpose(TF_in, q) → IR = transpose(TF_out, qinv∘p)
    qinv = [q.index(i) for i in range(rank)]
    return [Val(v.name, _norm_perm([qinv[d] for d in _compose(v.perm, rank)]))]


@converter("ConcatV2", "Concat")
def _concat(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    if n.op == "Concat":
        a, parts = ts[0], ts[1:]
    else:
        a, parts = ts[-1], ts[:-1]
    rank = len(imp.tf_shape(parts[0]))
    axis = _axis(int(imp.value(a).reshape(-1)[0]), rank, n)
    if all(imp.is_const(t) for t in parts):
        return [np.concatenate([imp.value(t) for t in parts], axis=axis)]
    perms = {imp.vals[t].perm for t in parts if not imp.is_const(t)}
    target = perms.pop() if len(perms) == 1 else None
    names = [imp.ir(t, target) for t in parts]
    ir_axis = target.index(axis) if target else axis
    return [Val(imp.emit("Concat", names, {"axis": ir_axis}, main=True, perm=target), target)]


@converter("Pad", "PadV2", "MirrorPad")
def _pad(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x, p = ts[:2]
    if n.op == "MirrorPad":
        raise _Unsupported(f"MirrorPad mode {_attr(n, 'mode', '?')!r} is not supported (only constant padding)")
    pads = imp.value(p).reshape(-1, 2).astype(np.int64)
    cv = float(imp.value(ts[2]).reshape(-1)[0]) if len(ts) > 2 else 0.0
    if imp.is_const(x):
        v = imp.value(x)
        return [np.pad(v, [tuple(r) for r in pads], constant_values=np.asarray(cv, v.dtype))]
    v = imp.vals[x]
    rank = len(imp.types[v.name].shape)
    if pads.shape[0] != rank:
        raise ShapeError(f"paddings of shape {list(pads.shape)} for a rank-{rank} input")
    order = _compose(v.perm, rank)
    begin = [int(pads[order[i], 0]) for i in range(rank)]
    end = [int(pads[order[i], 1]) for i in range(rank)]
    attrs = {"pads": begin + end, "mode": "constant"}
    if cv:
        attrs["value"] = cv
    return [Val(imp.emit("Pad", [v.name], attrs, main=True, perm=v.perm), v.perm)]


# -- compute ops -------------------------------------------------------------------------------

def _layout_of(n, rank: int = 4) -> tuple[tuple[int, ...] | None, list[int], int]:
    """(IR permutation the op needs, TF spatial dims, TF channel dim) from ``data_format``."""
    fmt = _attr(n, "data_format", "NHWC")
    if fmt in ("NHWC", "NDHWC") or fmt is None:
        perm = (0, rank - 1, *range(1, rank - 1))
        return _norm_perm(perm), list(range(1, rank - 1)), rank - 1
    if fmt in ("NCHW", "NCDHW"):
        return None, list(range(2, rank)), 1
    raise _Unsupported(f"data_format {fmt!r}")


def _window_pads(n, size: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                 fmt_dims: list[int]) -> list[int]:
    """ONNX ``pads`` (all begins, then all ends) for TF's SAME / VALID / EXPLICIT padding."""
    mode = _attr(n, "padding", "VALID")
    r = len(size)
    if mode == "VALID":
        return [0] * (2 * r)
    if mode == "SAME":
        begin, end = [], []
        for i, s, k, d in zip(size, strides, kernel, dilations):
            out = -(-i // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - i, 0)
            begin.append(total // 2)
            end.append(total - total // 2)
        return begin + end
    if mode == "EXPLICIT":
        ep = [int(v) for v in _attr(n, "explicit_paddings", []) or []]
        if len(ep) != 2 * (r + 2):
            raise GraphError(f"explicit_paddings {ep} needs {2 * (r + 2)} values")
        pairs = [ep[2 * d : 2 * d + 2] for d in fmt_dims]
        return [p[0] for p in pairs] + [p[1] for p in pairs]
    raise _Unsupported(f"padding {mode!r}")


def _spatial(n, name: str, dims: list[int], ch: int, default: int = 1) -> list[int]:
    v = [int(x) for x in (_attr(n, name, None) or [])]
    if not v:
        return [default] * len(dims)
    if len(v) == 1:
        return v * len(dims)
    if len(v) != len(dims) + 2:
        raise GraphError(f"{name}={v} needs {len(dims) + 2} values")
    if v[0] != 1 or v[ch] != 1:
        raise _Unsupported(f"{name}={v} along the batch or channel dimension")
    return [v[d] for d in dims]


@converter("Conv2D", "DepthwiseConv2dNative", "Conv3D")
def _conv(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x, w = ts
    dilated = imp.s2b.get(x)
    if dilated is not None:
        x = dilated[0]
    rank = len(imp.tf_shape(x))
    if rank != (5 if n.op == "Conv3D" else 4):
        raise ShapeError(f"input of rank {rank}")
    need, sp, ch = _layout_of(n, rank)
    if not imp.is_const(w):
        raise _Unsupported("the filter is computed at run time (only constant filters are supported)")
    wv = imp.value(w)
    if wv.ndim != rank:
        raise ShapeError(f"filter of shape {list(wv.shape)} for a rank-{rank} input")
    shape = imp.tf_shape(x)
    cin = shape[ch]
    kernel = list(wv.shape[: rank - 2])
    strides = _spatial(n, "strides", sp, ch)
    dilations = _spatial(n, "dilations", sp, ch)
    spatial_axes = tuple(range(rank - 2))
    if n.op == "DepthwiseConv2dNative":
        c, m = wv.shape[-2:]
        if c != cin:
            raise ShapeError(f"depthwise filter {list(wv.shape)} for {cin} input channels")
        # (KH, KW, C, M) → (C*M, 1, KH, KW): output channel c*M + m, as TensorFlow orders them
        wir = np.transpose(wv.reshape(*kernel, c * m), (rank - 2, *spatial_axes))[:, None]
        group = int(c)
    else:
        i, o = wv.shape[-2:]
        if i == 0 or cin % i:
            raise ShapeError(f"filter {list(wv.shape)} for {cin} input channels")
        wir = np.transpose(wv, (rank - 1, rank - 2, *spatial_axes))  # (..., I, O) → (O, I, ...)
        group = int(cin // i)
    pads = _window_pads(n, [shape[d] for d in sp], kernel, strides, dilations, sp)
    if dilated is not None:
        dilations, pads = dilated[1], dilated[2]
        imp.b2s.add(n.name)
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "group": group}
    wname = imp.const(np.ascontiguousarray(wir, dtype=wv.dtype), f"{w}#oihw")
    y = imp.emit("Conv", [imp.ir(x, need), wname], attrs, main=True, perm=need)
    return [imp.finish(y, need)]


def _static(imp: _Importer, t: str) -> np.ndarray | None:
    """The value of TF tensor ``t`` if it is constant, looking through Identity to a Const
    node not converted yet (None otherwise)."""
    v = imp.vals.get(t)
    if isinstance(v, np.ndarray):
        return v
    node = imp.by_name.get(_split(t)[0])
    while node is not None and node.op in PASS_THROUGH and node.input:
        node = imp.by_name.get(_split(node.input[0])[0])
    if node is not None and node.op == "Const" and "value" in node.attr:
        try:
            return attr_value(node.attr["value"])
        except PolymlError:
            return None
    return None


def _dilation_pattern(imp: _Importer, n, ts: list[str]) -> tuple[list[int], list[int]] | str:
    """``SpaceToBatchND(x, b, p) → Conv2D/DepthwiseConv2dNative(VALID, stride 1) →
    BatchToSpaceND(·, b, c)`` (how TensorFlow writes a dilated convolution) is that convolution
    with dilations ``b`` and pads ``p - c``: (dilations, ONNX pads), or why it does not match."""
    block, paddings = (_static(imp, t) for t in ts[1:3])
    readers = imp.readers.get(n.name, [])
    if block is None or paddings is None or len(readers) != 1:
        return "its block shape or paddings are computed at run time, or it has several readers"
    conv = readers[0]
    if conv.op not in ("Conv2D", "DepthwiseConv2dNative") or _attr(conv, "padding", "") != "VALID" \
            or _attr(conv, "data_format", "NHWC") != "NHWC" or any(int(v) != 1 for v in _attr(conv, "strides", []) or [1]) \
            or any(int(v) != 1 for v in _attr(conv, "dilations", []) or [1]):
        return "it is not read by a stride-1 VALID NHWC Conv2D or DepthwiseConv2dNative"
    after = imp.readers.get(conv.name, [])
    if len(after) != 1 or after[0].op != "BatchToSpaceND":
        return "the convolution's output is not read by one BatchToSpaceND"
    b2s = after[0]
    block2 = _static(imp, _tensor_name(b2s.input[1]))
    crops = _static(imp, _tensor_name(b2s.input[2]))
    block = [int(v) for v in np.asarray(block).reshape(-1)]
    if block2 is None or crops is None or [int(v) for v in np.asarray(block2).reshape(-1)] != block or len(block) != 2:
        return "the BatchToSpaceND's block shape differs or its crops are computed at run time"
    p = np.asarray(paddings).reshape(-1, 2).astype(int)
    c = np.asarray(crops).reshape(-1, 2).astype(int)
    begin, end = list(p[:, 0] - c[:, 0]), list(p[:, 1] - c[:, 1])
    if min(begin + end) < 0:
        return f"paddings {p.tolist()} minus crops {c.tolist()} are negative"
    return block, [int(v) for v in begin + end]


@converter("SpaceToBatchND")
def _space_to_batch(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    match = _dilation_pattern(imp, n, ts)
    if isinstance(match, str):
        raise _Unsupported(f"supported only as part of a dilated convolution (SpaceToBatchND → Conv2D → "
                           f"BatchToSpaceND); here {match}")
    if imp.is_const(ts[0]):
        raise _Unsupported("dilated convolution of a constant")
    imp.s2b[n.name] = (ts[0], *match)
    return [imp.vals[ts[0]]]


@converter("BatchToSpaceND")
def _batch_to_space(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    if _split(ts[0])[0] not in imp.b2s:
        raise _Unsupported("supported only as part of a dilated convolution (SpaceToBatchND → Conv2D → BatchToSpaceND)")
    return [imp.vals[ts[0]]]


@converter("MaxPool", "AvgPool", "MaxPoolV2", "MaxPool3D", "AvgPool3D")
def _pool(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    rank = len(imp.tf_shape(x))
    need, sp, ch = _layout_of(n, rank)
    shape = imp.tf_shape(x)
    if n.op == "MaxPoolV2":
        ks = [int(v) for v in imp.value(ts[1]).reshape(-1)]
        st = [int(v) for v in imp.value(ts[2]).reshape(-1)]
    else:
        ks, st = _attr(n, "ksize", []), _attr(n, "strides", [])
    if len(ks) != rank or len(st) != rank or ks[0] != 1 or ks[ch] != 1 or st[0] != 1 or st[ch] != 1:
        raise _Unsupported(f"ksize {ks} / strides {st}: pooling over the batch or channel dimension")
    kernel, strides = [int(ks[d]) for d in sp], [int(st[d]) for d in sp]
    pads = _window_pads(n, [shape[d] for d in sp], kernel, strides, [1] * len(sp), sp)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    op = "MaxPool" if n.op.startswith("MaxPool") else "AveragePool"
    if op == "AveragePool":
        attrs["count_include_pad"] = 0
    y = imp.emit(op, [imp.ir(x, need)], attrs, main=True, perm=need)
    return [imp.finish(y, need)]


@converter("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
def _fused_bn(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    if _attr(n, "is_training", True):
        raise _Unsupported("is_training=true (batch statistics); polyml compiles inference graphs")
    x, *params = ts[:5]
    rank = len(imp.tf_shape(x))
    need, _, ch = _layout_of(n, rank)
    live = [t for t in params if not imp.is_const(t)]
    if live:
        raise _Unsupported(f"the batch-norm parameter {live[0]!r} is computed at run time")
    c = imp.tf_shape(x)[ch]
    if any(imp.value(t).size != c for t in params):
        raise ShapeError(f"parameters {[list(imp.tf_shape(t)) for t in params]} for {c} channels")
    names = [imp.const(imp.value(t).reshape(c).astype(np.float32), t) for t in params]
    eps = float(_attr(n, "epsilon", 1e-4))
    y = imp.emit("BatchNormalization", [imp.ir(x, need), *names], {"epsilon": eps}, main=True, perm=need)
    return [imp.finish(y, need)]


@converter("Mean", "Sum", "Max", "Min", "Prod", "All", "Any")
def _reduce(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x, a = ts
    keep = bool(_attr(n, "keep_dims", False))
    if imp.is_const(x):
        return [_reduce_np(n.op)(n, imp.value(x), imp.value(a))]
    if n.op in ("Prod", "All", "Any"):
        raise _Unsupported(f"{n.op} at run time")
    rank = len(imp.tf_shape(x))
    axes = sorted({_axis(int(v), rank, n) for v in imp.value(a).reshape(-1)})
    v = imp.vals[x]
    if not axes:
        return [v]
    ir_axes = sorted(v.perm.index(d) for d in axes) if v.perm else axes
    perm = v.perm if keep else _drop_dims(v.perm, ir_axes)
    op = {"Mean": "ReduceMean", "Sum": "ReduceSum", "Max": "ReduceMax", "Min": "ReduceMin"}[n.op]
    y = imp.emit(op, [v.name], {"axes": ir_axes, "keepdims": int(keep)}, main=True, perm=perm)
    return [Val(y, perm)]


@converter("Softmax", "LogSoftmax")
def _softmax(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    v = imp.vals[x]
    if isinstance(v, np.ndarray):
        e = np.exp(v - v.max(axis=-1, keepdims=True))
        s = e / e.sum(axis=-1, keepdims=True)
        return [(np.log(s) if n.op == "LogSoftmax" else s).astype(v.dtype)]
    rank = len(imp.tf_shape(x))
    axis = v.perm.index(rank - 1) if v.perm else rank - 1
    return [Val(imp.emit(n.op, [v.name], {"axis": axis}, main=True, perm=v.perm), v.perm)]


@converter("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _matmul(imp: _Importer, n, ts: list[str]) -> list[Value | None]:
    a, b = ts
    batch = n.op != "MatMul"
    ta = bool(_attr(n, "adj_x" if batch else "transpose_a", False))
    tb = bool(_attr(n, "adj_y" if batch else "transpose_b", False))

    def operand(t: str, trans: bool) -> tuple[str, bool]:
        if imp.is_const(t) and trans:
            key = f"{t}#T"
            imp.vals[key] = np.swapaxes(imp.value(t), -1, -2)
            return key, False
        return t, trans

    if imp.is_const(a) and imp.is_const(b):
        x, y = imp.value(a), imp.value(b)
        return [np.matmul(np.swapaxes(x, -1, -2) if ta else x, np.swapaxes(y, -1, -2) if tb else y)]
    a, ta = operand(a, ta)
    b, tb = operand(b, tb)
    ra, rb = len(imp.tf_shape(a)), len(imp.tf_shape(b))
    if ta or tb:
        if ra != 2 or rb != 2:
            raise _Unsupported("adjoint batch matrix products computed at run time")
        return [Val(imp.emit("Gemm", [imp.tf_order(a), imp.tf_order(b)], {"transA": int(ta), "transB": int(tb)}, main=True))]
    return [Val(imp.emit("MatMul", [imp.tf_order(a), imp.tf_order(b)], main=True))]


# -- graph rewrites ---------------------------------------------------------------------------

def _consumers(graph: Graph) -> dict[str, list[Node]]:
    return graph.consumers()


def _sole_use(graph: Graph, t: str, uses: dict[str, list[Node]]) -> Node | None:
    """The only node reading ``t`` (None if several, none, or ``t`` is a graph output)."""
    readers = uses.get(t, [])
    if len(readers) != 1 or t in graph.outputs:
        return None
    return readers[0]


def _per_channel(c: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """``c`` as a vector along ``axis`` of ``shape`` if broadcasting it changes nothing else."""
    if c.ndim > len(shape):
        return None
    full = (1,) * (len(shape) - c.ndim) + c.shape
    if any(d != 1 and (i != axis or d != shape[axis]) for i, d in enumerate(full)):
        return None
    return np.broadcast_to(c.reshape(-1), (shape[axis],)).astype(np.float32)


def _swap_pad_transpose(graph: Graph) -> bool:
    """Pad → Transpose becomes Transpose → Pad (so that the Pad can meet a Conv)."""
    uses = _consumers(graph)
    for pad in graph.nodes:
        if pad.op_type != "Pad" or len(pad.inputs) > 1:
            continue
        tr = _sole_use(graph, pad.outputs[0], uses)
        if tr is None or tr.op_type != "Transpose":
            continue
        perm = [int(v) for v in tr.attrs["perm"]]
        p = [int(v) for v in pad.attrs["pads"]]
        r = len(perm)
        mid = _fresh(graph, f"{tr.outputs[0]}#unpadded")
        x = pad.inputs[0]
        src = graph.types[x]
        graph.types[mid] = TensorType(tuple(src.shape[i] for i in perm), src.dtype)
        tr.inputs, tr.outputs, pad.inputs, pad.outputs = [x], [mid], [mid], [tr.outputs[0]]
        pad.attrs["pads"] = [p[i] for i in perm] + [p[r + i] for i in perm]
        i, j = graph.nodes.index(pad), graph.nodes.index(tr)
        graph.nodes[i], graph.nodes[j] = tr, pad
        return True
    return False


def _fold_pad_into_conv(graph: Graph) -> bool:
    uses = _consumers(graph)
    for pad in graph.nodes:
        if pad.op_type != "Pad" or float(pad.attrs.get("value", 0.0)) != 0.0 or len(pad.inputs) > 1:
            continue
        conv = _sole_use(graph, pad.outputs[0], uses)
        if conv is None or conv.op_type != "Conv" or conv.inputs[0] != pad.outputs[0]:
            continue
        p = [int(v) for v in pad.attrs["pads"]]
        r = len(p) // 2
        if any(v < 0 for v in p) or any(p[d] or p[r + d] for d in (0, 1)):
            continue
        cp = [int(v) for v in conv.attrs.get("pads", [0] * 2 * (r - 2))]
        s = r - 2
        conv.attrs["pads"] = [cp[i] + p[2 + i] for i in range(s)] + [cp[s + i] + p[r + 2 + i] for i in range(s)]
        conv.inputs[0] = pad.inputs[0]
        graph.nodes.remove(pad)
        return True
    return False


def _fold_affine_into_conv(graph: Graph) -> bool:
    """Conv (→ Transpose) → per-channel Add/Sub/Mul/Div/BatchNormalization: fold into the Conv."""
    uses = _consumers(graph)
    producers = graph.producer_map()
    consts = graph.constants
    for node in graph.nodes:
        if node.op_type not in ("Add", "Sub", "Mul", "Div", "BatchNormalization"):
            continue
        for pos, t in enumerate(node.inputs[:2] if node.op_type != "BatchNormalization" else node.inputs[:1]):
            p = producers.get(t)
            if p is None or t in consts:
                continue
            trans = None
            if p.op_type == "Transpose":
                trans = p
                if _sole_use(graph, p.inputs[0], uses) is not p:
                    continue
                p = producers.get(p.inputs[0])
                if p is None:
                    continue
            if p.op_type != "Conv" or _sole_use(graph, t, uses) is not node:
                continue
            w_name = p.inputs[1]
            b_name = p.inputs[2] if len(p.inputs) > 2 and p.inputs[2] else None
            if w_name not in consts or (b_name is not None and b_name not in consts):
                continue
            shape = graph.types[t].shape
            axis = 1 if trans is None else list(trans.attrs["perm"]).index(1)
            if node.op_type == "BatchNormalization" and axis != 1:
                continue
            w = consts[w_name].astype(np.float32, copy=False)
            m = w.shape[0]
            b = consts[b_name].astype(np.float32, copy=False) if b_name else np.zeros(m, np.float32)
            if node.op_type == "BatchNormalization":
                params = node.inputs[1:5]
                if len(params) != 4 or any(q not in consts or consts[q].size != m for q in params):
                    continue
                scale, bias, mean, var = (consts[q].reshape(m).astype(np.float32) for q in params)
                a = scale / np.sqrt(var + np.float32(node.attrs.get("epsilon", 1e-5)))
                w2, b2 = w * a.reshape(-1, *([1] * (w.ndim - 1))), (b - mean) * a + bias
            else:
                other = node.inputs[1 - pos]
                if other not in consts:
                    continue
                c = _per_channel(consts[other], shape, axis)
                if c is None or graph.types[node.outputs[0]].shape != shape:
                    continue
                cw = c.reshape(-1, *([1] * (w.ndim - 1)))
                if node.op_type == "Add":
                    w2, b2 = w, b + c
                elif node.op_type == "Mul":
                    w2, b2 = w * cw, b * c
                elif node.op_type == "Sub" and pos == 0:
                    w2, b2 = w, b - c
                elif node.op_type == "Sub":
                    w2, b2 = -w, c - b
                elif node.op_type == "Div" and pos == 0:
                    w2, b2 = w / cw, b / c
                else:
                    continue
            wn = _fresh(graph, f"{p.name}#w")
            bn = _fresh(graph, f"{p.name}#b")
            _set_const(graph, wn, w2.astype(np.float32))
            _set_const(graph, bn, b2.astype(np.float32))
            p.inputs[1:] = [wn, bn]
            if trans is None:
                p.outputs[0] = node.outputs[0]
            else:
                trans.outputs[0] = node.outputs[0]
            graph.nodes.remove(node)
            return True
    return False


def _fold_bias_into_gemm(graph: Graph) -> bool:
    """MatMul(A, B) → Add(bias): one Gemm(A, B, bias)."""
    uses = _consumers(graph)
    producers = graph.producer_map()
    for node in graph.nodes:
        if node.op_type != "Add":
            continue
        for pos, t in enumerate(node.inputs[:2]):
            p = producers.get(t)
            other = node.inputs[1 - pos]
            if p is None or p.op_type != "MatMul" or other not in graph.constants or _sole_use(graph, t, uses) is not node:
                continue
            sa, sb = graph.types[p.inputs[0]].shape, graph.types[p.inputs[1]].shape
            shape = graph.types[t].shape
            c = graph.constants[other]
            if len(sa) != 2 or len(sb) != 2 or c.ndim > 2 or graph.types[node.outputs[0]].shape != shape:
                continue
            p.op_type = "Gemm"
            p.inputs = [p.inputs[0], p.inputs[1], other]
            p.outputs[0] = node.outputs[0]
            graph.nodes.remove(node)
            return True
    return False


def _compose_transposes(graph: Graph) -> bool:
    uses = _consumers(graph)
    producers = graph.producer_map()
    for node in graph.nodes:
        if node.op_type != "Transpose":
            continue
        p = producers.get(node.inputs[0])
        if p is None or p.op_type != "Transpose" or _sole_use(graph, node.inputs[0], uses) is not node:
            continue
        pa, pb = list(p.attrs["perm"]), list(node.attrs["perm"])
        node.attrs["perm"] = [pa[j] for j in pb]
        node.inputs[0] = p.inputs[0]
        graph.nodes.remove(p)
        if node.attrs["perm"] == list(range(len(pb))):
            node.op_type = "Identity"
            node.attrs = {}
        return True
    return False


def _fresh(graph: Graph, base: str) -> str:
    name, i = base, 1
    while name in graph.types:
        i += 1
        name = f"{base}{i}"
    return name


def _set_const(graph: Graph, name: str, arr: np.ndarray) -> None:
    graph.constants[name] = np.ascontiguousarray(arr)
    graph.types[name] = TensorType(tuple(arr.shape), arr.dtype.name)


def optimize(graph: Graph) -> None:
    """The exact rewrites of the module docstring, to a fixed point."""
    for rewrite in (_compose_transposes, _swap_pad_transpose, _fold_pad_into_conv, _fold_affine_into_conv, _fold_bias_into_gemm):
        while rewrite(graph):
            pass


# -- entry point ------------------------------------------------------------------------------

def from_graphdef(
    model,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    outputs: Sequence[str] | None = None,
    layout: str = "nchw",
) -> Graph:
    """Build the static-shape graph of a frozen GraphDef (a path to ``.pb``/``.pbtxt`` or a
    ``GraphDef`` message).  ``input_shapes`` fixes Placeholder shapes, ``outputs`` names the
    output tensors (default: the sinks), ``layout`` is ``"nchw"`` (tracked) or ``"nhwc"``."""
    if isinstance(model, (str, os.PathLike)):
        gd = load_graphdef(model)
        name = Path(model).stem
    else:
        gd = model
        check_graphdef(gd)
        name = "graph"
    return _Importer(gd, name, input_shapes, outputs, layout).run()


__all__ = ["from_graphdef", "load_graphdef", "tensor_to_numpy", "optimize", "LAYOUTS"]
