"""Running a CUDA artifact: one plan, two back ends.

:class:`CudaPlan` reads what a run needs from the manifest — the slots (graph inputs and
outputs, weights at their offsets in the blob, intermediates at their offsets in the arena,
views inside their parent), the kernel launches in order with their grid and block dimensions
and argument slots — and :class:`CudaModel` carries it out on a :class:`Backend`:

* :class:`DeviceBackend`: the CUDA driver API (``cuda-bindings``).  Device memory is explicit
  (``cuMemAlloc``, no managed memory): the weight blob is uploaded once when the model loads,
  intermediates live in one device arena for the model's lifetime, inputs and outputs have their
  own device buffers.  ``run`` copies the inputs to the device, launches every kernel in order on
  one stream (a launch boundary is the barrier between dependent nests), and copies the outputs
  back;
* the emulator (:mod:`polyml.gpu.emulate`): the same kernels' IR on the CPU, an emulated grid,
  every access bounds-checked against its slot (``--target cuda-emulated``).

Without the driver or a device, :func:`require_device` raises a :class:`PolymlError` that says
so ("no CUDA device: ...").
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from polyml.errors import ModelFormatError, PolymlError, index_out_of_range


class NoCudaDevice(PolymlError):
    """The CUDA driver, its Python bindings or a device is missing."""


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise NoCudaDevice(f"no CUDA device: the CUDA Python bindings are not installed ({e}); "
                           "pip install 'polyml[cuda]'") from None
    return driver


def _check(result, what: str):  # noqa: ANN001, ANN202 - cuda-bindings returns (CUresult, *values)
    err, *vals = result if isinstance(result, tuple) else (result,)
    driver = _driver()
    if err != driver.CUresult.CUDA_SUCCESS:
        _, msg = driver.cuGetErrorString(err)
        raise PolymlError(f"CUDA {what} failed: {err.name} ({msg.decode() if msg else '?'})")
    return vals[0] if len(vals) == 1 else vals


def require_device(ordinal: int = 0) -> tuple[object, object]:
    """``(device, context)`` of device ``ordinal`` (primary context), or NoCudaDevice."""
    driver = _driver()
    try:
        err, = driver.cuInit(0)
    except Exception as e:  # the bindings raise when libcuda.so cannot be loaded
        raise NoCudaDevice(f"no CUDA device: the NVIDIA driver library is not available ({e})") from None
    if err != driver.CUresult.CUDA_SUCCESS:
        raise NoCudaDevice(f"no CUDA device: cuInit failed with {err.name}")
    count = _check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    if count <= ordinal:
        raise NoCudaDevice(f"no CUDA device: {count} device(s) present, device {ordinal} requested")
    dev = _check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev, ctx


def device_available() -> bool:
    """Whether :func:`require_device` would succeed (for tests and scripts)."""
    try:
        require_device()
    except PolymlError:
        return False
    return True


def is_cuda_artifact(directory: str | os.PathLike) -> bool:
    try:
        return json.loads((Path(directory) / "manifest.json").read_text()).get("target") == "cuda"
    except (OSError, ValueError):
        return False


@dataclass(frozen=True)
class SlotPlan:
    """One entry of the pointer table (``manifest["slots"]``)."""

    kind: str  # "input" | "output" | "weight" | "arena" | "view"
    name: str
    nbytes: int
    offset: int
    parent: int = -1


@dataclass(frozen=True)
class LaunchPlan:
    """One kernel launch: function ``name`` of the op's module over the buffers of ``slots``."""

    name: str
    ptx: str  # ptx/<op>.ptx
    ir: str  # kernels/<op>.ll ("" in artifacts written before the emulator)
    op: str
    op_type: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    slots: tuple[int, ...]

    @property
    def module(self) -> str:
        return Path(self.ptx).stem


