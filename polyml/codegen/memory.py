"""The runtime's pointer table while a graph is lowered, shared by the host and GPU lowerings.

Every buffer an op function receives is a *slot*: a graph input or output (bound per run), a
constant (packed into one weight blob), an arena tensor (an intermediate or a scratch buffer,
placed by :func:`plan_arena` from its live range), or a view (a slice of another slot: Concat
inputs stored in place).  Alias ops (Reshape, Flatten, ...) emit no code; their output resolves
to the storage of their input (:meth:`SlotTable.storage`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Kernel


@dataclass
class Slot:
    """One entry of the runtime's pointer table."""

    kind: str  # "input" | "output" | "weight" | "arena" | "view"
    name: str
    nbytes: int
    offset: int = 0  # into the weight blob or the arena; a view: bytes into its parent
    parent: int = -1  # a view: the slot it lies in (always an earlier slot)

    def to_json(self) -> dict:
        d = {"kind": self.kind, "name": self.name, "nbytes": self.nbytes, "offset": self.offset}
        if self.kind == "view":
            d["parent"] = self.parent
        return d


def align_up(n: int, align: int) -> int:
    return (n + align - 1) // align * align


class SlotTable:
    """Slots of one lowering: graph inputs first, then the graph outputs their producers write
    directly, then constants and arena tensors as the ops ask for them.  ``align``: alignment
    of weights in the blob and of arena offsets (64 on the host, 256 for ``cudaMalloc``)."""

    def __init__(self, graph: Graph, kernels: dict[str, Kernel], align: int):
        self.graph = graph
        self.kernels = kernels
        self.align = align
        self.slots: list[Slot] = []
        self.slot_of: dict[str, int] = {}  # storage root tensor name -> slot
        self.root: dict[str, str] = {}  # alias output -> the tensor whose storage it shares
        self.live: dict[int, list[int]] = {}  # arena slot -> [first step, last step]
        self._weights: list[bytes] = []
        self._weight_size = 0
        self.producers = graph.producer_map()
        for name in graph.inputs:
            self.add(name, Slot("input", name, graph.types[name].nbytes))
        self.outputs_direct: set[str] = set()  # graph outputs written by their producer
        for name in graph.outputs:
            p = self.producers.get(name)
            if p is not None and not kernels[p.op_type].alias and name not in self.slot_of:
                self.outputs_direct.add(name)
                self.add(name, Slot("output", name, graph.types[name].nbytes))

    def add(self, key: str, slot: Slot) -> int:
        """Append ``slot`` and map ``key`` to it."""
        self.slot_of[key] = len(self.slots)
        self.slots.append(slot)
        return self.slot_of[key]

    def storage(self, t: str) -> str:
        """The tensor whose memory ``t`` is (through alias ops)."""
        while t in self.root:
            t = self.root[t]
        return t

    def weight_slot(self, t: str, value: np.ndarray | None = None) -> int:
        """The slot of constant ``t`` (a graph constant, or ``value`` a kernel derived)."""
        if t not in self.slot_of:
            data = (np.ascontiguousarray(self.graph.constants[t], dtype=self.graph.types[t].dtype) if value is None
                    else np.ascontiguousarray(value)).tobytes()
            padded = align_up(len(data), self.align)
            self.add(t, Slot("weight", t, len(data), self._weight_size))
            self._weights.append(data + b"\0" * (padded - len(data)))
            self._weight_size += padded
        return self.slot_of[t]

    @property
    def weights(self) -> bytes:
        return b"".join(self._weights)

    def root_slot(self, slot: int) -> int:
        while self.slots[slot].kind == "view":
            slot = self.slots[slot].parent
        return slot

    def touch(self, slot: int, step: int) -> None:
        """Step ``step`` uses ``slot``: extend its arena live range (a view keeps its whole parent alive)."""
        slot = self.root_slot(slot)
        if self.slots[slot].kind == "arena":
            r = self.live.setdefault(slot, [step, step])
            r[1] = step

    def output_copies(self) -> Iterator[tuple[Node, str, str, TensorType]]:
        """For each graph output its producer does not write (an input, a constant or an alias
        op's output): a new output slot and the flat copy node that fills it, as (node, source
        tensor, output key, flat type)."""
        types = self.graph.types
        for name in self.graph.outputs:
            if name in self.outputs_direct:
                continue
            p = self.producers.get(name)
            src = self.storage(p.inputs[0] if p is not None and self.kernels[p.op_type].alias else name)
            flat = TensorType((types[name].size,), types[name].dtype)
            # the output slot gets its own key: ``src`` may be this very tensor (a constant or a
            # graph input that is also a graph output) and must keep resolving to its storage
            key = f"{name}#output"
            self.add(key, Slot("output", name, types[name].nbytes))
            yield Node(f"copy_{name}", "polyml.Copy", [src], [key]), src, key, flat

    def plan_arena(self) -> int:
        """First-fit offsets for arena slots whose step ranges overlap; returns the arena size."""
        placed: list[tuple[int, int, int, int]] = []  # (offset, size, first, last)
        top = 0
        for s in sorted(self.live, key=lambda s: (self.live[s][0], -self.slots[s].nbytes)):
            first, last = self.live[s]
            size = align_up(max(self.slots[s].nbytes, 1), self.align)
            busy = sorted((o, o + n) for o, n, lo, hi in placed if not (hi < first or lo > last))
            offset = 0
            for lo, hi in busy:
                if offset + size <= lo:
                    break
                offset = max(offset, hi)
            self.slots[s].offset = offset
            placed.append((offset, size, first, last))
            top = max(top, offset + size)
        return top


class FlatCopy(Kernel):
    """A flat element copy, used where a graph output is an input, a constant or a view."""

    polly = "off"

    def lower(self, k) -> None:  # noqa: ANN001 - a KernelBuilder (host or GPU)
        src, dst = k.inputs[0], k.outputs[0]
        assert src is not None
        with k.loops([dst.type.size], names=["e"]) as (e,):
            dst.store([e], src.load([e]))
