"""The vocabulary kernels use to write affine loop nests in LLVM IR.

A kernel receives a :class:`KernelBuilder` for one graph node.  Tensors are :class:`Buffer`
objects: typed pointers to fixed-size multi-dimensional arrays (``[C x [H x [W x float]]]*``)
indexed with one ``getelementptr`` per access, which is what Polly's delinearization reads to
recover the array dimensions.  Loops are canonical (``i64`` induction variable from a constant
lower bound, unit step, ``icmp slt`` against a constant) so every nest is a static control part.
Basic blocks are named ``<op>.<loop>.<part>`` so Polly's statements trace back to the node.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import vmath
from polyml.graph import Node, TensorType
from polyml.options import CodegenConfig

I64 = ir.IntType(64)
I32 = ir.IntType(32)
F32 = ir.FloatType()

Index = int | ir.Value

#: fast-math flags for reductions whose order may change (vectorized sums); all ops are fp32
#: and checked at 1e-3 relative, so reassociation is allowed where it is declared.
REASSOC = ("reassoc", "nsz", "contract")

LLVM_TYPES: dict[str, ir.Type] = {
    "float32": F32,
    "int64": I64,
    "int32": I32,
    "bool": ir.IntType(8),
    "int8": ir.IntType(8),
    "uint8": ir.IntType(8),
}


#: dtypes whose LLVM integers are read as signed (bool is 0/1 in a byte, uint8 unsigned)
SIGNED = frozenset({"int64", "int32", "int8"})
INTEGER = frozenset({"int64", "int32", "int8", "uint8"})


def llvm_type(dtype: str) -> ir.Type:
    return LLVM_TYPES[dtype]


def is_float(dtype: str) -> bool:
    return isinstance(LLVM_TYPES[dtype], ir.FloatType | ir.DoubleType)


def constant(dtype: str, value: float | int | bool) -> ir.Constant:
    """An LLVM constant of ``dtype`` (rounded to float32 for float32, an integer otherwise)."""
    t = llvm_type(dtype)
    if isinstance(t, ir.FloatType):
        return ir.Constant(t, float(np.float32(value)))
    return ir.Constant(t, int(value))


def like(ty: ir.Type, value: float | int) -> ir.Constant:
    """``value`` as a constant of ``ty``: a scalar, or splat across a vector type."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [value] * ty.count)
    return ir.Constant(ty, value)


