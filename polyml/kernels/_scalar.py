"""Elementwise ops as scalar functions of typed LLVM values, and the one kernel that runs them.

An elementwise op computes each output element from the input elements at the same (broadcast)
index, so its lowering is one perfect nest over the output whose single statement reads each
operand with the affine access ``x[bcast(i)]`` (numpy broadcasting) and writes ``y[i]``.  What
differs between ops is only the scalar function, so an op family registers that function here
with :func:`scalar_op` (the data types it accepts and the type of its result) and shares the
kernel; :mod:`polyml.passes.fuse` composes the same functions in registers to contract chains
(:mod:`polyml.kernels.fused`).

Values are typed by the tensor dtypes of :mod:`polyml.codegen.builder`: ``float32`` is an LLVM
``float``, ``int64``/``int32``/``int8`` signed integers, ``uint8`` an unsigned byte, ``bool`` a
byte holding 0 or 1 (numpy's layout).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import llvmlite.ir as ir

from polyml.codegen.builder import KernelBuilder, coalesced_views, constant, is_float, llvm_type
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, broadcast_shapes, register_instance, unsupported_dtype

FLOAT = frozenset({"float32"})
INTS = frozenset({"int64", "int32"})
NUMERIC = FLOAT | INTS
BOOL = frozenset({"bool"})
#: quantized data: moved, compared, selected and cast, not computed on (arithmetic wraps in
#: ONNX but quantized models never do it; QuantizeLinear/QLinear* kernels handle them)
BYTES = frozenset({"int8", "uint8"})
ANY = NUMERIC | BOOL | BYTES
#: integer dtypes read as unsigned
UNSIGNED = frozenset({"bool", "uint8"})

#: below this many elements a parallel region costs more than it saves
PARALLEL_MIN_ELEMENTS = 1 << 15

Compute = Callable[["Scalar", list[ir.Value]], ir.Value]
ResultType = Callable[[Node, list[str]], str]


def same_as_first(node: Node, dtypes: list[str]) -> str:
    return dtypes[0]


def boolean(node: Node, dtypes: list[str]) -> str:
    return "bool"


@dataclass(frozen=True)
class ScalarOp:
    """One elementwise op: its scalar function and its typing rule."""

    compute: Compute
    #: dtypes every data input may have (``per_input`` overrides by position)
    dtypes: frozenset[str]
    result: ResultType = same_as_first
    #: data inputs must share one dtype (false for Where's condition, Pow's exponent, Cast)
    same_dtype: bool = True
    per_input: tuple[frozenset[str] | None, ...] = ()

    def accepts(self, i: int) -> frozenset[str]:
        if i < len(self.per_input) and self.per_input[i] is not None:
            return self.per_input[i]
        return self.dtypes


SCALAR_OPS: dict[str, ScalarOp] = {}


class Scalar:
    """What a scalar function sees: the builder, the node, its input dtypes and typed helpers."""

    def __init__(self, k: KernelBuilder, node: Node, dtypes: Sequence[str]):
        self.k = k
        self.b = k.b
        self.node = node
        self.dtypes = list(dtypes)
        self.dtype = dtypes[0] if dtypes else "float32"

    def attr(self, name: str, default: object = None) -> object:
        return self.node.attrs.get(name, default)

    @property
    def is_float(self) -> bool:
        return is_float(self.dtype)

    def const(self, value: float | int, dtype: str | None = None) -> ir.Constant:
        return constant(dtype or self.dtype, value)

    def f(self, value: float) -> ir.Constant:
        return constant("float32", value)

    # comparisons give i1; tensors of bool hold a byte
    def compare(self, pred: str, a: ir.Value, c: ir.Value, dtype: str | None = None) -> ir.Value:
        dtype = dtype or self.dtype
        if is_float(dtype):  # ordered, except "!=" which holds for NaN (numpy's not_equal)
            return self.b.fcmp_unordered(pred, a, c) if pred == "!=" else self.b.fcmp_ordered(pred, a, c)
        if dtype in UNSIGNED:
            return self.b.icmp_unsigned(pred, a, c)
        return self.b.icmp_signed(pred, a, c)

    def to_bool(self, bit: ir.Value) -> ir.Value:
        """An i1 as a bool tensor element (0/1 byte)."""
        return self.b.zext(bit, llvm_type("bool"))

    def truth(self, byte: ir.Value) -> ir.Value:
        """A bool tensor element as an i1 (any non-zero byte is true)."""
        return self.b.icmp_unsigned("!=", byte, ir.Constant(byte.type, 0))

    def select(self, bit: ir.Value, a: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.select(bit, a, c)

    def max(self, a: ir.Value, c: ir.Value) -> ir.Value:
        return self.select(self.compare(">", a, c), a, c)

    def min(self, a: ir.Value, c: ir.Value) -> ir.Value:
        return self.select(self.compare("<", a, c), a, c)

    def convert(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        """numpy's ``astype`` between dtypes (float→int truncates toward zero, →bool is ``!= 0``)."""
        if src == dst:
            return v
        b, to = self.b, llvm_type(dst)
        if dst == "bool":
            zero = constant(src, 0)
            bit = b.fcmp_unordered("!=", v, zero) if is_float(src) else b.icmp_unsigned("!=", v, zero)
            return self.to_bool(bit)
        if is_float(src):
            if is_float(dst):
                return b.fpext(v, to)
            return b.fptoui(v, to) if dst in UNSIGNED else b.fptosi(v, to)
        signed = src not in UNSIGNED
        if is_float(dst):
            return b.sitofp(v, to) if signed else b.uitofp(v, to)
        if to.width < v.type.width:
            return b.trunc(v, to)
        if to.width > v.type.width:
            return b.sext(v, to) if signed else b.zext(v, to)
        return v

    def libm(self, name: str, *args: ir.Value) -> ir.Value:
        return self.k.libm(name, *args)

    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        return self.k.intrinsic(name, *args)


