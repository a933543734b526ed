"""Lowering a graph to LLVM modules: one function per op, an entry function, a memory plan.

Every lowered node becomes its own ``noinline`` function over ``noalias`` typed array pointers,
so each op's loop nest is its own SCoP and the driver can decide per op what Polly does (the
functions are grouped into one module per Polly policy and each module gets its own ``opt``
flags).  The entry function ``polyml_main(i8** table)`` calls the op functions in topological
order with pointers read from a slot table the runtime fills: graph inputs and outputs, weights
(one 64-byte aligned blob) and intermediates (one arena, offsets from a liveness-based
first-fit plan).  View ops (Reshape, Flatten, Squeeze, ...) emit no code and share memory.

Concat in place (``in_place_concat``, on with ``--fuse``).  When every dimension before a
Concat's axis has size 1, input ``j`` is the contiguous byte range ``[off_j, off_j + |in_j|)`` of
the output: in polyhedral terms the copy statement ``out[.., off_j + i, ..] = in_j[.., i, ..]``
is an identity on memory once ``in_j`` is *stored* at ``out + off_j``.  An eligible input's
slot becomes a ``view`` of the output's slot (parent slot + byte offset), its producer writes
straight into the slice, and the Concat emits no copy for it (nothing at all when every input is
in place).  Legal because nothing else writes the slice while the input is live: the slices of
one Concat are disjoint, the parent's storage is live from its first child's producer to its
own last reader (a child's liveness extends its root's), and an input placed in one Concat only
has one home.  Chains (DenseNet's ``concat_k = Concat(concat_{k-1}, new)``) nest: the earlier
concat lives in the prefix of the later one's buffer.  Eligible: produced by a lowered (non-view)
node or by an in-place Concat; not a graph input, constant or output; in at most one Concat.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import llvmlite.ir as ir

from polyml.codegen.builder import I64, Buffer, KernelBuilder, pointer_type, sanitize, status_global
from polyml.codegen.identical import IdenticalFunctions
from polyml.codegen.memory import FlatCopy, Slot, SlotTable
from polyml.driver.toolchain import HostTarget
from polyml.errors import PolymlError
from polyml.flops import node_flops
from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Kernel, Operand, registry
from polyml.options import CodegenConfig

ALIGN = 64
ENTRY = "polyml_main"
STEP_ENTRY = "polyml_step"


@dataclass
class Step:
    """One call in the entry function: an op function and the slots it receives."""

    function: str
    node: str
    op_type: str
    policy: str
    slots: list[int]
    param_types: list[ir.Type]
    #: what the kernel chose (shape, mode), for profiles and the manifest
    detail: str = ""
    flops: float = 0.0
    #: bytes of the distinct inputs, outputs and constants it receives (each moved once at least:
    #: the roofline's traffic), and the elements of its outputs
    bytes: int = 0
    out_elements: int = 0
    #: how its loops were made: ``schedule`` (plain nests under polyml schedule trees,
    #: :mod:`polyml.schedule`), ``hand`` (a hand-scheduled lowering, Polly off) or ``plain``
    #: (plain nests left to ``opt`` under the Polly policy)
    path: str = "plain"
    reason: str = ""
    #: the schedule trees used (isl's text), for ``path == "schedule"``
    schedules: tuple[str, ...] = ()
    #: the plans of those trees where they have any (:func:`polyml.schedule.exchange.record`)
    plans: tuple[dict, ...] = ()
    #: its function is an earlier op's, whose body was identical (:mod:`polyml.codegen.identical`)
    shared: bool = False


def step_path(policy: str, schedules: list[str], stated: str | None = None) -> tuple[str, str]:
    """(path, reason) of an op function (:attr:`Step.path`); ``stated``: the kernel's own."""
    if stated == "plain":
        return "plain", "plain nest under its initial schedule (--no-schedule), opt -O3 without Polly"
    if schedules:
        return "schedule", f"{len(schedules)} nest(s) under polyml schedule trees, the rest plain"
    if policy == "off":
        return "hand", "hand-scheduled lowering, Polly off"
    return "plain", f"plain nests, opt -O3 with Polly policy '{policy}'"


@dataclass
class LoweredModel:
    modules: dict[str, ir.Module]  # "<policy>.<chunk>" -> module of op functions
    entry: ir.Module
    slots: list[Slot]
    steps: list[Step]
    weights: bytes
    arena_bytes: int
    inputs: dict[str, TensorType]
    outputs: dict[str, TensorType]
    intermediate_bytes: int = 0
    loop_nests: int = 0
    notes: list[str] = field(default_factory=list)
    #: fusion-report entries of the lowering: Concat inputs stored in place / refused
    concat_in_place: list[dict] = field(default_factory=list)
    concat_blocked: list[dict] = field(default_factory=list)


