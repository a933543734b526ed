"""Running a CUDA artifact through the CUDA driver API (``cuda-bindings``).

Device memory is explicit (``cuMemAlloc``, no managed memory): the weight blob is uploaded once
when the model loads, intermediates live in one device arena for the model's lifetime, inputs
and outputs have their own device buffers.  ``run`` copies the inputs to the device, launches
every kernel of the manifest in order on one stream (a launch boundary is the barrier between
dependent nests), and copies the outputs back.

Without the driver or a device, :func:`require_device` raises a :class:`PolymlError` that says
so ("no CUDA device: ...").
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
from pathlib import Path

import numpy as np

from polyml.errors import ModelFormatError, PolymlError


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


def load_artifact(directory: str | os.PathLike):  # noqa: ANN201 - CompiledModel | CudaModel
    """The runnable model for an artifact folder: :class:`CudaModel` for a CUDA build."""
    if is_cuda_artifact(directory):
        return CudaModel(directory)
    from polyml.runtime.model import CompiledModel

    return CompiledModel(directory)


class CudaModel:
    """A CUDA artifact loaded on device 0: ``run({name: array}) -> {name: array}``."""

    def __init__(self, directory: str | os.PathLike, device: int = 0):
        self.dir = Path(directory)
        try:
            self.manifest = m = json.loads((self.dir / "manifest.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelFormatError(f"{self.dir}: not a readable polyml artifact ({e})") from None
        if m.get("target") != "cuda":
            raise ModelFormatError(f"{self.dir}: not a CUDA build (target {m.get('target', 'cpu')!r})")
        self.inputs = {i["name"]: (tuple(i["shape"]), np.dtype(i["dtype"])) for i in m["inputs"]}
        self.outputs = {o["name"]: (tuple(o["shape"]), np.dtype(o["dtype"])) for o in m["outputs"]}
        self._slots = m["slots"]
        weights = (self.dir / "weights.bin").read_bytes()
        if len(weights) != m["weights_bytes"]:
            raise ModelFormatError(f"{self.dir}/weights.bin: {len(weights)} bytes, manifest says {m['weights_bytes']}")
        self._dev, self._ctx = require_device(device)
        d = self._driver = _driver()
        self._allocs: list[int] = []

        def alloc(n: int) -> int:
            p = int(_check(d.cuMemAlloc(max(n, 1)), "cuMemAlloc"))
            self._allocs.append(p)
            return p

        wbase = alloc(len(weights))
        if weights:
            _check(d.cuMemcpyHtoD(wbase, weights, len(weights)), "cuMemcpyHtoD (weights)")
        abase = alloc(m["arena_bytes"])
        self._ptr: list[int] = []
        for s in self._slots:
            if s["kind"] == "weight":
                self._ptr.append(wbase + s["offset"])
            elif s["kind"] == "arena":
                self._ptr.append(abase + s["offset"])
            else:
                self._ptr.append(alloc(s["nbytes"]))
        self._modules: dict[str, object] = {}
        self._launches = []
        for k in m["kernels"]:
            mod = self._modules.get(k["ptx"])
            if mod is None:
                image = (self.dir / k["ptx"]).read_bytes() + b"\0"
                mod = self._modules[k["ptx"]] = _check(d.cuModuleLoadData(image), f"cuModuleLoadData {k['ptx']}")
            fn = _check(d.cuModuleGetFunction(mod, k["name"].encode()), f"cuModuleGetFunction {k['name']}")
            args = [ctypes.c_void_p(self._ptr[s]) for s in k["slots"]]
            params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
            self._launches.append((fn, tuple(k["grid"]), tuple(k["block"]), args, params, k["name"]))
        self._stream = _check(d.cuStreamCreate(0), "cuStreamCreate")
        self._lock = threading.Lock()

    def check_inputs(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from polyml.runtime.model import CompiledModel

        return CompiledModel.check_inputs(self, feeds)  # same checks; uses only self.inputs

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        d = self._driver
        ready = self.check_inputs(feeds)
        outs = {n: np.empty(shape, dtype) for n, (shape, dtype) in self.outputs.items()}
        with self._lock:
            for i, s in enumerate(self._slots):
                if s["kind"] == "input":
                    a = ready[s["name"]]
                    _check(d.cuMemcpyHtoDAsync(self._ptr[i], a.ctypes.data, a.nbytes, self._stream), "cuMemcpyHtoD")
            for fn, grid, block, _args, params, name in self._launches:
                _check(d.cuLaunchKernel(fn, *grid, *block, 0, self._stream, ctypes.addressof(params), 0),
                       f"cuLaunchKernel {name}")
            for i, s in enumerate(self._slots):
                if s["kind"] == "output":
                    a = outs[s["name"]]
                    _check(d.cuMemcpyDtoHAsync(a.ctypes.data, self._ptr[i], a.nbytes, self._stream), "cuMemcpyDtoH")
            _check(d.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
        return outs

    def close(self) -> None:
        d = getattr(self, "_driver", None)
        if d is None:
            return
        for p in self._allocs:
            d.cuMemFree(p)
        self._allocs = []
        for mod in self._modules.values():
            d.cuModuleUnload(mod)
        self._modules = {}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"CudaModel({str(self.dir)!r}, kernels={len(self._launches)})"


__all__ = ["CudaModel", "NoCudaDevice", "device_available", "is_cuda_artifact", "load_artifact", "require_device"]
