"""What the integer products (MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv) share:
their operands' quantization parameters, the zero-point corrections of
:mod:`polyml.codegen.igemm`, and the epilogue that turns an int32 accumulator into the output.

Notation as in :mod:`polyml.codegen.igemm`: the product is ``W (M×K) · X (K×N)``, ``W`` the
weights (a MatMul's ``Bᵀ``, a convolution's filters), ``X`` the activations (a MatMul's
``Aᵀ``, a convolution's im2col matrix), so output channels are rows.  With the packed
operands ``W' = W + dW``, ``X' = X + dX`` (the micro-kernel's top-bit flips) and
``zW' = zW + dW``, ``zX' = zX + dX``:

    Σ_p (W - zW)(X - zX) = acc + rb[i] - zW'[i]·CX[j],
    rb[i] = bias[i] - zX'·(RW[i] - K·zW'[i]),  RW = row sums of W',  CX = column sums of X'.

``rb`` is a compile-time constant when the weights, the zero points and the bias are (the
row sums of constant weights are folded), else a small nest computes it before the product;
the ``CX`` term exists only where some ``zW'`` may be nonzero (uint8 weights under VNNI, or
weights with nonzero zero points) and is then a nest over the activations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import igemm
from polyml.codegen.builder import F32, I32, I64, Buffer, KernelBuilder, like, splat
from polyml.codegen.quant import qrange, quantize_value, to_i32
from polyml.graph import Node
from polyml.kernels import Kernel, Operand

QTYPES = frozenset({"int8", "uint8"})


@dataclass(frozen=True)
class ZeroPoint:
    """A zero point: its constant values (size 1 or one per channel) or, computed at run time,
    the input index of its buffer (``size`` elements)."""

    value: np.ndarray | None
    index: int | None
    size: int
    dtype: str

    @property
    def known(self) -> bool:
        return self.value is not None

    def nonzero(self) -> bool:
        return not self.known or bool(np.any(self.value != 0))

    def at(self, i: int) -> int:
        v = self.value.reshape(-1)
        return int(v[0] if v.size == 1 else v[i])

    def array(self, n: int) -> np.ndarray:
        return np.broadcast_to(self.value.reshape(-1).astype(np.int64), (n,)) if self.value.size == 1 \
            else self.value.reshape(-1).astype(np.int64)


def zero_point(ins: list[Operand | None], index: int, dtype: str) -> ZeroPoint:
    """Input ``index`` as a zero point (absent: 0 of ``dtype``)."""
    op = ins[index] if index < len(ins) else None
    if op is None:
        return ZeroPoint(np.zeros(1, np.int64), None, 1, dtype)
    value = None if op.value is None else np.asarray(op.value).astype(np.int64).reshape(-1)
    return ZeroPoint(value, None if value is not None else index, max(1, op.type.size), op.type.dtype)


def _count_problem(op: Operand, sizes: Sequence[int], what: str) -> str | None:
    """Why ``op`` holds neither one value nor one per channel (``sizes``: the allowed counts)."""
    if op.type.size not in (1, *sizes):
        return f"{what} of shape {op.type.shape}: polyml takes one value or one per {'/'.join(map(str, sizes))}"
    return None


def zp_problem(node: Node, ins: list[Operand | None], index: int, want_dtype: str, sizes: Sequence[int],
               what: str) -> str | None:
    """Why input ``index`` is not a usable zero point (dtype of its tensor, size 1 or per channel)."""
    op = ins[index] if index < len(ins) else None
    if op is None:
        return None
    if op.type.dtype != want_dtype:
        return f"{what} is {op.type.dtype}, its tensor {want_dtype}"
    return _count_problem(op, sizes, what)


@dataclass(frozen=True)
class Requant:
    """QLinear* output: per-row multipliers ``x_s·w_s[i]/y_s`` (float32), the output zero point
    and dtype, and the fused activation's clamp (``polyml_clip``, output domain)."""

    multipliers: np.ndarray
    zero_point: int
    dtype: str
    lo: int
    hi: int


def requant_of(node: Node, ins: list[Operand | None], x_scale: int, w_scale: int, y_scale: int, y_zp: int,
               rows: int, out_dtype: str) -> Requant:
    """The requantization of a QLinear* node (scales and zero points are static inputs)."""
    xs = float(np.asarray(ins[x_scale].value, np.float32).reshape(-1)[0])
    ws = np.asarray(ins[w_scale].value, np.float32)
    ys = float(np.asarray(ins[y_scale].value, np.float32).reshape(-1)[0])
    zp = 0 if y_zp >= len(ins) or ins[y_zp] is None else int(np.asarray(ins[y_zp].value).reshape(-1)[0])
    qmin, qmax = qrange(out_dtype)
    clip = node.attrs.get("polyml_clip")
    lo, hi = (qmin, qmax) if not clip else (max(qmin, int(clip[0])), min(qmax, int(clip[1])))
    return Requant(igemm.multipliers(xs, ws, ys, rows), zp, out_dtype, lo, hi)