def new_module(name: str, target: HostTarget) -> ir.Module:
    m = ir.Module(name=name)
    m.triple = target.triple
    m.data_layout = target.datalayout
    return m


def set_target_attributes(fn: ir.Function, target: HostTarget) -> None:
    """Put the host CPU and features on a function, as clang does for ``-march=native``."""
    fn.attributes.add("nounwind")
    # llvmlite only knows a fixed list of attribute names; string attributes go in verbatim.
    set.add(fn.attributes, f'"target-cpu"="{target.cpu}"')
    set.add(fn.attributes, f'"target-features"="{target.features}"')


def _concat_axis(node: Node, rank: int) -> int:
    axis = int(node.attrs.get("axis", 0))
    return axis + rank if axis < 0 else axis


def plan_concat_in_place(graph: Graph, kernels: dict[str, Kernel]) -> tuple[dict[str, tuple[str, int]], list[dict], list[dict]]:
    """Which Concat inputs live inside their Concat's output: ``{input: (concat output, byte
    offset)}``, plus the report entries (placed, refused with the reason)."""
    types = graph.types
    producers = graph.producer_map()
    uses: dict[str, int] = {}
    for n in graph.nodes:
        if n.op_type == "Concat":
            for t in n.inputs:
                if t:
                    uses[t] = uses.get(t, 0) + 1
    outputs = set(graph.outputs)
    view_of: dict[str, tuple[str, int]] = {}
    placed: list[dict] = []
    blocked: list[dict] = []
    for n in graph.nodes:
        if n.op_type != "Concat" or len(n.outputs) != 1:
            continue
        out = n.outputs[0]
        shape = types[out].shape
        axis = _concat_axis(n, len(shape))
        label = n.label

        def refuse(t: str, why: str, label: str = label) -> None:
            p = producers.get(t)
            blocked.append({"producer": p.label if p is not None else t, "consumer": label,
                            "reason": f"concat input {t!r} copied, not in place: {why}"})

        if any(d != 1 for d in shape[:axis]):
            for t in n.inputs:
                if t:
                    refuse(t, f"dims {list(shape[:axis])} before axis {axis} are not all 1, so the slice of the output is strided")
            continue
        inner = types[out].nbytes // max(shape[axis], 1) if shape[axis] else 0
        offset = 0
        for t in n.inputs:
            if not t:
                continue
            here = offset
            offset += types[t].shape[axis] * inner
            p = producers.get(t)
            if t in graph.inputs or t in graph.constants:
                refuse(t, "a graph input or constant has storage of its own")
            elif t in outputs:
                refuse(t, "a graph output is written to the caller's array")
            elif uses.get(t, 0) != 1:
                refuse(t, f"read by {uses[t]} Concats (one home only)")
            elif p is None or kernels[p.op_type].alias:
                refuse(t, "a view of another tensor's storage")
            elif types[t].nbytes == 0:
                continue
            else:
                view_of[t] = (out, here)
                placed.append({"nest": label, "ops": [p.label, label], "kind": "concat-in-place",
                               "tensor": t, "byte_offset": here})
    return view_of, placed, blocked


