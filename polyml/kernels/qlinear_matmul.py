"""Integer matrix products: MatMulInteger (int32 out) and QLinearMatMul (requantized 8-bit out).

``Y = (A - zA) · (B - zB)`` with numpy ``matmul`` shapes, uint8/int8 operands and int32
accumulation; QLinearMatMul then requantizes, ``y = saturate(rint(acc · a_s·b_s[j]/y_s) + y_zp)``
(``acc`` plus the optional int32 ``bias``, polyml's extension for a quantized Gemm, and the
fused Relu/Clip ``polyml_clip``: :mod:`polyml.kernels._integer`).

Where ``B`` is one matrix and the product is large enough (host builds with the packed GEMM),
it runs on :mod:`polyml.codegen.igemm` transposed, ``Yᵀ = Bᵀ · Aᵀ``: ``B`` is the weight side
(constant weights pre-packed at compile time with their row sums folded into the per-column
bias), ``A``'s rows the activation columns, and the epilogue stores ``Y`` row by row.  Other
products (batched ``B``, a few rows, GPU and SCoP lowerings) use plain nests: an int32
accumulator ``C[β][i][j] += (A - zA)(B - zB[j])`` in loops ``β, i, k, j`` (unit stride in B and
C, vectorized), then the output.  Both compute exactly the ONNX value (int32 arithmetic).

QLinearMatMul's scales and zero points must be compile-time constants (``static_inputs``:
the ONNX backend specializes graph inputs there); MatMulInteger's zero points may be computed
at run time (``DynamicQuantizeLinear``'s output in dynamically quantized models).
"""

from __future__ import annotations

import math

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import gemv, igemm
from polyml.codegen.builder import F32, I32, Buffer, KernelBuilder, splat
from polyml.codegen.quant import to_i32
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Operand, register
from polyml.kernels._integer import (
    QTYPES,
    Corrections,
    IntegerKernel,
    QLinear,
    Tables,
    ZeroPoint,
    emit_cx,
    emit_rb,
    store_output,
    zero_point,
    zp_problem,
)
from polyml.kernels.matmul import MatMul, prefer_wide_vectors, view

#: products with fewer activation rows than this, or fewer multiply-adds, stay plain nests
GEMM_MIN_ROWS = 8
GEMM_MIN_MACS = 1 << 15

I64 = ir.IntType(64)
I8P = ir.IntType(8).as_pointer()
#: one-row products narrower than this stay plain nests
GEMV_MIN_COLUMNS = 16


