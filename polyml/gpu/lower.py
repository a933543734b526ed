"""Graph → NVPTX modules (one per op) and the launch plan the CUDA runtime follows.

Memory is laid out as on the CPU (:mod:`polyml.codegen.memory`): slots for graph inputs and
outputs, weights in one blob (uploaded once), intermediates in one device arena at first-fit
offsets from their live ranges; view ops emit nothing and share their input's slot.  Each op is
lowered twice with :class:`~polyml.gpu.builder.GpuKernelBuilder` — once to record its nests'
domains and accesses, once with the grid mappings :func:`~polyml.gpu.mapping.map_nest` chose —
and every top-level nest becomes one kernel launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import llvmlite.ir as ir

from polyml.codegen.builder import STATUS, Buffer, pointer_type, sanitize
from polyml.codegen.memory import FlatCopy, Slot, SlotTable
from polyml.errors import PolymlError
from polyml.gpu import TRIPLE
from polyml.gpu.builder import GpuKernelBuilder, GpuLoweringError, NestRecord
from polyml.gpu.mapping import NestMapping, check_bijective, map_nest
from polyml.gpu.shared import check_cover, map_nest_shared
from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Kernel, Operand, registry

ALIGN = 256  # cudaMalloc alignment; keeps every slot aligned for vector loads


@dataclass
class Launch:
    """One kernel launch: function ``name`` of the op's module over ``slots``."""

    name: str
    module: str  # op function name: its PTX is ``ptx/<module>.ptx``
    node: str
    op_type: str
    slots: list[int]
    mapping: NestMapping

    def to_json(self) -> dict:
        return {"name": self.name, "ptx": f"ptx/{self.module}.ptx", "ir": f"kernels/{self.module}.ll", "op": self.node, "op_type": self.op_type,
                "grid": list(self.mapping.grid), "block": list(self.mapping.block), "slots": self.slots,
                "mapping": self.mapping.describe()}


@dataclass
class CudaLowered:
    modules: dict[str, ir.Module]  # op function name -> NVPTX module
    launches: list[Launch]
    slots: list[Slot]
    weights: bytes
    arena_bytes: int
    inputs: dict[str, TensorType]
    outputs: dict[str, TensorType]
    records: dict[str, list[NestRecord]] = field(default_factory=dict)


def new_module(name: str) -> ir.Module:
    m = ir.Module(name=name)
    m.triple = TRIPLE
    return m


def lower_op(node: Node, kernel: Kernel, ops: list[Operand | None], out_types: list[TensorType],
             temp_types: list[TensorType], fname: str, params: list[tuple[TensorType, str, str]],
             verify: bool = True, shared_bytes: int = 0) -> tuple[ir.Module, list[tuple[str, NestMapping]], list[NestRecord]]:
    """Lower one node to an NVPTX module; returns it, (kernel, mapping) per nest, and the records.

    ``params``: (type, role, tensor name) of each buffer argument, inputs then outputs then temps.
    ``shared_bytes`` > 0: promote reused input tiles into that much shared memory per block
    (:mod:`polyml.gpu.shared`).
    """

    def run(module: ir.Module, mappings: dict[int, NestMapping] | None) -> GpuKernelBuilder:
        scratch = ir.Module(name=f"{fname}.prologue")
        fn = ir.Function(scratch, ir.FunctionType(ir.VoidType(), [pointer_type(t) for t, _, _ in params]), fname)
        for a, (_, role, _) in zip(fn.args, params):
            a.name = role
        kb = GpuKernelBuilder(module, fn, node, [], [], [], [op.value if op else None for op in ops],
                              [op.type if op else None for op in ops], mappings=mappings)
        args = iter(zip(fn.args, params))
        for i, t in enumerate(node.inputs):
            if not t or i in kernel.static_inputs:
                kb.inputs.append(None)
            else:
                a, (tt, _, name) = next(args)
                kb.inputs.append(Buffer(kb, a, tt, name))
        for t in node.outputs:
            if t:
                a, (tt, _, name) = next(args)
                kb.outputs.append(Buffer(kb, a, tt, name))
        for _ in temp_types:
            a, (tt, _, name) = next(args)
            kb.temps.append(Buffer(kb, a, tt, name))
        kernel.lower(kb)
        return kb

    sizes = [t.size for t, _, _ in params]
    recording = run(new_module(f"{fname}.record"), None)
    if shared_bytes:
        shapes, dtypes, names = [t.shape for t, _, _ in params], [t.dtype for t, _, _ in params], [n for _, _, n in params]
        mappings = {r.index: map_nest_shared(r, sizes, shapes, dtypes, shared_bytes, names) for r in recording.records}
    else:
        mappings = {r.index: map_nest(r, sizes) for r in recording.records}
    if verify:
        for m in mappings.values():
            check_bijective(m)
            if m.shared is not None:
                check_cover(m.shared, m)
    module = new_module(f"polyml.cuda.{fname}")
    mapped = run(module, mappings)
    if len(mapped.kernels) != len(recording.kernels):
        raise GpuLoweringError(f"{node.label!r}: the two lowerings of the op emitted different nests")
    return module, [(k.name, mappings[k.nest]) for k in mapped.kernels], recording.records


