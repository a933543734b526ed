"""The QDQ pass: ``DequantizeLinear → op → QuantizeLinear`` sandwiches become integer ops.

A QDQ model (onnxruntime's ``quantize_static(quant_format=QDQ)``) states its integer
computation as float ops between ``DequantizeLinear`` (DQ) and ``QuantizeLinear`` (Q) nodes:
``Q(op(DQ(x_q), DQ(w_q)))``.  The pass rewrites each sandwich into the op that computes the same
value on the quantized tensors, so the float values in between are never materialized:

* ``DQ(x), DQ(w)[, DQ(b)] → Conv [→ Relu/Clip] → Q`` ⇒ ``QLinearConv(x, x_s, x_zp, w, w_s, w_zp,
  y_s, y_zp, b_int32)``;
* ``DQ(a), DQ(b) → MatMul [→ Relu/Clip] → Q`` ⇒ ``QLinearMatMul``; a ``Gemm`` (``transA=0``,
  ``alpha=beta=1``) likewise, with its constant ``B`` transposed at compile time when
  ``transB=1`` and its bias ``C`` as a 9th int32 input (polyml's extension of QLinearMatMul);
* ``DQ, DQ → Add/Sum/Mul [→ Relu/Clip] → Q`` ⇒ ``com.microsoft.QLinearAdd/QLinearMul``; ``DQ →
  GlobalAveragePool → Q`` ⇒ ``com.microsoft.QLinearGlobalAveragePool``; ``DQ... → Concat → Q``
  ⇒ ``com.microsoft.QLinearConcat``;
* ``DQ → MaxPool/Reshape/Flatten/Transpose/Squeeze/Unsqueeze → Q`` with the same scale and zero
  point on both sides ⇒ the op itself on the int8/uint8 tensor.  Exact: these ops only select
  or move elements, and ``Q(DQ(v)) = v`` for the same parameters; max commutes with the monotone
  map ``v ↦ (v - zp)·s``.

Conventions for the integer ops (also in docs/QUANTIZATION.md):

* biases: ``b_int32[m] = b_q[m]`` when the bias is ``DQ(b_q)`` of an int32 constant whose scale
  is ``x_s·w_s[m]`` (relative 1e-4) and zero point 0 (what the quantizer writes and what
  onnxruntime's own QDQ fusion uses); otherwise ``round_half_even(b[m] / (x_s·w_s[m]))``;
* a Relu or Clip between the op and Q becomes the attribute ``polyml_clip = [lo, hi]`` in the
  output's quantized domain, applied after saturation: Q is monotone, so ``Q(relu(v)) =
  max(Q(v), y_zp)`` and ``Q(clip(v, a, b)) = clamp(Q(v), Q(a), Q(b))`` exactly.

A sandwich is rewritten only when every scale and zero point is a compile-time constant (per
tensor for activations), the float intermediates have no other reader and are not graph
outputs, and the integer op has a kernel that accepts the operands (``Kernel.supports``).
Otherwise ``DQ → float op → Q`` stays: the op *ran in float* and the report says so (build
output and ``manifest.json``'s ``quantization``).  Dequantizations of constants that remain are
folded into float32 constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Operand, registry
from polyml.passes.graph import GraphPass, register_graph_pass

MS = "com.microsoft."
#: ops that only select or move elements: run on the quantized tensor when DQ and Q agree
MOVES = frozenset({"MaxPool", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze"})
#: float ops that stay between DQ and Q when nothing better exists (reported as ran in float)
QDQ = frozenset({"QuantizeLinear", "DequantizeLinear"})


@dataclass
class QuantizationReport:
    """What became integer, what ran in float and why."""

    integer: list[dict] = field(default_factory=list)
    ran_in_float: list[dict] = field(default_factory=list)
    folded_constants: int = 0
    #: node name → why its integer form was refused (kept in float)
    refused: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"integer": self.integer, "ran_in_float": self.ran_in_float, "folded_constants": self.folded_constants}

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for e in self.ran_in_float:
            ops[e["op_type"]] = ops.get(e["op_type"], 0) + 1
        floats = ", ".join(f"{k}×{v}" for k, v in sorted(ops.items())) or "none"
        return f"quantized: {len(self.integer)} integer ops; ran in float: {floats}"


@dataclass(frozen=True)
class _DQ:
    """A DequantizeLinear whose parameters are constants."""

    node: Node
    x: str  # the quantized tensor
    scale: np.ndarray
    zp: np.ndarray | None
    scale_name: str
    zp_name: str
    axis: int

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1

    def same_params(self, q: _DQ) -> bool:
        zp_a = self.zp if self.zp is not None else np.zeros((), np.uint8)
        zp_b = q.zp if q.zp is not None else np.zeros((), np.uint8)
        return (self.per_tensor and q.per_tensor and zp_a.dtype == zp_b.dtype
                and np.array_equal(self.scale.reshape(-1), q.scale.reshape(-1)) and np.array_equal(zp_a.reshape(-1), zp_b.reshape(-1)))


@register_graph_pass
@dataclass(frozen=True)
class QuantizeQDQ(GraphPass):
    """QDQ sandwiches (DequantizeLinear → float op → QuantizeLinear) become integer ops."""

    name: ClassVar[str] = "quantize"

    def apply(self, graph: Graph) -> tuple[Graph, QuantizationReport]:
        if not any(n.op_type in QDQ for n in graph.nodes):
            return graph, QuantizationReport()  # nothing to rewrite: no copy
        return super().apply(graph)

    def rewrite(self, g: Graph) -> QuantizationReport:
        report = QuantizationReport()
        _Rewriter(g, report).run()
        g.prune()
        _fold_constant_dequantize(g, report)
        _report_float(g, report)
        return report


def _param(g: Graph, node: Node, pos: int) -> tuple[np.ndarray | None, str]:
    name = node.inputs[pos] if pos < len(node.inputs) else ""
    if not name:
        return None, ""
    return g.constants.get(name), name


def _as_qparams(g: Graph, node: Node | None) -> _DQ | None:
    """A DQ or Q node's constant parameters (None when computed or not such a node)."""
    if node is None or node.op_type not in QDQ or int(node.attrs.get("block_size", 0) or 0):
        return None
    scale, sname = _param(g, node, 1)
    zp, zname = _param(g, node, 2)
    if scale is None or (zname and zp is None):
        return None
    rank = len(g.types[node.inputs[0]].shape)
    axis = int(node.attrs.get("axis", 1))
    axis = axis % rank if rank else 0
    return _DQ(node, node.inputs[0], scale, zp, sname, zname, axis)


