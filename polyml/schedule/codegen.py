"""A schedule tree to LLVM IR: isl's AST generator emits the loops, this module the rest.

The tree of a :class:`~polyml.schedule.nest.Program` goes through ``isl_ast_build`` (islpy)
with its parameters fixed to the build's sizes where they are known; every statement instance
in the AST gets the index expressions of its accesses from the build at that point
(``at_each_domain``, as PPCG does), every ``tensorize`` mark the bounds of the register tile
below it and its operands' addresses at the tile's origin (``after_each_mark``).  Walking the
AST then emits: ``for`` → a counted loop (``parallel`` mark above it: the iterations split over
OpenMP threads in an outlined worker), ``if`` → a branch, a user node → the statement's body on
its element pointers, a ``tensorize`` mark → its intrinsic (:mod:`polyml.schedule.intrinsics`),
``unroll`` → the loops below fully unrolled, ``vectorize`` → the loops below vectorized by LLVM
as they stand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import islpy as isl
import llvmlite.ir as ir

from polyml.codegen.builder import F32, I64, counted_loop, omp_parallel
from polyml.errors import PolymlError
from polyml.schedule import tree as T
from polyml.schedule.nest import Program

#: the parameter naming the OpenMP thread inside a ``parallel`` loop (0 outside): buffers
#: private to a thread are indexed by it (:mod:`polyml.schedule.gemm`'s packing buffers)
THREAD = "T"


class ScheduleCodegenError(PolymlError):
    """A schedule tree the code generator cannot lower (an unknown intrinsic, a bad mark)."""


@dataclass
class TileBox:
    """What a ``tensorize`` mark's intrinsic gets: per statement dimension the tile's first
    and last index, and each access's element address expression at the first corner."""

    intrinsic: str
    statement: str
    init: str
    lo: list[isl.AstExpr]
    hi: list[isl.AstExpr]
    first: list[list[isl.AstExpr]]
    #: with ``init``: whether the tile holds the first step of its reduction (the statement's
    #: last dimension), where the intrinsic stores instead of accumulating
    starts: isl.AstExpr | None = None
    #: the finishing statement folded into the intrinsic (``finish=``), and whether the tile
    #: holds its reduction's last step, after which the intrinsic does that statement's work
    finish: str = ""
    ends: isl.AstExpr | None = None


@dataclass
class _Payloads:
    items: list = field(default_factory=list)
    error: BaseException | None = None

    def add(self, value: object) -> isl.Id:
        self.items.append(value)
        return isl.Id(f"polyml.{len(self.items) - 1}")

    def of(self, node: isl.AstNode) -> object:
        return self.items[int(node.get_annotation().get_name().split(".")[1])]


def _stmt_map(build: isl.AstBuild, name: str) -> isl.Map:
    """{ [schedule] -> S[x] } of statement ``name`` at this point of the AST."""
    sched = build.get_schedule()
    maps: list[isl.Map] = []
    sched.foreach_map(lambda m: maps.append(m) if m.get_tuple_name(isl.dim_type.in_) == name else None)
    return maps[0].reverse()


def _index_exprs(build: isl.AstBuild, it: isl.PwMultiAff, access: isl.PwMultiAff) -> list[isl.AstExpr]:
    """The ``access`` (a function of the statement's index) at the schedule point ``it``: one
    expression per index."""
    pma = access.pullback_pw_multi_aff(it)
    return [build.expr_from_pw_aff(pma.get_pw_aff(d)) for d in range(pma.dim(isl.dim_type.out))]