def lower_graph(graph: Graph, target: HostTarget, chunks: int = 1, parallel: bool = False,
                in_place_concat: bool = False, tile_bytes: int = 0, packed_gemm: bool = True,
                conv: str = "auto", config: CodegenConfig | None = None,
                schedule_tiles: Mapping[str, Mapping[str, int]] | None = None,
                share_identical: bool = True) -> LoweredModel:
    """Lower ``graph``; op functions of one policy are dealt round-robin into ``chunks`` modules
    so that ``opt`` can work on them in parallel. ``parallel`` lets kernels split their outer
    loops over OpenMP threads (:meth:`KernelBuilder.parallel_loop`). ``in_place_concat`` stores
    eligible Concat inputs in slices of the output (module docstring); ``tile_bytes`` is the
    cache budget of tiled nests (:mod:`polyml.codegen.tiling`, 0: untiled).  ``config`` is what
    every kernel is configured with (default: products on polyml's packed GEMM if
    ``packed_gemm``, convolutions by ``conv``, no settings); ``schedule_tiles``: imported tiles
    of nodes' schedules, by node (``--import-schedules``); ``share_identical``: an op whose
    function would be identical to an earlier one's calls that one
    (:mod:`polyml.codegen.identical`)."""
    if config is None:
        config = CodegenConfig(packed=packed_gemm, conv=conv, threaded=parallel)
    kernels = registry(config)
    view_of, concat_placed, concat_blocked = plan_concat_in_place(graph, kernels) if in_place_concat else ({}, [], [])
    types = graph.types
    modules: dict[str, ir.Module] = {}
    table = SlotTable(graph, kernels, ALIGN)
    slots, slot_of, storage = table.slots, table.slot_of, table.storage

    def arena_slot(t: str, nbytes: int) -> int:
        if t not in slot_of:
            if t in view_of:  # a slice of the Concat output's storage (created first)
                parent, offset = view_of[t]
                table.add(t, Slot("view", t, nbytes, offset, parent=arena_slot(parent, types[parent].nbytes)))
            else:
                table.add(t, Slot("arena", t, nbytes))
        return slot_of[t]

    steps: list[Step] = []
    identical = IdenticalFunctions()
    per_policy: dict[str, int] = {}  # functions dealt so far, per Polly policy
    nests = 0

    def emit(node: Node, kernel: Kernel, in_names: list[str], in_types: list[TensorType | None], out_names: list[str], out_types: list[TensorType]) -> None:
        if schedule_tiles and node.label in schedule_tiles:  # every call for this node sees the same plan
            kernel = kernel.configured(replace(config, schedule_tiles=tuple(sorted(schedule_tiles[node.label].items()))))
            try:
                return _emit(node, kernel, in_names, in_types, out_names, out_types)
            except PolymlError as e:
                raise PolymlError(f"--import-schedules: node {node.label!r}: {e}") from None
        return _emit(node, kernel, in_names, in_types, out_names, out_types)

    def _emit(node: Node, kernel: Kernel, in_names: list[str], in_types: list[TensorType | None], out_names: list[str], out_types: list[TensorType]) -> None:
        ops = [Operand(t, tt, graph.constants.get(t)) if t and tt else None for t, tt in zip(in_names, in_types)]
        temp_types = kernel.temps(node, ops, out_types)
        derived = kernel.constants(node, ops)
        skip = {i for i, inplace in enumerate(node.attrs.get("in_place", [])) if inplace}  # Concat: already there
        skip |= kernel.replaced_inputs(node, ops)
        policy = kernel.policy(node, ops)
        # deal each policy's functions round-robin on their own count: dealing on the global step
        # index put all 16 of shufflenet's Polly-optimized Transposes into one module (9.3 s of
        # opt next to 0.07 s for the other)
        dealt = per_policy.get(policy, 0)
        per_policy[policy] = dealt + 1
        key = f"{policy}.{dealt % chunks}"
        module = modules.get(key)
        if module is None:
            module = modules[key] = new_module(f"polyml.{key}", target)
        params: list[tuple[int, TensorType, str]] = []  # (slot, type-as-seen, role)
        for i, t in enumerate(in_names):
            if not t or i in kernel.static_inputs or i in skip:
                continue
            r = storage(t)
            if r in graph.constants:
                s = table.weight_slot(r)
            elif r in slot_of:
                s = slot_of[r]
            else:
                raise PolymlError(f"internal: tensor {t!r} used by {node.label!r} before it is computed")
            params.append((s, in_types[i], f"in{i}"))
        for i, (t, tt) in enumerate(zip(out_names, out_types)):
            if not t:
                continue
            s = slot_of[t] if t in slot_of else arena_slot(t, tt.nbytes)
            params.append((s, tt, f"out{i}"))
        for i, tt in enumerate(temp_types):
            params.append((arena_slot(f"{node.label}#temp{i}@{len(steps)}", tt.nbytes), tt, f"temp{i}"))
        const_types = [TensorType(tuple(a.shape), str(a.dtype)) for a in derived]
        for i, (arr, tt) in enumerate(zip(derived, const_types)):
            params.append((table.weight_slot(f"{node.label}#const{i}@{len(steps)}", arr), tt, f"const{i}"))
        ptypes = [pointer_type(tt) for _, tt, _ in params]
        fname = f"op{len(steps)}_{sanitize(node.label)}"
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), ptypes), fname)
        set_target_attributes(fn, target)
        fn.attributes.add("noinline")
        for a, (_, _, role) in zip(fn.args, params):
            a.add_attribute("noalias")
            a.name = role
        kb = KernelBuilder(module, fn, node, [], [], [], [op.value if op else None for op in ops],
                           [op.type if op else None for op in ops], parallel=parallel)
        kb.tile_bytes = tile_bytes
        kb.config = kernel.config if kernel.config.schedule_tiles else config
        kb.step = len(steps)
        args = iter(fn.args)
        for i, t in enumerate(in_names):
            if not t or i in kernel.static_inputs or i in skip:
                kb.inputs.append(None)
            else:
                kb.inputs.append(Buffer(kb, next(args), in_types[i], t))
        for t, tt in zip(out_names, out_types):
            if t:
                kb.outputs.append(Buffer(kb, next(args), tt, t))
        for i, tt in enumerate(temp_types):
            kb.temps.append(Buffer(kb, next(args), tt, f"temp{i}"))
        for i, tt in enumerate(const_types):
            kb.constants.append(Buffer(kb, next(args), tt, f"const{i}"))
        kernel.lower(kb)
        kb.b.ret_void()
        first = identical.owner(module, fname, kb.prefix, (policy, node.op_type, *map(str, ptypes))) if share_identical else None
        if first is not None:  # nothing was added to the module: the next function takes its turn
            per_policy[policy] = dealt
        nonlocal nests
        nests += kb.nests
        for s, _, _ in params:
            table.touch(s, len(steps))
        moved = {s: tt.nbytes for s, tt, role in params if not role.startswith("temp")}
        path, reason = step_path(policy, kb.schedules, kb.path)
        steps.append(Step(first or fname, node.label, node.op_type, policy, [s for s, _, _ in params], ptypes,
                          kernel.describe(node, ops, out_types), node_flops(types, node), sum(moved.values()),
                          sum(tt.size for _, tt, role in params if role.startswith("out")), path, reason,
                          tuple(kb.schedules), tuple(kb.plans), first is not None))

    for node in graph.nodes:
        kernel = kernels[node.op_type]
        if kernel.alias:
            table.root[node.outputs[0]] = node.inputs[0]  # a graph output among these is copied below
            continue
        in_types = [types[t] if t else None for t in node.inputs]
        if node.op_type == "Concat" and any(t in view_of for t in node.inputs):
            if all(not t or t in view_of or types[t].nbytes == 0 for t in node.inputs):
                arena_slot(node.outputs[0], types[node.outputs[0]].nbytes)  # every input already in place
                continue
            node = Node(node.name, node.op_type, list(node.inputs), list(node.outputs),
                        {**node.attrs, "in_place": [bool(t) and t in view_of for t in node.inputs]},
                        source=node.source, opset=node.opset)
        emit(node, kernel, node.inputs, in_types, node.outputs, [types[t] if t else None for t in node.outputs])
    copy = FlatCopy()
    for node, src, key, flat in table.output_copies():
        emit(node, copy, [src], [flat], [key], [flat])

    arena = table.plan_arena()
    entry = _entry_module(steps, len(slots), target)
    inter = sum(s.nbytes for s in slots if s.kind == "arena")
    return LoweredModel(
        modules=modules,
        entry=entry,
        slots=slots,
        steps=steps,
        weights=table.weights,
        arena_bytes=arena,
        inputs={n: types[n] for n in graph.inputs},
        outputs={n: types[n] for n in graph.outputs},
        intermediate_bytes=inter,
        loop_nests=nests,
        concat_in_place=concat_placed,
        concat_blocked=concat_blocked,
    )


