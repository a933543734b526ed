"""A KernelBuilder that emits an op's loop nests as CUDA kernels (NVPTX LLVM IR).

The CPU builder puts all of an op's nests in one function.  Here every *top-level nest* (a
``loops``/``loop`` call at depth 0) is outlined into its own kernel ``<op>_k<n>(buffers...)``
(``nvvm.annotations`` marks it a kernel): consecutive nests of one op may depend on each other
(fill, then accumulate), and kernel launches on one stream are the grid-wide barrier between
them.  Only buffers cross into a kernel; views (bitcasts of an op argument) are re-derived from
the kernel's own parameters.

The same ``lower()`` runs twice:

1. **recording** (no mapping): loops are ordinary loops, and every load/store is recorded as an
   affine access relation over the enclosing loop counters (:class:`NestRecord`), with the
   position of the access in the nest (a ``2d+1`` schedule).  Indices are recovered from the
   ``add``/``sub``/``mul``/``shl`` chains of loop counters and constants the kernels build;
   anything else is recorded as an access to the whole array (a sound over-approximation).
2. **mapped** (a :class:`~polyml.gpu.mapping.NestMapping` per nest): a mapped band loop
   ``for (i = lo; i < hi; ++i)`` becomes ``i = lo + blockIdx.a * T + threadIdx.a; if (i < hi)``,
   every other loop stays a loop inside the thread (reductions, sequential remainders).

With a shared-memory plan (:mod:`polyml.gpu.shared`) the mapped run changes in three ways: the
bound guards become *predicates* of each load and store (``select(i < hi, &A[..], &dummy)``), so
that every thread of a block reaches the barriers; the reduction loop is strip-mined, and each
tile starts with the cooperative copy of the promoted boxes into ``addrspace(3)`` between
``llvm.nvvm.barrier0`` calls; and the reads of promoted arrays inside it load from shared memory.

Calls of the outlined GEMM helper of :mod:`kernels.matmul` (``<op>.gemm2d(A, B, C)``, used per
batch index of a batched MatMul) are inlined as one nest ``for i, j: C = -0; for k: C += A·B``,
so the batch, ``i`` and ``j`` loops join the band and map onto the grid (``k`` stays in the thread).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import F32, I32, I64, Buffer, KernelBuilder, counted_loop, pointer_type
from polyml.errors import PolymlError
from polyml.graph import Node, TensorType

LOG2E = 1.4426950408889634
AXES = "xyz"


class GpuLoweringError(PolymlError):
    """An op's lowering does something the GPU builder cannot outline into kernels."""


Affine = dict  # {loop key or 1: coefficient}; key 1 is the constant term


@dataclass
class LoopRecord:
    """One loop of a nest: ``for (i = lo; i < hi; ++i)`` at ``depth`` (0 = outermost)."""

    key: tuple[int, ...]
    lo: int
    hi: int
    depth: int
    name: str
    children: list[tuple[int, ...]] = field(default_factory=list)
    #: whether a load/store sits directly in this loop's body (outside its child loops)
    direct_access: bool = False


@dataclass
class AccessRecord:
    """One load/store: ``kind`` of array ``A<root>[offset]`` at schedule ``[c0, i1, c1, ...]``."""

    kind: str  # "read" | "write"
    root: int  # index of the op's buffer argument the address is derived from
    loops: list[tuple[int, ...]]  # enclosing loops, outermost first
    ordinals: list[int]  # position among the siblings at each level (len(loops) + 1)
    offset: Affine | None  # flat element offset into the root array; None: not affine (any element)


@dataclass
class NestRecord:
    """What the recording run saw of one top-level nest (one kernel)."""

    index: int
    loops: dict[tuple[int, ...], LoopRecord] = field(default_factory=dict)
    roots: list[tuple[int, ...]] = field(default_factory=list)
    accesses: list[AccessRecord] = field(default_factory=list)
    #: reasons the accesses are not fully known (calls of non-intrinsic functions)
    opaque: list[str] = field(default_factory=list)
    #: conditional branches the kernel emitted inside the nest (other than loop exits)
    branches: int = 0


