"""Named intrinsics that a ``tensorize`` mark lowers its register tile onto.

An intrinsic states the computation it performs on a tile (as a statement's accesses must
read) and emits it on an :class:`~polyml.schedule.codegen.Emitter` from the tile's bounds and
its operands' addresses (:class:`~polyml.schedule.codegen.TileBox`).

* ``fma.f32.<mr>x<nr>`` (:class:`FmaTile`): ``C[i, j] += Σ_k A[i, k] · B[k, j]`` on an
  ``mr × nr`` tile with ``A`` in an ``mr``-high packed panel (element ``(i0 + r, k0 + p)`` at
  ``p·mr + r``), ``B`` in an ``nr``-wide one (``(k0 + p, j0 + c)`` at ``p·nr + c``) and ``C``
  row-major: the vector micro-kernel of :func:`polyml.codegen.gemm.micro_kernel`
  (``mr · nr / w`` accumulators in registers, one ``llvm.fma`` each per step).  Partial tiles
  run the whole kernel into a stack tile and add its ``rows × cols`` part into ``C``.
"""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32, I64


@dataclass(frozen=True)
class FmaTile:
    blk: packed.Blocking
    attrs: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"fma.f32.{self.blk.mr}x{self.blk.nr}"

    def lower(self, em, box) -> None:  # noqa: ANN001  (Emitter, TileBox: codegen imports this module's users)
        b = em.b
        stmt = em.program.nest.statement(box.statement)
        roles = _roles(stmt)
        (i0, j0, k0), (i1, j1, k1) = ([em.expr(e) for e in box.lo], [em.expr(e) for e in box.hi])
        one = ir.Constant(I64, 1)
        rows, cols, kc = (b.add(b.sub(h, lo), one) for lo, h in ((i0, i1), (j0, j1), (k0, k1)))
        c_acc, a_acc, b_acc = (stmt.accesses[roles[r]] for r in ("C", "A", "B"))
        c_ptr = em.address(c_acc.array, box.first[roles["C"]])
        a_ptr = em.address(a_acc.array, box.first[roles["A"]])
        b_ptr = em.address(b_acc.array, box.first[roles["B"]])
        c_shape = em.program.nest.array(c_acc.array).shape
        ldc = em.params[c_shape[1]] if isinstance(c_shape[1], str) else ir.Constant(I64, c_shape[1])
        if box.init:  # the first reduction step stores (the initialisation folded into it)
            accumulate = b.not_(em.condition(box.starts))
        else:
            accumulate = ir.Constant(ir.IntType(1), 1)
        mr, nr = self.blk.mr, self.blk.nr
        ukernel = packed.micro_kernel(em.module, self.blk, list(self.attrs))
        full = b.and_(b.icmp_signed("==", rows, ir.Constant(I64, mr)), b.icmp_signed("==", cols, ir.Constant(I64, nr)))
        with b.if_else(full) as (then, otherwise):
            with then:
                b.call(ukernel, [kc, a_ptr, b_ptr, c_ptr, ldc, accumulate])
            with otherwise:
                tile = em.stack_tile("fma.tile", mr * nr)
                b.call(ukernel, [kc, a_ptr, b_ptr, tile, ir.Constant(I64, nr), ir.Constant(ir.IntType(1), 0)])

                def c_addr(i: ir.Value, j: ir.Value) -> ir.Value:
                    return b.gep(c_ptr, [b.add(b.mul(i, ldc, flags=["nsw"]), j, flags=["nsw"])], inbounds=True)

                zero = ir.Constant(I64, 0)
                packed.add_edge_tile(b, tile, nr, c_addr, zero, zero, rows, cols, b.not_(accumulate),
                                     ir.Constant(F32, 0.0), b.fadd)


def _roles(stmt) -> dict[str, int]:  # noqa: ANN001
    """Positions of C (the updated access) and A, B (the two reads, in that order)."""
    update = [p for p, a in enumerate(stmt.accesses) if a.mode == "update"]
    reads = [p for p, a in enumerate(stmt.accesses) if a.mode == "read"]
    if len(update) != 1 or len(reads) != 2:
        raise ValueError(f"fma tile: statement {stmt.name} is not C[i, j] += A[i, k] * B[k, j]")
    return {"C": update[0], "A": reads[0], "B": reads[1]}
