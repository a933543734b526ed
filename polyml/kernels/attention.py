"""Fused attention: ``O = softmax(chain(Q·K)) · V`` per head, made by :mod:`polyml.passes.attention`.

Polyhedral view.  The unfused graph runs three nests over all heads ``z`` (batch × heads):
``S1[z, i, j, d]`` accumulates the scores ``Sc[z, i, j]``, ``S2[z, i, j]`` applies the chain
(scale, mask) and the row softmax into ``P[z, i, j]``, ``S3[z, i, e, j]`` accumulates
``O[z, i, e]``.  The fused schedule makes ``z`` the outermost loop of all three
(``S1 -> [z, 0, ...]``, ``S2 -> [z, 1, ...]``, ``S3 -> [z, 2, ...]``), legal because every
dependence stays within one head (checked with isl by the pass).  ``Sc`` and ``P`` are then
live for one head at a time: they are *contracted* to one ``seq × seq`` tile per thread, which
stays in L2 (BERT-base: 64 KiB per thread instead of 768 KiB for all heads), written by the
first product and read by the softmax and the second product while warm.

The heads are split over threads in equal shares; each share runs its heads one after another
through the packed GEMM's block function (:mod:`polyml.codegen.gemm`), single-threaded per head,
with its own tile and packing scratch.  Where the packed GEMM is off (``--gemm polly``, the SCoP
tools) the two products are plain nests on the same tile.
"""

from __future__ import annotations

import math
import os

import llvmlite.ir as ir

from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32, REASSOC, Buffer, KernelBuilder, pointer_type
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register
from polyml.kernels.fused import evaluate_chain
from polyml.kernels.matmul import gemm_nests, prefer_wide_vectors

ATTENTION_OP = "polyml.Attention"


def _dims(ins: list[TensorType | None], k_transposed: bool) -> tuple[int, int, int, int, int]:
    """(heads z, queries s, keys sk, depth d, value depth dv) from Q, K (or Kᵀ) and V."""
    q, kk, v = ins[0].shape, ins[1].shape, ins[2].shape
    z = math.prod(q[:-2])
    s, d = q[-2], q[-1]
    sk = kk[-2] if k_transposed else kk[-1]
    return z, s, sk, d, v[-1]


def _parts(z: int) -> int:
    return max(1, min(z, os.cpu_count() or 1))


def _specs(s: int, sk: int, d: int, dv: int, k_transposed: bool) -> tuple[packed.GemmSpec, packed.GemmSpec]:
    """Scores ``Sc (s×sk) = Q (s×d) · K'`` and ``O (s×dv) = P (s×sk) · V (sk×dv)`` for one head."""
    scores = packed.GemmSpec(s, sk, d, packed.matrix_loader(0, d), packed.matrix_loader(1, d if k_transposed else sk, k_transposed), 2)
    out = packed.GemmSpec(s, dv, sk, packed.matrix_loader(0, sk), packed.matrix_loader(1, dv), 2)
    return scores, out