class _Rewriter:
    def __init__(self, g: Graph, report: QuantizationReport):
        self.g, self.report = g, report
        self.kernels = registry()
        self.count = 0

    def run(self) -> None:
        for q in [n for n in self.g.nodes if n.op_type == "QuantizeLinear"]:
            self.producers = self.g.producer_map()
            self.consumers = self.g.consumers()
            self._rewrite(q)

    # -- helpers ----------------------------------------------------------------------------
    def private(self, t: str) -> bool:
        """Whether ``t`` is read by exactly one node and is not a graph output."""
        return t not in self.g.outputs and len(self.consumers.get(t, [])) == 1

    def dq(self, t: str) -> _DQ | None:
        p = self.producers.get(t)
        if p is None or p.op_type != "DequantizeLinear":
            return None
        return _as_qparams(self.g, p)

    def const(self, name: str, value: np.ndarray) -> str:
        self.count += 1
        key = f"{name}@q{self.count}"
        self.g.constants[key] = value
        self.g.types[key] = TensorType(tuple(value.shape), value.dtype.name)
        return key

    def zp_name(self, p: _DQ, dtype: str) -> str:
        """The zero point input (a zero of the quantized dtype when the node has none)."""
        return p.zp_name or self.const("zero_point", np.zeros((), dtype))

    def clip_range(self, act: Node | None, y: _DQ, dtype: str) -> list[int] | None:
        """``polyml_clip`` for a Relu/Clip between the op and Q (None: no activation)."""
        if act is None:
            return None
        s = float(y.scale.reshape(-1)[0])
        zp = int(y.zp.reshape(-1)[0]) if y.zp is not None else 0
        info = np.iinfo(dtype)

        def q(v: float) -> int:
            return int(np.clip(np.rint(np.float32(v) / np.float32(s)) + zp, info.min, info.max))

        if act.op_type == "Relu":
            return [q(0.0), int(info.max)]
        lo = self.g.constants.get(act.inputs[1]) if len(act.inputs) > 1 and act.inputs[1] else act.attrs.get("min")
        hi = self.g.constants.get(act.inputs[2]) if len(act.inputs) > 2 and act.inputs[2] else act.attrs.get("max")
        return [q(float(np.asarray(lo).reshape(-1)[0])) if lo is not None else int(info.min),
                q(float(np.asarray(hi).reshape(-1)[0])) if hi is not None else int(info.max)]

    def accepts(self, node: Node) -> str | None:
        """Why the integer op cannot be lowered (None: it can)."""
        kernel = self.kernels.get(node.op_type)
        if kernel is None:
            return f"no {node.op_type} kernel"
        ops = [Operand(t, self.g.types[t], self.g.constants.get(t)) if t else None for t in node.inputs]
        try:
            why = kernel.supports(node, ops)
            if why is None:
                kernel.infer(node, ops)
        except Exception as e:  # a shape the integer op refuses: keep the float sandwich
            return str(e)
        return why

    def replace(self, new: Node, removed: list[Node], sources: list[Node]) -> bool:
        why = self.accepts(new)
        if why:
            self.report.refused[removed[0].name] = f"{new.op_type}: {why}"
            return False
        at = self.g.nodes.index(removed[-1])
        self.g.nodes[at] = new
        for n in removed[:-1]:
            self.g.nodes.remove(n)
        self.report.integer.append({"node": new.name, "op_type": new.op_type,
                                    "replaces": [n.op_type for n in sources]})
        return True

    # -- the patterns -----------------------------------------------------------------------
    def _rewrite(self, q: Node) -> None:
        y = _as_qparams(self.g, q)
        if y is None or not y.per_tensor:
            return
        t = q.inputs[0]
        op = self.producers.get(t)
        if op is None or not self.private(t):
            return
        act = None
        if op.op_type in ("Relu", "Clip") and self.private(op.inputs[0]):
            act, op = op, self.producers.get(op.inputs[0])
            if op is None:
                return
        out_dtype = self.g.types[q.outputs[0]].dtype
        if op.op_type in ("Conv", "MatMul", "Gemm"):
            self._product(op, act, q, y, out_dtype)
        elif op.op_type in ("Add", "Mul") or (op.op_type == "Sum" and len(op.inputs) == 2):
            self._binary(op, act, q, y)
        elif act is not None:
            return
        elif op.op_type == "GlobalAveragePool":
            self._unary(op, q, y, MS + "QLinearGlobalAveragePool")
        elif op.op_type == "Concat":
            self._concat(op, q, y)
        elif op.op_type in MOVES:
            self._move(op, q, y)

    def _product(self, op: Node, act: Node | None, q: Node, y: _DQ, out_dtype: str) -> None:
        g = self.g
        x, w = self.dq(op.inputs[0]), self.dq(op.inputs[1])
        if x is None or w is None or not x.per_tensor or w.x not in g.constants:
            return
        wq = g.constants[w.x]
        ws = w.scale.reshape(-1).astype(np.float32)
        wzp = w.zp if w.zp is not None else np.zeros(ws.shape, wq.dtype)
        bias_name = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] else ""
        kind = op.op_type
        if kind == "Gemm":
            if op.attrs.get("transA", 0) or float(op.attrs.get("alpha", 1.0)) != 1.0 or float(op.attrs.get("beta", 1.0)) != 1.0:
                return
            if wq.ndim != 2:
                return
            if op.attrs.get("transB", 0):
                if not w.per_tensor and w.axis != 0:
                    return
                wq = np.ascontiguousarray(wq.T)
            elif not w.per_tensor and w.axis != 1:
                return
        elif kind == "MatMul":
            if not w.per_tensor and (wq.ndim != 2 or w.axis != 1):
                return
        elif not w.per_tensor and w.axis != 0:  # Conv: per output channel
            return
        channels = wq.shape[0] if kind == "Conv" else wq.shape[-1]
        bias = None
        if bias_name:
            bias = self._int_bias(bias_name, float(x.scale.reshape(-1)[0]), ws, channels)
            if bias is None:
                return
        wz = np.asarray(wzp).reshape(-1) if wzp.size > 1 else np.asarray(wzp).reshape(())
        wsn = self.const(f"{op.name}.w_scale", ws if ws.size > 1 else ws.reshape(()))
        wzn = self.const(f"{op.name}.w_zero_point", wz.astype(wq.dtype))
        wn = self.const(f"{op.name}.w", wq) if kind == "Gemm" else w.x
        xzp = self.zp_name(x, g.types[x.x].dtype)
        yzp = self.zp_name(y, out_dtype)
        inputs = [x.x, x.scale_name, xzp, wn, wsn, wzn, y.scale_name, yzp]
        if bias is not None:
            inputs.append(self.const(f"{op.name}.bias", bias))
        attrs = dict(op.attrs) if kind == "Conv" else {}
        clip = self.clip_range(act, y, out_dtype)
        if clip is not None:
            attrs["polyml_clip"] = clip
        new_op = "QLinearConv" if kind == "Conv" else "QLinearMatMul"
        new = Node(f"{op.name}.int8", new_op, inputs, list(q.outputs), attrs, source=op.source or op.name, opset=op.opset)
        removed = [op, *([act] if act else []), q]
        self.replace(new, removed, removed)

    def _int_bias(self, name: str, xs: float, ws: np.ndarray, channels: int) -> np.ndarray | None:
        """The bias as int32 in the accumulator's scale ``x_s·w_s[m]``."""
        g = self.g
        acc_scale = (np.float32(xs) * ws.astype(np.float32)).astype(np.float64)
        acc_scale = np.broadcast_to(acc_scale, (channels,))
        b = self.dq(name)
        if b is not None and b.x in g.constants and g.constants[b.x].dtype == np.int32:
            bq = g.constants[b.x].reshape(-1)
            bs = np.broadcast_to(b.scale.reshape(-1).astype(np.float64), (channels,))
            zero = b.zp is None or not np.any(b.zp)
            if bq.size == channels and zero and np.allclose(bs, acc_scale, rtol=1e-4, atol=0):
                return bq.astype(np.int32)
            value = (bq.astype(np.float64) - (b.zp.astype(np.float64) if b.zp is not None else 0.0)) * b.scale.reshape(-1)
        elif name in g.constants:
            value = g.constants[name].astype(np.float64).reshape(-1)
        else:
            return None
        if value.size not in (1, channels):
            return None
        out = np.rint(np.broadcast_to(value, (channels,)) / acc_scale)
        return np.clip(out, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)

    def _binary(self, op: Node, act: Node | None, q: Node, y: _DQ) -> None:
        a, b = self.dq(op.inputs[0]), self.dq(op.inputs[1])
        if a is None or b is None or not a.per_tensor or not b.per_tensor:
            return
        dtype = self.g.types[q.outputs[0]].dtype
        if self.g.types[a.x].dtype != dtype or self.g.types[b.x].dtype != dtype:
            return
        inputs = [a.x, a.scale_name, self.zp_name(a, dtype), b.x, b.scale_name, self.zp_name(b, dtype), y.scale_name, self.zp_name(y, dtype)]
        clip = self.clip_range(act, y, dtype)
        attrs = {"polyml_clip": clip} if clip is not None else {}
        kind = "Mul" if op.op_type == "Mul" else "Add"
        new = Node(f"{op.name}.int8", MS + "QLinear" + kind, inputs, list(q.outputs), attrs, source=op.source or op.name,
                   opset=op.opset)
        removed = [op, *([act] if act else []), q]
        self.replace(new, removed, removed)

    def _unary(self, op: Node, q: Node, y: _DQ, new_op: str) -> None:
        x = self.dq(op.inputs[0])
        dtype = self.g.types[q.outputs[0]].dtype
        if x is None or not x.per_tensor or self.g.types[x.x].dtype != dtype:
            return
        inputs = [x.x, x.scale_name, self.zp_name(x, dtype), y.scale_name, self.zp_name(y, dtype)]
        new = Node(f"{op.name}.int8", new_op, inputs, list(q.outputs), {}, source=op.source or op.name, opset=op.opset)
        self.replace(new, [op, q], [op, q])

    def _concat(self, op: Node, q: Node, y: _DQ) -> None:
        dtype = self.g.types[q.outputs[0]].dtype
        ins = [self.dq(t) for t in op.inputs]
        if any(x is None or not x.per_tensor or self.g.types[x.x].dtype != dtype for x in ins):
            return
        inputs = [y.scale_name, self.zp_name(y, dtype)]
        for x in ins:
            inputs += [x.x, x.scale_name, self.zp_name(x, dtype)]
        new = Node(f"{op.name}.int8", MS + "QLinearConcat", inputs, list(q.outputs), dict(op.attrs), source=op.source or op.name,
                   opset=op.opset)
        self.replace(new, [op, q], [op, q])

    def _move(self, op: Node, q: Node, y: _DQ) -> None:
        x = self.dq(op.inputs[0])
        if x is None or not x.same_params(y) or self.g.types[x.x].dtype != self.g.types[q.outputs[0]].dtype:
            return
        new = Node(f"{op.name}.int8", op.op_type, [x.x, *op.inputs[1:]], list(q.outputs), dict(op.attrs),
                   source=op.source or op.name, opset=op.opset)
        self.replace(new, [op, q], [op, q])