@dataclass
class KernelRecord:
    """One emitted kernel: its function name, nest and mapping (None: one thread)."""

    name: str
    nest: int
    mapping: object | None = None


def _elements(t: ir.Type) -> int:
    n = 1
    while isinstance(t, ir.ArrayType):
        n *= t.count
        t = t.element
    return n


class _TracingBuilder(ir.IRBuilder):
    """An IRBuilder that tells its KernelBuilder about address computations and memory accesses."""

    def __init__(self, kb: GpuKernelBuilder, block: ir.Block):
        super().__init__(block)
        self.kb = kb

    def gep(self, ptr, indices, *args, **kwargs):  # noqa: ANN001, ANN201 - llvmlite's signature
        v = super().gep(ptr, indices, *args, **kwargs)
        self.kb._geps[id(v)] = (ptr, list(indices))
        return v

    def load(self, ptr, *args, **kwargs):  # noqa: ANN001, ANN201
        self.kb._access("read", ptr)
        promoted = self.kb._shared_load(ptr)
        if promoted is not None:
            return promoted
        return super().load(self.kb._predicated(ptr), *args, **kwargs)

    def store(self, value, ptr, *args, **kwargs):  # noqa: ANN001, ANN201
        self.kb._access("write", ptr)
        return super().store(value, self.kb._predicated(ptr), *args, **kwargs)

    def cbranch(self, cond, truebr, falsebr, *args, **kwargs):  # noqa: ANN001, ANN201
        self.kb._branch(cond)
        return super().cbranch(cond, truebr, falsebr, *args, **kwargs)

    def call(self, fn, args, *rest, **kwargs):  # noqa: ANN001, ANN201
        name = getattr(fn, "name", "")
        if not name.startswith("llvm."):
            if self.kb._inline_call(fn, args):
                return None
            self.kb._opaque(f"call of {name or 'an indirect function'}")
        return super().call(fn, args, *rest, **kwargs)