def scalar_op(*ops: str, dtypes: frozenset[str] = FLOAT, result: ResultType = same_as_first, same_dtype: bool = True,
              per_input: tuple[frozenset[str] | None, ...] = ()) -> Callable[[Compute], Compute]:
    """Register the decorated ``compute(s: Scalar, vals) -> value`` for each op in ``ops``."""

    def deco(fn: Compute) -> Compute:
        for op in ops:
            SCALAR_OPS[op] = ScalarOp(fn, dtypes, result, same_dtype, per_input)
            register_instance(op, ELEMENTWISE_KERNEL)
        return fn

    return deco


def result_dtype(node: Node, dtypes: list[str]) -> str:
    return SCALAR_OPS[node.op_type].result(node, dtypes)


def scalar(k: KernelBuilder, node: Node, vals: list[ir.Value], dtypes: Sequence[str] | None = None) -> ir.Value:
    """The value one output element of elementwise ``node`` takes, given its input elements
    (omitted optional inputs excluded) of ``dtypes`` (default: all float32)."""
    dts = list(dtypes) if dtypes is not None else ["float32"] * len(vals)
    return SCALAR_OPS[node.op_type].compute(Scalar(k, node, dts), vals)


def outer_parallel_dims(shape: tuple[int, ...]) -> int:
    """How many outer dims of a nest over ``shape`` may be split over threads (0: too small)."""
    size = 1
    for d in shape:
        size *= d
    return len(shape) - 1 if size >= PARALLEL_MIN_ELEMENTS and len(shape) > 1 else 0


class Elementwise(Kernel):
    """``y[i] = f(x0[bcast(i)], x1[bcast(i)], ...)``: one perfect nest over the output."""

    # Memory-bound single-statement nests: Polly's tiling buys nothing here and costs ~100 ms
    # of compile time per op (measured: 600 such ops took 70 s through -polly, 4 s without).
    polly = "off"
    dtypes = ANY

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        op = SCALAR_OPS[node.op_type]
        present = [(i, x) for i, x in enumerate(ins) if x is not None]
        if not present:
            return "no inputs"
        for i, x in present:
            allowed = op.accepts(i)
            if x.type.dtype not in allowed:
                return unsupported_dtype(i, x, allowed)
        if op.same_dtype and len({x.type.dtype for _, x in present}) > 1:
            return f"inputs have different dtypes {[x.type.dtype for _, x in present]}"
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        present = [x for x in ins if x is not None]
        shape = broadcast_shapes(node, *(x.type.shape for x in present))
        return [TensorType(shape, result_dtype(node, [x.type.dtype for x in present]))]

    def lower(self, k: KernelBuilder) -> None:
        bufs = [buf for buf in k.inputs if buf is not None]
        dtypes = [buf.type.dtype for buf in bufs]
        out, bufs = coalesced_views(k.outputs[0], bufs)
        with k.loops(out.shape, parallel=outer_parallel_dims(out.shape)) as ix:
            vals = [buf.load(buf.broadcast_index(ix)) for buf in bufs]
            out.store(ix, scalar(k, k.node, vals, dtypes))


ELEMENTWISE_KERNEL = Elementwise()