def scale_problem(node: Node, ins: list[Operand | None], index: int, sizes: Sequence[int], what: str) -> str | None:
    """Why input ``index`` is not a usable scale (present, float32, size 1 or per channel)."""
    op = ins[index] if index < len(ins) else None
    if op is None:
        return f"{what} is missing"
    if op.type.dtype != "float32":
        return f"{what} is {op.type.dtype} (float32 scales only)"
    return _count_problem(op, sizes, what)


class IntegerKernel(Kernel):
    """Base of the integer products: 8-bit operands, int32 output unless a subclass requantizes
    (``requant``), no bias unless a subclass has one."""

    polly = "off"
    dtypes = QTYPES

    def requant(self, node: Node, ins: list[Operand | None], rows: int) -> Requant | None:
        return None

    def bias(self, ins: list[Operand | None]) -> np.ndarray | None:
        return None

    def out_dtype(self, ins: list[Operand | None]) -> str:
        return "int32"


class QLinear:
    """The QLinear* operands (mixin before an :class:`IntegerKernel`): ``x, x_scale, x_zp, w,
    w_scale, w_zp, y_scale, y_zp`` and polyml's optional int32 ``bias`` (input 8), scales and
    zero points compile-time constants, one output value per ``channels`` (the rows of the
    requantization)."""

    static_inputs: ClassVar[tuple[int, ...]] = (1, 2, 4, 5, 6, 7, 8)
    #: the x and w scales' names in messages
    scale_names: ClassVar[tuple[str, str]] = ("x_scale", "w_scale")

    def channels(self, ins: list[Operand | None]) -> int:
        """How many per-channel scales / bias values the weights allow."""
        raise NotImplementedError

    def out_dtype(self, ins: list[Operand | None]) -> str:
        return ins[7].type.dtype if len(ins) > 7 and ins[7] is not None else ins[0].type.dtype

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        base = super().supports(node, ins)
        if base:
            return base
        for i in self.static_inputs:
            if i < len(ins) and ins[i] is not None and ins[i].value is None:
                return f"input {i} ({ins[i].name!r}) must be a compile-time constant (scales and zero points are folded)"
        c = self.channels(ins)
        xs, ws = self.scale_names
        problem = (scale_problem(node, ins, 1, (1,), xs) or scale_problem(node, ins, 4, (c,), ws)
                   or scale_problem(node, ins, 6, (1,), "y_scale"))
        if problem:
            return problem
        if len(ins) > 7 and ins[7] is not None and (ins[7].type.dtype not in QTYPES or ins[7].type.size != 1):
            return f"y_zero_point is {ins[7].type.dtype} {ins[7].type.shape} (one int8/uint8 value)"
        if len(ins) > 8 and ins[8] is not None and (ins[8].type.dtype != "int32" or ins[8].type.shape != (c,)):
            return f"bias {ins[8].type.dtype} {ins[8].type.shape} (int32 of shape ({c},))"
        return None

    def requant(self, node: Node, ins: list[Operand | None], rows: int) -> Requant | None:
        return requant_of(node, ins, 1, 4, 6, 7, rows, self.out_dtype(ins))

    def bias(self, ins: list[Operand | None]) -> np.ndarray | None:
        if len(ins) > 8 and ins[8] is not None:
            return np.asarray(ins[8].value).astype(np.int64).reshape(-1)
        return None


# -- the zero-point corrections -------------------------------------------------------------------

@dataclass(frozen=True)
class Corrections:
    """The terms of the module docstring for one product (per group of a convolution: the
    arrays hold ``groups × M`` rows)."""

    rows: int
    k: int
    dw: int
    dx: int
    zw: ZeroPoint
    zx: ZeroPoint
    #: constant row sums of W (unshifted), ``rows`` values, or None (W computed at run time)
    row_sums: np.ndarray | None
    bias: np.ndarray | None

    @property
    def needs_cx(self) -> bool:
        """Whether the ``zW'[i]·CX[j]`` term may be nonzero."""
        return self.dw != 0 or self.zw.nonzero()

    @property
    def constant_rb(self) -> bool:
        return self.row_sums is not None and self.zw.known and self.zx.known

    def rb(self) -> np.ndarray:
        """``rb`` (int32, ``rows``) when :attr:`constant_rb`."""
        zwp = self.zw.array(self.rows) + self.dw
        zxp = self.zx.at(0) + self.dx
        rw = self.row_sums.astype(np.int64) + self.k * self.dw
        bias = self.bias.astype(np.int64) if self.bias is not None else 0
        return np.asarray(bias - zxp * (rw - self.k * zwp), np.int64).astype(np.int32)

    def zw_shifted(self) -> np.ndarray:
        return (self.zw.array(self.rows) + self.dw).astype(np.int32)