def _entry_module(steps: list[Step], nslots: int, target: HostTarget) -> ir.Module:
    m = new_module("polyml.entry", target)
    i8p = ir.IntType(8).as_pointer()
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [i8p.as_pointer()]), ENTRY)
    set_target_attributes(fn, target)
    fn.args[0].name = "table"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    declared: dict[str, ir.Function] = {}

    def call(st: Step, table: ir.Value) -> None:
        callee = declared.get(st.function)
        if callee is None:
            callee = ir.Function(m, ir.FunctionType(ir.VoidType(), st.param_types), st.function)
            declared[st.function] = callee
        args = []
        for slot, pty in zip(st.slots, st.param_types):
            p = b.load(b.gep(table, [ir.Constant(I64, slot)], inbounds=True))
            args.append(b.bitcast(p, pty))
        b.call(callee, args)

    for st in steps:
        call(st, fn.args[0])
    b.ret_void()
    # polyml_step(table, i): step i alone, for per-op profiles (polyml.runtime.model.profile)
    step_fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [i8p.as_pointer(), I64]), STEP_ENTRY)
    set_target_attributes(step_fn, target)
    b = ir.IRBuilder(step_fn.append_basic_block("entry"))
    done = step_fn.append_basic_block("done")
    switch = b.switch(step_fn.args[1], done)
    for i, st in enumerate(steps):
        case = step_fn.append_basic_block(f"step{i}")
        switch.add_case(ir.Constant(I64, i), case)
        b.position_at_end(case)
        call(st, step_fn.args[0])
        b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    for name, value in (("polyml_num_slots", nslots), ("polyml_num_steps", len(steps))):
        g = ir.GlobalVariable(m, ir.IntType(32), name)
        g.initializer = ir.Constant(ir.IntType(32), value)
        g.global_constant = True
    status_global(m).initializer = ir.Constant(ir.IntType(32), 0)
    return m
