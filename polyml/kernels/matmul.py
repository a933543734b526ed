"""Matrix products: Gemm and MatMul.

Both lower to the form Polly's GEMM pattern optimizer recognizes (it replaces the nest by a
BLIS-like packed, register-tiled micro-kernel): an init nest ``C[i][j] = -0.0`` followed by

    for i, k, j:  C[i][j] += A[i][k] * B[k][j]

over two-dimensional arrays, then (Gemm) an epilogue nest ``C = alpha * C + beta * bias``.
The matcher accepts any order of the three loops but exactly the accesses ``C[i][j]``,
``A[i][k]``, ``B[k][j]`` of 2-D arrays in a three-deep band, alone in its SCoP statement, so:

* the loop order is i, k, j (innermost loop unit-stride in B and C): Polly matches it as well
  as i, j, k, and the ``--no-polly`` build then vectorizes (1024³: 14.6 vs 0.2 GFLOP/s);
* operands read transposed (Gemm's ``transA``/``transB``) are first copied into a row-major
  scratch buffer, O(n²) next to the O(n³) product: ``A[k][i]`` or ``B[j][k]`` is not matched.
  Except ``transB`` with few rows (batch-1 fully connected layers): there the copy costs more
  than the product, and B is read in place by dot products along its rows;
* MatMul's 1-D operands, and batch dimensions of A when B is a single matrix, are folded into
  the 2-D shape by viewing the same memory with another array type (one 2-D GEMM);
* products where B has batch dimensions call a ``noinline`` 2-D GEMM function once per batch
  index (a four-deep nest over 3-D arrays is not matched and Polly's generic schedule for it
  ran 40x slower: 8x256³ at 1.2 vs 49-80 GFLOP/s); on the host the packed GEMM's block
  function instead, the batch indices dealt to the threads and A read in place
  (:func:`batched_product`; BERT-base attention, 12 heads of 128×64 @ 64×128, best of 60:
  0.45 → 0.27 ms on one core, 0.40 → 0.16 ms on two, onnxruntime 0.27 and 0.155);
* a large product whose B is one matrix splits its rows into one block per core
  (:func:`parallel_gemm`): Polly does not parallelize its pattern-matched nest, so each block
  is a constant-size 2-D GEMM function called from a ``parallel_loop`` (1024³, 2 threads:
  0.71 -> 0.76 of OpenBLAS on a loaded host, ~2x when the second core is free);
* on AVX-512 hosts the op's functions get ``"prefer-vector-width"="512"``: LLVM's x86 default
  (256) halves the width of Polly's micro-kernel; 512 measured 1.4-1.6x faster (512³: 88 → 138
  GFLOP/s on one core);
* the init stores ``-0.0`` (``-0.0 + x == x`` exactly) and the bias comes after the product:
  LLVM's loop-idiom pass, which runs before Polly, turns a nest storing ``0.0`` into a
  ``memset`` and one copying a bias row into a ``memcpy``, and Polly then dismisses the whole
  SCoP (byte-wise and float accesses of one array: in-bounds assumption false), losing the
  GEMM optimization.  ``-0.0`` is no byte splat, so it stays a loop.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import gemm as packed
from polyml.codegen import gemv
from polyml.codegen.builder import F32, Buffer, KernelBuilder, pointer_type, splat
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, broadcast_shapes, register
from polyml.options import CodegenConfig
from polyml.schedule import exchange as schedule_exchange
from polyml.schedule import gemm as scheduled_gemm
from polyml.schedule import tree as schedule_tree
from polyml.schedule.codegen import Emitter
from polyml.schedule.intrinsics import FmaTile


def view(k: KernelBuilder, buf: Buffer, shape: Sequence[int]) -> Buffer:
    """``buf``'s memory seen as a row-major array of ``shape`` (same number of elements)."""
    tt = TensorType(tuple(int(d) for d in shape), buf.type.dtype)
    if tt.size != buf.type.size:
        raise AssertionError(f"{buf.name}: cannot view {buf.shape} as {tt.shape}")
    return Buffer(k, k.b.bitcast(buf.ptr, pointer_type(tt)), tt, buf.name)


def transpose_into(k: KernelBuilder, src: Buffer, dst: Buffer) -> None:
    """dst[i][j] = src[j][i] for a 2-D ``src``."""
    with k.loops(dst.shape, names=["ti", "tj"]) as (i, j):
        dst.store([i, j], src.load([j, i]))


#: one-row products with fewer multiply-adds stay on the plain nests
GEMV_MIN_MACS = 1 << 16


def gemv_pack(w: np.ndarray) -> np.ndarray:
    """A constant ``K×N`` B as :func:`gemv_rows` streams it: per block of :data:`polyml.codegen.gemv.BLOCK`
    columns (the last padded with zeros), its ``K`` rows of the block, ``[N/64][K][64]``."""
    kk, n = w.shape
    blocks = gemv.blocks(n)
    out = np.zeros((kk, blocks * gemv.BLOCK), np.float32)
    out[:, :n] = w
    return np.ascontiguousarray(out.reshape(kk, blocks, gemv.BLOCK).transpose(1, 0, 2)).reshape(-1)


