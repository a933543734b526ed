"""Loading a compiled artifact and calling it from Python with numpy arrays.

The artifact's ``model.so`` exports ``polyml_main(void **table)``.  The runtime owns the table:
weights (``weights.bin``, read once into 64-byte aligned memory), an arena for intermediates,
the caller's inputs and freshly allocated outputs.  Every input is checked (name, dtype, shape;
non-contiguous arrays are copied) before any native code sees a pointer.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from polyml.errors import InputError, ModelFormatError, index_out_of_range

ALIGN = 64

# GNU OpenMP's idle threads spin (GOMP_SPINCOUNT, 300k iterations by default) before they
# sleep. polyml opens one parallel region per parallel nest, back to back, so on a machine whose
# cores are free the spin keeps the workers awake between regions; a short spin makes every
# region wake them through the kernel (measured, 2 threads, quiet host: squeezenet 4.55 ms with
# libgomp's default vs 7.9 ms with GOMP_SPINCOUNT=1000, ResNet-50 41.4 vs 44.4 ms). On a host
# whose cores are busy with other work the spin steals them instead (squeezenet with one core
# loaded: median 9.1 ms, outliers to 96 ms; 8.3 ms steady with GOMP_SPINCOUNT=1000;
# OMP_WAIT_POLICY=passive is the other choice there). polyml keeps libgomp's default; set
# GOMP_SPINCOUNT or OMP_WAIT_POLICY for shared hosts (the test suite does).


#: LLVM's name of a vector extension generated code may use -> its flag in /proc/cpuinfo
CPUINFO_FLAGS = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma",
    "f16c": "f16c", "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw", "avx512dq": "avx512dq",
    "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "avx512vbmi": "avx512vbmi", "avx512ifma": "avx512ifma", "avxvnni": "avx_vnni", "amx-tile": "amx_tile",
    "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}


CPUINFO = "/proc/cpuinfo"


def missing_cpu_features(target: dict, cpuinfo: str | os.PathLike | None = None) -> list[str]:
    """The vector extensions an artifact's target (``manifest["target"]``) has and this CPU lacks,
    by LLVM's names; [] where the target is not x86 or ``cpuinfo`` cannot be read."""
    if not str(target.get("triple", "")).startswith("x86_64"):
        return []
    try:
        with open(cpuinfo or CPUINFO) as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return []
    have = set(line.partition(":")[2].split())
    if not have:
        return []
    wanted = [f[1:] for f in str(target.get("features", "")).split(",") if f.startswith("+")]
    return [f for f in wanted if f in CPUINFO_FLAGS and CPUINFO_FLAGS[f] not in have]


