"""The TF values of one GraphDef → Graph translation: how each TF tensor is held in the IR
(:class:`Val`: an IR tensor and a permutation, or a numpy constant), the IR built so far, and the
emission helpers every converter works through (:class:`TFValues`; the layout tracking is
described in :mod:`polyml.frontends.tensorflow.importer`).

The converters of :mod:`polyml.frontends.tensorflow.convert` import this module;
:class:`~polyml.frontends.tensorflow.importer.Importer` (a :class:`TFValues` that also drives the
conversion loop) imports them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polyml.graph import Node, TensorType
from polyml.kernels import Operand, registry

#: the ONNX opset whose attribute conventions the emitted nodes follow
OPSET = 18
#: the permutation holding an NHWC tensor in NCHW order (IR dim i is TF dim NCHW[i])
NCHW = (0, 3, 1, 2)
LAYOUTS = ("nchw", "nhwc")


class Unsupported(Exception):
    """A TF node polyml cannot lower (collected, reported together)."""


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


class TFValues:
    """The values and the IR of one GraphDef → Graph translation (the state converters read and
    extend; :class:`~polyml.frontends.tensorflow.importer.Importer` adds the conversion loop)."""

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
                    self.readers.setdefault(tensor_name(t), []).append(n)
        #: SpaceToBatchND nodes of the dilated-convolution pattern → (input, dilations, pads)
        self.s2b: dict[str, tuple[str, list[int], list[int]]] = {}
        #: Conv nodes of that pattern whose BatchToSpaceND passes their output through
        self.b2s: set[str] = set()
        self.input_shapes = {split_name(k)[0]: tuple(int(d) for d in v) for k, v in (input_shapes or {}).items()}
        self.requested = [tensor_name(o) for o in outputs] if outputs else None

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
