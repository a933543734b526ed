"""Reductions over constant axes: ReduceSum, ReduceMean, ReduceProd, ReduceMax, ReduceMin,
ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum and ReduceLogSumExp.

The axes come from the ``axes`` attribute (opset < 18; ReduceSum from opset 13) or a constant
input; ``keepdims`` (default 1) keeps the reduced dimensions as 1s, and empty axes reduce
everything unless ``noop_with_empty_axes`` (then each element is reduced alone: ReduceL2 gives
``|x|``, ReduceSumSquare ``x²``, as onnxruntime and the reference do).  The input is seen with
runs of adjacent kept or reduced dimensions merged (a view: NCHW over (H, W) becomes
(N·C, H·W)); each op is ``finish(⊕_r pre(x[k, r]))`` and lowers to

1. ``y[k] = e`` — the identity of ⊕ (-0.0, 1), or for max/min the first element ``x[k, 0]``;
2. ``y[k] = y[k] ⊕ pre(x[k, r])`` over the whole input in its own row-major order (unit-stride
   reads, full trip counts; sums and products are reassociable and max/min compare without
   NaNs, so a reduction along the innermost dimension vectorizes as a recurrence and one along
   an outer dimension vectorizes across the kept inner one);
3. ``y[k] = finish(y[k])`` (mean, sqrt, log) over the kept domain.

ReduceLogSumExp runs 1–2 twice: the maximum ``m[k]`` into a scratch buffer, then
``Σ exp(x - m[k])`` into ``y``, finished as ``log(y) + m`` (no overflow for large inputs).

Where the outermost merged dimension is kept and the tensor is large, the statements above run
inside one parallel loop over it (each thread reduces its own rows, which stay in cache).
Integer types (int32, int64; bool for ReduceMax/Min) reduce exactly; finishes that need a real
number truncate as onnxruntime does (the mean divides the integer sum, the L2 norm takes the
square root in double).  Reducing an empty tensor writes the reduction of nothing (0, 1, ±inf,
log 0 = -inf; the mean 0, as onnxruntime).

Policy ``off``: a streaming pass, as the other memory-bound kernels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import REASSOC, Buffer, KernelBuilder, constant, is_float
from polyml.errors import GraphError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, const_ints, normalize_axis, register, unsupported_dtype
from polyml.kernels._scalar import BOOL, FLOAT, NUMERIC, PARALLEL_MIN_ELEMENTS
from polyml.kernels.matmul import view

#: flags of a float max/min whose operands are never NaN: LLVM then vectorizes the recurrence
MINMAX = ("nnan", "nsz")

F64 = ir.DoubleType()


# -- scalar helpers shared with the normalizations -------------------------------------------

def vmax(k: KernelBuilder, a: ir.Value, c: ir.Value, dtype: str = "float32") -> ir.Value:
    """``a > c ? a : c``, typed (bool compares unsigned)."""
    return _pick(k, ">", a, c, dtype)


def vmin(k: KernelBuilder, a: ir.Value, c: ir.Value, dtype: str = "float32") -> ir.Value:
    return _pick(k, "<", a, c, dtype)


def _pick(k: KernelBuilder, pred: str, a: ir.Value, c: ir.Value, dtype: str) -> ir.Value:
    b = k.b
    if is_float(dtype):
        return b.select(b.fcmp_ordered(pred, a, c, flags=MINMAX), a, c, flags=MINMAX)
    cmp = b.icmp_unsigned if dtype in ("bool", "uint8") else b.icmp_signed
    return b.select(cmp(pred, a, c), a, c)



def parallel_rows(size: int) -> bool:
    """Whether a tensor of ``size`` elements is worth splitting over threads."""
    return size >= PARALLEL_MIN_ELEMENTS


# -- axes and views -----------------------------------------------------------------------------

def reduce_axes(node: Node, ins: list[Operand | None]) -> list[int]:
    """The sorted, normalized reduced axes of ``node`` (all axes where none are given)."""
    rank = len(ins[0].type.shape)
    if len(ins) > 1 and ins[1] is not None:
        axes = const_ints(node, ins[1], "axes")
    else:
        axes = [int(a) for a in node.attrs.get("axes", []) or []]
    if not axes:
        return [] if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    norm = sorted({normalize_axis(node, a, rank) for a in axes})
    if len(norm) != len(axes):
        raise GraphError(f"{node.op_type} node {node.label!r}: repeated axes {axes}")
    return norm


def merged_view(shape: tuple[int, ...], axes: list[int]) -> tuple[list[int], list[bool]]:
    """``shape`` with size-1 dims dropped and adjacent dims of the same role merged:
    (extents, reduced?) per merged dimension."""
    dims: list[int] = []
    roles: list[bool] = []
    for d, n in enumerate(shape):
        if n == 1:
            continue
        red = d in axes
        if roles and roles[-1] == red:
            dims[-1] *= n
        else:
            dims.append(n)
            roles.append(red)
    return dims, roles


@dataclass(frozen=True)
class Reduction:
    """A reduction over a merged view, optionally inside a loop over its leading kept dim.

    ``dims``/``roles`` are the merged view; ``lead`` is the induction variable of the loop over
    dims[0] (the statements then cover dims[1:]), or None.
    """

    k: KernelBuilder
    dims: list[int]
    roles: list[bool]
    lead: ir.Value | None = None

    @property
    def sub(self) -> tuple[list[int], list[bool]]:
        return (self.dims[1:], self.roles[1:]) if self.lead is not None else (self.dims, self.roles)

    @property
    def kept(self) -> list[int]:
        """The kept extents inside the lead loop."""
        dims, roles = self.sub
        return [n for n, r in zip(dims, roles) if not r]

    def x_index(self, ix: Sequence) -> list:
        return [self.lead, *ix] if self.lead is not None else list(ix)

    def y_index(self, ix: Sequence) -> list:
        _, roles = self.sub
        kept = [i for i, r in zip(ix, roles) if not r]
        return ([self.lead, *kept] if self.lead is not None else kept) or [0]

    def accumulate(self, dst: Buffer, init: Callable[[list], ir.Value],
                   step: Callable[[ir.Value, list], ir.Value], tag: str = "r") -> None:
        """``dst[k] = init(k, r = 0)``, then ``dst[k] = step(dst[k], (k, r))`` for every r in
        the view's row-major order.  ``init`` is the identity of ``step`` or, for an idempotent
        one (max, min), the first element; either way every nest has full trip counts.
        Callbacks get the index inside the lead loop (see :meth:`x_index`)."""
        k = self.k
        dims, roles = self.sub
        with k.loops([(0, 1) if r else n for n, r in zip(dims, roles)], names=[f"{tag}f{d}" for d in range(len(dims))]) as ix:
            dst.store(self.y_index(ix), init(ix))
        with k.loops(dims, names=[f"{tag}{d}" for d in range(len(dims))]) as ix:
            yi = self.y_index(ix)
            dst.store(yi, step(dst.load(yi), ix))

    def over_kept(self, body: Callable[[list], None], tag: str = "k") -> None:
        """``body(y index)`` for every kept point."""
        kept = self.kept
        with self.k.loops(kept, names=[f"{tag}{d}" for d in range(len(kept))]) as ks:
            body(([self.lead, *ks] if self.lead is not None else list(ks)) or [0])


def rows_loop(k: KernelBuilder, dims: list[int], roles: list[bool], size: int):
    """A parallel loop over ``dims[0]`` when it is kept and the tensor large (yields its
    induction variable), else a context yielding None."""
    if len(dims) > 1 and not roles[0] and dims[0] > 1 and parallel_rows(size) and k.parallel:
        return k.parallel_loop(0, dims[0], "rows")
    return nullcontext(None)


# -- the reductions -------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReduceOp:
    """``finish(⊕ pre(x))``: the combine, the per-element map and the finish of one op."""

    combine: str  # add | mul | max | min
    pre: str = "id"  # id | abs | square | exp (exp(x - max), ReduceLogSumExp)
    finish: str = "id"  # id | mean | sqrt | log | lse
    dtypes: frozenset[str] = NUMERIC


REDUCE_OPS: dict[str, ReduceOp] = {
    "ReduceSum": ReduceOp("add"),
    "ReduceMean": ReduceOp("add", finish="mean"),
    "ReduceProd": ReduceOp("mul"),
    "ReduceMax": ReduceOp("max", dtypes=NUMERIC | BOOL),
    "ReduceMin": ReduceOp("min", dtypes=NUMERIC | BOOL),
    "ReduceL1": ReduceOp("add", pre="abs"),
    "ReduceL2": ReduceOp("add", pre="square", finish="sqrt"),
    "ReduceSumSquare": ReduceOp("add", pre="square"),
    # log and exp of integers left the schema (opset 28); onnx's reference refuses them
    "ReduceLogSum": ReduceOp("add", finish="log", dtypes=FLOAT),
    "ReduceLogSumExp": ReduceOp("add", pre="exp", finish="lse", dtypes=FLOAT),
}


def empty_value(op: str, dtype: str) -> float | int:
    """What ``op`` gives for an empty reduced group (onnxruntime's result)."""
    spec = REDUCE_OPS[op]
    if spec.combine in ("max", "min"):
        if dtype == "bool":
            return 0 if spec.combine == "max" else 1
        if is_float(dtype):
            return -math.inf if spec.combine == "max" else math.inf
        info = np.iinfo(dtype)
        return int(info.min) if spec.combine == "max" else int(info.max)
    if spec.combine == "mul":
        return 1
    if spec.finish in ("log", "lse"):
        return -math.inf
    return 0  # the mean too: onnxruntime's 0 (numpy's would be NaN)


@register
class Reduce(Kernel):
    """The ten ONNX reductions, with constant axes, over float32, int32/int64 (and bool for max/min)."""

    op_types = tuple(REDUCE_OPS)
    static_inputs = (1,)
    polly = "off"
    dtypes = NUMERIC | BOOL

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        allowed = REDUCE_OPS[node.op_type].dtypes
        if ins[0].type.dtype not in allowed:
            return unsupported_dtype(0, ins[0], allowed)
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        axes = reduce_axes(node, ins)
        if node.attrs.get("keepdims", 1):
            out = tuple(1 if d in axes else n for d, n in enumerate(shape))
        else:
            out = tuple(n for d, n in enumerate(shape) if d not in axes)
        return [TensorType(out, ins[0].type.dtype)]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """ReduceLogSumExp: the maxima, one per output element."""
        if REDUCE_OPS[node.op_type].pre == "exp":
            return [TensorType((max(outs[0].size, 1),), ins[0].type.dtype)]
        return []

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        dims, roles = merged_view(ins[0].type.shape, reduce_axes(node, ins))
        return "x".join(f"{n}{'r' if r else ''}" for n, r in zip(dims, roles))

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        if y.type.size == 0:
            return
        op = k.node.op_type
        spec = REDUCE_OPS[op]
        dt = x.type.dtype
        yflat = view(k, y, [y.type.size])
        if x.type.size == 0:
            with k.loops([y.type.size], names=["e"]) as ix:
                yflat.store(ix, constant(dt, empty_value(op, dt)))
            return
        ins = [Operand("", t, v) if t is not None else None for t, v in zip(k.in_types, k.values)]
        dims, roles = merged_view(x.shape, reduce_axes(k.node, ins))
        if not dims:
            dims, roles = [1], [False]
        kept = [n for n, r in zip(dims, roles) if not r] or [1]
        count = math.prod(n for n, r in zip(dims, roles) if r)
        xv, yv = view(k, x, dims), view(k, y, kept)
        mx = view(k, k.temps[0], kept) if spec.pre == "exp" else None
        flt = is_float(dt)
        # -0.0 is the exact identity of a float sum (-0.0 + -0.0 stays -0.0)
        identity = constant(dt, 1 if spec.combine == "mul" else -0.0 if flt else 0)

        # k.b changes inside the parallel loop (its body is outlined): no builder is cached
        def pre(v: ir.Value) -> ir.Value:
            b = k.b
            if spec.pre == "abs":
                return k.intrinsic("llvm.fabs", v) if flt else b.select(b.icmp_signed("<", v, constant(dt, 0)), b.neg(v), v)
            if spec.pre == "square":
                return b.fmul(v, v) if flt else b.mul(v, v)
            return v

        def combine(acc: ir.Value, v: ir.Value) -> ir.Value:
            b = k.b
            if spec.combine == "add":
                return b.fadd(acc, v, flags=REASSOC) if flt else b.add(acc, v)
            if spec.combine == "mul":
                return b.fmul(acc, v, flags=REASSOC) if flt else b.mul(acc, v)
            return (vmax if spec.combine == "max" else vmin)(k, acc, v, dt)

        with rows_loop(k, dims, roles, x.type.size) as lead:
            red = Reduction(k, dims, roles, lead)

            def load(ix: list) -> ir.Value:
                return xv.load(red.x_index(ix))

            if mx is not None:
                # m[k] = max_r x[k, r]; y[k] = Σ_r exp(x[k, r] - m[k]); y = log(y) + m
                red.accumulate(mx, load, lambda acc, ix: vmax(k, acc, load(ix)), "m")

                def shifted(ix: list) -> ir.Value:
                    return k.exp(k.b.fsub(load(ix), mx.load(red.y_index(ix))))

                red.accumulate(yv, lambda ix: k.f32(-0.0), lambda acc, ix: k.b.fadd(acc, shifted(ix), flags=REASSOC), "s")
            elif spec.combine in ("max", "min"):
                red.accumulate(yv, lambda ix: pre(load(ix)), lambda acc, ix: combine(acc, pre(load(ix))))
            else:
                red.accumulate(yv, lambda ix: identity, lambda acc, ix: combine(acc, pre(load(ix))))
            if spec.finish != "id":
                red.over_kept(lambda yi: yv.store(yi, self._finish(k, spec.finish, yv.load(yi), dt, count,
                                                                   mx.load(yi) if mx is not None else None)))

    @staticmethod
    def _finish(k: KernelBuilder, how: str, v: ir.Value, dt: str, count: int, m: ir.Value | None) -> ir.Value:
        b = k.b
        if how == "lse":
            return b.fadd(k.intrinsic("llvm.log", v), m)
        if how == "log":
            return k.intrinsic("llvm.log", v)
        if is_float(dt):
            if how == "mean":
                return b.fmul(v, k.f32(1.0 / count)) if count > 1 else v
            return k.sqrt(v)
        if how == "mean":
            return b.sdiv(v, constant(dt, count)) if count > 1 else v
        # integer sqrt: in double, truncated (onnxruntime's std::sqrt of the integer sum)
        return b.fptosi(k.intrinsic("llvm.sqrt", b.sitofp(v, F64)), v.type)


def reference(op: str, x: np.ndarray, axes: list[int], keepdims: bool) -> np.ndarray:
    """numpy's result of the reduction (for constant folding in the frontends)."""
    ax = tuple(axes)
    fns = {
        "ReduceMean": lambda: np.mean(x, axis=ax, keepdims=keepdims),
        "ReduceSum": lambda: np.sum(x, axis=ax, keepdims=keepdims),
        "ReduceMax": lambda: np.max(x, axis=ax, keepdims=keepdims),
        "ReduceMin": lambda: np.min(x, axis=ax, keepdims=keepdims),
        "ReduceProd": lambda: np.prod(x, axis=ax, keepdims=keepdims),
        "ReduceL1": lambda: np.sum(np.abs(x), axis=ax, keepdims=keepdims),
        "ReduceL2": lambda: np.sqrt(np.sum(np.square(x), axis=ax, keepdims=keepdims)),
        "ReduceSumSquare": lambda: np.sum(np.square(x), axis=ax, keepdims=keepdims),
        "ReduceLogSum": lambda: np.log(np.sum(x, axis=ax, keepdims=keepdims)),
        "ReduceLogSumExp": lambda: np.log(np.sum(np.exp(x), axis=ax, keepdims=keepdims)),
    }
    return np.asarray(fns[op]()).astype(x.dtype)
