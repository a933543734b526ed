"""One-row products ``y = a · B`` (batch-1 classifiers) with B constant and pre-packed in
column blocks: the loop structure the float and the integer kernels share.

Per block of ``block`` columns (the parallel loop), ``block / lanes`` vector accumulators live in
registers across the whole reduction (stack slots that mem2reg promotes); each reduction step
broadcasts one element (or 4-byte group) of ``a`` and updates every accumulator with the block's
packed row of B, so B streams once, contiguously, with no horizontal sums.  The caller says what
a step does and how a finished vector (or, in the last partial vector, one column) is stored.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir

from polyml.codegen.builder import KernelBuilder

I32 = ir.IntType(32)
#: columns per block (per parallel iteration): four 16-lane accumulators
BLOCK = 64

#: ``step(b, q, j0, accs) -> accs``: reduction step ``q`` of the block starting at column ``j0``
Step = Callable[[ir.IRBuilder, ir.Value, ir.Value, list[ir.Value]], list[ir.Value]]
#: ``store(b, j, value)``: a whole vector of columns ``j…j+lanes``, or one column's scalar
Store = Callable[[ir.IRBuilder, ir.Value, ir.Value], None]


def blocks(n: int, block: int = BLOCK) -> int:
    """Column blocks of ``n`` columns (the last padded)."""
    return -(-n // block)


def one_row_product(k: KernelBuilder, n: int, steps: int, vec: ir.VectorType, block: int, step: Step,
                    store_vector: Store, store_column: Store, name: str = "gemv") -> None:
    """Emit the blocks of ``y = a · B`` (see the module docstring): ``steps`` reduction steps
    per block, accumulators of type ``vec``, whole vectors through ``store_vector``, the
    columns of a last partial vector below ``n`` through ``store_column``."""
    lanes = vec.count
    zero = ir.Constant(vec, [0 if isinstance(vec.element, ir.IntType) else 0.0] * lanes)
    with k.parallel_loop(0, blocks(n, block), name) as jb:
        b = k.b
        j0 = b.mul(k.i64(jb), k.i64(block))
        slots = [k.entry_alloca(vec, f"acc{v}") for v in range(block // lanes)]
        for slot in slots:
            b.store(zero, slot)
        with k.loop(0, steps, "q") as q:
            b = k.b
            for slot, acc in zip(slots, step(b, k.i64(q), j0, [b.load(slot) for slot in slots])):
                b.store(acc, slot)
        b = k.b
        for v, slot in enumerate(slots):
            j = b.add(j0, k.i64(lanes * v))
            acc = b.load(slot)
            with b.if_else(b.icmp_signed("<=", b.add(j, k.i64(lanes)), k.i64(n))) as (whole, part):
                with whole:
                    store_vector(b, j, acc)
                with part:
                    for lane in range(lanes):
                        jl = b.add(j, k.i64(lane))
                        with b.if_then(b.icmp_signed("<", jl, k.i64(n))):
                            store_column(b, jl, b.extract_element(acc, ir.Constant(I32, lane)))