def lower_graph_cuda(graph: Graph, verify: bool = True, shared_bytes: int = 0) -> CudaLowered:
    """Lower ``graph`` for the device (see the module docstring); ``shared_bytes`` > 0 turns on
    shared-memory promotion with that budget per block."""
    kernels = registry()
    types = graph.types
    table = SlotTable(graph, kernels, ALIGN)
    slots, slot_of, storage = table.slots, table.slot_of, table.storage

    modules: dict[str, ir.Module] = {}
    launches: list[Launch] = []
    records: dict[str, list[NestRecord]] = {}
    step = 0

    def emit(node: Node, kernel: Kernel, in_names: list[str], in_types: list[TensorType | None],
             out_names: list[str], out_types: list[TensorType]) -> None:
        nonlocal step
        ops = [Operand(t, tt, graph.constants.get(t)) if t and tt else None for t, tt in zip(in_names, in_types)]
        temp_types = kernel.temps(node, ops, out_types)
        params: list[tuple[TensorType, str, str]] = []
        pslots: list[int] = []
        for i, t in enumerate(in_names):
            if not t or i in kernel.static_inputs:
                continue
            r = storage(t)
            if r in graph.constants:
                s = table.weight_slot(r)
            elif r in slot_of:
                s = slot_of[r]
            else:
                raise PolymlError(f"internal: tensor {t!r} used by {node.label!r} before it is computed")
            params.append((in_types[i], f"in{i}", t))
            pslots.append(s)
        for i, (t, tt) in enumerate(zip(out_names, out_types)):
            if not t:
                continue
            if t not in slot_of:
                table.add(t, Slot("arena", t, tt.nbytes))
            params.append((tt, f"out{i}", t))
            pslots.append(slot_of[t])
        for i, tt in enumerate(temp_types):
            name = f"{node.label}#temp{i}@{step}"
            pslots.append(table.add(name, Slot("arena", name, tt.nbytes)))
            params.append((tt, f"temp{i}", f"temp{i}"))
        fname = f"op{step}_{sanitize(node.label)}"
        try:
            module, ks, recs = lower_op(node, kernel, ops, out_types, temp_types, fname, params, verify, shared_bytes)
        except GpuLoweringError:
            raise
        except AssertionError as e:
            raise GpuLoweringError(f"{node.label!r}: grid mapping check failed: {e}") from None
        own_status_word(module)
        modules[fname] = module
        records[fname] = recs
        for kname, m in ks:
            if 0 in m.grid:  # a nest over an empty domain (a zero-size tensor): nothing to launch
                continue
            launches.append(Launch(kname, fname, node.label, node.op_type, pslots, m))
        for s in pslots:
            table.touch(s, step)
        step += 1

    for node in graph.nodes:
        kernel = kernels[node.op_type]
        if kernel.alias:
            table.root[node.outputs[0]] = node.inputs[0]
            continue
        emit(node, kernel, node.inputs, [types[t] if t else None for t in node.inputs], node.outputs,
             [types[t] if t else None for t in node.outputs])
    copy = FlatCopy()
    for node, src, key, flat in table.output_copies():
        emit(node, copy, [src], [flat], [key], [flat])
    arena = table.plan_arena()
    return CudaLowered(modules, launches, slots, table.weights, arena,
                       {n: types[n] for n in graph.inputs}, {n: types[n] for n in graph.outputs}, records)


def own_status_word(module: ir.Module) -> None:
    """Define the module's ``polyml_status`` where its index checks store to it: each CUDA module
    is loaded on its own (``cuModuleLoadData`` resolves no ``extern``), so each owns its status
    word, which :class:`polyml.gpu.runtime.DeviceBackend` reads after a run; weak, so the
    emulator's host library links the modules' copies as one (its runtime's)."""
    status = module.globals.get(STATUS)
    if status is not None:
        status.initializer = ir.Constant(ir.IntType(32), 0)
        status.linkage = "weak"


__all__ = ["CudaLowered", "Launch", "Slot", "lower_graph_cuda", "lower_op"]