def qgemm_as_qlinear_matmul(g: Graph) -> None:
    """onnxruntime's ``com.microsoft.QGemm`` (its QOperator Gemm: ``A, a_s, a_zp, B, b_s, b_zp,
    C, y_s, y_zp``) with a constant ``B``, ``transA=0``, ``alpha=1`` and a quantized output as
    ``QLinearMatMul`` with ``B`` transposed at compile time when ``transB=1`` and ``C`` (int32,
    scale ``a_s·b_s``) as the 9th input (the convention of the QDQ pass).  Runs in the frontend
    before type inference; other QGemm forms are left to be reported as unsupported."""
    for i, n in enumerate(g.nodes):
        if n.op_type != MS + "QGemm":
            continue
        ins = n.inputs + [""] * (9 - len(n.inputs))
        b = g.constants.get(ins[3])
        if (b is None or b.ndim != 2 or not ins[7] or n.attrs.get("transA", 0)
                or float(n.attrs.get("alpha", 1.0)) != 1.0):
            continue
        if n.attrs.get("transB", 0):
            key = f"{ins[3]}@T"
            g.constants[key] = np.ascontiguousarray(b.T)
            g.types[key] = TensorType(tuple(b.T.shape), b.dtype.name)
            ins[3] = key
        inputs = [*ins[:6], ins[7], ins[8], *([ins[6]] if ins[6] else [])]
        g.nodes[i] = Node(n.name, "QLinearMatMul", inputs, list(n.outputs), {}, source=n.source or n.name, opset=n.opset)


