"""The emulator back end of :class:`polyml.gpu.runtime.CudaModel`: host buffers laid out as the
device's, the rewritten kernels compiled once per artifact, launches on the emulated grid.

Memory follows the plan exactly: one weight buffer, one arena (the slots at their manifest
offsets), one buffer per graph input and output.  Fresh buffers and each block's shared memory
are filled with ``0xff`` bytes (NaN as float32) — device memory is not zeroed, and a kernel that
reads what nobody wrote must not look right by chance.  Each launch passes every kernel argument
with the bounds of its slot, so a check names the tensor an access strays from.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from polyml.errors import EmulationError, ModelFormatError, index_out_of_range
from polyml.gpu.emulate.compile import build_library
from polyml.gpu.emulate.rewrite import KernelInfo, Rewritten, Site, rewrite_module
from polyml.gpu.runtime import CudaModel, CudaPlan, LaunchPlan

ALIGN = 256  # as cudaMalloc
MAX_THREADS = 1024
MAX_SHARED = 48 * 1024  # static shared memory per block

OOB, BARRIER_EXIT, BARRIER_MISMATCH, NO_MEMORY, UNEXPECTED_BARRIER = 1, 2, 3, 4, 5


class EmuError(ctypes.Structure):
    """``emu_error`` of runtime.c."""

    _fields_ = [("kind", ctypes.c_int32), ("site", ctypes.c_int32), ("thread", ctypes.c_uint32 * 3),
                ("block", ctypes.c_uint32 * 3), ("offset", ctypes.c_int64), ("size", ctypes.c_int64),
                ("extent", ctypes.c_int64), ("other", ctypes.c_uint32 * 3), ("other_site", ctypes.c_int32),
                ("waiting", ctypes.c_uint32), ("exited", ctypes.c_uint32), ("phase", ctypes.c_uint64)]


KERNEL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class _Launch:
    """One launch bound to its buffers: arguments, bounds, dimensions, the wrapper to call."""

    def __init__(self, plan: LaunchPlan, fn: ctypes._CFuncPtr, info: KernelInfo, sites: list[Site],
                 args: list[int], bounds: list[int]):
        self.plan, self.fn, self.info, self.sites = plan, fn, info, sites
        self.args = (ctypes.c_void_p * max(len(args), 1))(*args)
        self.bounds = (ctypes.c_void_p * max(len(bounds), 1))(*bounds)
        self.grid = (ctypes.c_uint32 * 3)(*plan.grid)
        self.block = (ctypes.c_uint32 * 3)(*plan.block)


class EmulatorBackend:
    """:class:`polyml.gpu.runtime.Backend` on the CPU (see the module docstring)."""

    def __init__(self, jobs: int | None = None):
        self._buffers: list[np.ndarray] = []
        self._launches: list[_Launch] = []
        self._jobs = jobs
        self._lib: ctypes.CDLL | None = None
        self.plan: CudaPlan | None = None

    def alloc(self, nbytes: int) -> int:
        buf = np.full(nbytes + ALIGN, 0xFF, dtype=np.uint8)
        self._buffers.append(buf)
        return -(-buf.ctypes.data // ALIGN) * ALIGN

    def upload(self, ptr: int, data: bytes | np.ndarray) -> None:
        if isinstance(data, np.ndarray):
            ctypes.memmove(ptr, data.ctypes.data, data.nbytes)
        elif data:
            ctypes.memmove(ptr, data, len(data))

    def download(self, out: np.ndarray, ptr: int) -> None:
        ctypes.memmove(out.ctypes.data, ptr, out.nbytes)

    def prepare(self, plan: CudaPlan, ptrs: list[int]) -> None:
        self.plan = plan
        modules: dict[str, Rewritten] = {}
        for k in plan.launches:
            if not k.ir:
                raise ModelFormatError(f"{plan.dir}: this CUDA build has no kernel IR for the emulator (written by an "
                                       "older polyml); rebuild it with polyml build --target cuda")
            if k.ir not in modules:
                try:
                    text = (plan.dir / k.ir).read_text()
                except OSError as e:
                    raise ModelFormatError(f"{plan.dir}: cannot read the kernel IR {k.ir} ({e})") from None
                modules[k.ir] = rewrite_module(text, k.ir)
        lib = self._lib = ctypes.CDLL(str(build_library({m: r.text for m, r in modules.items()}, self._jobs)))
        lib.polyml_emu_launch.restype = ctypes.c_int
        lib.polyml_emu_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int, ctypes.POINTER(EmuError)]
        lib.polyml_emu_error_size.restype = ctypes.c_size_t
        self._status = ctypes.c_int32.in_dll(lib, "polyml_status")
        if lib.polyml_emu_error_size() != ctypes.sizeof(EmuError):
            raise EmulationError("emulated CUDA: runtime.c and launch.py disagree on emu_error")
        for k in plan.launches:
            rw = modules[k.ir]
            info = rw.kernels.get(k.name)
            if info is None:
                raise ModelFormatError(f"{plan.dir}/{k.ir}: no kernel {k.name} (the manifest launches it)")
            if info.nargs != len(k.slots):
                raise ModelFormatError(f"{plan.dir}: kernel {k.name} takes {info.nargs} buffers, the manifest passes "
                                       f"{len(k.slots)}")
            self._check_dims(k, info)
            fn = ctypes.cast(getattr(lib, f"{k.name}__emu"), ctypes.c_void_p)
            args = [ptrs[s] for s in k.slots]
            bounds = [x for s in k.slots for x in (ptrs[s], ptrs[s] + plan.slots[s].nbytes)]
            self._launches.append(_Launch(k, fn, info, rw.sites, args, bounds))

    @staticmethod
    def _check_dims(k: LaunchPlan, info: KernelInfo) -> None:
        if any(d < 1 for d in (*k.grid, *k.block)) or np.prod(k.block) > MAX_THREADS or k.block[2] > 64:
            raise EmulationError(f"emulated CUDA: kernel {k.name} cannot launch: grid {k.grid}, block {k.block} "
                                 f"(at most {MAX_THREADS} threads per block, blockDim.z ≤ 64, every dimension ≥ 1)")
        if info.shared_bytes > MAX_SHARED:
            raise EmulationError(f"emulated CUDA: kernel {k.name} cannot launch: {info.shared_bytes} bytes of static "
                                 f"shared memory per block, more than {MAX_SHARED}")

    def launch(self, index: int) -> None:
        ln = self._launches[index]
        err = EmuError()
        status = self._lib.polyml_emu_launch(ln.fn, ln.args, ln.bounds, ln.grid, ln.block, ln.info.shared_bytes,
                                             int(ln.info.barriers > 0), ctypes.byref(err))
        if status:
            raise EmulationError(self._describe(ln, err))
        if self._status.value:
            self._status.value = 0
            raise index_out_of_range(f"{ln.plan.op_type} node {ln.plan.op!r}")

    def synchronize(self) -> None:
        pass

    def take_status(self) -> tuple[str, str] | None:
        return None  # :meth:`launch` raises at the kernel that met the index

    def close(self) -> None:
        self._launches = []
        self._buffers = []

    # -- error messages ---------------------------------------------------------------------------
    def _array(self, ln: _Launch, array: str) -> str:
        plan = self.plan
        if array.startswith("arg"):
            a = int(array[3:])
            s = plan.slots[ln.plan.slots[a]]
            return f"{s.kind} tensor {s.name!r} (kernel argument {ln.info.params[a]}, {s.nbytes} bytes)"
        g = array[len("shared:"):]
        label = g.strip('@"')
        root = label.rsplit(".smem", 1)[-1]
        what = ""
        if root.isdigit() and int(root) < len(ln.plan.slots):
            s = plan.slots[ln.plan.slots[int(root)]]
            what = f", the tile of {s.name!r}"
        return f"shared array {label}{what} ({ln.info.shared[g][1]} bytes)"

    def _describe(self, ln: _Launch, e: EmuError) -> str:
        k = ln.plan
        where = f"kernel {k.name} ({k.op_type} node {k.op!r}; grid {k.grid}, block {k.block})"
        th, bl = tuple(e.thread), tuple(e.block)
        if e.kind == OOB:
            site = ln.sites[e.site]
            action = "read" if site.kind == "load" else "write"
            return (f"emulated CUDA: out-of-bounds {action} in {where}: thread {th} of block {bl} accesses "
                    f"{e.size} bytes at byte offset {e.offset} of {self._array(ln, site.array)}; "
                    f"{k.ir} line {site.line}. On a device this {action} would hit another tensor or unmapped "
                    "memory; the kernel's guards or index arithmetic are wrong.")
        if e.kind in (BARRIER_EXIT, BARRIER_MISMATCH):
            at = f"{k.ir} line {ln.sites[e.site].line}"
            if e.kind == BARRIER_EXIT:
                what = (f"thread {th} and {e.waiting - 1} other(s) wait at the barrier of {at}, but thread "
                        f"{tuple(e.other)} exited without reaching it ({e.exited} thread(s) exited)")
            else:
                what = (f"the threads wait at different barriers: thread {th} at {at}, thread {tuple(e.other)} at "
                        f"{k.ir} line {ln.sites[e.other_site].line}")
            return (f"emulated CUDA: barrier not reached by every thread in {where}: in block {bl}, after "
                    f"{e.phase} completed barrier(s), {what}. __syncthreads must be reached by all threads "
                    "of a block; on a device the block would hang or race.")
        if e.kind == UNEXPECTED_BARRIER:
            return f"emulated CUDA: {where} reached a barrier the rewriter did not see (thread {th}, block {bl})"
        if e.kind == NO_MEMORY:
            return f"emulated CUDA: out of host memory for the threads of {where}"
        return f"emulated CUDA: {where} failed (status {e.kind})"


class EmulatedModel(CudaModel):
    """A CUDA artifact run on the emulator: ``run({name: array}) -> {name: array}``."""

    def __init__(self, directory: str | os.PathLike, jobs: int | None = None):
        super().__init__(Path(directory), backend=EmulatorBackend(jobs))


__all__ = ["EmulatedModel", "EmulatorBackend"]
