"""``polyml build --target cuda``: the artifact of a CUDA build.

Layout: ``ptx/<op function>.ptx`` (one PTX module per op, its kernels are ``.entry`` functions),
``kernels/<op function>.ll`` (the same module before the NVPTX back end: what the emulator runs,
``--target cuda-emulated``), ``weights.bin`` (uploaded to the device once) and ``manifest.json`` with ``"target": "cuda"``,
the SM, the slots and memory plan, and ``kernels``: the launches in order, each with its op,
grid and block dimensions, argument slots and the band mapping (which loop became which
``blockIdx``/``threadIdx``, which stayed a loop).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from polyml._version import __version__
from polyml.errors import PolymlError
from polyml.gpu import DEFAULT_SM, TRIPLE
from polyml.gpu.emulate import EmulatedModel
from polyml.gpu.lower import lower_graph_cuda
from polyml.gpu.ptx import assemble, ptxas, to_ptx
from polyml.gpu.runtime import CudaModel
from polyml.gpu.shared import SHARED_BYTES
from polyml.graph import Graph
from polyml.pipeline import cuda_fusion, prepare

MANIFEST = "manifest.json"
WEIGHTS = "weights.bin"
PTX_DIR = "ptx"
IR_DIR = "kernels"


def build_cuda_artifact(graph: Graph, outdir: str | os.PathLike, sm: str = DEFAULT_SM, fuse: bool = True,
                        check_ptxas: bool | None = None, model_sha256: str = "", source: dict | None = None,
                        shared_memory: bool = False, ptx: bool = True) -> dict:
    """Compile ``graph`` into PTX in ``outdir``; returns the manifest written there.

    ``shared_memory``: promote reused input tiles of conv/matmul nests into shared memory
    (:mod:`polyml.gpu.shared`, ``SHARED_BYTES`` per block).

    ``check_ptxas``: assemble every PTX file with ``ptxas -arch=<sm>`` (default: when ptxas is
    installed); the result is recorded in the manifest.

    ``ptx=False``: write only the kernel IR (``kernels/``), not the PTX: an artifact for the
    emulator (``polyml.compile(..., target="cuda-emulated")``), which runs that IR; the NVPTX
    back end is the slowest stage of a build and a device cannot load such an artifact.
    """
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / PTX_DIR, out / IR_DIR, out / "model.so"):
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()
    if ptx:
        (out / PTX_DIR).mkdir()
    (out / IR_DIR).mkdir()
    prepared = prepare(graph, quantize=False, fusion=cuda_fusion() if fuse else None)
    graph, fusion = prepared.graph, prepared.fusion
    seconds: dict[str, float] = dict(prepared.seconds)
    t0 = time.perf_counter()
    low = lower_graph_cuda(graph, shared_bytes=SHARED_BYTES if shared_memory else 0)
    seconds["lower+map"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    files: dict[str, str] = {}
    kernel_ir: dict[str, str] = {}
    for fname, module in low.modules.items():
        ir_text = str(module)
        (out / IR_DIR / f"{fname}.ll").write_text(ir_text)
        kernel_ir[f"{IR_DIR}/{fname}.ll"] = hashlib.sha256(ir_text.encode()).hexdigest()
        if not ptx:
            continue
        text = to_ptx(module, sm)
        path = out / PTX_DIR / f"{fname}.ptx"
        path.write_text(text)
        files[f"{PTX_DIR}/{fname}.ptx"] = hashlib.sha256(text.encode()).hexdigest()
    seconds["ptx"] = time.perf_counter() - t0
    checked = ptx and (ptxas() is not None if check_ptxas is None else check_ptxas)
    if checked:
        t0 = time.perf_counter()
        for name in files:
            assemble(out / name, sm)
        seconds["ptxas"] = time.perf_counter() - t0
    (out / WEIGHTS).write_bytes(low.weights)
    manifest = {
        "format": 1,
        "polyml_version": __version__,
        "target": "cuda",
        "triple": TRIPLE,
        "sm": sm,
        "ptx": ptx,
        "ptxas_checked": checked,
        "model": {"sha256": model_sha256, **(source or {})},
        "inputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in low.inputs.items()],
        "outputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in low.outputs.items()],
        "slots": [s.to_json() for s in low.slots],
        "weights_bytes": len(low.weights),
        "arena_bytes": low.arena_bytes,
        "kernels": [launch.to_json() for launch in low.launches],
        "shared_memory_kernels": sum(1 for launch in low.launches if launch.mapping.shared is not None),
        "files": files,
        "kernel_ir": kernel_ir,
        "fusion": fusion.to_json() if fusion is not None else None,
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "options": {"fuse": fuse, "sm": sm, "shared_memory": shared_memory,
                    "shared_bytes": SHARED_BYTES if shared_memory else 0},
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


#: the targets polyml.compile and polyml run take besides "cpu"
CUDA_TARGETS = ("cuda", "cuda-emulated")
#: compile options that apply to a CUDA build
CUDA_OPTIONS = ("fuse", "shared_memory", "sm")


def compile_cuda(graph: Graph, output_dir: str | os.PathLike | None, target: str, model_sha256: str = "",
                 source: dict | None = None, **options):  # noqa: ANN201 - CudaModel
    """``polyml.compile(..., target="cuda" | "cuda-emulated")``: build ``graph`` for CUDA into
    ``output_dir`` (a temporary folder when None) and load it on the device or the emulator.

    The emulated target writes the kernel IR only (no PTX, see :func:`build_cuda_artifact`).
    Options: ``fuse``, ``shared_memory``, ``sm``; others (CPU code generation) are refused.
    """
    if target not in CUDA_TARGETS:
        raise PolymlError(f"target {target!r}: expected cpu, {' or '.join(CUDA_TARGETS)}")
    other = sorted(set(options) - set(CUDA_OPTIONS))
    if other:
        raise PolymlError(f"target {target}: option(s) {', '.join(other)} apply to CPU builds only "
                          f"(a CUDA build takes {', '.join(CUDA_OPTIONS)})")
    tmp = None
    if output_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="polyml-cuda-")
        output_dir = tmp.name
    build_cuda_artifact(graph, output_dir, sm=options.get("sm", DEFAULT_SM), fuse=options.get("fuse", True),
                        shared_memory=options.get("shared_memory", False), model_sha256=model_sha256, source=source,
                        ptx=target == "cuda", check_ptxas=None if target == "cuda" else False)
    model = CudaModel(output_dir) if target == "cuda" else EmulatedModel(output_dir)
    model._tmp = tmp  # keeps a temporary artifact alive as long as the model
    return model


__all__ = ["CUDA_OPTIONS", "CUDA_TARGETS", "build_cuda_artifact", "compile_cuda"]
