"""Lowering a graph to LLVM modules: one function per op, an entry function, a memory plan.

Every lowered node becomes its own ``noinline`` function over ``noalias`` typed array pointers,
so each op's loop nest is its own SCoP and the driver can decide per op what Polly does (the
functions are grouped into one module per Polly policy and each module gets its own ``opt``
flags).  The entry function ``polyml_main(i8** table)`` calls the op functions in topological
order with pointers read from a slot table the runtime fills: graph inputs and outputs, weights
(one 64-byte aligned blob) and intermediates (one arena, offsets from a liveness-based
first-fit plan).  View ops (Reshape, Flatten, Squeeze, ...) emit no code and share memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import I64, Buffer, KernelBuilder, pointer_type, sanitize
from polyml.driver.toolchain import HostTarget
from polyml.errors import PolymlError
from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Kernel, Operand, registry

ALIGN = 64
ENTRY = "polyml_main"


@dataclass
class Slot:
    """One entry of the runtime's pointer table."""

    kind: str  # "input" | "output" | "weight" | "arena"
    name: str
    nbytes: int
    offset: int = 0  # into the weight blob or the arena

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "nbytes": self.nbytes, "offset": self.offset}


@dataclass
class Step:
    """One call in the entry function: an op function and the slots it receives."""

    function: str
    node: str
    op_type: str
    policy: str
    slots: list[int]
    param_types: list[ir.Type]


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


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


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


class _Copy(Kernel):
    """A flat element copy, used where a graph output is an input, a constant or a view."""

    polly = "off"

    def lower(self, k: KernelBuilder) -> None:
        src, dst = k.inputs[0], k.outputs[0]
        assert src is not None
        with k.loops([dst.type.size], names=["e"]) as (e,):
            dst.store([e], src.load([e]))


def lower_graph(graph: Graph, target: HostTarget, chunks: int = 1, parallel: bool = False) -> LoweredModel:
    """Lower ``graph``; op functions of one policy are dealt round-robin into ``chunks`` modules
    so that ``opt`` can work on them in parallel. ``parallel`` lets kernels split their outer
    loops over OpenMP threads (:meth:`KernelBuilder.parallel_loop`)."""
    kernels = registry()
    types = graph.types
    modules: dict[str, ir.Module] = {}
    slots: list[Slot] = []
    slot_of: dict[str, int] = {}  # storage root tensor name -> slot
    root: dict[str, str] = {}  # tensor -> storage root tensor

    def storage(t: str) -> str:
        while t in root:
            t = root[t]
        return t

    for name in graph.inputs:
        slot_of[name] = len(slots)
        slots.append(Slot("input", name, types[name].nbytes))
    outputs_direct: set[str] = set()
    producers = graph.producer_map()
    for name in graph.outputs:
        p = producers.get(name)
        if p is not None and not kernels[p.op_type].alias and name not in slot_of:
            outputs_direct.add(name)
            slot_of[name] = len(slots)
            slots.append(Slot("output", name, types[name].nbytes))

    weight_chunks: list[bytes] = []
    weight_size = 0

    def weight_slot(t: str) -> int:
        nonlocal weight_size
        if t not in slot_of:
            data = np.ascontiguousarray(graph.constants[t], dtype=types[t].dtype).tobytes()
            slot_of[t] = len(slots)
            slots.append(Slot("weight", t, len(data), weight_size))
            padded = _align(len(data))
            weight_chunks.append(data + b"\0" * (padded - len(data)))
            weight_size += padded
        return slot_of[t]

    def arena_slot(t: str, nbytes: int) -> int:
        if t not in slot_of:
            slot_of[t] = len(slots)
            slots.append(Slot("arena", t, nbytes))
        return slot_of[t]

    steps: list[Step] = []
    nests = 0
    live_ranges: dict[int, list[int]] = {}  # arena slot -> [first step, last step]

    def touch(slot: int) -> None:
        if slots[slot].kind == "arena":
            r = live_ranges.setdefault(slot, [len(steps), len(steps)])
            r[1] = len(steps)

    def emit(node: Node, kernel: Kernel, in_names: list[str], in_types: list[TensorType | None], out_names: list[str], out_types: list[TensorType]) -> None:
        ops = [Operand(t, tt, graph.constants.get(t)) if t and tt else None for t, tt in zip(in_names, in_types)]
        temp_types = kernel.temps(node, ops, out_types)
        key = f"{kernel.polly}.{len(steps) % chunks}"
        module = modules.get(key)
        if module is None:
            module = modules[key] = new_module(f"polyml.{key}", target)
        params: list[tuple[int, TensorType, str]] = []  # (slot, type-as-seen, role)
        for i, t in enumerate(in_names):
            if not t or i in kernel.static_inputs:
                continue
            r = storage(t)
            if r in graph.constants:
                s = weight_slot(r)
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
        args = iter(fn.args)
        for i, t in enumerate(in_names):
            if not t or i in kernel.static_inputs:
                kb.inputs.append(None)
            else:
                kb.inputs.append(Buffer(kb, next(args), in_types[i], t))
        for t, tt in zip(out_names, out_types):
            if t:
                kb.outputs.append(Buffer(kb, next(args), tt, t))
        for i, tt in enumerate(temp_types):
            kb.temps.append(Buffer(kb, next(args), tt, f"temp{i}"))
        kernel.lower(kb)
        kb.b.ret_void()
        nonlocal nests
        nests += kb.nests
        for s, _, _ in params:
            touch(s)
        steps.append(Step(fname, node.label, node.op_type, kernel.polly, [s for s, _, _ in params], ptypes))

    copy = _Copy()
    for node in graph.nodes:
        kernel = kernels[node.op_type]
        if kernel.alias:
            root[node.outputs[0]] = node.inputs[0]  # a graph output among these is copied below
            continue
        in_types = [types[t] if t else None for t in node.inputs]
        emit(node, kernel, node.inputs, in_types, node.outputs, [types[t] for t in node.outputs])
    for name in graph.outputs:
        if name in outputs_direct:
            continue
        src = storage(node_input_of_alias(name, producers, kernels))
        flat = TensorType((types[name].size,), types[name].dtype)
        # the output slot gets its own key: ``src`` may be this very tensor (a constant or a
        # graph input that is also a graph output) and must keep resolving to its storage
        key = f"{name}#output"
        slot_of[key] = len(slots)
        slots.append(Slot("output", name, types[name].nbytes))
        emit(Node(f"copy_{name}", "polyml.Copy", [src], [key]), copy, [src], [flat], [key], [flat])

    arena = _plan_arena(slots, live_ranges)
    entry = _entry_module(steps, len(slots), target)
    inter = sum(s.nbytes for s in slots if s.kind == "arena")
    return LoweredModel(
        modules=modules,
        entry=entry,
        slots=slots,
        steps=steps,
        weights=b"".join(weight_chunks),
        arena_bytes=arena,
        inputs={n: types[n] for n in graph.inputs},
        outputs={n: types[n] for n in graph.outputs},
        intermediate_bytes=inter,
        loop_nests=nests,
    )