class GpuKernelBuilder(KernelBuilder):
    """Lower one node into NVPTX kernels, one per top-level loop nest.

    ``fn`` is the op's *prologue*: a function (in a scratch module, never compiled) whose
    arguments are the op's buffers; code the kernel emits outside every nest (views) lands there
    and is re-derived inside each kernel.  ``mappings`` (nest index → mapping) selects the
    mapped run; without it the builder records :class:`NestRecord` s.
    """

    def __init__(self, module: ir.Module, fn: ir.Function, node: Node, inputs: list[Buffer | None],
                 outputs: list[Buffer], temps: list[Buffer], values: list[np.ndarray | None],
                 in_types: list[TensorType | None], mappings: dict[int, object] | None = None):
        self._geps: dict[int, tuple[ir.Value, list[ir.Value]]] = {}
        super().__init__(module, fn, node, inputs, outputs, temps, values, in_types, parallel=False)
        self.b = _TracingBuilder(self, self.b.block)
        self.prologue = fn
        self.mappings = mappings
        self.records: list[NestRecord] = []
        self.kernels: list[KernelRecord] = []
        self._arg_index: dict[int, int] = {id(a): i for i, a in enumerate(fn.args)}
        self._nest: NestRecord | None = None
        self._loop_stack: list[LoopRecord] = []
        self._loop_ords: list[int] = [0]  # next loop ordinal per open level
        self._seq_ords: list[int] = [0]  # next schedule ordinal (loops and accesses) per level
        self._seq_path: list[int] = []
        self._ivs: dict[int, tuple[int, ...]] = {}  # id(phi) -> loop key
        self._iv_val: dict[tuple[int, ...], ir.Value] = {}  # loop key -> its counter in this kernel
        self._pred: ir.Value | None = None  # predicate of the enclosing mapped loops (shared mode)
        self._region: dict | None = None  # root -> (array, shared global, origins) inside a promoted tile
        self._dummies: dict[str, ir.Value] = {}
        self._alloca_block: ir.Block | None = None

    # -- kernels ----------------------------------------------------------------------------
    @contextmanager
    def _kernel(self) -> Iterator[None]:
        """Outline what is emitted inside into a new kernel over the op's buffers."""
        index = len(self.kernels)
        name = f"{self.prologue.name}_k{index}"
        fnty = ir.FunctionType(ir.VoidType(), [a.type for a in self.prologue.args])
        kfn = ir.Function(self.module, fnty, name)
        kfn.attributes.add("nounwind")
        for a, p in zip(kfn.args, self.prologue.args):
            a.add_attribute("noalias")
            a.name = p.name
        for i, a in enumerate(kfn.args):
            self._arg_index[id(a)] = i
        md = self.module.add_named_metadata("nvvm.annotations")
        md.add(self.module.add_metadata([kfn, "kernel", ir.Constant(I32, 1)]))
        # one builder object throughout (kernels keep ``b = k.b``): it moves into the kernel
        saved_fn, saved_block = self.fn, self.b.block
        bufs = list(self._buffers)
        saved_ptrs = [buf.ptr for buf in bufs]
        self.fn = kfn
        mapping = (self.mappings or {}).get(index)
        # shared mode: the predicates' dummy slots go in a block of their own before the entry
        allocas = kfn.append_basic_block(f"{self.prefix}.k{index}.allocas") if getattr(mapping, "shared", None) else None
        entry = kfn.append_basic_block(f"{self.prefix}.k{index}.entry")
        self._alloca_block = allocas
        self.b.position_at_end(entry)
        memo: dict[int, ir.Value] = {}
        for buf in bufs:
            buf.ptr = self._rederive(buf.ptr, kfn, memo)
        self._nest = NestRecord(index)
        self._loop_ords, self._seq_ords, self._seq_path = [0], [0], []
        self._iv_val, self._pred, self._region, self._dummies = {}, None, None, {}
        self.kernels.append(KernelRecord(name, index, (self.mappings or {}).get(index)))
        try:
            yield
            self.b.ret_void()
            if allocas is not None:
                ir.IRBuilder(allocas).branch(entry)
        finally:
            self.records.append(self._nest)
            self._nest = None
            self.fn = saved_fn
            self.b.position_at_end(saved_block)
            for buf, ptr in zip(bufs, saved_ptrs):
                buf.ptr = ptr

    def _rederive(self, v: ir.Value, kfn: ir.Function, memo: dict[int, ir.Value]) -> ir.Value:
        """``v`` (an op argument, or bitcasts/constant geps of one) in terms of ``kfn``'s args."""
        if id(v) in memo:
            return memo[id(v)]
        if id(v) in self._arg_index:
            out = kfn.args[self._arg_index[id(v)]]
        elif isinstance(v, ir.CastInstr) and v.opname == "bitcast":
            out = self.b.bitcast(self._rederive(v.operands[0], kfn, memo), v.type)
        elif isinstance(v, ir.GEPInstr) and all(isinstance(i, ir.Constant) for i in v.indices):
            out = self.b.gep(self._rederive(v.pointer, kfn, memo), list(v.indices), inbounds=v.inbounds)
        else:
            raise GpuLoweringError(f"{self.node.op_type} node {self.node.label!r}: a buffer pointer computed outside "
                                   "its loop nests cannot be passed to a GPU kernel")
        memo[id(v)] = out
        return out

    @contextmanager
    def loops(self, extents: Sequence[int | tuple[int, int]], names: Sequence[str] | None = None,
              parallel: int = 0) -> Iterator[list[ir.Value]]:
        """A perfect nest, as on the CPU; at the top level it is one kernel even if every loop
        has a single iteration (then the kernel is one thread)."""
        if self._nest is None:
            with self._kernel(), super().loops(extents, names, 0) as ivs:
                yield ivs
        else:
            with super().loops(extents, names, 0) as ivs:
                yield ivs

    @contextmanager
    def parallel_loop(self, lo: int, hi: int, name: str = "p") -> Iterator[ir.Value]:
        """No OpenMP on the device: parallelism comes from the grid mapping."""
        with self.loop(lo, hi, name) as iv:
            yield iv

    @contextmanager
    def loop(self, lo: int, hi: int, name: str = "i") -> Iterator[ir.Value]:
        if self._nest is None:
            with self._kernel(), self.loop(lo, hi, name) as iv:
                yield iv
            return
        if not (isinstance(lo, int) and isinstance(hi, int)):
            raise GpuLoweringError(f"{self.node.label!r}: loop {name} has non-constant bounds")
        depth = len(self._loop_stack)
        parent = self._loop_stack[-1].key if self._loop_stack else None
        key = (*(parent or ()), self._loop_ords[-1])
        self._loop_ords[-1] += 1
        rec = LoopRecord(key, lo, hi, depth, name)
        self._nest.loops[key] = rec
        (self._nest.loops[parent].children if parent else self._nest.roots).append(key)
        self._seq_path.append(self._seq_ords[-1])
        self._seq_ords[-1] += 1
        self._loop_stack.append(rec)
        self._loop_ords.append(0)
        self._seq_ords.append(0)
        mapping = self.kernels[-1].mapping
        axis = mapping.axis_of(key) if mapping is not None else None
        plan = getattr(mapping, "shared", None)
        try:
            if plan is not None and key == plan.loop:
                with self._promoted(lo, hi, name, key, plan, mapping) as iv:
                    yield iv
            elif axis is None:
                with KernelBuilder.loop(self, lo, hi, name) as iv:
                    self._ivs[id(iv)] = key
                    self._iv_val[key] = iv
                    yield iv
            else:
                with self._mapped(lo, hi, name, axis, mapping.tile_of(key), plan is not None) as iv:
                    self._ivs[id(iv)] = key
                    self._iv_val[key] = iv
                    yield iv
        finally:
            self._loop_stack.pop()
            self._loop_ords.pop()
            self._seq_ords.pop()
            self._seq_path.pop()

    def sreg(self, reg: str, axis: int) -> ir.Value:
        """``%tid.x`` etc. as i64, through ``llvm.nvvm.read.ptx.sreg.<reg>.<axis>``."""
        name = f"llvm.nvvm.read.ptx.sreg.{reg}.{AXES[axis]}"
        fn = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(I32, []), name)
        return ir.IRBuilder.zext(self.b, ir.IRBuilder.call(self.b, fn, []), I64)

    @contextmanager
    def _mapped(self, lo: int, hi: int, name: str, axis: int, tile: int, predicated: bool = False) -> Iterator[ir.Value]:
        """``i = lo + ctaid.a * tile + tid.a``; the body runs under ``if (i < hi)``
        (``predicated``: every thread runs it, ``i < hi`` joins the predicate of its memory accesses)."""
        b = self.b
        if self._depth == 0:
            self.nests += 1
        tag = f"{self.prefix}.L{self._depth}.{name}"
        point = b.add(b.mul(self.sreg("ctaid", axis), self.i64(tile)), self.sreg("tid", axis))
        iv = b.add(point, self.i64(lo), name=name) if lo else point
        if predicated:
            saved = self._pred
            inside = b.icmp_signed("<", iv, self.i64(hi))
            self._pred = inside if saved is None else b.and_(saved, inside)
            self._depth += 1
            try:
                yield iv
            finally:
                self._depth -= 1
                self._pred = saved
            return
        body = b.append_basic_block(f"{tag}.{AXES[axis]}.body")
        exit_ = b.append_basic_block(f"{tag}.{AXES[axis]}.exit")
        ir.IRBuilder.cbranch(b, b.icmp_signed("<", iv, self.i64(hi)), body, exit_)
        b.position_at_end(body)
        self._depth += 1
        try:
            yield iv
        finally:
            self._depth -= 1
        self.b.branch(exit_)
        self.b.position_at_end(exit_)

    # -- shared-memory promotion --------------------------------------------------------------
    @contextmanager
    def _raw_loop(self, lo: ir.Value, hi: ir.Value, name: str, step: int = 1) -> Iterator[ir.Value]:
        """``for (iv = lo; iv < hi; iv += step)`` over IR values (our own code: not recorded)."""
        b = self.b
        tag = f"{self.prefix}.L{self._depth}.{name}"
        with counted_loop(b, lo, hi, tag, name, step, branch_if=functools.partial(ir.IRBuilder.cbranch, b)) as iv:
            self._depth += 1
            try:
                yield iv
            finally:
                self._depth -= 1

    def _barrier(self) -> None:
        """``bar.sync 0``: every thread of the block waits here."""
        fn = self.module.globals.get("llvm.nvvm.barrier0") or ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), []), "llvm.nvvm.barrier0")
        ir.IRBuilder.call(self.b, fn, [])

    def _affine_ir(self, form: dict, syms: dict) -> ir.Value:
        """An affine form over the symbols of :mod:`polyml.gpu.shared` as i64 arithmetic."""
        acc: ir.Value = self.i64(form.get(1, 0))
        for s, c in form.items():
            if s != 1 and c:
                acc = self.b.add(acc, self.b.mul(syms[s], self.i64(c)))
        return acc

    @contextmanager
    def _promoted(self, lo: int, hi: int, name: str, key: tuple[int, ...], plan, mapping) -> Iterator[ir.Value]:  # noqa: ANN001
        """The reduction loop strip-mined by ``plan.tile``: per tile, copy each promoted box into
        shared memory (all threads of the block), barrier, the tile's iterations, barrier."""
        b = self.b
        tk = plan.tile
        with self._raw_loop(self.i64(0), self.i64(plan.tiles), f"{name}.tile") as q:
            r0 = b.add(b.mul(q, self.i64(tk)), self.i64(lo), name=f"{name}.r0")
            syms: dict = {("q",): q}
            for k, kind in plan.kinds.items():
                if kind == "fixed":
                    syms[("f", k)] = self._iv_val[k]
                elif kind == "grid":
                    syms[("b", mapping.axes[k])] = self.sreg("ctaid", mapping.axes[k])
            region = {}
            for arr in plan.arrays:
                smem = self._shared_array(arr)
                origins = [self._affine_ir(o, syms) for o in arr.origin]
                self._copy_box(arr, smem, origins, mapping.block)
                region[arr.root] = (arr, smem, origins)
            self._barrier()
            end = b.add(r0, self.i64(tk))
            if (hi - lo) % tk:
                end = b.select(b.icmp_signed("<", end, self.i64(hi)), end, self.i64(hi))
            with self._raw_loop(r0, end, name) as iv:
                self._ivs[id(iv)] = key
                self._iv_val[key] = iv
                saved, self._region = self._region, region
                try:
                    yield iv
                finally:
                    self._region = saved
            self._barrier()

    def _shared_array(self, arr) -> ir.GlobalVariable:  # noqa: ANN001
        gv = ir.GlobalVariable(self.module, ir.ArrayType(F32, arr.elems), f"{self.fn.name}.smem{arr.root}", addrspace=3)
        gv.linkage = "internal"
        gv.initializer = ir.Constant(gv.value_type, ir.Undefined)
        gv.align = 16
        return gv

    def _copy_box(self, arr, smem: ir.GlobalVariable, origins: list[ir.Value], block: tuple[int, int, int]) -> None:  # noqa: ANN001
        """``S[e] = A[Σ s_d (origin_d + e_d)]`` for every ``e`` of the box, ``e`` strided over the
        block's threads (consecutive threads: consecutive elements of the last dimension);
        offsets outside the buffer are skipped (never read, stored as 0)."""
        b = self.b
        tid = self.sreg("tid", 0)
        if block[1] > 1 or block[2] > 1:
            tid = b.add(tid, b.mul(self.i64(block[0]), b.add(self.sreg("tid", 1), b.mul(self.i64(block[1]), self.sreg("tid", 2)))))
        base = b.bitcast(self.fn.args[arr.root], F32.as_pointer())
        with self._raw_loop(tid, self.i64(arr.elems), f"cp{arr.root}", step=math.prod(block)) as e:
            rest, digits = e, []
            for d in range(len(arr.widths) - 1, -1, -1):
                if d:
                    digits.append(b.urem(rest, self.i64(arr.widths[d])))
                    rest = b.udiv(rest, self.i64(arr.widths[d]))
                else:
                    digits.append(rest)
            digits.reverse()
            flat: ir.Value = self.i64(0)
            for s, o, dg in zip(arr.strides, origins, digits):
                flat = b.add(flat, b.mul(b.add(o, dg), self.i64(s)))
            inside = b.and_(b.icmp_signed(">=", flat, self.i64(0)), b.icmp_signed("<", flat, self.i64(arr.size)))
            v = ir.IRBuilder.load(b, ir.IRBuilder.gep(b, base, [b.select(inside, flat, self.i64(0))], inbounds=True))
            v = b.select(inside, v, self.f32(0.0))
            ir.IRBuilder.store(b, v, ir.IRBuilder.gep(b, smem, [self.i64(0), e], inbounds=True))

    def _shared_load(self, ptr: ir.Value) -> ir.Value | None:
        """Inside a promoted tile: the read of a promoted array from its shared box, else None."""
        if self._region is None:
            return None
        root, off = self._address(ptr)
        if root not in self._region or off is None:
            return None
        arr, smem, origins = self._region[root]
        if {k: c for k, c in off.items() if k != 1 and c} != arr.linear or off.get(1, 0) not in arr.consts:
            return None
        b = self.b
        index: ir.Value = self.i64(0)
        last = len(arr.coeffs) - 1
        digits = arr.digits(off.get(1, 0))
        for d, (co, o, pitch) in enumerate(zip(arr.coeffs, origins, arr.pitches)):
            sub: ir.Value = self.i64(digits[d] + (min(arr.consts) if d == last else 0))
            for k, c in co.items():
                sub = b.add(sub, b.mul(self._iv_val[k], self.i64(c)))
            index = b.add(index, b.mul(b.sub(sub, o), self.i64(pitch)))
        return ir.IRBuilder.load(b, ir.IRBuilder.gep(b, smem, [self.i64(0), index], inbounds=True))

    def _predicated(self, ptr: ir.Value) -> ir.Value:
        """``ptr``, or (outside the mapped loops' bounds) a private dummy of the same type."""
        if self._pred is None:
            return ptr
        key = str(ptr.type)
        if key not in self._dummies:
            entry = ir.IRBuilder(self._alloca_block)
            slot = entry.alloca(ptr.type.pointee)
            entry.store(ir.Constant(ptr.type.pointee, None), slot)
            self._dummies[key] = slot if slot.type == ptr.type else entry.bitcast(slot, ptr.type)
        return self.b.select(self._pred, ptr, self._dummies[key])

    # -- the outlined GEMM helper of kernels.matmul -------------------------------------------
    def _inline_call(self, fn: ir.Value, args: Sequence[ir.Value]) -> bool:
        """Emit a call of the GEMM helper as a nest of this kernel instead (see the module doc)."""
        if self._nest is None or not isinstance(fn, ir.Function) or not re.search(r"\.gemm", fn.name) or len(args) != 3:
            return False
        dims = self._gemm_dims(fn, args)
        if dims is None:
            return False
        m, n, kk = dims
        tys = [TensorType((m, kk)), TensorType((kk, n)), TensorType((m, n))]
        before = len(self._buffers)
        a, bm, c = (Buffer(self, self.b.bitcast(v, pointer_type(t)), t, role) for v, t, role in zip(args, tys, "ABC"))
        del self._buffers[before:]  # views of this call only: no kernel re-derives them
        with self.loops([m, n], names=["gi", "gj"]) as (i, j):
            c.store([i, j], self.f32(-0.0 if kk else 0.0))
            if kk:
                with self.loop(0, kk, "gk") as r:
                    prod = self.fmul(a.load([i, r]), bm.load([r, j]), reassoc=True)
                    c.store([i, j], self.fsum(c.load([i, j]), prod, reassoc=True))
        fn.linkage = "internal"  # now unused: dropped from the PTX
        return True

    def _gemm_dims(self, fn: ir.Function, args: Sequence[ir.Value]) -> tuple[int, int, int] | None:
        """(M, N, K) of a GEMM helper ``(A: MxK, B: KxN, C: MxN)``: N and K from its row
        types, M from the array the caller's address of C steps into."""
        ta, tb, tc = (a.type.pointee for a in fn.args)
        if not all(isinstance(t, ir.ArrayType) and t.element == F32 for t in (ta, tb, tc)) or tb.count != tc.count:
            return None
        g = self._geps.get(id(args[2]))
        if g is None or len(g[1]) < 2:
            return None
        t = g[0].type.pointee
        for _ in g[1][1:-1]:
            t = t.element if isinstance(t, ir.ArrayType) else None
        if not isinstance(t, ir.ArrayType) or t.element != tc:
            return None
        return t.count, tc.count, ta.count

    # -- recording ----------------------------------------------------------------------------
    def _branch(self, cond: ir.Value) -> None:
        """Count a conditional branch of the kernel's code (a loop's exit test is not one)."""
        if self._nest is None:
            return
        if getattr(cond, "opname", "") == "icmp" and isinstance(cond.operands[0], ir.PhiInstr):
            return
        self._nest.branches += 1

    def _opaque(self, why: str) -> None:
        if self._nest is not None and why not in self._nest.opaque:
            self._nest.opaque.append(why)

    def _access(self, kind: str, ptr: ir.Value) -> None:
        if self._nest is None:
            raise GpuLoweringError(f"{self.node.op_type} node {self.node.label!r}: memory is accessed outside a loop "
                                   "nest, which no GPU kernel would execute")
        root, offset = self._address(ptr)
        if self._loop_stack:
            self._loop_stack[-1].direct_access = True
        ordinals = [*self._seq_path, self._seq_ords[-1]]
        self._seq_ords[-1] += 1
        self._nest.accesses.append(AccessRecord(kind, root, [lp.key for lp in self._loop_stack], ordinals, offset))

    def _address(self, ptr: ir.Value) -> tuple[int, Affine | None]:
        """(root argument, flat element offset) of an address built by geps over bitcasts."""
        if id(ptr) in self._arg_index:
            return self._arg_index[id(ptr)], {1: 0}
        if isinstance(ptr, ir.CastInstr) and ptr.opname == "bitcast":
            return self._address(ptr.operands[0])
        g = self._geps.get(id(ptr))
        if g is None:
            raise GpuLoweringError(f"{self.node.label!r}: an address not derived from a buffer argument")
        base, indices = g
        root, off = self._address(base)
        t = base.type.pointee
        stride = _elements(t)
        for i, idx in enumerate(indices):
            if i > 0:
                if not isinstance(t, ir.ArrayType):
                    return root, None
                t = t.element
                stride = _elements(t)
            a = self._affine(idx)
            if a is None or off is None:
                off = None
                continue
            off = _add(off, _scale(a, stride))
        return root, off

    def _affine(self, v: ir.Value) -> Affine | None:
        """``v`` as an affine form of loop counters (keys) and 1, or None."""
        if isinstance(v, ir.Constant) and isinstance(v.type, ir.IntType):
            return {1: int(v.constant)}
        if id(v) in self._ivs:
            return {self._ivs[id(v)]: 1}
        if isinstance(v, ir.CastInstr) and v.opname in ("sext", "zext", "trunc"):
            return self._affine(v.operands[0])
        if isinstance(v, ir.Instruction) and v.opname in ("add", "sub", "mul", "shl") and len(v.operands) == 2:
            a, c = (self._affine(o) for o in v.operands)
            if a is None or c is None:
                return None
            if v.opname == "add":
                return _add(a, c)
            if v.opname == "sub":
                return _add(a, _scale(c, -1))
            if v.opname == "shl":
                return _scale(a, 1 << c[1]) if set(c) == {1} else None
            if set(a) == {1}:
                return _scale(c, a[1])
            if set(c) == {1}:
                return _scale(a, c[1])
        return None

    # -- device math: NVPTX has no libm, so transcendental functions go through exp2/log2 ----
    def exp(self, x: ir.Value) -> ir.Value:
        return KernelBuilder.intrinsic(self, "llvm.exp2", self.b.fmul(x, self.f32(LOG2E)))

    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        if name == "llvm.exp":
            return self.exp(args[0])
        if name == "llvm.log":
            return self.b.fmul(KernelBuilder.intrinsic(self, "llvm.log2", args[0]), self.f32(1 / LOG2E))
        if name == "llvm.pow":
            lg = KernelBuilder.intrinsic(self, "llvm.log2", args[0])
            r = KernelBuilder.intrinsic(self, "llvm.exp2", self.b.fmul(args[1], lg))
            if args[0].type == ir.DoubleType():
                # integer Pow computes in double and truncates: exp2(y·log2 x) may land a hair below
                # an exact integer (9^3 = 728.99…), so results within 1e-9 of one snap to it
                near = KernelBuilder.intrinsic(self, "llvm.roundeven", r)
                diff = KernelBuilder.intrinsic(self, "llvm.fabs", self.b.fsub(r, near))
                tol = self.b.fmul(KernelBuilder.intrinsic(self, "llvm.maxnum", KernelBuilder.intrinsic(
                    self, "llvm.fabs", near), ir.Constant(r.type, 1.0)), ir.Constant(r.type, 1e-9))
                r = self.b.select(self.b.fcmp_ordered("<=", diff, tol), near, r)
            return r
        return super().intrinsic(name, *args)

    def libm(self, name: str, *args: ir.Value) -> ir.Value:
        if name == "tanhf":  # tanh x = 1 - 2 / (exp(2x) + 1)
            e = self.exp(self.b.fmul(args[0], self.f32(2.0)))
            return self.b.fsub(self.f32(1.0), self.b.fdiv(self.f32(2.0), self.b.fadd(e, self.f32(1.0))))
        if name in ("expf", "logf", "sqrtf"):
            return self.intrinsic({"expf": "llvm.exp", "logf": "llvm.log", "sqrtf": "llvm.sqrt"}[name], *args)
        if name == "erff":  # Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7)
            return self._erf(args[0])
        raise GpuLoweringError(f"{self.node.label!r}: {name} has no device implementation")

    def _erf(self, x: ir.Value) -> ir.Value:
        b = self.b
        ax = KernelBuilder.intrinsic(self, "llvm.fabs", x)
        t = b.fdiv(self.f32(1.0), b.fadd(self.f32(1.0), b.fmul(self.f32(0.3275911), ax)))
        poly = self.f32(1.061405429)
        for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
            poly = b.fadd(b.fmul(poly, t), self.f32(c))
        y = b.fsub(self.f32(1.0), b.fmul(b.fmul(poly, t), self.exp(b.fneg(b.fmul(ax, ax)))))
        return KernelBuilder.intrinsic(self, "llvm.copysign", y, x)


def _add(a: Affine, c: Affine) -> Affine:
    out = dict(a)
    for k, v in c.items():
        out[k] = out.get(k, 0) + v
    return out


def _scale(a: Affine, s: int) -> Affine:
    return {k: v * s for k, v in a.items()}


__all__ = ["AccessRecord", "GpuKernelBuilder", "GpuLoweringError", "KernelRecord", "LoopRecord", "NestRecord", "F32"]