def splat(b: ir.IRBuilder, v: ir.Value, ty: ir.Type) -> ir.Value:
    """A scalar broadcast to every lane of the vector type ``ty`` (itself if ``ty`` is scalar)."""
    if not isinstance(ty, ir.VectorType):
        return v
    one = b.insert_element(ir.Constant(ir.VectorType(v.type, ty.count), None), v, ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(one, ir.Constant(one.type, None), ir.Constant(ir.VectorType(ir.IntType(32), ty.count), [0] * ty.count))


def skip_polly(fn: ir.Function) -> None:
    """Mark ``fn`` ``"polly.skip.fn"``: a kernel written as explicit vectors has no SCoP to offer,
    and Polly 19's alias grouping segfaulted on the masked accesses of the depthwise and max-pool
    kernels (``ScopBuilder::splitAliasGroupsByDomain``, on ``--emit jscop``) and of the GEMM's
    column kernel.  The SCoP report
    leaves such functions out of its rejections (:func:`polyml.scop.detect.polly_skipped`)."""
    set.add(fn.attributes, '"polly.skip.fn"')


def vector_fma(module: ir.Module, lanes: int) -> ir.Function:
    """``llvm.fma.v<lanes>f32``, declared in ``module`` once."""
    name = f"llvm.fma.v{lanes}f32"
    vec = ir.VectorType(F32, lanes)
    return module.globals.get(name) or ir.Function(module, ir.FunctionType(vec, [vec, vec, vec]), name)


def masked_intrinsic(b: ir.IRBuilder, name: str, vec: ir.VectorType, lanes_on: list[bool]) -> tuple[ir.Function, ir.Constant]:
    """The ``llvm.masked.{load,store}`` intrinsic for ``vec`` and the constant lane mask."""
    module = b.module
    mask_t = ir.VectorType(ir.IntType(1), vec.count)
    ptr_t = vec.as_pointer()
    fname = f"llvm.masked.{name}.v{vec.count}f32.p0v{vec.count}f32"
    if name == "load":
        fty = ir.FunctionType(vec, [ptr_t, ir.IntType(32), mask_t, vec])
    else:
        fty = ir.FunctionType(ir.VoidType(), [vec, ptr_t, ir.IntType(32), mask_t])
    fn = module.globals.get(fname) or ir.Function(module, fty, fname)
    return fn, ir.Constant(mask_t, [int(on) for on in lanes_on])


def load_lanes(b: ir.IRBuilder, ptr: ir.Value, count: int, fill: float | None = 0.0) -> ir.Value:
    """The vector at ``ptr`` (a float-vector pointer), only its first ``count`` lanes read (a
    masked load unless all are; the rest ``fill``, None: undefined)."""
    vec = ptr.type.pointee
    if count >= vec.count:
        return b.load(ptr, align=4)
    load, mask = masked_intrinsic(b, "load", vec, [u < count for u in range(vec.count)])
    rest = ir.Constant(vec, None if fill is None else [fill] * vec.count)
    return b.call(load, [ptr, ir.Constant(ir.IntType(32), 4), mask, rest])


def store_lanes(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value, count: int) -> None:
    """``value``'s first ``count`` lanes stored at ``ptr`` (a masked store unless all are)."""
    vec = value.type
    if count >= vec.count:
        b.store(value, ptr, align=4)
        return
    store, mask = masked_intrinsic(b, "store", vec, [u < count for u in range(vec.count)])
    b.call(store, [value, ptr, ir.Constant(ir.IntType(32), 4), mask])


def pointer_type(t: TensorType) -> ir.PointerType:
    """``elem*`` for rank ≤ 1, else a pointer to the array of the trailing dimensions."""
    inner: ir.Type = llvm_type(t.dtype)
    for d in reversed(t.shape[1:]):
        inner = ir.ArrayType(inner, d)
    return inner.as_pointer()


def sanitize(name: str) -> str:
    """A compact identifier for block and function names (LLVM quotes the rest)."""
    s = re.sub(r"[^A-Za-z0-9_.]", "_", name)
    return s[:48] or "t"


class Buffer:
    """One tensor as seen inside an op function: typed base pointer plus static shape."""

    def __init__(self, kb: KernelBuilder, ptr: ir.Value, ttype: TensorType, name: str):
        self.kb = kb
        self.ptr = ptr
        self.type = ttype
        self.name = name
        kb._buffers.append(self)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def rank(self) -> int:
        return len(self.type.shape)

    def addr(self, idx: Sequence[Index]) -> ir.Value:
        if len(idx) != self.rank:
            raise ValueError(f"{self.name}: {len(idx)} indices for rank {self.rank}")
        ix = [self.kb.i64(i) for i in idx] if idx else [self.kb.i64(0)]
        return self.kb.b.gep(self.ptr, ix, inbounds=True)

    def load(self, idx: Sequence[Index]) -> ir.Value:
        return self.kb.b.load(self.addr(idx))

    def store(self, idx: Sequence[Index], value: ir.Value) -> None:
        self.kb.b.store(value, self.addr(idx))

    def broadcast_index(self, out_idx: Sequence[Index]) -> list[Index]:
        """numpy broadcasting: align trailing dims, index 0 along this buffer's size-1 dims."""
        tail = list(out_idx)[len(out_idx) - self.rank :] if self.rank else []
        return [0 if d == 1 else i for d, i in zip(self.shape, tail)]


def coalesce_dims(out: tuple[int, ...], shapes: Sequence[tuple[int, ...]]) -> list[list[int]]:
    """Groups of adjacent dims of ``out`` that every operand (numpy-broadcast to ``out``)
    reads alike: each operand either spans all of a group's dims or none of them (size 1
    along each).  A nest over the groups visits the same elements in the same order, with
    fewer loops and a longer unit-stride innermost loop.  Dims of extent 1 join any group."""
    aligned = [(1,) * (len(out) - len(sh)) + tuple(sh) for sh in shapes]

    def kinds(d: int) -> list[str | None]:
        if out[d] == 1:
            return [None] * len(aligned)
        return ["full" if sh[d] == out[d] else "one" for sh in aligned]

    groups: list[list[int]] = []
    current: list[str | None] = []
    for d in range(len(out)):
        kd = kinds(d)
        if groups and all(a is None or b is None or a == b for a, b in zip(current, kd)):
            groups[-1].append(d)
            current = [a if a is not None else b for a, b in zip(current, kd)]
        else:
            groups.append([d])
            current = kd
    return groups


def coalesced_views(out: Buffer, ins: Sequence[Buffer]) -> tuple[Buffer, list[Buffer]]:
    """``out`` and ``ins`` as views over :func:`coalesce_dims`'s groups (the buffers
    themselves when no dims merge).  An elementwise nest over a ``(1, C, H, W) · (1, C, 1,
    1)`` product runs ``C × H·W`` instead of ``C × H × W``: with a 28-trip innermost loop
    LLVM had vectorized the loop outside it, with gathers (5x slower)."""
    groups = coalesce_dims(out.shape, [b.shape for b in ins])
    if len(groups) == out.rank:
        return out, list(ins)
    kb = out.kb

    def view(buf: Buffer) -> Buffer:
        full = (1,) * (out.rank - buf.rank) + buf.shape
        shape = tuple(math.prod(full[d] for d in g) for g in groups)
        tt = TensorType(shape, buf.type.dtype)
        return Buffer(kb, kb.b.bitcast(buf.ptr, pointer_type(tt)), tt, buf.name)

    return view(out), [view(b) for b in ins]


class KernelBuilder:
    """Everything a kernel needs to lower one node into the body of its op function."""

    def __init__(
        self,
        module: ir.Module,
        fn: ir.Function,
        node: Node,
        inputs: list[Buffer | None],
        outputs: list[Buffer],
        temps: list[Buffer],
        values: list[np.ndarray | None],
        in_types: list[TensorType | None],
        parallel: bool = False,
    ):
        self.module = module
        self.fn = fn
        self.node = node
        self.inputs = inputs
        self.outputs = outputs
        self.temps = temps
        #: compile-time arrays the kernel derived (:meth:`polyml.kernels.Kernel.constants`)
        self.constants: list[Buffer] = []
        #: compile-time values of constant inputs (None where the input is computed)
        self.values = values
        self.in_types = in_types
        self.prefix = sanitize(node.label)
        self._depth = 0
        #: whether parallel_loop may distribute work over OpenMP threads
        self.parallel = parallel
        #: the build's code generation choices (the lowering sets the build's)
        self.config = CodegenConfig()
        self._buffers: list[Buffer] = []
        self._par_count = 0
        #: top-level loop nests emitted so far (reported as the manifest's ``loop_nests``)
        self.nests = 0
        #: the schedule trees (isl text) of the nests emitted through :mod:`polyml.schedule`
        self.schedules: list[str] = []
        #: the plans those trees were made from, as files record them (:func:`polyml.schedule.exchange.record`)
        self.plans: list[dict] = []
        #: the function's path where the kernel states it (``plain``: a plain nest emitted
        #: unscheduled under ``--no-schedule``); None: from the policy and :attr:`schedules`
        self.path: str | None = None
        #: cache budget (bytes) of a conv row tile's source slice, 0: untiled (codegen.tiling)
        self.tile_bytes = 0
        #: this op's position in the entry function (reported by :meth:`checked_index`)
        self.step = 0
        entry = fn.append_basic_block(f"{self.prefix}.entry")
        self.b = ir.IRBuilder(entry)

    # -- attributes and constants -----------------------------------------------------------
    @property
    def attrs(self) -> dict[str, Any]:
        return self.node.attrs

    def attr(self, name: str, default: Any = None) -> Any:
        return self.node.attrs.get(name, default)

    def entry_alloca(self, ty: ir.Type, name: str) -> ir.Value:
        """A stack slot in the current function's entry block (outside every loop; mem2reg
        promotes scalars).  In the entry block itself it is allocated where the builder is:
        llvmlite builders keep an index into their block, so a second builder inserting at its
        start would shift ``self.b``'s position."""
        block = self.fn.entry_basic_block
        if self.b.block is block:
            return self.b.alloca(ty, name=name)
        entry = ir.IRBuilder(block)
        entry.position_at_start(block)
        return entry.alloca(ty, name=name)

    def i64(self, v: Index) -> ir.Value:
        return v if isinstance(v, ir.Value) else ir.Constant(I64, int(v))

    def f32(self, v: float) -> ir.Value:
        return ir.Constant(F32, float(np.float32(v)))

    # -- loops ------------------------------------------------------------------------------
    @contextmanager
    def loop(self, lo: int, hi: int, name: str = "i") -> Iterator[ir.Value]:
        """``for (iv = lo; iv < hi; ++iv)`` with constant bounds; yields the induction variable."""
        level = self._depth
        if level == 0:
            self.nests += 1
        with counted_loop(self.b, self.i64(lo), self.i64(hi), f"{self.prefix}.L{level}.{name}", name) as iv:
            self._depth += 1
            try:
                yield iv
            finally:
                self._depth -= 1

    @contextmanager
    def parallel_loop(self, lo: int, hi: int, name: str = "p") -> Iterator[ir.Value]:
        """An outermost loop whose iterations are independent, split over OpenMP threads.

        The loop's body is outlined into ``<fn>.par<k>(buffers..., lo, hi)`` (``noalias``
        pointers again, so LLVM vectorizes it as it would the op function) and called from a
        worker run by GNU OpenMP's ``GOMP_parallel``: thread ``t`` of ``T`` gets the block
        ``[lo + t⌈n/T⌉, min(hi, lo + (t+1)⌈n/T⌉))``.  Only buffers may cross into the body (no
        other SSA values of the op function).  Without ``parallel`` it is a plain loop.
        """
        if not self.parallel or hi - lo < 2 or self._depth:
            with self.loop(lo, hi, name) as iv:
                yield iv
            return
        bufs = list(self._buffers)
        ptypes = [buf.ptr.type for buf in bufs]
        tag = f"{self.fn.name}.par{self._par_count}"
        self._par_count += 1
        body = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [*ptypes, I64, I64]), tag)
        for attr in self.fn.attributes:
            set.add(body.attributes, attr)
        for a in body.args[: len(bufs)]:
            a.add_attribute("noalias")
        saved = (self.fn, self.b, [buf.ptr for buf in bufs])
        self.fn = body
        self.b = ir.IRBuilder(body.append_basic_block(f"{self.prefix}.{name}.par.entry"))
        for buf, a in zip(bufs, body.args):
            buf.ptr = a
        try:
            with self.loop(body.args[-2], body.args[-1], name) as iv:
                yield iv
            self.b.ret_void()
        finally:
            self.fn, self.b = saved[0], saved[1]
            for buf, ptr in zip(bufs, saved[2]):
                buf.ptr = ptr
        omp_parallel(self.b, f"{tag}.worker", [buf.ptr for buf in bufs],
                     lambda b, ptrs, start, end, _thread: b.call(body, [*ptrs, start, end]),
                     ir.Constant(I64, lo), ir.Constant(I64, hi))

    @contextmanager
    def loops(self, extents: Sequence[int | tuple[int, int]], names: Sequence[str] | None = None,
              parallel: int = 0) -> Iterator[list[ir.Value]]:
        """A perfect nest over ``extents`` (ints mean ``range(n)``, pairs ``range(lo, hi)``).

        ``parallel=d``: the caller asserts that the first ``d`` dims carry no dependence; the
        outermost of them with more than one iteration becomes a :meth:`parallel_loop`.
        """
        names = list(names) if names else [f"i{d}" for d in range(len(extents))]
        with _nest(self, list(extents), names, parallel) as ivs:
            yield ivs

    # -- arithmetic helpers -----------------------------------------------------------------
    def intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        fnty = ir.FunctionType(args[0].type, [a.type for a in args])
        fn = self.module.declare_intrinsic(name, [args[0].type], fnty)
        return self.b.call(fn, list(args))

    def libm(self, name: str, *args: ir.Value) -> ir.Value:
        """Call a libm function of floats (e.g. ``tanhf``), declared readnone so Polly accepts it."""
        fn = self.module.globals.get(name)
        if fn is None:
            fty = ir.FunctionType(F32, [F32] * len(args))
            fn = ir.Function(self.module, fty, name)
            fn.attributes.add("nounwind")
            fn.attributes.add("readnone")
        return self.b.call(fn, list(args))

    def exp(self, x: ir.Value) -> ir.Value:
        """``eˣ`` as vectorizable arithmetic (:mod:`polyml.codegen.vmath`; libm's is a scalar call)."""
        return vmath.exp(self.b, x)

    def tanh(self, x: ir.Value) -> ir.Value:
        return vmath.tanh(self.b, x)

    def logistic(self, x: ir.Value) -> ir.Value:
        return vmath.logistic(self.b, x)

    def erf(self, x: ir.Value) -> ir.Value:
        return vmath.erf(self.b, x)

    def sqrt(self, x: ir.Value) -> ir.Value:
        return self.intrinsic("llvm.sqrt", x)

    def maxf(self, a: ir.Value, c: ir.Value) -> ir.Value:
        """``a > c ? a : c`` (a select, which vectorizes; equals numpy's maximum on finite data)."""
        return self.b.select(self.b.fcmp_ordered(">", a, c), a, c)

    def minf(self, a: ir.Value, c: ir.Value) -> ir.Value:
        return self.b.select(self.b.fcmp_ordered("<", a, c), a, c)

    def fsum(self, a: ir.Value, c: ir.Value, reassoc: bool = False) -> ir.Value:
        return self.b.fadd(a, c, flags=REASSOC if reassoc else ())

    def fmul(self, a: ir.Value, c: ir.Value, reassoc: bool = False) -> ir.Value:
        return self.b.fmul(a, c, flags=REASSOC if reassoc else ())

    def checked_index(self, idx: ir.Value, extent: int, negative: bool = True) -> ir.Value:
        """A data-dependent index (any integer type) as an i64 in ``[0, extent)``.

        ``negative`` indices count from the end (ONNX's Gather/Scatter convention).  An index out
        of range would address memory outside the buffer, so it is replaced by 0 and the step
        number (+1) is written to the module-wide ``polyml_status``, which the runtime checks
        after every run and reports as an error naming this node.
        """
        b = self.b
        i = b.sext(idx, I64) if idx.type != I64 else idx
        n = ir.Constant(I64, extent)
        if negative:
            i = b.select(b.icmp_signed("<", i, ir.Constant(I64, 0)), b.add(i, n), i)
        bad = b.icmp_unsigned(">=", i, n)  # negative values are huge unsigned
        with b.if_then(bad, likely=False):
            b.store_atomic(ir.Constant(I32, self.step + 1), status_global(self.module), "monotonic", 4)
        return b.select(bad, ir.Constant(I64, 0), i)

    def fill(self, buf: Buffer, value: float) -> None:
        """One nest writing ``value`` to every element of ``buf``."""
        with self.loops(buf.shape, names=[f"z{d}" for d in range(buf.rank)]) as ix:
            buf.store(ix, self.f32(value))