def _fold_constant_dequantize(g: Graph, report: QuantizationReport) -> None:
    """DequantizeLinear of constants that no integer op took: float32 constants."""
    keep = []
    for n in g.nodes:
        p = _as_qparams(g, n) if n.op_type == "DequantizeLinear" else None
        if p is None or p.x not in g.constants:
            keep.append(n)
            continue
        x = g.constants[p.x]
        shape = [1] * x.ndim
        if not p.per_tensor and x.ndim:
            shape[p.axis] = -1
        zp = p.zp.astype(np.float32).reshape(shape) if p.zp is not None else np.float32(0)
        s = p.scale.astype(np.float32).reshape(shape) if x.ndim else p.scale.astype(np.float32)
        g.constants[n.outputs[0]] = ((x.astype(np.float32) - zp) * s).astype(np.float32)
        report.folded_constants += 1
    g.nodes = keep


def _report_float(g: Graph, report: QuantizationReport) -> None:
    """Float ops on a path from a DequantizeLinear to a QuantizeLinear (the model asked for
    them quantized; polyml computes them on dequantized floats), in graph order."""
    producers = g.producer_map()
    consumers = g.consumers()
    after_dq: set[str] = set()  # nodes reachable from a DQ output
    for n in g.nodes:
        if n.op_type == "DequantizeLinear" or any((p := producers.get(t)) is not None and p.name in after_dq
                                                  and p.op_type != "QuantizeLinear" for t in n.inputs if t):
            after_dq.add(n.name)
    before_q: set[str] = set()  # nodes from which a Q is reachable
    for n in reversed(g.nodes):
        if n.op_type == "QuantizeLinear" or any(c.name in before_q and c.op_type != "DequantizeLinear"
                                                for o in n.outputs if o for c in consumers.get(o, [])):
            before_q.add(n.name)
    for n in g.nodes:
        if n.op_type not in QDQ and n.name in after_dq and n.name in before_q:
            entry = {"node": n.name, "op_type": n.op_type}
            if n.name in report.refused:
                entry["why"] = report.refused[n.name]
            report.ran_in_float.append(entry)