@register
class Attention(Kernel):
    """One head at a time: scores by GEMM, chain and softmax on the tile, then the second GEMM."""

    op_types = (ATTENTION_OP,)
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        raise AssertionError(f"{ATTENTION_OP} is created after shape inference")

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        z, s, sk, d, dv = _dims([op.type for op in ins], node.attrs["k_transposed"])
        return f"{z} heads of ({s}x{d})·({d}x{sk}) → softmax → ·({sk}x{dv})" + (", packed" if self.config.packed else "")

    def _per_part(self, node: Node, types: list[TensorType]) -> tuple[int, int, int]:
        """Floats of one share's scratch: (tile, packing of product 1, packing of product 2)."""
        z, s, sk, d, dv = _dims(types, node.attrs["k_transposed"])
        tile = s * sk
        if not self.config.packed:
            return tile, 0, 0
        blk = packed.blocking_for_host(self.config.gemm_blocking)
        scores, out = _specs(s, sk, d, dv, node.attrs["k_transposed"])
        return tile, packed.packing_floats(scores, blk, s, sk), packed.packing_floats(out, blk, s, dv)

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        types = [op.type for op in ins]
        z = _dims(types, node.attrs["k_transposed"])[0]
        return [TensorType((_parts(z) * sum(self._per_part(node, types)),))]

    def lower(self, k: KernelBuilder) -> None:
        node = k.node
        kt = node.attrs["k_transposed"]
        q, key, v = k.inputs[0], k.inputs[1], k.inputs[2]
        out, scratch = k.outputs[0], k.temps[0]
        types = [q.type, key.type, v.type]
        z, s, sk, d, dv = _dims(types, kt)
        tile_f, pack1, pack2 = self._per_part(node, types)
        per = tile_f + pack1 + pack2
        parts = _parts(z)
        share = math.ceil(z / parts)
        side = {buf.name: buf for buf in k.inputs[3:] if buf is not None}
        batch = out.shape[:-2]
        use_packed = self.config.packed
        if use_packed:
            blk = packed.blocking_for_host(self.config.gemm_blocking)
            spec1, spec2 = _specs(s, sk, d, dv, kt)
            attrs = [a for a in k.fn.attributes if a != "noinline"]
            gemm1 = packed.block_function(k.module, f"{k.fn.name}.scores", spec1, blk, attrs)
            gemm2 = packed.block_function(k.module, f"{k.fn.name}.values", spec2, blk, attrs)
        prefer_wide_vectors(k.fn)
        c = k.i64
        with k.parallel_loop(0, parts, "share") as part:
            b = k.b
            lo = b.mul(part, c(share))
            hi = b.select(b.icmp_signed("<", b.add(lo, c(share)), c(z)), b.add(lo, c(share)), c(z))
            base = b.gep(b.bitcast(scratch.ptr, F32.as_pointer()), [b.mul(part, c(per))], inbounds=True)
            with k.loop(lo, hi, "head") as zi:
                b = k.b

                def head(buf: Buffer, rows: int, cols: int) -> ir.Value:
                    return b.gep(b.bitcast(buf.ptr, F32.as_pointer()), [b.mul(zi, c(rows * cols))], inbounds=True)

                qh, kh, vh, oh = head(q, s, d), head(key, sk if kt else d, d if kt else sk), head(v, sk, dv), head(out, s, dv)
                tile = base
                if use_packed:
                    w1 = b.gep(base, [c(tile_f)], inbounds=True)
                    w2 = b.gep(base, [c(tile_f + pack1)], inbounds=True)
                    b.call(gemm1, [qh, kh, tile, w1, c(0), c(s), c(0), c(sk)])
                else:
                    view = {name: Buffer(k, b.bitcast(p, pointer_type(TensorType(shape))), TensorType(shape), name)
                            for name, p, shape in (("q", qh, (s, d)), ("k", kh, (sk, d) if kt else (d, sk)), ("t", tile, (s, sk)))}
                    gemm_nests(k, view["q"], view["k"], view["t"], b_transposed=kt)
                self._softmax_rows(k, tile, zi, batch, s, sk, side)
                if use_packed:
                    b = k.b
                    b.call(gemm2, [tile, vh, oh, w2, c(0), c(s), c(0), c(dv)])
                else:
                    b = k.b
                    tv = Buffer(k, b.bitcast(tile, pointer_type(TensorType((s, sk)))), TensorType((s, sk)), "tile")
                    vb = Buffer(k, b.bitcast(vh, pointer_type(TensorType((sk, dv)))), TensorType((sk, dv)), "v")
                    ob = Buffer(k, b.bitcast(oh, pointer_type(TensorType((s, dv)))), TensorType((s, dv)), "o")
                    gemm_nests(k, tv, vb, ob)

    def _softmax_rows(self, k: KernelBuilder, tile: ir.Value, zi: ir.Value, batch: tuple[int, ...], s: int, sk: int,
                      side: dict[str, Buffer]) -> None:
        """Per query row of the tile: the chain at ``[batch(z), i, j]`` (side inputs broadcast),
        then ``p = exp(x - max) / Σ exp(x - max)`` and the post-softmax ops, in place."""
        node = k.node
        chain, acc = node.attrs["chain"], node.attrs["acc"]
        b = k.b
        # the batch indices of head zi (row-major over the batch dims) for the side inputs
        bidx: list[ir.Value] = []
        rest = zi
        for dim in reversed(batch):
            bidx.insert(0, b.urem(rest, k.i64(dim)))
            rest = b.udiv(rest, k.i64(dim))
        row_t = ir.ArrayType(F32, sk)
        rows = b.bitcast(tile, row_t.as_pointer())
        with k.loop(0, s, "row") as i:
            b = k.b
            row = b.gep(rows, [i], inbounds=True)

            def at(j: ir.Value) -> ir.Value:
                return k.b.gep(row, [k.i64(0), j], inbounds=True)

            if chain:
                with k.loop(0, sk, "chain") as j:
                    x = k.b.load(at(j))
                    k.b.store(evaluate_chain(k, chain, {acc: x}, side, [*bidx, i, j]), at(j))
            hi = _row_max(k, at, sk)
            total = _row_exp_sum(k, at, sk, hi)
            inv = k.b.fdiv(k.f32(1.0), total)
            post = node.attrs.get("post") or []
            with k.loop(0, sk, "norm") as j:
                p = k.b.fmul(k.b.load(at(j)), inv)
                if post:
                    p = evaluate_chain(k, post, {node.attrs["probabilities"]: p}, side, [*bidx, i, j])
                k.b.store(p, at(j))


def _row_max(k: KernelBuilder, at, n: int) -> ir.Value:  # noqa: ANN001 - element address callback
    """max over one row, through a stack slot (mem2reg makes it the loop's phi)."""
    slot = k.entry_alloca(F32, "rowmax")
    k.b.store(k.b.load(at(k.i64(0))), slot)
    with k.loop(1, n, "max") as j:
        x, m = k.b.load(at(j)), k.b.load(slot)
        k.b.store(k.maxf(x, m), slot)
    return k.b.load(slot)


def _row_exp_sum(k: KernelBuilder, at, n: int, hi: ir.Value) -> ir.Value:  # noqa: ANN001
    """``x[j] = exp(x[j] - hi)`` in place, returning Σ x[j] (reassociated: vectorizes)."""
    slot = k.entry_alloca(F32, "rowsum")
    k.b.store(k.f32(0.0), slot)
    with k.loop(0, n, "exp") as j:
        e = k.exp(k.b.fsub(k.b.load(at(j)), hi))
        k.b.store(e, at(j))
        k.b.store(k.b.fadd(k.b.load(slot), e, flags=REASSOC), slot)
    return k.b.load(slot)