def emit_rb(k: KernelBuilder, cor: Corrections, rb: Buffer, zw: Buffer | None, zx: Buffer | None,
            w_at: Callable[[ir.Value, ir.Value], ir.Value] | None = None, w_dtype: str = "int8") -> None:
    """``rb[i]`` at run time: ``zw``/``zx`` the zero-point buffers computed at run time (None:
    constant), ``w_at(i, p)`` W's element when its row sums are not constant (a first nest
    then sums the rows into ``rb``)."""
    b = k.b

    def c32(v: int) -> ir.Constant:
        return ir.Constant(I32, int(v))

    tables = Tables(k.module, k.fn.name)

    def table(values: np.ndarray, tag: str, i: ir.Value) -> ir.Value:
        return tables.load(b, tables.i32(np.asarray(values).astype(np.int32), tag), i)

    if cor.row_sums is None:
        with k.loop(0, cor.rows, "rw") as i:
            rb.store([i], c32(0))
            with k.loop(0, cor.k, "rwp") as p:
                rb.store([i], b.add(rb.load([i]), to_i32(b, w_at(i, p), w_dtype)))
    with k.loop(0, cor.rows, "rb") as i:
        rw = rb.load([i]) if cor.row_sums is None else table(cor.row_sums, "rowsum", i)
        rw = b.add(rw, c32(cor.k * cor.dw))
        if zw is None:
            kzw = table(cor.zw_shifted().astype(np.int64) * cor.k, "kzw", i)
        else:
            zidx = [i] if zw.type.size > 1 else [0] * zw.rank
            kzw = b.mul(c32(cor.k), b.add(to_i32(b, zw.load(zidx), cor.zw.dtype), c32(cor.dw)))
        zx_v = to_i32(b, zx.load([0] * zx.rank), cor.zx.dtype) if zx is not None else c32(cor.zx.at(0))
        out = b.sub(c32(0), b.mul(b.add(zx_v, c32(cor.dx)), b.sub(rw, kzw)))
        if cor.bias is not None:
            out = b.add(out, table(cor.bias, "bias", i))
        rb.store([i], out)


class Tables:
    """Small private constant arrays (per-row multipliers, folded biases) in the op's module,
    readable from the op function and the GEMM block function alike."""

    def __init__(self, module: ir.Module, prefix: str):
        self.module = module
        self.prefix = prefix

    def _global(self, ty: ir.Type, values: list, tag: str) -> ir.GlobalVariable:
        arr = ir.ArrayType(ty, max(1, len(values)))
        g = ir.GlobalVariable(self.module, arr, f"{self.prefix}.{tag}{len(self.module.globals)}")
        g.global_constant = True
        g.linkage = "private"
        g.initializer = ir.Constant(arr, values or [0])
        return g

    def i32(self, values: np.ndarray, tag: str) -> ir.GlobalVariable:
        return self._global(I32, [int(v) for v in np.asarray(values).reshape(-1)], tag)

    def f32(self, values: np.ndarray, tag: str) -> ir.GlobalVariable:
        return self._global(F32, [float(v) for v in np.asarray(values, np.float32).reshape(-1)], tag)

    @staticmethod
    def load(b: ir.IRBuilder, g: ir.GlobalVariable, i: ir.Value) -> ir.Value:
        return b.load(b.gep(g, [ir.Constant(I64, 0), i], inbounds=True))


def emit_cx(k: KernelBuilder, cx: Buffer, columns: int, kk: int, x_at: Callable[..., ir.Value], x_dtype: str, dx: int,
            lead: Sequence[int] = ()) -> None:
    """``cx[β][j] = Σ_p (X[p][j] + dX)`` at run time, ``x_at(β, p, j)`` loading X's element."""
    b = k.b
    with k.loops([*lead, columns], names=[*(f"cb{d}" for d in range(len(lead))), "cxj"]) as ix:
        cx.store(ix, ir.Constant(I32, kk * dx))
        with k.loop(0, kk, "cxp") as p:
            cx.store(ix, b.add(cx.load(ix), to_i32(b, x_at(ix[:-1], p, ix[-1]), x_dtype)))


def store_output(b: ir.IRBuilder, acc: ir.Value, out_ptr: ir.Value, multiplier: ir.Value | None,
                 requant: Requant | None) -> None:
    """Store a corrected accumulator at ``out_ptr`` (an ``i8*`` or typed pointer): int32 as
    is, or requantized with its row's ``multiplier`` (float32).  ``acc`` may be a vector of
    consecutive outputs (one multiplier for all, or a vector of one per output)."""
    q = requantized(b, acc, multiplier, requant)
    b.store(q, b.bitcast(out_ptr, q.type.as_pointer()), align=1 if requant is not None else 4)


def requantized(b: ir.IRBuilder, acc: ir.Value, multiplier: ir.Value | None, requant: Requant | None) -> ir.Value:
    """What :func:`store_output` stores: the accumulator (int32, no ``requant``) or its
    requantized 8-bit value (scalars or vectors)."""
    if requant is None:
        return acc
    fty = ir.VectorType(F32, acc.type.count) if isinstance(acc.type, ir.VectorType) else F32
    mult = multiplier if isinstance(multiplier.type, ir.VectorType) else splat(b, multiplier, fty)
    return quantize_value(b, b.fmul(b.sitofp(acc, fty), mult), like(fty, float(requant.zero_point)),
                          requant.dtype, requant.lo, requant.hi)