def ast_of(program: Program, params: Mapping[str, int] | None = None) -> tuple[isl.AstNode, _Payloads]:
    """The AST of ``program`` (parameters in ``params`` fixed) and what its annotations refer to."""
    nest = program.nest
    ctx = nest.context_set()
    for name, value in (params or {}).items():
        ctx = ctx.fix_val(isl.dim_type.param, ctx.find_dim_by_name(isl.dim_type.param, name), isl.Val(value))
    payloads = _Payloads()
    functions: dict[str, list[isl.PwMultiAff]] = {}  # each statement's accesses, converted once

    def accesses(name: str) -> list[isl.PwMultiAff]:
        if name not in functions:
            functions[name] = [isl.PwMultiAff.from_map(a.map()) for a in nest.statement(name).accesses]
        return functions[name]

    inside: list[bool] = []  # the marks being built, outermost first: whether each is a tensorize mark

    def before_mark(mark: isl.Id, build: isl.AstBuild) -> int:
        inside.append(T.parse_tensorize(mark.get_name()) is not None)
        return 0

    def at_domain(node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        if any(inside):  # the intrinsic replaces this subtree: its statements' indices are never read
            return node
        try:
            name = node.user_get_expr().get_op_arg(0).get_id().get_name()
            it = isl.PwMultiAff.from_map(_stmt_map(build, name))
            exprs = [_index_exprs(build, it, a) for a in accesses(name)]
            return node.set_annotation(payloads.add((name, exprs)))
        except BaseException as e:  # an exception must not unwind through isl
            payloads.error = payloads.error or e
            return node

    def after_mark(node: isl.AstNode, build: isl.AstBuild) -> isl.AstNode:
        inside.pop()
        try:
            parsed = T.parse_tensorize(node.mark_get_id().get_name())
            if parsed is None:
                return node
            intrinsic, name, init, finish = parsed
            stmt = nest.statement(name)
            instances = _stmt_map(build, name)
            corner = isl.PwMultiAff.from_map(instances.lexmin())
            first = [_index_exprs(build, corner, a) for a in accesses(name)]
            dom = stmt.domain_set().intersect_params(ctx)
            box = instances
            if stmt.view:  # bounds in the intrinsic's iteration space
                box, dom = instances.apply_range(isl.Map(stmt.view)), dom.apply(isl.Map(stmt.view))
            n = box.dim(isl.dim_type.out)
            lo = [build.expr_from_pw_aff(box.dim_min(d)) for d in range(n)]
            hi = [build.expr_from_pw_aff(box.dim_max(d)) for d in range(n)]
            starts = ends = None
            if init:  # the tile holds its lines' first reduction step (the last dimension)
                line_start = dom.subtract(dom.apply(_shift_last(dom)))
                starts = build.expr_from_set(box.intersect_range(line_start).domain())
            if finish:  # ... or their last
                line_end = dom.subtract(dom.apply(_shift_last(dom).reverse()))
                ends = build.expr_from_set(box.intersect_range(line_end).domain())
            return node.set_annotation(payloads.add(TileBox(intrinsic, name, init, lo, hi, first, starts, finish, ends)))
        except BaseException as e:
            payloads.error = payloads.error or e
            return node

    build = isl.AstBuild.from_context(ctx)
    build, h1 = build.set_at_each_domain(at_domain)
    build, h2 = build.set_after_each_mark(after_mark)
    build, h3 = build.set_before_each_mark(before_mark)
    ast = build.node_from_schedule(program.tree.intersect_domain(program.tree.get_domain().intersect_params(ctx)))
    del h1, h2, h3
    if payloads.error is not None:
        raise payloads.error
    return ast, payloads


def _shift_last(dom: isl.Set) -> isl.Map:
    """``{ S[.., x] -> S[.., x + 1] }`` on ``dom``'s space."""
    shift = isl.MultiAff.identity(isl.Space.map_from_set(dom.get_space()))
    last = dom.dim(isl.dim_type.set) - 1
    return isl.Map.from_multi_aff(shift.set_aff(last, shift.get_aff(last).add_constant_val(isl.Val(1))))


def c_text(program: Program, params: Mapping[str, int] | None = None) -> str:
    """The loops isl generates for ``program``, as C (the golden text of the tests and dumps)."""
    ast, _ = ast_of(program, params)
    return ast.to_C_str()


class Emitter:
    """Emits a program's AST on a builder; ``arrays`` maps array names to base pointers,
    ``params`` parameter names to ``i64`` values or ints."""

    def __init__(self, module: ir.Module, fn: ir.Function, b: ir.IRBuilder, program: Program,
                 arrays: Mapping[str, ir.Value], params: Mapping[str, int | ir.Value], intrinsics: Mapping[str, object],
                 attrs: tuple[str, ...] = ()):
        self.module, self.fn, self.b = module, fn, b
        self.program = program
        self.arrays = dict(arrays)
        self.params = {k: (v if isinstance(v, ir.Value) else ir.Constant(I64, int(v))) for k, v in params.items()}
        self.params.setdefault(THREAD, ir.Constant(I64, 0))  # outside a parallel loop: thread 0
        self.intrinsics = intrinsics
        self.attrs = attrs
        self.env: dict[str, ir.Value] = {}
        self.payloads: _Payloads | None = None
        self._workers = 0
        self._entry_allocas: dict[str, ir.Value] = {}

    # -- expressions ----------------------------------------------------------------------------
    def expr(self, e: isl.AstExpr) -> ir.Value:
        b = self.b
        t = e.get_type()
        if t == isl.ast_expr_type.int:
            return ir.Constant(I64, int(e.get_val().to_python()))
        if t == isl.ast_expr_type.id:
            name = e.get_id().get_name()
            if name in self.env:
                return self.env[name]
            return self.params[name]
        op = e.get_op_type()
        args = [self.expr(e.get_op_arg(i)) for i in range(e.get_op_n_arg())]
        OP = isl.ast_expr_op_type
        if op == OP.add:
            return b.add(*args)
        if op == OP.sub:
            return b.sub(*args)
        if op == OP.mul:
            return b.mul(*args)
        if op == OP.minus:
            return b.neg(args[0])
        if op in (OP.div, OP.pdiv_q):
            return b.sdiv(*args)
        if op == OP.fdiv_q:  # floor division by a positive constant
            x, y = args
            neg = b.icmp_signed("<", x, ir.Constant(I64, 0))
            adj = b.select(neg, b.sub(x, b.sub(y, ir.Constant(I64, 1))), x)
            return b.sdiv(adj, y)
        if op in (OP.pdiv_r, OP.zdiv_r):
            return b.srem(*args)
        if op in (OP.min, OP.max):
            v = args[0]
            for a in args[1:]:
                v = b.select(b.icmp_signed("<" if op == OP.min else ">", v, a), v, a)
            return v
        if op in (OP.cond, OP.select):
            return b.select(args[0], args[1], args[2])
        cmp = {OP.eq: "==", OP.le: "<=", OP.lt: "<", OP.ge: ">=", OP.gt: ">"}
        if op in cmp:
            return b.icmp_signed(cmp[op], *args)
        if op in (OP.and_, OP.and_then):
            return b.and_(*args)
        if op in (OP.or_, OP.or_else):
            return b.or_(*args)
        raise ScheduleCodegenError(f"schedule codegen: unsupported AST expression {e.to_C_str()}")

    def condition(self, e: isl.AstExpr) -> ir.Value:
        """A boolean AST expression as ``i1`` (isl writes a constant condition as an integer)."""
        v = self.expr(e)
        return v if v.type == ir.IntType(1) else self.b.icmp_signed("!=", v, ir.Constant(v.type, 0))

    def extent(self, extent: int | str) -> ir.Value:
        return self.params[extent] if isinstance(extent, str) else ir.Constant(I64, extent)

    def address(self, array: str, index: list[isl.AstExpr]) -> ir.Value:
        """The element pointer of ``array[index]`` (row-major over the nest's shape); for a
        padded array, outside its shape a slot holding the padding value."""
        arr = self.program.nest.array(array)
        b = self.b
        values = [self.expr(e) for e in index]
        flat = None
        for d, v in enumerate(values):
            flat = v if flat is None else b.add(b.mul(flat, self.extent(arr.shape[d]), flags=["nsw"]), v, flags=["nsw"])
        flat = flat if flat is not None else ir.Constant(I64, 0)
        if arr.padding is None:
            return b.gep(self.arrays[array], [flat], inbounds=True)
        inside = ir.Constant(ir.IntType(1), 1)
        for d, v in enumerate(values):  # 0 <= v < extent, as one unsigned comparison
            inside = b.and_(inside, b.icmp_unsigned("<", v, self.extent(arr.shape[d])))
        return b.select(inside, b.gep(self.arrays[array], [flat]), self._padding_slot(arr.padding))

    def _padding_slot(self, value: float) -> ir.Value:
        key = f"{self.fn.name}.pad{value!r}"
        if key not in self._entry_allocas:
            slot = self.stack_tile(f"pad{len(self._entry_allocas)}", 1)
            entry = self.b
            if self.b.block is not self.fn.entry_basic_block:  # stored once, where the slot is made
                entry = ir.IRBuilder(self.fn.entry_basic_block)
                entry.position_after(slot)
            entry.store(ir.Constant(F32, value), slot)
            self._entry_allocas[key] = slot
        return self._entry_allocas[key]

    def stack_tile(self, name: str, floats: int) -> ir.Value:
        """A ``floats``-element stack array in the current function's entry block."""
        key = f"{self.fn.name}.{name}"
        if key not in self._entry_allocas:
            block = self.fn.entry_basic_block
            if self.b.block is block:  # a second builder at the block's start would shift self.b
                entry = self.b
            else:
                entry = ir.IRBuilder(block)
                entry.position_at_start(block)
            arr = entry.alloca(ir.ArrayType(F32, floats), name=name)
            self._entry_allocas[key] = entry.bitcast(arr, F32.as_pointer())
        return self._entry_allocas[key]

    # -- nodes ------------------------------------------------------------------------------------
    def emit(self, params_fixed: Mapping[str, int] | None = None,
             built: tuple[isl.AstNode, _Payloads] | None = None) -> None:
        """The program's loops at the builder; ``built``: its AST from :func:`ast_of` with
        these parameters (ASTs are immutable: one serves every function of the same shape)."""
        ast, self.payloads = built or ast_of(self.program, params_fixed)
        self.node(ast)

    def node(self, n: isl.AstNode, parallel: bool | int = False, unroll: bool = False, vector: bool = False) -> None:
        t = n.get_type()
        if t == isl.ast_node_type.block:
            children = n.block_get_children()
            for i in range(children.n_ast_node()):
                self.node(children.get_at(i), unroll=unroll, vector=vector)
        elif t == isl.ast_node_type.for_:
            self._for(n, parallel, unroll, vector)
        elif t == isl.ast_node_type.if_:
            self._if(n)
        elif t == isl.ast_node_type.user:
            name, exprs = self.payloads.of(n)
            stmt = self.program.nest.statement(name)
            ptrs = [self.address(a.array, ix) for a, ix in zip(stmt.accesses, exprs)]
            stmt.body(self.b, ptrs)
        elif t == isl.ast_node_type.mark:
            text = n.mark_get_id().get_name()
            child = n.mark_get_node()
            if text == "parallel" or text.startswith("parallel "):
                threads = int(text.split("threads=")[1]) if "threads=" in text else 0
                self.node(child, parallel=threads or True)
            elif text == "unroll":
                self.node(child, unroll=True)
            elif text == "vectorize":
                self.node(child, vector=True)
            elif T.parse_tensorize(text) is not None:
                box: TileBox = self.payloads.of(n)
                intrinsic = self.intrinsics.get(box.intrinsic)
                if intrinsic is None:
                    raise ScheduleCodegenError(f"schedule codegen: no intrinsic {box.intrinsic!r} "
                                               f"(known: {', '.join(sorted(self.intrinsics)) or 'none'})")
                intrinsic.lower(self, box)
            else:
                self.node(child)
        else:
            raise ScheduleCodegenError(f"schedule codegen: unexpected AST node type {t}")

    def _if(self, n: isl.AstNode) -> None:
        cond = self.condition(n.if_get_cond())
        if n.if_has_else_node():
            with self.b.if_else(cond) as (then, otherwise):
                with then:
                    self.node(n.if_get_then_node())
                with otherwise:
                    self.node(n.if_get_else_node())
        else:
            with self.b.if_then(cond):
                self.node(n.if_get_then_node())

    def _bounds(self, n: isl.AstNode) -> tuple[str, ir.Value, ir.Value, int]:
        """(iterator, first value, exclusive end, step) of a for node (``it <= e`` or ``it < e``)."""
        it = n.for_get_iterator().get_id().get_name()
        lo = self.expr(n.for_get_init())
        cond = n.for_get_cond()
        op = cond.get_op_type()
        if cond.get_type() != isl.ast_expr_type.op or op not in (isl.ast_expr_op_type.le, isl.ast_expr_op_type.lt) \
                or cond.get_op_arg(0).get_type() != isl.ast_expr_type.id:
            raise ScheduleCodegenError(f"schedule codegen: loop condition {cond.to_C_str()} is not 'it <= e' / 'it < e'")
        hi = self.expr(cond.get_op_arg(1))
        if op == isl.ast_expr_op_type.le:
            hi = self.b.add(hi, ir.Constant(I64, 1))
        step = int(n.for_get_inc().get_val().to_python())
        return it, lo, hi, step

    def _for(self, n: isl.AstNode, parallel: bool | int, unroll: bool = False, vector: bool = False) -> None:
        it, lo, hi, step = self._bounds(n)
        if parallel:
            self._parallel_for(n, it, lo, hi, step, 0 if parallel is True else int(parallel))
            return
        hints: tuple[str | tuple[str, int], ...] = ()
        if unroll:
            hints = ("llvm.loop.unroll.full",)
        elif vector:  # vectorized itself: not unrolled first (LLVM would then vectorize the loop around it)
            hints = (("llvm.loop.vectorize.enable", 1), "llvm.loop.unroll.disable")
        with counted_loop(self.b, lo, hi, f"{self.fn.name}.{it}", it, step, hints=hints) as iv:
            self.env[it] = iv
            self.node(n.for_get_body(), unroll=unroll, vector=vector)
        del self.env[it]

    def _parallel_for(self, n: isl.AstNode, it: str, lo: ir.Value, hi: ir.Value, step: int, threads: int = 0) -> None:
        """The loop's iterations split into equal blocks over OpenMP threads
        (:func:`polyml.codegen.builder.omp_parallel`), at most ``threads`` of them (0: all the
        team), so that buffers private to a thread (indexed by the parameter :data:`THREAD`,
        its number) exist for each.

        Everything live (array pointers, parameters, outer iterators) crosses to the worker,
        which calls the loop's body function on its block: the body takes the arrays as
        ``noalias`` arguments, as the op function does, so LLVM vectorizes the copies in it as
        it would there (a frame's pointers carry no aliasing facts)."""
        live = {**{f"a.{k}": v for k, v in self.arrays.items()},
                **{f"p.{k}": v for k, v in self.params.items() if not isinstance(v, ir.Constant) and k != THREAD},
                **{f"e.{k}": v for k, v in self.env.items()}}
        keys = list(live)
        tag = f"{self.fn.name}.spar{self._workers}"  # unique in the module (other emitters, parallel_loop)
        while f"{tag}.body" in self.module.globals:
            self._workers += 1
            tag = f"{self.fn.name}.spar{self._workers}"
        self._workers += 1
        body = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [*(live[k].type for k in keys), I64, I64, I64]),
                           f"{tag}.body")
        body.linkage = "internal"
        for a in self.attrs:
            set.add(body.attributes, a)
        for k, a in zip(keys, body.args):
            if k.startswith("a."):
                a.add_attribute("noalias")
        omp_parallel(self.b, f"{tag}.worker", [live[k] for k in keys],
                     lambda b, values, start, end, thread: b.call(body, [*values, start, end, thread]),
                     lo, hi, step, threads, self.attrs, internal=True)

        # the body: the loop over [start, end) with everything live rebound to its arguments
        saved = (self.fn, self.b, dict(self.arrays), dict(self.params), dict(self.env))
        self.fn = body
        self.b = bb = ir.IRBuilder(body.append_basic_block("entry"))
        for k, v in zip(keys, body.args):
            kind, name = k.split(".", 1)
            {"a": self.arrays, "p": self.params, "e": self.env}[kind][name] = v
        b_lo, b_hi, self.params[THREAD] = body.args[-3:]
        with counted_loop(bb, b_lo, b_hi, f"{tag}.{it}", it, step) as iv:
            self.env[it] = iv
            self.node(n.for_get_body())
        self.b.ret_void()
        self.fn, self.b, self.arrays, self.params, self.env = saved