def aligned_empty(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose data pointer is 64-byte aligned."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    shift = (-raw.ctypes.data) % ALIGN
    return raw[shift : shift + nbytes]


_gomp = None


def set_num_threads(n: int) -> None:
    """Set the OpenMP thread count used by Polly's parallel loops (0 keeps the default)."""
    global _gomp
    if n <= 0:
        return
    if _gomp is None:
        _gomp = ctypes.CDLL("libgomp.so.1")
    _gomp.omp_set_num_threads(ctypes.c_int(n))


def _load_private_copy(lib: Path) -> ctypes.CDLL:
    """dlopen a private copy of ``lib``: the dynamic loader returns an already-loaded library
    for the same path (or inode), so a model rebuilt into the same folder would otherwise keep
    running the old code in this process."""
    if not lib.is_file():
        raise ModelFormatError(f"{lib} is missing: the artifact is incomplete")
    fd, tmp = tempfile.mkstemp(prefix="polyml-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as dst, open(lib, "rb") as src:
            shutil.copyfileobj(src, dst)
        return ctypes.CDLL(tmp)
    except OSError as e:
        raise ModelFormatError(f"{lib}: cannot load the compiled library ({e})") from None
    finally:
        os.unlink(tmp)  # the mapping stays valid after the file is gone


class CompiledModel:
    """A compiled model: ``run({name: array}) -> {name: array}``."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        mpath = self.dir / "manifest.json"
        try:
            self.manifest = json.loads(mpath.read_text())
        except FileNotFoundError:
            raise ModelFormatError(f"{self.dir} is not a polyml artifact (no manifest.json)") from None
        except json.JSONDecodeError as e:
            raise ModelFormatError(f"{mpath}: malformed manifest ({e})") from None
        m = self.manifest
        self.inputs = {i["name"]: (tuple(i["shape"]), np.dtype(i["dtype"])) for i in m["inputs"]}
        self.outputs = {o["name"]: (tuple(o["shape"]), np.dtype(o["dtype"])) for o in m["outputs"]}
        self._slots = m["slots"]
        weights_file = self.dir / "weights.bin"
        nbytes = weights_file.stat().st_size
        if nbytes != m["weights_bytes"]:
            raise ModelFormatError(f"{weights_file}: {nbytes} bytes, manifest says {m['weights_bytes']}")
        self._weights = aligned_empty(max(nbytes, 1))
        with open(weights_file, "rb") as f:
            f.readinto(memoryview(self._weights)[:nbytes])
        self._arena = aligned_empty(max(m["arena_bytes"], 1))
        self._lib = _load_private_copy(self.dir / "model.so")
        self._main = self._lib.polyml_main
        self._main.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._main.restype = None
        nslots = ctypes.c_int32.in_dll(self._lib, "polyml_num_slots").value
        if nslots != len(self._slots):
            raise ModelFormatError(f"{self.dir}: model.so has {nslots} slots, manifest {len(self._slots)}")
        # 1 + the step that met an out-of-range data-dependent index (Gather, Scatter...), else 0
        try:
            self._status = ctypes.c_int32.in_dll(self._lib, "polyml_status")
        except ValueError:
            self._status = None  # built by an older polyml
        self._table = (ctypes.c_void_p * len(self._slots))()
        for i, s in enumerate(self._slots):
            if s["kind"] == "weight":
                self._table[i] = self._weights.ctypes.data + s["offset"]
            elif s["kind"] == "arena":
                self._table[i] = self._arena.ctypes.data + s["offset"]
        # views (Concat inputs stored in place): parent pointer + byte offset; parents come first.
        # A view whose root is an input or output slot is refilled on every run.
        self._dynamic_views: list[tuple[int, int, int]] = []
        for i, s in enumerate(self._slots):
            if s["kind"] == "view":
                root = s["parent"]
                while self._slots[root]["kind"] == "view":
                    root = self._slots[root]["parent"]
                if self._slots[root]["kind"] in ("input", "output"):
                    self._dynamic_views.append((i, s["parent"], s["offset"]))
                else:
                    self._table[i] = self._table[s["parent"]] + s["offset"]
        # the slots each run points at its own arrays (a few among hundreds of weights/temps)
        self._io_slots = [(i, s["kind"], s["name"]) for i, s in enumerate(self._slots) if s["kind"] in ("input", "output")]
        self._lock = threading.Lock()
        # a cross build (POLYML_TARGET_CPU) loads anywhere but runs only where its instructions exist
        self._missing_features = missing_cpu_features(m.get("target", {}))
        set_num_threads(int(m["options"].get("threads", 0)))

    def check_inputs(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Validate names, dtypes and shapes; return C-contiguous arrays ready for native code."""
        if not isinstance(feeds, dict):
            raise InputError(f"inputs must be a dict of name -> numpy array, got {type(feeds).__name__}")
        # TensorFlow tensor names: "x:0" is output 0 of node "x", which names the input
        feeds = {k[:-2] if k.endswith(":0") and k not in self.inputs and k[:-2] in self.inputs else k: v
                 for k, v in feeds.items()}
        missing = [n for n in self.inputs if n not in feeds]
        extra = [n for n in feeds if n not in self.inputs]
        if missing or extra:
            raise InputError(
                f"input names do not match the model: missing {missing}, unexpected {extra}; "
                f"expected {list(self.inputs)}"
            )
        ready = {}
        for name, (shape, dtype) in self.inputs.items():
            a = feeds[name]
            if not isinstance(a, np.ndarray):
                raise InputError(f"input {name!r}: expected a numpy array, got {type(a).__name__}")
            if a.dtype != dtype:
                raise InputError(f"input {name!r}: dtype {a.dtype}, the model expects {dtype}")
            if a.shape != shape:
                raise InputError(f"input {name!r}: shape {a.shape}, the model expects {shape}")
            ready[name] = np.ascontiguousarray(a)
        return ready

    def _bind(self, ready: dict[str, np.ndarray], outs: dict[str, np.ndarray]) -> None:
        """Point the table's input, output and dynamic view slots at this run's arrays."""
        for i, kind, name in self._io_slots:
            self._table[i] = (ready if kind == "input" else outs)[name].ctypes.data
        for i, parent, offset in self._dynamic_views:
            self._table[i] = self._table[parent] + offset

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ready = self.check_inputs(feeds)
        outs = {n: np.empty(shape, dtype) for n, (shape, dtype) in self.outputs.items()}
        with self._lock:
            self._bind(ready, outs)
            self._call(self._main)
        return outs

    def _call(self, entry, *args) -> None:  # noqa: ANN001 - a ctypes function
        """Run ``entry(table, *args)``; raise where generated code met an index out of range."""
        if self._missing_features:
            cpu = self.manifest["target"].get("cpu", "?")
            raise ModelFormatError(f"{self.dir}: built for the CPU {cpu!r}; this machine's CPU lacks "
                                   f"{', '.join(self._missing_features)}, which its code uses (rebuild it here)")
        if self._status is not None:
            self._status.value = 0
        entry(self._table, *args)
        if self._status is not None and self._status.value:
            step = self._status.value - 1
            fns = self.manifest.get("functions", [])
            what = f"{fns[step]['op_type']} node {fns[step]['node']!r}" if step < len(fns) else f"step {step}"
            raise index_out_of_range(what)

    def profile(self, feeds: dict[str, np.ndarray], repeat: int = 10) -> list[dict]:
        """Median seconds of each op function: the steps run one by one through
        ``polyml_step`` (same order, same buffers as :meth:`run`), ``repeat`` times.
        Returns one row per step: function, node, op_type, policy, median_s, min_s (the minimum,
        steadier on a loaded host)."""
        try:
            step = self._lib.polyml_step
        except AttributeError:
            raise ModelFormatError(f"{self.dir}: model.so has no polyml_step (built by an older polyml)") from None
        step.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int64]
        step.restype = None
        functions = self.manifest["functions"]
        if ctypes.c_int32.in_dll(self._lib, "polyml_num_steps").value != len(functions):
            raise ModelFormatError(f"{self.dir}: model.so and manifest.json disagree on the number of steps")
        ready = self.check_inputs(feeds)
        outs = {n: np.empty(shape, dtype) for n, (shape, dtype) in self.outputs.items()}
        times = [[] for _ in functions]
        with self._lock:
            self._bind(ready, outs)
            self._call(self._main)  # warm-up; also checks the indices
            for _ in range(repeat):
                for i in range(len(functions)):
                    t = time.perf_counter()
                    step(self._table, i)
                    times[i].append(time.perf_counter() - t)
        return [{**f, "median_s": statistics.median(ts), "min_s": min(ts)} for f, ts in zip(functions, times)]

    def __repr__(self) -> str:
        return f"CompiledModel({str(self.dir)!r}, inputs={list(self.inputs)}, outputs={list(self.outputs)})"