def gemv_rows(k: KernelBuilder, a: Buffer, bp: Buffer, y: Buffer) -> None:
    """``y[0, :] = a[0, :] · B`` for one row ``a`` and B packed by :func:`gemv_pack`
    (:func:`polyml.codegen.gemv.one_row_product`): per reduction step one broadcast of ``a[k]``
    and four FMAs with the block's row ``k``.  The dot products along Bᵀ's rows (one
    accumulator chain per column) ran a batch-1 classifier at 0.087 ms on 1280×1000 against
    onnxruntime's 0.045."""
    n, kk = y.shape[1], a.shape[1]
    vec = ir.VectorType(F32, 16)

    def step(b: ir.IRBuilder, r: ir.Value, j0: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
        av = splat(b, b.load(b.gep(b.bitcast(a.ptr, F32.as_pointer()), [r], inbounds=True)), vec)
        row = b.gep(b.bitcast(bp.ptr, F32.as_pointer()), [b.add(b.mul(j0, k.i64(kk)), b.mul(r, k.i64(gemv.BLOCK)))],
                    inbounds=True)
        return [k.fsum(acc, k.fmul(av, b.load(b.bitcast(b.gep(row, [k.i64(16 * v)], inbounds=True), vec.as_pointer()),
                                                     align=4), reassoc=True), reassoc=True)
                for v, acc in enumerate(accs)]

    def store(b: ir.IRBuilder, j: ir.Value, value: ir.Value) -> None:
        out = b.gep(b.bitcast(y.ptr, F32.as_pointer()), [j], inbounds=True)
        b.store(value, b.bitcast(out, value.type.as_pointer()) if isinstance(value.type, ir.VectorType) else out, align=4)

    gemv.one_row_product(k, n, kk, vec, gemv.BLOCK, step, store, store)


def prefer_wide_vectors(fn: ir.Function) -> None:
    """Let LLVM use 512-bit vectors in ``fn`` where its target features include AVX-512."""
    features = [a for a in fn.attributes if a.startswith('"target-features"=')]
    if any("+avx512f" in a for a in features):
        set.add(fn.attributes, '"prefer-vector-width"="512"')


def gemm_nests(k: KernelBuilder, a: Buffer, b: Buffer, c: Buffer, b_transposed: bool = False) -> None:
    """C[i][j] = -0.0, then ``C[i][j] += A[i][k] * B[k][j]`` (loops i, k, j) over 2-D buffers: C = A @ B.

    ``b_transposed``: B is stored as Bt (N×K) and read in place, ``C[i][j] += A[i][k] * Bt[j][k]``
    in loops i, j, k (dot products along Bt's rows, no copy)."""
    m, n = c.shape
    kk = a.shape[1]
    with k.loops([m, n], names=["i", "j"]) as ix:
        c.store(ix, k.f32(-0.0 if kk else 0.0))
    extents, names = ([m, n, kk], ["i", "j", "k"]) if b_transposed else ([m, kk, n], ["i", "k", "j"])
    with k.loops(extents, names=names) as ivs:
        i, r, j = (ivs[0], ivs[2], ivs[1]) if b_transposed else ivs
        prod = k.fmul(a.load([i, r]), b.load([j, r] if b_transposed else [r, j]), reassoc=True)
        c.store([i, j], k.fsum(c.load([i, j]), prod, reassoc=True))


def gemm_function(k: KernelBuilder, m: int, n: int, kk: int, suffix: str = "gemm2d") -> ir.Function:
    """A ``noinline`` function ``(A: MxK, B: KxN, C: MxN)`` computing C = A @ B with :func:`gemm_nests`."""
    tys = [TensorType((m, kk)), TensorType((kk, n)), TensorType((m, n))]
    fn = ir.Function(k.module, ir.FunctionType(ir.VoidType(), [pointer_type(t) for t in tys]), f"{k.fn.name}.{suffix}")
    for attr in k.fn.attributes:  # target cpu/features and nounwind, noinline, as the op function
        set.add(fn.attributes, attr)
    fn.attributes.add("noinline")
    # it touches only its arguments' memory: with this Polly's -polly-allow-modref-calls (used
    # by polyml.scop) models each call as a statement of the batch loop, which then is a SCoP too
    set.add(fn.attributes, "memory(argmem: readwrite)")
    for arg, role in zip(fn.args, ("A", "B", "C")):
        arg.add_attribute("noalias")
        arg.name = role
    sub = KernelBuilder(k.module, fn, k.node, [], [], [], [], [])
    sub.prefix = f"{k.prefix}.{suffix}"
    sub.config = k.config
    a, b, c = (Buffer(sub, arg, t, role) for arg, t, role in zip(fn.args, tys, ("A", "B", "C")))
    gemm_nests(sub, a, b, c)
    sub.b.ret_void()
    return fn


#: products with at least this many multiply-adds split their rows over the cores (below it
#: the threads' start-up and the second packing of B cost more than they save).  With 2^21
#: SqueezeNet's 13x13 1x1 convolutions ran as fast at 2 threads
#: as at 1 (a fork/join costs 0.8 us on that host); 2^19 / 2^21, per step of whole models at 2
#: threads, minimum of 20: 256->48 @13 0.71, 48->192 @13 0.69-0.76, ShuffleNet's grouped 1x1
#: on 14x14 and 7x7 0.53-0.58 (their neighbours 1.1-1.2: the step sums 0.995); whole models,
#: 60 runs, minimum / median: SqueezeNet 0.99 / 0.99, ShuffleNet 1.00 / 1.02, Inception-v1
#: 0.99 / 0.98; MobileNetV2 and EfficientNet-B0 unchanged (no product that small)
PARALLEL_MIN_MACS = 1 << 19


def row_blocks(rows: int, n: int, kk: int) -> int:
    """How many row blocks :func:`parallel_gemm` splits an MxK @ KxN product into (1: don't)."""
    cores = os.cpu_count() or 1
    if cores < 2 or rows * n * kk < PARALLEL_MIN_MACS:
        return 1
    return min(cores, rows // 16) if rows >= 32 else 1


def parallel_gemm(k: KernelBuilder, a: Buffer, b: Buffer, c: Buffer) -> bool:
    """C = A @ B with A's and C's rows split into one block per core, run by OpenMP threads.

    Each block calls a ``noinline`` 2-D GEMM function with constant sizes and ``noalias``
    operands (:func:`gemm_function`), the form Polly's GEMM pattern optimizer replaces by its
    packed micro-kernel; every thread packs its own copy of B's panels.  False (nothing
    emitted) when the product is too small or the op function may not use threads.
    """
    rows, kk = a.shape
    n = c.shape[1]
    nb = row_blocks(rows, n, kk) if k.parallel else 1
    if nb < 2:
        return False
    mb = -(-rows // nb)  # rows per block; the last block gets the remainder
    nb = -(-rows // mb)
    tail = rows - (nb - 1) * mb
    main_fn = gemm_function(k, mb, n, kk, "gemm_rows")
    tail_fn = main_fn if tail == mb else gemm_function(k, tail, n, kk, "gemm_tail")
    with k.parallel_loop(0, nb, "rb") as blk:
        row0 = k.b.mul(blk, k.i64(mb), flags=["nuw", "nsw"])
        a_blk, c_blk = (k.b.gep(buf.ptr, [row0], inbounds=True) for buf in (a, c))
        b0 = b.ptr
        if tail_fn is main_fn:
            k.b.call(main_fn, [k.b.bitcast(a_blk, main_fn.args[0].type), b0, k.b.bitcast(c_blk, main_fn.args[2].type)])
        else:
            is_tail = k.b.icmp_signed("==", blk, k.i64(nb - 1))
            with k.b.if_else(is_tail) as (then, otherwise):
                with then:
                    k.b.call(tail_fn, [k.b.bitcast(a_blk, tail_fn.args[0].type), b0, k.b.bitcast(c_blk, tail_fn.args[2].type)])
                with otherwise:
                    k.b.call(main_fn, [k.b.bitcast(a_blk, main_fn.args[0].type), b0, k.b.bitcast(c_blk, main_fn.args[2].type)])
    return True


#: products with at least this many multiply-adds and rows go through polyml's packed GEMM
#: (:mod:`polyml.codegen.gemm`) on the CPU; smaller ones keep the plain nests
PACKED_MIN_MACS = 1 << 15


def packed_plan(config: CodegenConfig, m: int, n: int, kk: int,
                b_constant: bool = False) -> tuple[packed.Blocking, int] | None:
    """(blocking, thread shares) of the packed GEMM for an MxK @ KxN product in a build of
    ``config``, or None (``config.packed`` off, or too small).

    Fewer rows than a register tile only with a constant B (weights, pre-packed at compile
    time): the micro-kernel then streams B's panels once, which beats the plain nests 3-27x
    (1x1280 @ 1280x1000: 1.19 -> 0.39 ms; 4x768 @ 768x3072: 13.4 -> 0.50 ms, onnxruntime 0.51),
    whereas packing a computed B on every call would cost as much as the product."""
    if not config.packed:
        return None
    blk = packed.blocking_for_host(config.gemm_blocking)
    if (m < blk.mr and not b_constant) or m * n * kk < PACKED_MIN_MACS:
        return None
    cores = os.cpu_count() or 1
    parts = cores if m * n * kk >= PARALLEL_MIN_MACS else 1
    return blk, parts


def packed_temps(config: CodegenConfig, m: int, n: int, kk: int, b_constant: bool = False) -> list[TensorType]:
    """The packing scratch :func:`packed_product` needs (empty when the product stays plain)."""
    plan = packed_plan(config, m, n, kk, b_constant)
    if plan is None:
        return []
    spec = packed.GemmSpec(m, n, kk, packed.matrix_loader(0, kk), packed.matrix_loader(1, n), 2)
    blk, parts = plan
    return [TensorType((packed.scratch_floats(spec, blk, parts),))]


def packed_product(k: KernelBuilder, spec: packed.GemmSpec, operands: Sequence[Buffer], c: Buffer, scratch: Buffer) -> None:
    """``spec`` through the packed GEMM into ``c`` (threads only where the op may use them;
    the plan of ``k.config``)."""
    blk, parts = packed_plan(k.config, spec.m, spec.n, spec.k, spec.prepacked_b)
    packed.emit_gemm(k, spec, operands, c, scratch, blk, parts if k.parallel else 1)


def scheduled_plan(config: CodegenConfig, m: int, n: int, kk: int, b_constant: bool, parallel: bool = True,
                   batch: int = 0, a_constant: bool = False, kc_step: int = 1) -> scheduled_gemm.Plan | None:
    """The schedule's sizes for an ``m × n × kk`` product (``batch``: that many), or None where
    it stays on the packed GEMM: ``--gemm packed``, too small, or fewer rows than a register
    tile (a constant B with a row or a few: the packed GEMM's short kernels compute only the
    rows that exist).  The threads as the packed GEMM's (:func:`packed_plan`, :func:`batched_plan`);
    ``kc_step``: :func:`polyml.schedule.gemm.plan`'s (a convolution's taps)."""
    if not config.schedule:
        return None
    if batch:
        bp = batched_plan(config, batch, m, n, kk, parallel)
        if bp is None:
            return None
        threads = (os.cpu_count() or 1) if parallel and batch * m * n * kk >= PARALLEL_MIN_MACS else 1
        chosen = scheduled_gemm.plan(m, n, kk, bp.blk, threads, a_constant=a_constant, batch=batch)
    else:
        plan = packed_plan(config, m, n, kk, b_constant)
        if plan is None or m < plan[0].mr:
            return None
        blk, parts = plan
        chosen = scheduled_gemm.plan(m, n, kk, blk, parts if parallel else 1, b_constant, a_constant, kc_step)
    if config.schedule_tiles:  # --import-schedules: this node's cache tiles from its file
        return schedule_exchange.with_tiles(chosen, dict(config.schedule_tiles), f"{m}x{kk} @ {kk}x{n} product")
    return chosen


def scheduled_scratch(config: CodegenConfig, m: int, n: int, kk: int, b_constant: bool, batch: int = 0,
                      a_constant: bool = False) -> int:
    """Floats of packing buffers :func:`scheduled_product` needs, threaded or not."""
    return max(scheduled_plan(config, m, n, kk, b_constant, par, batch, a_constant).scratch_floats
               for par in (False, True))


def scheduled_product(k: KernelBuilder, operands: dict[str, Buffer], m: int, n: int, kk: int,
                      b_constant: bool = False, work: Buffer | None = None, a_constant: bool = False,
                      **nest_args: object) -> None:
    """The GEMM nest (:func:`polyml.schedule.gemm.nest` of ``nest_args``, a ``batch`` of
    products among them) under its BLIS schedule, the register tiles on the FMA intrinsic; with
    ``--no-schedule`` (``config.plain_nests``) under its initial schedule instead, scalar bodies
    for ``opt -O3``.  ``operands`` binds its arrays: ``A``, ``B`` as stored or, for a constant
    operand already in the schedule's layout (:func:`polyml.schedule.gemm.constant_b`,
    :func:`~polyml.schedule.gemm.constant_a`), ``Bc`` / ``Ac``; ``C``; a bias ``Cb``.  ``work``:
    the packing buffers (default: the kernel's first temp)."""
    f32p = ir.FloatType().as_pointer()
    arrays = {name: k.b.bitcast(buf.ptr, f32p) for name, buf in operands.items()}
    sizes = {"M": m, "N": n, "K": kk}
    k.nests += 1
    if k.config.plain_nests:
        Emitter(k.module, k.fn, k.b, scheduled_gemm.Program.of(scheduled_gemm.nest(**nest_args)), arrays, sizes,
                {}).emit(sizes)
        k.path = "plain"
        return
    batch = int(nest_args.pop("batch", 0) or 0)
    plan = scheduled_plan(k.config, m, n, kk, b_constant, k.parallel, batch, a_constant)
    program, ast = scheduled_gemm.built(plan, **nest_args)
    attrs = tuple(x for x in k.fn.attributes if x != "noinline")
    fma = FmaTile(plan.blk, attrs)
    scratch = k.b.bitcast((work or k.temps[0]).ptr, f32p)
    arrays.update({**({} if a_constant else {"Ap": scratch}), **({} if b_constant else {"Bp": scratch})})
    Emitter(k.module, k.fn, k.b, program, arrays, sizes, {fma.name: fma}, attrs).emit(sizes, ast)
    k.schedules.append(schedule_tree.text(program.tree))
    k.plans.append(schedule_exchange.record(plan))


@dataclass(frozen=True)
class BatchedPlan:
    """How :func:`batched_product` runs ``count`` products of M×K by K×N: each product is cut
    into ``shares`` pieces of ``share`` rows or columns (``dim``), and the ``count·shares``
    units are dealt in contiguous runs to ``slots`` threads, each with ``per`` floats of
    packing scratch."""

    blk: packed.Blocking
    dim: str
    share: int
    shares: int
    slots: int
    per: int


def _shape_spec(m: int, n: int, kk: int) -> packed.GemmSpec:
    """A spec of the product's shape only (what the scratch size and the split depend on)."""
    return packed.GemmSpec(m, n, kk, packed.matrix_loader(0, kk), packed.matrix_loader(1, n), 2)


def batched_plan(config: CodegenConfig, count: int, m: int, n: int, kk: int,
                 parallel: bool = True) -> BatchedPlan | None:
    """The packed GEMM for ``count`` independent M×K @ K×N products in a build of ``config``,
    or None (plain nests).

    The batch is the parallel dimension: with ``T`` cores each product is cut into the
    number of shares ``p ≤ T`` that minimizes the busiest thread's work ``⌈count·p/T⌉ / p``
    (in products; ties: fewer shares), so 12 heads on 2 cores run whole products, 6 per
    thread, and 3 heads are cut in halves instead of leaving one core idle for a third."""
    if not config.packed or count < 1:
        return None
    blk = packed.blocking_for_host(config.gemm_blocking)
    macs = count * m * n * kk
    if m < blk.mr or macs < PACKED_MIN_MACS:
        return None
    spec = _shape_spec(m, n, kk)
    threads = (os.cpu_count() or 1) if parallel and macs >= PARALLEL_MIN_MACS else 1
    best = None
    for p in range(1, threads + 1):
        dim, share = packed.split(spec, blk, p)
        shares = -(-(m if dim == "m" else n) // share)
        load = -(-count * shares // threads) / shares
        if best is None or load < best[0]:
            best = (load, dim, share, shares)
    _, dim, share, shares = best
    per = packed.packing_floats(spec, blk, share if dim == "m" else m, share if dim == "n" else n)
    return BatchedPlan(blk, dim, share, shares, min(threads, count * shares), per)


#: batched products with at most this many ``nr``-wide column panels read a row-major A in
#: place (``GemmSpec.lda``): its packed panels would be reused by that few micro-kernel calls
#: (BERT's heads, 1 thread: 12 x 128x64 @ 64x128 0.31 -> 0.25 ms, 12 x 128x128 @ 128x64
#: 0.33 -> 0.26 ms)
IN_PLACE_A_MAX_PANELS = 4


def a_in_place(config: CodegenConfig, n: int) -> bool:
    """Whether a batched product with N columns reads A in place instead of packing it."""
    return -(-n // packed.blocking_for_host(config.gemm_blocking).nr) <= IN_PLACE_A_MAX_PANELS


def batched_temps(config: CodegenConfig, count: int, m: int, n: int, kk: int) -> list[TensorType]:
    """The packing scratch of :func:`batched_product` (empty when the products stay plain)."""
    plan = batched_plan(config, count, m, n, kk)
    return [TensorType((plan.slots * plan.per,))] if plan else []


def batched_product(k: KernelBuilder, spec: packed.GemmSpec, operands: Sequence[Buffer], c: Buffer, scratch: Buffer,
                    batch: Sequence[int], strides: Sequence[Sequence[int]]) -> None:
    """``C[β] = A[β] · B[β]`` for every index β of the ``batch`` shape, on the packed GEMM.

    ``strides[x][d]`` is the element stride of batch dim ``d`` in operand ``x`` (C last; 0
    where the operand is broadcast along it): the per-product base pointers are affine in β.
    The domain ``{[β, s] : 0 ≤ s < shares}`` is flattened and cut into :class:`BatchedPlan`'s
    slots, one ``parallel_loop`` iteration each; a slot walks its units in order and calls
    one block function of the spec (constant sizes) per unit with its own packing scratch
    (the plan of ``k.config``)."""
    count = math.prod(batch)
    plan = batched_plan(k.config, count, spec.m, spec.n, spec.k, k.parallel)
    if plan is None or scratch.type.size < plan.slots * plan.per:
        raise AssertionError(f"{k.node.label}: no batched GEMM plan or scratch too small for {count} x {spec.m}x{spec.n}x{spec.k}")
    attrs = [a for a in k.fn.attributes if a != "noinline"]
    fn = packed.block_function(k.module, f"{k.fn.name}.gemm{k.nests}", spec, plan.blk, attrs)
    k.nests += 1
    units = count * plan.shares
    total = spec.m if plan.dim == "m" else spec.n

    def c64(v: int) -> ir.Constant:
        return ir.Constant(ir.IntType(64), v)

    with k.parallel_loop(0, plan.slots, "gemm") as slot:
        b = k.b
        lo = b.sdiv(b.mul(slot, c64(units)), c64(plan.slots))
        hi = b.sdiv(b.mul(b.add(slot, c64(1)), c64(units)), c64(plan.slots))
        bases = [b.bitcast(buf.ptr, packed.F32P) for buf in (*operands, c)]
        work = b.gep(b.bitcast(scratch.ptr, packed.F32P), [b.mul(slot, c64(plan.per))], inbounds=True)
        with packed.for_range(b, lo, hi, name="unit") as u:
            rest, part = b.udiv(u, c64(plan.shares)), b.urem(u, c64(plan.shares))
            offsets = [c64(0)] * len(bases)
            for d in reversed(range(len(batch))):
                idx = b.urem(rest, c64(batch[d])) if d else rest
                rest = b.udiv(rest, c64(batch[d]))
                offsets = [off if not st[d] else b.add(off, b.mul(idx, c64(st[d]))) for off, st in zip(offsets, strides)]
            ptrs = [b.gep(base, [off], inbounds=True) for base, off in zip(bases, offsets)]
            p0 = b.mul(part, c64(plan.share))
            p1 = b.add(p0, c64(plan.share))
            p1 = b.select(b.icmp_signed("<", p1, c64(total)), p1, c64(total))
            ranges = [p0, p1, c64(0), c64(spec.n)] if plan.dim == "m" else [c64(0), c64(spec.m), p0, p1]
            b.call(fn, [*ptrs, work, *ranges])


@register
class Gemm(Kernel):
    """Y = alpha * A' @ B' + beta * C with A' = A or Aᵀ, B' = B or Bᵀ, C broadcast to (M, N)."""

    op_types = ("Gemm",)
    polly = "polly"
    #: with ``transB`` and at most this many rows, read B in place (dot products along its
    #: rows) instead of transposing it for the packed GEMM: the copy and Polly's packing cost
    #: more than the product itself there (1x1024 @ (1024x1024)ᵀ: 0.16 ms vs 1.4 ms on one
    #: core; the packed GEMM is ahead from about 256 rows).  Covers batch-1 fully connected layers.
    DOT_MAX_ROWS: ClassVar[int] = 128

    def _dims(self, node: Node, ins: list[Operand | None]) -> tuple[int, int, int]:
        sa, sb = ins[0].type.shape, ins[1].type.shape
        if len(sa) != 2 or len(sb) != 2:
            raise ShapeError(f"Gemm node {node.label!r}: A {sa} and B {sb} must be 2-D")
        m, ka = (sa[1], sa[0]) if node.attrs.get("transA", 0) else sa
        kb, n = (sb[1], sb[0]) if node.attrs.get("transB", 0) else sb
        if ka != kb:
            raise ShapeError(f"Gemm node {node.label!r}: inner dimensions differ (A' is {m}x{ka}, B' is {kb}x{n})")
        return m, n, ka

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        m, n, _ = self._dims(node, ins)
        if len(ins) > 2 and ins[2] is not None:
            sc = ins[2].type.shape
            if len(sc) > 2 or broadcast_shapes(node, sc, (m, n)) != (m, n):
                raise ShapeError(f"Gemm node {node.label!r}: C {sc} does not broadcast to ({m}, {n})")
        return [TensorType((m, n), ins[0].type.dtype)]

    def _packed_plan(self, node: Node, ins: list[Operand | None]) -> tuple[packed.Blocking, int] | None:
        if self._gemv(node, ins):
            return None
        return packed_plan(self.config, *self._dims(node, ins), b_constant=self._b_constant(node, ins[1].value is not None))

    def _gemv(self, node: Node, ins: list[Operand | None]) -> bool:
        """Whether the product runs on :func:`gemv_rows`: one row (a batch-1 classifier), A
        not transposed, constant B, host builds, enough work for the threads."""
        m, n, kk = self._dims(node, ins)
        return (self.config.packed and m == 1 and not node.attrs.get("transA", 0) and ins[1].value is not None
                and n * kk >= GEMV_MIN_MACS)

    @staticmethod
    def _b_constant(node: Node, constant: bool) -> bool:
        """Whether B counts as constant weights for :func:`packed_plan`: not with ``transB``,
        where the dot products along B's rows beat the packed GEMM below a register tile of rows
        (1x1280 @ (1000x1280)ᵀ: 0.20 vs 0.56 ms)."""
        return constant and not node.attrs.get("transB", 0)

    def _scheduled(self, node: Node, ins: list[Operand | None]) -> scheduled_gemm.Plan | None:
        """The schedule's sizes where the product runs on it (:func:`scheduled_plan`: by the
        packed GEMM's rule for which products are packed), else None.  A constant B' is packed
        at compile time (transposed there if ``transB``)."""
        if self._gemv(node, ins) or self._packed_plan(node, ins) is None:
            return None
        m, n, kk = self._dims(node, ins)
        if scheduled_plan(self.config, m, n, kk, self._b_constant(node, ins[1].value is not None)) is None:
            return None
        return scheduled_plan(self.config, m, n, kk, ins[1].value is not None)

    def policy(self, node: Node, ins: list[Operand | None]) -> str:
        return "off" if self._packed_plan(node, ins) or self._gemv(node, ins) else self.polly

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        m, n, kk = self._dims(node, ins)
        how = ("gemv" if self._gemv(node, ins) else "scheduled" if self._scheduled(node, ins) else
               "packed" if self._packed_plan(node, ins) else "nests")
        return f"{m}x{kk} @ {kk}x{n} {how}"

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """The packed GEMM's scratch, or row-major copies of the operands read transposed (B
        only for Polly's GEMM pattern)."""
        m, n, kk = self._dims(node, ins)
        if self._gemv(node, ins):
            return []
        if self._scheduled(node, ins):
            return [] if self.config.plain_nests else [
                TensorType((scheduled_scratch(self.config, m, n, kk, ins[1].value is not None),))]
        if self._packed_plan(node, ins):
            return packed_temps(self.config, m, n, kk, self._b_constant(node, ins[1].value is not None))
        t = []
        if node.attrs.get("transA", 0):
            t.append(TensorType((m, kk)))
        if node.attrs.get("transB", 0) and m > self.DOT_MAX_ROWS:
            t.append(TensorType((kk, n)))
        return t

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        """A constant B' (weights) pre-packed in panel order for the packed GEMM, or in
        :func:`gemv_rows`'s column blocks."""
        if self._gemv(node, ins):
            w = np.asarray(ins[1].value, np.float32)
            return [gemv_pack(w.T if node.attrs.get("transB", 0) else w)]
        if ins[1].value is None or not self._packed_plan(node, ins):
            return []
        w = np.asarray(ins[1].value, np.float32)
        plan = self._scheduled(node, ins)
        if plan is not None and self.config.plain_nests:  # the plain nest reads B' as it is
            return []
        if plan is not None:
            return [scheduled_gemm.constant_b(plan, w.T if node.attrs.get("transB", 0) else w)]
        return [packed.prepack_b(w.T if node.attrs.get("transB", 0) else w,
                                 packed.blocking_for_host(self.config.gemm_blocking))]

    def replaced_inputs(self, node: Node, ins: list[Operand | None]) -> set[int]:
        """B is replaced where :meth:`constants` re-lays it out (without making the copy)."""
        if ins[1].value is None or self.config.plain_nests and self._scheduled(node, ins) is not None:
            return set()
        return {1} if self._gemv(node, ins) or self._packed_plan(node, ins) else set()

    def lower(self, k: KernelBuilder) -> None:
        prefer_wide_vectors(k.fn)
        a, b, y = k.inputs[0], k.inputs[1] or k.constants[0], k.outputs[0]
        c = k.inputs[2] if len(k.inputs) > 2 else None
        alpha = float(k.attr("alpha", 1.0))
        beta = float(k.attr("beta", 1.0))
        if beta == 0.0:
            c = None  # no C term (also where C holds inf/nan, as onnxruntime)
        m, n = y.shape
        kk = a.shape[0] if k.attr("transA", 0) else a.shape[1]
        ins = [None if t is None else Operand(f"in{i}", t, v) for i, (t, v) in enumerate(zip(k.in_types, k.values))]
        if self._gemv(k.node, ins):
            gemv_rows(k, a, k.constants[0], y)
        elif self._scheduled(k.node, ins) is not None:
            constant = k.inputs[1] is None  # B' in the schedule's layout (not with --no-schedule)
            bias = None if c is None else tuple(d > 1 for d in (1,) * (2 - c.rank) + c.shape)
            operands = {"A": a, ("Bc" if constant else "B"): b, "C": y, **({"Cb": c} if c is not None else {})}
            scheduled_product(k, operands, m, n, kk, constant, trans_a=bool(k.attr("transA", 0)),
                              trans_b=bool(k.attr("transB", 0)) and not constant, alpha=alpha, bias=bias, beta=beta)
            return
        elif packed_plan(self.config, m, n, kk, self._b_constant(k.node, k.values[1] is not None)):
            self._packed(k, a, b, c, y, alpha, beta)
            return
        else:
            self._plain(k, a, b, y)
        if alpha == 1.0 and c is None:
            return
        # y = alpha * y + beta * C, after the product (see the module docstring: not as the init)
        with k.loops(y.shape, names=["si", "sj"]) as ix:
            v = y.load(ix)
            if alpha != 1.0:
                v = k.b.fmul(v, k.f32(alpha))
            if c is not None:
                cv = c.load(c.broadcast_index(ix))
                v = k.b.fadd(v, cv if beta == 1.0 else k.b.fmul(cv, k.f32(beta)))
            y.store(ix, v)

    @staticmethod
    def _packed(k: KernelBuilder, a: Buffer, b: Buffer, c: Buffer | None, y: Buffer, alpha: float, beta: float) -> None:
        """Through :mod:`polyml.codegen.gemm`: transposed operands packed in place, alpha and
        beta·C applied to each register tile as its epilogue."""
        m, n = y.shape
        trans_a, trans_b = bool(k.attr("transA", 0)), bool(k.attr("transB", 0))
        kk = a.shape[0] if trans_a else a.shape[1]
        epilogue = None
        if alpha != 1.0 or c is not None:
            c_rows, c_cols = ((1,) * (2 - c.rank) + c.shape) if c is not None else (1, 1)

            def epilogue(bld: ir.IRBuilder, ops, i, j, v):  # noqa: ANN001, ANN202
                if alpha != 1.0:
                    v = bld.fmul(v, ir.Constant(v.type, alpha))
                if c is not None:
                    row = i if c_rows > 1 else ir.Constant(i.type, 0)
                    col = j if c_cols > 1 else ir.Constant(j.type, 0)
                    idx = bld.add(bld.mul(row, ir.Constant(i.type, c_cols)), col)
                    cv = bld.load(bld.gep(ops[2], [idx], inbounds=True))
                    v = bld.fadd(v, cv if beta == 1.0 else bld.fmul(cv, ir.Constant(v.type, beta)))
                return v

        prepacked = k.inputs[1] is None  # B' pre-packed at compile time (constants)
        spec = packed.GemmSpec(m, n, kk, packed.matrix_loader(0, a.shape[1], trans_a),
                               packed.matrix_loader(1, n if prepacked else b.shape[1], trans_b and not prepacked),
                               3 if c is not None else 2, epilogue=epilogue, prepacked_b=prepacked)
        packed_product(k, spec, [a, b, *([c] if c is not None else [])], y, k.temps[0])

    def _plain(self, k: KernelBuilder, a: Buffer, b: Buffer, y: Buffer) -> None:
        """Polly's GEMM pattern: operands read transposed are copied row-major first."""
        temps = iter(k.temps)
        if k.attr("transA", 0):
            a_t = next(temps)
            transpose_into(k, a, a_t)
            a = a_t
        if not k.attr("transB", 0):
            gemm_nests(k, a, b, y)
        elif y.shape[0] <= self.DOT_MAX_ROWS:
            gemm_nests(k, a, b, y, b_transposed=True)
        else:
            b_t = next(temps)
            transpose_into(k, b, b_t)
            gemm_nests(k, a, b_t, y)


@register
class MatMul(Kernel):
    """numpy ``matmul``: 1-D operands are promoted (the added dim dropped), batch dims broadcast."""

    op_types = ("MatMul",)
    polly = "polly"

    @staticmethod
    def _plan(node: Node, sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[tuple[int, ...], int, int, int, tuple[int, ...]]:
        """(batch shape, M, N, K, output shape) of ``A @ B``."""
        if not sa or not sb:
            raise ShapeError(f"MatMul node {node.label!r}: operands must not be scalars ({sa} @ {sb})")
        a2 = (1, *sa) if len(sa) == 1 else sa
        b2 = (*sb, 1) if len(sb) == 1 else sb
        m, ka = a2[-2:]
        kb, n = b2[-2:]
        if ka != kb:
            raise ShapeError(f"MatMul node {node.label!r}: inner dimensions differ ({sa} @ {sb})")
        batch = broadcast_shapes(node, a2[:-2], b2[:-2])
        out = (*batch, *((m,) if len(sa) > 1 else ()), *((n,) if len(sb) > 1 else ()))
        return batch, m, n, ka, out

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        *_, out = self._plan(node, ins[0].type.shape, ins[1].type.shape)
        return [TensorType(out, ins[0].type.dtype)]

    def _packed_dims(self, node: Node, sa: tuple[int, ...], sb: tuple[int, ...],
                     b_constant: bool = False) -> tuple[int, int, int] | None:
        """(rows, N, K) of the one 2-D product when B is a single matrix and it is packed."""
        batch, m, n, kk, _ = self._plan(node, sa, sb)
        if int(np.prod(sb[:-2], dtype=np.int64)) != 1:
            return None
        rows = int(np.prod(batch, dtype=np.int64)) * m
        return (rows, n, kk) if packed_plan(self.config, rows, n, kk, b_constant) else None

    def _batched(self, node: Node, sa: tuple[int, ...], sb: tuple[int, ...]) -> tuple[int, int, int, int] | None:
        """(products, M, N, K) when B has batch dims and the products run on the packed GEMM."""
        batch, m, n, kk, _ = self._plan(node, sa, sb)
        if int(np.prod(sb[:-2], dtype=np.int64)) == 1:
            return None
        count = int(np.prod(batch, dtype=np.int64))
        return (count, m, n, kk) if batched_plan(self.config, count, m, n, kk) else None

    def policy(self, node: Node, ins: list[Operand | None]) -> str:
        sa, sb = ins[0].type.shape, ins[1].type.shape
        packed_2d = self._packed_dims(node, sa, sb, ins[1].value is not None)
        return "off" if packed_2d or self._batched(node, sa, sb) else self.polly

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        sa, sb = ins[0].type.shape, ins[1].type.shape
        b_constant = ins[1].value is not None
        packed_2d = self._packed_dims(node, sa, sb, b_constant)
        scheduled = packed_2d and scheduled_plan(self.config, *packed_2d, b_constant) is not None
        how = "scheduled" if scheduled else "packed" if packed_2d else "packed batched" if self._batched(node, sa, sb) else "nests"
        return f"{sa} @ {sb} {how}"

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        sa, sb = ins[0].type.shape, ins[1].type.shape
        b_constant = ins[1].value is not None
        dims = self._packed_dims(node, sa, sb, b_constant)
        if dims and scheduled_plan(self.config, *dims, b_constant) is not None:  # scheduled_product's buffers
            return [] if self.config.plain_nests else [TensorType((scheduled_scratch(self.config, *dims, b_constant),))]
        if dims:
            return packed_temps(self.config, *dims, b_constant=b_constant)
        batched = self._batched(node, sa, sb)
        return batched_temps(self.config, *batched) if batched else []

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        """A constant single-matrix B (weights) pre-packed in panel order for the packed GEMM."""
        sa, sb = ins[0].type.shape, ins[1].type.shape
        dims = self._packed_dims(node, sa, sb, ins[1].value is not None)
        if ins[1].value is None or dims is None:
            return []
        _, n, kk = dims
        weights = np.asarray(ins[1].value, np.float32).reshape(kk, n)
        plan = scheduled_plan(self.config, *dims, True)
        if plan is not None and self.config.plain_nests:  # the plain nest reads B as it is
            return []
        if plan is not None:  # in the schedule's layout (the kc blocks do not depend on threads)
            return [scheduled_gemm.constant_b(plan, weights)]
        return [packed.prepack_b(weights, packed.blocking_for_host(self.config.gemm_blocking))]

    def replaced_inputs(self, node: Node, ins: list[Operand | None]) -> set[int]:
        sa, sb = ins[0].type.shape, ins[1].type.shape
        constant = ins[1].value is not None
        dims = self._packed_dims(node, sa, sb, constant) if constant else None
        if dims is None or (self.config.plain_nests and scheduled_plan(self.config, *dims, True) is not None):
            return set()
        return {1}

    def lower(self, k: KernelBuilder) -> None:
        prefer_wide_vectors(k.fn)
        a, y = k.inputs[0], k.outputs[0]
        prepacked = k.inputs[1] is None  # B pre-packed at compile time (constants)
        b = k.constants[0] if prepacked else k.inputs[1]
        b_shape = k.in_types[1].shape
        batch, m, n, kk, _ = self._plan(k.node, a.shape, b_shape)
        if int(np.prod(b_shape[:-2], dtype=np.int64)) == 1:
            # B is one matrix: A's batch dims stack into M (row-major, same memory) -> one 2-D GEMM
            rows = int(np.prod(batch, dtype=np.int64)) * m
            a2, y2 = view(k, a, (rows, kk)), view(k, y, (rows, n))
            if scheduled_plan(k.config, rows, n, kk, k.values[1] is not None) is not None:
                # a constant B arrives in the schedule's layout, but as stored with --no-schedule
                operands = {"A": a2, "Bc": b} if prepacked else {"A": a2, "B": view(k, b, (kk, n))}
                scheduled_product(k, {**operands, "C": y2}, rows, n, kk, prepacked)
                return
            if prepacked:
                spec = packed.GemmSpec(rows, n, kk, packed.matrix_loader(0, kk), packed.matrix_loader(1, n), 2,
                                       prepacked_b=True)
                packed_product(k, spec, [a2, b], y2, k.temps[0])
                return
            b2 = view(k, b, (kk, n))
            if k.temps:  # packed_plan said yes (host lowering)
                spec = packed.GemmSpec(rows, n, kk, packed.matrix_loader(0, kk), packed.matrix_loader(1, n), 2)
                packed_product(k, spec, [a2, b2], y2, k.temps[0])
            elif not parallel_gemm(k, a2, b2, y2):
                gemm_nests(k, a2, b2, y2)
            return
        if k.temps:  # batched B on the packed GEMM: one product per batch index, split over threads
            nb = len(batch)
            sa = (*(1,) * (nb + 2 - max(a.rank, 2)), *a.shape[:-2], *((m, kk) if a.rank > 1 else (1, kk)))
            sb = (*(1,) * (nb + 2 - b.rank), *b.shape)
            strides = [[0 if s[d] == 1 else math.prod(s[d + 1:]) for d in range(nb)] for s in (sa, sb, (*batch, m, n))]
            spec = packed.GemmSpec(m, n, kk, packed.matrix_loader(0, kk), packed.matrix_loader(1, n), 2,
                                   lda=kk if a_in_place(self.config, n) else 0)
            batched_product(k, spec, [a, b], y, k.temps[0], batch, strides)
            return
        # batched B: for each batch index, C[b] = A[bcast(b)] @ B[bcast(b)] via a 2-D GEMM function
        nb = len(batch)
        a_core = (m, kk) if a.rank > 1 else (1, kk)
        a_full = view(k, a, (*(1,) * (nb + 2 - max(a.rank, 2)), *a.shape[:-2], *a_core))
        b_full = view(k, b, (*(1,) * (nb + 2 - b.rank), *b.shape))
        y_full = view(k, y, (*batch, m, n))
        gemm = gemm_function(k, m, n, kk)
        with k.loops(batch, names=[f"b{d}" for d in range(nb)]) as bi:
            ptrs = [
                k.b.gep(buf.ptr, [k.i64(0 if d == 1 else i) for d, i in zip(buf.shape[:nb], bi)] + [k.i64(0)], inbounds=True)
                for buf in (a_full, b_full, y_full)
            ]
            k.b.call(gemm, ptrs)