def node_input_of_alias(name: str, producers: dict[str, Node], kernels: dict[str, Kernel]) -> str:
    """The tensor whose memory a graph output should be copied from."""
    p = producers.get(name)
    if p is not None and kernels[p.op_type].alias:
        return p.inputs[0]
    return name


def _plan_arena(slots: list[Slot], live: dict[int, list[int]]) -> int:
    """First-fit offsets for arena slots whose step ranges overlap; returns the arena size."""
    placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
    top = 0
    for s in sorted(live, key=lambda s: (live[s][0], -slots[s].nbytes)):
        first, last = live[s]
        size = _align(max(slots[s].nbytes, 1))
        busy = sorted((o, o + n) for o, n, lo, hi in placed if not (hi < first or lo > last))
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        slots[s].offset = offset
        placed.append((offset, size, first, last))
        top = max(top, offset + size)
    return top


def _entry_module(steps: list[Step], nslots: int, target: HostTarget) -> ir.Module:
    m = new_module("polyml.entry", target)
    i8p = ir.IntType(8).as_pointer()
    fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [i8p.as_pointer()]), ENTRY)
    set_target_attributes(fn, target)
    fn.args[0].name = "table"
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    declared: dict[str, ir.Function] = {}
    for st in steps:
        callee = declared.get(st.function)
        if callee is None:
            callee = ir.Function(m, ir.FunctionType(ir.VoidType(), st.param_types), st.function)
            declared[st.function] = callee
        args = []
        for slot, pty in zip(st.slots, st.param_types):
            p = b.load(b.gep(fn.args[0], [ir.Constant(I64, slot)], inbounds=True))
            args.append(b.bitcast(p, pty))
        b.call(callee, args)
    b.ret_void()
    g = ir.GlobalVariable(m, ir.IntType(32), "polyml_num_slots")
    g.initializer = ir.Constant(ir.IntType(32), nslots)
    g.global_constant = True
    return m