STATUS = "polyml_status"


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The external function ``name`` of ``module`` (declared ``nounwind`` on first use)."""
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, args), name)
        fn.attributes.add("nounwind")
    return fn


def omp_parallel(b: ir.IRBuilder, name: str, values: Sequence[ir.Value],
                 run: Callable[[ir.IRBuilder, list[ir.Value], ir.Value, ir.Value, ir.Value], object],
                 lo: ir.Value, hi: ir.Value, step: int = 1, threads: int = 0,
                 attrs: Sequence[str] = ("nounwind",), internal: bool = False) -> ir.Function:
    """The iterations ``range(lo, hi, step)`` split over an OpenMP team, at ``b``.

    ``values`` (and bounds that are not constants) cross in a frame to the worker ``name``,
    which GNU OpenMP's ``GOMP_parallel`` runs on every thread: thread ``t`` of ``T`` gets
    the iterations ``[t⌈n/T⌉, min(n, (t+1)⌈n/T⌉))`` of the ``n``, at most ``threads`` threads
    taking part (0: all; the rest get none), and calls ``run(builder, values, start, end,
    t)`` there with ``start``/``end`` the first and the end value of its block.  Returns the
    worker."""
    module = b.module
    i8p = ir.IntType(8).as_pointer()
    crossing = [*values, *(v for v in (lo, hi) if not isinstance(v, ir.Constant))]
    frame_t = ir.LiteralStructType([v.type for v in crossing])
    worker = ir.Function(module, ir.FunctionType(ir.VoidType(), [i8p]), name)
    for a in attrs:
        set.add(worker.attributes, a)
    if internal:
        worker.linkage = "internal"
    frame = b.alloca(frame_t, name=f"{name}.frame")
    for i, v in enumerate(crossing):
        b.store(v, b.gep(frame, [ir.Constant(I32, 0), ir.Constant(I32, i)]))
    b.call(declare(module, "GOMP_parallel", ir.VoidType(), [worker.type, i8p, I32, I32]),
           [worker, b.bitcast(frame, i8p), ir.Constant(I32, 0), ir.Constant(I32, 0)])

    wb = ir.IRBuilder(worker.append_basic_block("entry"))
    run_bb, done = worker.append_basic_block("run"), worker.append_basic_block("done")
    fp = wb.bitcast(worker.args[0], frame_t.as_pointer())
    fields = [wb.load(wb.gep(fp, [ir.Constant(I32, 0), ir.Constant(I32, i)])) for i in range(len(crossing))]
    rest = iter(fields[len(values):])
    w_lo, w_hi = (v if isinstance(v, ir.Constant) else next(rest) for v in (lo, hi))
    tid = wb.sext(wb.call(declare(module, "omp_get_thread_num", I32, []), []), I64)
    nt = wb.sext(wb.call(declare(module, "omp_get_num_threads", I32, []), []), I64)
    if threads:
        nt = wb.select(wb.icmp_signed(">", nt, ir.Constant(I64, threads)), ir.Constant(I64, threads), nt)
    one, step_c = ir.Constant(I64, 1), ir.Constant(I64, step)
    trips = wb.sub(w_hi, w_lo) if step == 1 else wb.sdiv(wb.add(wb.sub(w_hi, w_lo), ir.Constant(I64, step - 1)), step_c)
    chunk = wb.sdiv(wb.add(trips, wb.sub(nt, one)), nt)
    first = wb.mul(tid, chunk)
    last = wb.add(first, chunk)
    last = wb.select(wb.icmp_signed("<", last, trips), last, trips)
    wb.cbranch(wb.icmp_signed("<", first, last), run_bb, done)
    wb.position_at_end(run_bb)
    start, end = ((wb.add(w_lo, x) if step == 1 else wb.add(w_lo, wb.mul(x, step_c))) for x in (first, last))
    run(wb, fields[:len(values)], start, end, tid)
    wb.branch(done)
    wb.position_at_end(done)
    wb.ret_void()
    return worker


def status_global(module: ir.Module) -> ir.GlobalVariable:
    """``@polyml_status``: 0, or 1 + the step that met an out-of-range index (defined in the
    entry module, declared in the op modules)."""
    g = module.globals.get(STATUS)
    if g is None:
        g = ir.GlobalVariable(module, I32, STATUS)
        g.align = 4
    return g


#: marks loop metadata nodes that :func:`module_text` makes distinct and self-referential (an
#: LLVM loop ID); llvmlite builds neither
LOOP_ID_MARK = "polyml.loop.id"


def loop_hint(b: ir.IRBuilder, back_edge: ir.Instruction, *hints: str | tuple[str, int]) -> None:
    """Attach ``!llvm.loop`` hints (``llvm.loop.unroll.disable``, ``("llvm.loop.interleave.count",
    4)``, ...) to a loop's back edge."""
    m = b.module
    count = getattr(m, "_polyml_loop_ids", 0)
    m._polyml_loop_ids = count + 1
    nodes = [m.add_metadata([ir.MetaDataString(m, h[0]), ir.Constant(ir.IntType(32), h[1])]) if isinstance(h, tuple)
             else m.add_metadata([ir.MetaDataString(m, h)]) for h in hints]
    back_edge.set_metadata("llvm.loop", m.add_metadata([ir.MetaDataString(m, LOOP_ID_MARK),
                                                        ir.MetaDataString(m, str(count)), *nodes]))