class CudaPlan:
    """What running a CUDA artifact means, independent of where it runs."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        try:
            self.manifest = m = json.loads((self.dir / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{self.dir}: not a readable polyml artifact ({e})") from None
        if m.get("target") != "cuda":
            raise ModelFormatError(f"{self.dir}: not a CUDA build (target {m.get('target', 'cpu')!r})")
        try:
            self.inputs = {i["name"]: (tuple(i["shape"]), np.dtype(i["dtype"])) for i in m["inputs"]}
            self.outputs = {o["name"]: (tuple(o["shape"]), np.dtype(o["dtype"])) for o in m["outputs"]}
            self.slots = [SlotPlan(s["kind"], s["name"], int(s["nbytes"]), int(s.get("offset", 0)), int(s.get("parent", -1)))
                          for s in m["slots"]]
            self.launches = [LaunchPlan(k["name"], k["ptx"], k.get("ir", ""), k.get("op", ""), k.get("op_type", ""),
                                        tuple(k["grid"]), tuple(k["block"]), tuple(k["slots"])) for k in m["kernels"]]
            self.arena_bytes = int(m["arena_bytes"])
            weights_bytes = int(m["weights_bytes"])
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFormatError(f"{self.dir}/manifest.json: incomplete CUDA manifest ({e!r})") from None
        self.weights = (self.dir / "weights.bin").read_bytes()
        if len(self.weights) != weights_bytes:
            raise ModelFormatError(f"{self.dir}/weights.bin: {len(self.weights)} bytes, manifest says {weights_bytes}")
        for k in self.launches:
            if any(not 0 <= s < len(self.slots) for s in k.slots):
                raise ModelFormatError(f"{self.dir}/manifest.json: kernel {k.name} names a slot that does not exist")
            for s in k.slots:
                self.check_slot(s)

    def check_slot(self, i: int) -> None:
        """A slot lies inside its storage (the blob, the arena, or its parent)."""
        s = self.slots[i]
        room = {"weight": len(self.weights), "arena": self.arena_bytes}.get(s.kind)
        if s.kind == "view":
            if not 0 <= s.parent < i:
                raise ModelFormatError(f"{self.dir}/manifest.json: view slot {s.name!r} has no earlier parent")
            room = self.slots[s.parent].nbytes
        if room is not None and not (0 <= s.offset and s.offset + s.nbytes <= room):
            raise ModelFormatError(f"{self.dir}/manifest.json: slot {s.name!r} ({s.kind}, {s.nbytes} bytes at "
                                   f"{s.offset}) lies outside its storage ({room} bytes)")

    def pointers(self, weights_base: int, arena_base: int, alloc) -> list[int]:  # noqa: ANN001 - (nbytes) -> address
        """The address of every slot: weights and arena tensors at their offsets, views inside
        their parent, inputs and outputs in buffers of their own (``alloc``)."""
        out: list[int] = []
        for s in self.slots:
            if s.kind == "weight":
                out.append(weights_base + s.offset)
            elif s.kind == "arena":
                out.append(arena_base + s.offset)
            elif s.kind == "view":
                out.append(out[s.parent] + s.offset)
            else:
                out.append(alloc(s.nbytes))
        return out


class Backend(Protocol):
    """Where a :class:`CudaPlan` runs: memory, copies and launches."""

    def alloc(self, nbytes: int) -> int: ...

    def upload(self, ptr: int, data: bytes | np.ndarray) -> None: ...

    def download(self, out: np.ndarray, ptr: int) -> None: ...

    def prepare(self, plan: CudaPlan, ptrs: list[int]) -> None:
        """Load the kernels of ``plan`` and bind each launch to the slot addresses ``ptrs``."""

    def launch(self, index: int) -> None:
        """Enqueue launch ``index`` of the plan (in plan order)."""

    def synchronize(self) -> None: ...

    def take_status(self) -> tuple[str, str] | None:
        """After :meth:`synchronize`: ``(op_type, op)`` of a kernel that met an out-of-range
        index since the last call (its status word cleared), else None."""

    def close(self) -> None: ...


#: the module global an index check stores ``1 + step`` to (``polyml.codegen.builder.STATUS``)
STATUS_WORD = b"polyml_status"


class DeviceBackend:
    """A CUDA device through the driver API: explicit device buffers, one stream."""

    def __init__(self, device: int = 0):
        self._dev, self._ctx = require_device(device)
        self._d = _driver()
        self._allocs: list[int] = []
        self._modules: dict[str, object] = {}
        self._launches: list = []
        self._status_words: list[tuple[int, str, str]] = []  # (device address, op_type, op) per module
        self._stream = _check(self._d.cuStreamCreate(0), "cuStreamCreate")

    def alloc(self, nbytes: int) -> int:
        p = int(_check(self._d.cuMemAlloc(max(nbytes, 1)), "cuMemAlloc"))
        self._allocs.append(p)
        return p

    def upload(self, ptr: int, data: bytes | np.ndarray) -> None:
        if isinstance(data, np.ndarray):
            _check(self._d.cuMemcpyHtoDAsync(ptr, data.ctypes.data, data.nbytes, self._stream), "cuMemcpyHtoD")
        elif data:
            _check(self._d.cuMemcpyHtoD(ptr, data, len(data)), "cuMemcpyHtoD")

    def download(self, out: np.ndarray, ptr: int) -> None:
        _check(self._d.cuMemcpyDtoHAsync(out.ctypes.data, ptr, out.nbytes, self._stream), "cuMemcpyDtoH")

    def prepare(self, plan: CudaPlan, ptrs: list[int]) -> None:
        d = self._d
        if not plan.manifest.get("ptx", True):
            raise ModelFormatError(f"{plan.dir}: built for the emulator only (no PTX); rebuild it with "
                                   "polyml build --target cuda to run it on a device")
        for k in plan.launches:
            mod = self._modules.get(k.ptx)
            if mod is None:
                image = (plan.dir / k.ptx).read_bytes() + b"\0"
                mod = self._modules[k.ptx] = _check(d.cuModuleLoadData(image), f"cuModuleLoadData {k.ptx}")
                found = d.cuModuleGetGlobal(mod, STATUS_WORD)  # modules with index checks own one
                if int(found[0]) == 0:
                    self._status_words.append((int(found[1]), k.op_type, k.op))
            fn = _check(d.cuModuleGetFunction(mod, k.name.encode()), f"cuModuleGetFunction {k.name}")
            args = [ctypes.c_void_p(ptrs[s]) for s in k.slots]
            params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
            self._launches.append((fn, k.grid, k.block, args, params, k.name))

    def launch(self, index: int) -> None:
        fn, grid, block, _args, params, name = self._launches[index]
        _check(self._d.cuLaunchKernel(fn, *grid, *block, 0, self._stream, ctypes.addressof(params), 0),
               f"cuLaunchKernel {name}")

    def synchronize(self) -> None:
        _check(self._d.cuStreamSynchronize(self._stream), "cuStreamSynchronize")

    def take_status(self) -> tuple[str, str] | None:
        met = None
        for ptr, op_type, op in self._status_words:
            word = ctypes.c_int32(0)
            _check(self._d.cuMemcpyDtoH(ctypes.addressof(word), ptr, 4), "cuMemcpyDtoH polyml_status")
            if word.value:
                _check(self._d.cuMemsetD32(ptr, 0, 1), "cuMemsetD32 polyml_status")
                met = met or (op_type, op)
        return met

    def close(self) -> None:
        for p in self._allocs:
            self._d.cuMemFree(p)
        self._allocs = []
        for mod in self._modules.values():
            self._d.cuModuleUnload(mod)
        self._modules = {}


class CudaModel:
    """A CUDA artifact loaded on a back end (default: device 0): ``run({name: array}) -> {name: array}``.

    The plan is carried out the same way everywhere: the weight blob uploaded once, one arena
    for the intermediates, input and output buffers; per run the inputs copied in, every launch
    in manifest order, the outputs copied back.
    """

    def __init__(self, directory: str | os.PathLike, device: int = 0, backend: Backend | None = None):
        self.plan = plan = CudaPlan(directory)
        self.dir, self.manifest = plan.dir, plan.manifest
        self.inputs, self.outputs = plan.inputs, plan.outputs
        self.backend = backend if backend is not None else DeviceBackend(device)
        wbase = self.backend.alloc(len(plan.weights))
        self.backend.upload(wbase, plan.weights)
        abase = self.backend.alloc(plan.arena_bytes)
        self._ptr = plan.pointers(wbase, abase, self.backend.alloc)
        self.backend.prepare(plan, self._ptr)
        self._lock = threading.Lock()

    def check_inputs(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from polyml.runtime.model import CompiledModel

        return CompiledModel.check_inputs(self, feeds)  # same checks; uses only self.inputs

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ready = self.check_inputs(feeds)
        outs = {n: np.empty(shape, dtype) for n, (shape, dtype) in self.outputs.items()}
        be = self.backend
        with self._lock:
            for i, s in enumerate(self.plan.slots):
                if s.kind == "input":
                    be.upload(self._ptr[i], ready[s.name])
            for i in range(len(self.plan.launches)):
                be.launch(i)
            for i, s in enumerate(self.plan.slots):
                if s.kind == "output":
                    be.download(outs[s.name], self._ptr[i])
            be.synchronize()
            met = be.take_status()
        if met is not None:
            raise index_out_of_range(f"{met[0]} node {met[1]!r}")
        return outs

    def close(self) -> None:
        be = getattr(self, "backend", None)
        if be is not None:
            be.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.dir)!r}, kernels={len(self.plan.launches)})"


__all__ = ["Backend", "CudaModel", "CudaPlan", "DeviceBackend", "LaunchPlan", "NoCudaDevice", "SlotPlan",
           "device_available", "is_cuda_artifact", "require_device"]
