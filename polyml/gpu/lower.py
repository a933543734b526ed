"""Graph → NVPTX modules (one per op) and the launch plan the CUDA runtime follows.

Memory is laid out as on the CPU (:mod:`polyml.codegen.lower`): slots for graph inputs and
outputs, weights in one blob (uploaded once), intermediates in one device arena at first-fit
offsets from their live ranges; view ops emit nothing and share their input's slot.  Each op is
lowered twice with :class:`~polyml.gpu.builder.GpuKernelBuilder` — once to record its nests'
domains and accesses, once with the grid mappings :func:`~polyml.gpu.mapping.map_nest` chose —
and every top-level nest becomes one kernel launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import Buffer, KernelBuilder, pointer_type, sanitize
from polyml.errors import PolymlError
from polyml.gpu import TRIPLE
from polyml.gpu.builder import GpuKernelBuilder, GpuLoweringError, NestRecord
from polyml.gpu.mapping import NestMapping, check_bijective, map_nest
from polyml.gpu.shared import check_cover, map_nest_shared
from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Kernel, Operand, registry

ALIGN = 256  # cudaMalloc alignment; keeps every slot aligned for vector loads


@dataclass
class Slot:
    kind: str  # "input" | "output" | "weight" | "arena"
    name: str
    nbytes: int
    offset: int = 0

    def to_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "nbytes": self.nbytes, "offset": self.offset}


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
        return {"name": self.name, "ptx": f"ptx/{self.module}.ptx", "op": self.node, "op_type": self.op_type,
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


class _Copy(Kernel):
    """A flat element copy (a graph output that is a view, an input or a constant)."""

    def lower(self, k: KernelBuilder) -> None:
        src, dst = k.inputs[0], k.outputs[0]
        with k.loops([dst.type.size], names=["e"]) as (e,):
            dst.store([e], src.load([e]))


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


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
    slots: list[Slot] = []
    slot_of: dict[str, int] = {}
    root: dict[str, str] = {}

    def storage(t: str) -> str:
        while t in root:
            t = root[t]
        return t

    for name in graph.inputs:
        slot_of[name] = len(slots)
        slots.append(Slot("input", name, types[name].nbytes))
    producers = graph.producer_map()
    direct: set[str] = set()
    for name in graph.outputs:
        p = producers.get(name)
        if p is not None and not kernels[p.op_type].alias and name not in slot_of:
            direct.add(name)
            slot_of[name] = len(slots)
            slots.append(Slot("output", name, types[name].nbytes))
    blob: list[bytes] = []
    blob_size = 0

    def weight_slot(t: str) -> int:
        nonlocal blob_size
        if t not in slot_of:
            data = np.ascontiguousarray(graph.constants[t], dtype=types[t].dtype).tobytes()
            slot_of[t] = len(slots)
            slots.append(Slot("weight", t, len(data), blob_size))
            blob.append(data + b"\0" * (_align(len(data)) - len(data)))
            blob_size += _align(len(data))
        return slot_of[t]

    modules: dict[str, ir.Module] = {}
    launches: list[Launch] = []
    records: dict[str, list[NestRecord]] = {}
    live: dict[int, list[int]] = {}
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
                s = weight_slot(r)
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
                slot_of[t] = len(slots)
                slots.append(Slot("arena", t, tt.nbytes))
            params.append((tt, f"out{i}", t))
            pslots.append(slot_of[t])
        for i, tt in enumerate(temp_types):
            slots.append(Slot("arena", f"{node.label}#temp{i}@{step}", tt.nbytes))
            params.append((tt, f"temp{i}", f"temp{i}"))
            pslots.append(len(slots) - 1)
        fname = f"op{step}_{sanitize(node.label)}"
        try:
            module, ks, recs = lower_op(node, kernel, ops, out_types, temp_types, fname, params, verify, shared_bytes)
        except GpuLoweringError:
            raise
        except AssertionError as e:
            raise GpuLoweringError(f"{node.label!r}: grid mapping check failed: {e}") from None
        modules[fname] = module
        records[fname] = recs
        for kname, m in ks:
            launches.append(Launch(kname, fname, node.label, node.op_type, pslots, m))
        for s in pslots:
            if slots[s].kind == "arena":
                r = live.setdefault(s, [step, step])
                r[1] = step
        step += 1

    for node in graph.nodes:
        kernel = kernels[node.op_type]
        if kernel.alias:
            root[node.outputs[0]] = node.inputs[0]
            continue
        emit(node, kernel, node.inputs, [types[t] if t else None for t in node.inputs], node.outputs,
             [types[t] for t in node.outputs])
    for name in graph.outputs:
        if name in direct:
            continue
        p = producers.get(name)
        src = storage(p.inputs[0] if p is not None and kernels[p.op_type].alias else name)
        flat = TensorType((types[name].size,), types[name].dtype)
        key = f"{name}#output"
        slot_of[key] = len(slots)
        slots.append(Slot("output", name, types[name].nbytes))
        emit(Node(f"copy_{name}", "polyml.Copy", [src], [key]), _Copy(), [src], [flat], [key], [flat])
    arena = _plan_arena(slots, live)
    return CudaLowered(modules, launches, slots, b"".join(blob), arena,
                       {n: types[n] for n in graph.inputs}, {n: types[n] for n in graph.outputs}, records)


def _plan_arena(slots: list[Slot], live: dict[int, list[int]]) -> int:
    """First-fit offsets for arena slots whose live step ranges overlap; returns the arena size."""
    placed: list[tuple[int, int, int, int]] = []
    top = 0
    for s in sorted(live, key=lambda s: (live[s][0], -slots[s].nbytes)):
        first, last = live[s]
        size = _align(max(slots[s].nbytes, 1))
        offset = 0
        for lo, hi in sorted((o, o + n) for o, n, a, b in placed if not (b < first or a > last)):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        slots[s].offset = offset
        placed.append((offset, size, first, last))
        top = max(top, offset + size)
    return top


__all__ = ["CudaLowered", "Launch", "Slot", "lower_graph_cuda", "lower_op"]