def module_text(m: ir.Module) -> str:
    """The module's IR with the :func:`loop_hint` nodes turned into loop IDs
    (``!7 = distinct !{!7, !6}``)."""
    return re.sub(r'^(!\d+) = !\{ ?!"' + re.escape(LOOP_ID_MARK) + r'", !"\d+", ?',
                  lambda mo: f"{mo.group(1)} = distinct !{{{mo.group(1)}, ", str(m), flags=re.M)


@contextmanager
def counted_loop(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value, tag: str, name: str, step: int = 1,
                 branch_if: Callable[[ir.Value, ir.Block, ir.Block], object] | None = None,
                 hints: Sequence[str | tuple[str, int]] = ()) -> Iterator[ir.Value]:
    """``for (iv = lo; iv < hi; iv += step)`` on ``b``: blocks ``<tag>.header/.body/.exit``, the
    i64 induction phi ``name`` tested with ``slt`` in the header (the canonical form Polly and
    SCEV read); yields ``iv``.  ``branch_if`` replaces ``b.cbranch`` for that test (the GPU
    builder's own loops bypass its branch tracing)."""
    pre = b.block
    header = b.append_basic_block(f"{tag}.header")
    body = b.append_basic_block(f"{tag}.body")
    exit_ = b.append_basic_block(f"{tag}.exit")
    b.branch(header)
    b.position_at_end(header)
    iv = b.phi(I64, name)
    iv.add_incoming(lo, pre)
    (branch_if or b.cbranch)(b.icmp_signed("<", iv, hi), body, exit_)
    b.position_at_end(body)
    yield iv
    # nuw only where the counter starts at a known non-negative value: a padded copy's loop
    # from -1 would wrap as unsigned on its first step, and LLVM then drops the exit test
    unsigned = isinstance(lo, ir.Constant) and isinstance(lo.constant, int) and lo.constant >= 0
    iv.add_incoming(b.add(iv, ir.Constant(I64, step), flags=["nuw", "nsw"] if unsigned else ["nsw"]), b.block)
    back = b.branch(header)
    if hints:
        loop_hint(b, back, *hints)
    b.position_at_end(exit_)


@contextmanager
def _nest(kb: KernelBuilder, extents: list, names: list[str], parallel: int = 0) -> Iterator[list[ir.Value]]:
    if not extents:
        yield []
        return
    first, rest = extents[0], extents[1:]
    lo, hi = (0, first) if isinstance(first, int) else first
    if hi - lo == 1:
        # A one-trip loop folds into an i1 phi whose trip count SCEV cannot compute, which
        # makes Polly reject the whole nest: emit the constant index instead.
        with _nest(kb, rest, names[1:], parallel - 1) as ivs:
            yield [kb.i64(lo), *ivs]
        return
    loop = kb.parallel_loop if parallel > 0 else kb.loop
    with loop(lo, hi, names[0]) as iv:
        with _nest(kb, rest, names[1:]) as ivs:
            yield [iv, *ivs]