class _IntegerProduct(IntegerKernel):
    """The shared lowering; subclasses say where the operands are."""

    #: input positions: A, B, zA, zB
    A, B, ZA, ZB = 0, 1, 2, 3

    # -- shapes -----------------------------------------------------------------------------
    def dims(self, node: Node, ins: list[Operand | None]) -> tuple[tuple[int, ...], int, int, int, tuple[int, ...]]:
        sa, sb = ins[self.A].type.shape, ins[self.B].type.shape
        try:
            return MatMul._plan(node, sa, sb)
        except ShapeError as e:
            raise ShapeError(str(e).replace("MatMul node", f"{node.op_type} node")) from None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        *_, out = self.dims(node, ins)
        return [TensorType(out, self.out_dtype(ins))]

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        for i, what in ((self.A, "A"), (self.B, "B")):
            if ins[i].type.dtype not in QTYPES:
                return f"{what} ({ins[i].name!r}) is {ins[i].type.dtype}; supported: int8, uint8"
        n = ins[self.B].type.shape[-1] if len(ins[self.B].type.shape) > 1 else 1
        return (zp_problem(node, ins, self.ZA, ins[self.A].type.dtype, (1,), "A's zero point")
                or zp_problem(node, ins, self.ZB, ins[self.B].type.dtype, (n,), "B's zero point"))

    def gemm_dims(self, node: Node, ins: list[Operand | None]) -> tuple[int, int, int] | None:
        """(rows of A stacked, N, K) when the product runs on the integer GEMM, else None."""
        batch, m, n, kk, _ = self.dims(node, ins)
        sb = ins[self.B].type.shape
        if not self.config.packed or len(sb) < 2 or math.prod(sb[:-2]) != 1:
            return None
        rows = math.prod(batch) * m
        return (rows, n, kk) if rows >= GEMM_MIN_ROWS and rows * n * kk >= GEMM_MIN_MACS else None

    def gemv_dims(self, node: Node, ins: list[Operand | None]) -> tuple[int, int] | None:
        """(N, K) when a one-row product runs on :meth:`_gemv`: a host build with VNNI, one
        constant B, K whole groups of 4, zero points that fold into one constant per column."""
        batch, m, n, kk, _ = self.dims(node, ins)
        sb = ins[self.B].type.shape
        if (not self.config.packed or ins[self.B].value is None or len(sb) < 2 or math.prod(sb[:-2]) != 1
                or math.prod(batch) * m != 1 or kk % 4 or n < GEMV_MIN_COLUMNS):
            return None
        blk = igemm.blocking_for_host(override=self.config.igemm)
        if blk.variant != "vnni":
            return None
        cor = self.corrections(node, ins, n, kk, blk)
        return (n, kk) if cor.constant_rb and not cor.needs_cx else None

    def corrections(self, node: Node, ins: list[Operand | None], n: int, kk: int,
                    blk: igemm.IBlocking) -> Corrections:
        w, x = ins[self.B].type.dtype, ins[self.A].type.dtype
        dw, dx = blk.shifts(w == "int8", x == "int8")
        bval = ins[self.B].value
        row_sums = None if bval is None else np.asarray(bval).astype(np.int64).reshape(kk, n).sum(axis=0)
        return Corrections(n, kk, dw, dx, zero_point(ins, self.ZB, w), zero_point(ins, self.ZA, x), row_sums,
                           self.bias(ins))

    # -- hooks ------------------------------------------------------------------------------
    def policy(self, node: Node, ins: list[Operand | None]) -> str:
        return "off"

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        sa, sb = ins[self.A].type.shape, ins[self.B].type.shape
        how = (f"igemm {igemm.blocking_for_host(override=self.config.igemm).variant}" if self.gemm_dims(node, ins)
               else "gemv vnni" if self.gemv_dims(node, ins) else "nests")
        return f"{sa} {ins[self.A].type.dtype} @ {sb} {ins[self.B].type.dtype} {how}"

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        dims = self.gemm_dims(node, ins)
        if self.gemv_dims(node, ins):
            return []
        if dims is None:
            return [] if outs[0].dtype == "int32" else [TensorType(outs[0].shape, "int32")]
        rows, n, kk = dims
        blk = igemm.blocking_for_host(override=self.config.igemm)
        cor = self.corrections(node, ins, n, kk, blk)
        t = [TensorType((n, rows) if igemm.needs_c(kk, blk) else (1,), "int32"),
             TensorType((-(-igemm.scratch_size(1, n, rows, kk, blk=igemm.blocking_for_host(n, self.config.igemm)) // 4),),
                        "int32")]
        if not cor.constant_rb:
            t.append(TensorType((n,), "int32"))
        if cor.needs_cx:
            t.append(TensorType((rows,), "int32"))
        return t

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        """Constant B pre-packed as the weight side (its transpose, converted for the
        micro-kernel) when the product runs on the integer GEMM."""
        one_row = self.gemv_dims(node, ins)
        if one_row is not None:  # B as [K/4][N padded to whole blocks][4] bytes, converted
            n, kk = one_row
            bm = np.asarray(ins[self.B].value).reshape(kk, n)
            blk = igemm.blocking_for_host(override=self.config.igemm)
            conv = igemm.convert_np(bm, blk, ins[self.B].type.dtype == "int8", "w")
            packed_b = np.zeros((kk // 4, gemv.blocks(n) * gemv.BLOCK, 4), np.int8)
            packed_b[:, :n, :] = conv.reshape(kk // 4, 4, n).transpose(0, 2, 1)
            return [packed_b.reshape(-1).view(np.int32)]
        dims = self.gemm_dims(node, ins)
        if dims is None or ins[self.B].value is None:
            return []
        _, n, kk = dims
        bm = np.asarray(ins[self.B].value).reshape(kk, n)
        return [igemm.prepack_w(bm.T, igemm.blocking_for_host(n, self.config.igemm), ins[self.B].type.dtype == "int8")]

    def replaced_inputs(self, node: Node, ins: list[Operand | None]) -> set[int]:
        return {self.B} if self.constants(node, ins) else set()

    # -- lowering ---------------------------------------------------------------------------
    def _operands(self, k: KernelBuilder) -> list[Operand | None]:
        return [None if t is None else Operand(f"in{i}", t, v) for i, (t, v) in enumerate(zip(k.in_types, k.values))]

    def lower(self, k: KernelBuilder) -> None:
        prefer_wide_vectors(k.fn)
        ins = self._operands(k)
        dims = self.gemm_dims(k.node, ins)
        one_row = self.gemv_dims(k.node, ins)
        if one_row is not None:
            self._gemv(k, ins, *one_row)
        elif dims is None:
            self._nests(k, ins)
        else:
            self._gemm(k, ins, *dims)

    def _gemm(self, k: KernelBuilder, ins: list[Operand | None], rows: int, n: int, kk: int) -> None:
        blk = igemm.blocking_for_host(n, self.config.igemm)
        cor = self.corrections(k.node, ins, n, kk, blk)
        rq = self.requant(k.node, ins, n)
        temps = iter(k.temps)
        c, scratch = next(temps), next(temps)
        rb = None if cor.constant_rb else next(temps)
        cx = next(temps) if cor.needs_cx else None
        a = view(k, k.inputs[self.A], (rows, kk))
        y = view(k, k.outputs[0], (rows, n))
        prepacked = k.inputs[self.B] is None
        w = k.constants[0] if prepacked else view(k, k.inputs[self.B], (kk, n))
        zw_buf = k.inputs[self.ZB] if not cor.zw.known else None
        zx_buf = k.inputs[self.ZA] if not cor.zx.known else None
        a_dtype, b_dtype = ins[self.A].type.dtype, ins[self.B].type.dtype
        if rb is not None:
            emit_rb(k, cor, rb, zw_buf, zx_buf, None if prepacked else (lambda i, p: w.load([p, i])), b_dtype)
        if cx is not None:
            emit_cx(k, cx, rows, kk, lambda _, p, j: a.load([j, p]), a_dtype, cor.dx)
        operands: list[Buffer] = [w, a, y]
        at: dict[str, int] = {}
        for name, buf in (("rb", rb), ("cx", cx), ("zw", zw_buf)):
            if buf is not None:
                at[name] = len(operands)
                operands.append(buf)
        tables = Tables(k.module, k.fn.name)
        rb_const = tables.i32(cor.rb(), "rb") if rb is None else None
        zw_const = tables.i32(cor.zw_shifted(), "zw") if cor.needs_cx and zw_buf is None else None
        mult = tables.f32(rq.multipliers, "mult") if rq is not None else None
        out_bytes = 4 if rq is None else 1

        def epilogue(b: ir.IRBuilder, ops, i: ir.Value, j: ir.Value, acc: ir.Value) -> None:  # noqa: ANN001
            bias = tables.load(b, rb_const, i) if rb is None else b.load(b.gep(b.bitcast(ops[at["rb"]], I32.as_pointer()), [i]))
            v = b.add(acc, bias)
            if cx is not None:
                if zw_const is not None:
                    zw = tables.load(b, zw_const, i)
                else:
                    zptr = b.bitcast(ops[at["zw"]], ir.IntType(8).as_pointer())
                    zw = to_i32(b, b.load(b.gep(zptr, [i if cor.zw.size > 1 else ir.Constant(I64, 0)])), cor.zw.dtype)
                    zw = b.add(zw, ir.Constant(I32, cor.dw))
                cxv = b.load(b.gep(b.bitcast(ops[at["cx"]], I32.as_pointer()), [j]))
                v = b.sub(v, b.mul(zw, cxv))
            dst = b.gep(ops[2], [b.mul(b.add(b.mul(j, ir.Constant(I64, n)), i), ir.Constant(I64, out_bytes))])
            store_output(b, v, dst, tables.load(b, mult, i) if rq is not None else None, rq)

        spec = igemm.IGemmSpec(n, rows, kk, None if prepacked else igemm.matrix_loader(0, n, transposed=True), None,
                               len(operands), b_dtype == "int8", a_dtype == "int8", epilogue,
                               pack_x=igemm.transposed_packer(1, kk, kk, rows, blk, a_dtype == "int8"),
                               prepacked_w=prepacked, epilogue_cols_outer=True, blocking=blk)
        igemm.emit(k, spec, operands, c if igemm.needs_c(kk, blk) else None, scratch)

    def _gemv(self, k: KernelBuilder, ins: list[Operand | None], n: int, kk: int) -> None:
        """``y = a · B`` for one row ``a`` (:func:`polyml.codegen.gemv.one_row_product`): int32
        accumulators, per group of 4 reduction elements one broadcast word of ``a`` and one
        ``vpdpbusd`` per vector of pre-packed B, then the constant per-column correction and the
        requantization on whole vectors (the last, partial vector column by column)."""
        blk = igemm.blocking_for_host(override=self.config.igemm)
        cor = self.corrections(k.node, ins, n, kk, blk)
        rq = self.requant(k.node, ins, n)
        tables = Tables(k.module, k.fn.name)
        rb_t = tables.i32(cor.rb(), "rb")
        mult_t = tables.f32(rq.multipliers, "mult") if rq is not None else None
        a = view(k, k.inputs[self.A], (kk,))
        y = view(k, k.outputs[0], (n,))
        bp = k.constants[0]
        npad = gemv.blocks(n) * gemv.BLOCK
        vec = ir.VectorType(I32, 16)
        dp = igemm.vpdpbusd(k.module)
        flip = ins[self.A].type.dtype == "int8"
        out_bytes = 4 if rq is None else 1

        def step(b: ir.IRBuilder, q: ir.Value, j0: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            word = b.load(b.gep(b.bitcast(a.ptr, I32.as_pointer()), [q], inbounds=True), align=1)
            if flip:  # int8 activations as vpdpbusd's unsigned bytes (the shift is in rb)
                word = b.xor(word, ir.Constant(I32, 0x80808080 - (1 << 32)))
            bcast = splat(b, word, vec)
            row = b.gep(b.bitcast(bp.ptr, I32.as_pointer()), [b.add(b.mul(q, k.i64(npad)), j0)], inbounds=True)
            return [b.call(dp, [acc, bcast, b.load(b.bitcast(b.gep(row, [k.i64(16 * v)], inbounds=True), vec.as_pointer()),
                                                   align=4)]) for v, acc in enumerate(accs)]

        def out_at(b: ir.IRBuilder, j: ir.Value) -> ir.Value:
            return b.gep(b.bitcast(y.ptr, I8P), [b.mul(j, k.i64(out_bytes))])

        def store_vector(b: ir.IRBuilder, j: ir.Value, acc: ir.Value) -> None:
            rb = b.load(b.bitcast(b.gep(rb_t, [k.i64(0), j], inbounds=True), vec.as_pointer()), align=4)
            m = None
            if mult_t is not None:
                m = b.load(b.bitcast(b.gep(mult_t, [k.i64(0), j], inbounds=True), ir.VectorType(F32, 16).as_pointer()),
                           align=4)
            store_output(b, b.add(acc, rb), out_at(b, j), m, rq)

        def store_column(b: ir.IRBuilder, j: ir.Value, acc: ir.Value) -> None:
            store_output(b, b.add(acc, tables.load(b, rb_t, j)), out_at(b, j),
                         tables.load(b, mult_t, j) if mult_t is not None else None, rq)

        gemv.one_row_product(k, n, kk // 4, vec, gemv.BLOCK, step, store_vector, store_column)

    def _nests(self, k: KernelBuilder, ins: list[Operand | None]) -> None:
        """``acc[β][i][j] += (A - zA)(B - zB[j])`` (loops β, i, k, j), then the output."""
        batch, m, n, kk, _ = self.dims(k.node, ins)
        a_buf, b_buf, y = k.inputs[self.A], k.inputs[self.B], k.outputs[0]
        nb = len(batch)
        sa, sb = ins[self.A].type.shape, ins[self.B].type.shape
        a_full = view(k, a_buf, (*(1,) * (nb + 2 - max(len(sa), 2)), *sa[:-2], *((m, kk) if len(sa) > 1 else (1, kk))))
        b_full = view(k, b_buf, (*(1,) * (nb + 2 - max(len(sb), 2)), *sb[:-2], *((kk, n) if len(sb) > 1 else (kk, 1))))
        acc = y if y.type.dtype == "int32" else k.temps[0]
        acc = view(k, acc, (*batch, m, n))
        a_dtype, b_dtype = ins[self.A].type.dtype, ins[self.B].type.dtype
        cor_x = zero_point(ins, self.ZA, a_dtype)
        cor_w = zero_point(ins, self.ZB, b_dtype)
        rq = self.requant(k.node, ins, n)
        bias = self.bias(ins)
        tables = Tables(k.module, k.fn.name)

        def zp(z: ZeroPoint, index: int, at: ir.Value | int) -> ir.Value:
            b = k.b  # the builder of the loop body (parallel loops outline it)
            if z.known:
                if z.value.size == 1:
                    return ir.Constant(I32, z.at(0))
                return tables.load(b, tables.i32(z.array(n).astype(np.int32), "zp"), k.i64(at))
            flat = view(k, k.inputs[index], (z.size,))
            return to_i32(b, flat.load([at if z.size > 1 else 0]), z.dtype)

        with k.loops([*batch, m, n], names=[*(f"b{d}" for d in range(nb)), "i", "j"], parallel=nb + 1) as ix:
            b = k.b
            init = ir.Constant(I32, 0) if bias is None else tables.load(b, tables.i32(bias.astype(np.int32), "bias"), ix[-1])
            acc.store(ix, init)
        with k.loops([*batch, m, kk, n], names=[*(f"b{d}" for d in range(nb)), "i", "k", "j"], parallel=nb + 1) as ix:
            *bi, i, p, j = ix
            b = k.b
            av = b.sub(to_i32(b, a_full.load(_bidx(a_full, bi) + [i if a_full.shape[-2] > 1 else 0, p]), a_dtype),
                       zp(cor_x, self.ZA, 0))
            bv = b.sub(to_i32(b, b_full.load(_bidx(b_full, bi) + [p, j if b_full.shape[-1] > 1 else 0]), b_dtype),
                       zp(cor_w, self.ZB, j))
            at = [*bi, i, j]
            acc.store(at, b.add(acc.load(at), b.mul(av, bv)))
        if rq is None:
            return
        mult = tables.f32(rq.multipliers, "mult")
        y_full = view(k, y, (*batch, m, n))
        with k.loops([*batch, m, n], names=[*(f"q{d}" for d in range(nb)), "qi", "qj"], parallel=nb + 1) as ix:
            store_output(k.b, acc.load(ix), y_full.addr(ix), tables.load(k.b, mult, ix[-1]), rq)


def _bidx(buf: Buffer, bi: list) -> list:
    """Batch indices of a broadcast operand (0 along its size-1 batch dims)."""
    nb = len(bi)
    return [0 if d == 1 else i for d, i in zip(buf.shape[:nb], bi)]


@register
class MatMulInteger(_IntegerProduct):
    """ONNX MatMulInteger: int32 ``(A - a_zero_point) @ (B - b_zero_point)``."""

    op_types = ("MatMulInteger",)


@register
class QLinearMatMul(QLinear, _IntegerProduct):
    """ONNX QLinearMatMul (+ polyml's optional int32 bias, input 8, and ``polyml_clip``)."""

    op_types = ("QLinearMatMul",)
    A, B, ZA, ZB = 0, 3, 2, 5
    scale_names = ("a_scale", "b_scale")

    def channels(self, ins: list[Operand | None]) -> int:
        return ins[self.B].type.shape[-1] if len(ins[self.B].type.shape) > 1 else 1
