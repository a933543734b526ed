"""The user-facing entry points: ``polyml.compile(path, **options)`` and ``polyml.load(dir)``."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from polyml import cache as compile_cache
from polyml.driver.artifact import sha256_file
from polyml.driver.build import build_artifact
from polyml.driver.flags import Options
from polyml.gpu.build import compile_cuda
from polyml.graph import Graph
from polyml.pipeline import read_graph
from polyml.runtime.model import CompiledModel

file_sha256 = sha256_file  # the model file's hash, as recorded in manifest.json


def compile_graph(graph: Graph, output_dir: str | os.PathLike | None = None, emit=(), model_sha256: str = "", frontend_seconds: float = 0.0,
                  chunks: int | None = None, source: dict | None = None, **options) -> CompiledModel:
    opts = Options(**options)
    tmp = None
    if output_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="polyml-build-")
        output_dir = tmp.name
    build_artifact(graph, opts, output_dir, emit=frozenset(emit), model_sha256=model_sha256, frontend_seconds=frontend_seconds,
                   chunks=chunks, source=source)
    model = CompiledModel(output_dir)
    model._tmp = tmp  # keeps a temporary artifact alive as long as the model
    return model


def compile(
    path: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    *,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    outputs: list[str] | None = None,
    emit=(),
    cache: bool | None = None,
    chunks: int | None = None,
    target: str = "cpu",
    **options,
) -> CompiledModel:
    """Compile a model file (``.onnx``, ``.pb``) to native code; options as :class:`Options`.

    ``cache``: reuse or fill the compile cache (:mod:`polyml.cache`; default on unless
    ``POLYML_NO_CACHE=1``); ``chunks``: modules per policy (default: one per core).
    ``target``: ``"cpu"`` (default), ``"cuda"`` (a :class:`~polyml.gpu.runtime.CudaModel` on
    device 0) or ``"cuda-emulated"`` (the CUDA kernels on the CPU emulator, a correctness tool:
    :mod:`polyml.gpu.emulate`); CUDA targets take the options ``fuse``, ``shared_memory``, ``sm``.
    """
    t0 = time.perf_counter()
    p = Path(path)
    sha = file_sha256(p) if p.is_file() else ""
    shapes = {k: list(v) for k, v in sorted((input_shapes or {}).items())}
    source = {"path": str(p.resolve()), "input_shapes": shapes, "outputs": list(outputs) if outputs else None}
    if target != "cpu":
        graph = read_graph(path, input_shapes=input_shapes, outputs=outputs)
        return compile_cuda(graph, output_dir, target, model_sha256=sha or file_sha256(path), source=source, **options)

    def build() -> CompiledModel:
        graph = read_graph(path, input_shapes=input_shapes, outputs=outputs)
        return compile_graph(graph, output_dir, emit=emit, model_sha256=sha or file_sha256(path),
                             frontend_seconds=time.perf_counter() - t0, chunks=chunks, source=source, **options)

    use = bool(sha) and (compile_cache.enabled_by_default() if cache is None else cache)
    companions = compile_cache.model_companions(p) if use else None
    if companions is None:  # no cache, or external data missing (the frontend says so)
        model = build()
        model.cache = {"hit": False, "key": None}
        return model
    chunks = chunks or os.cpu_count() or 1
    inputs = compile_cache.cache_inputs(sha, Options(**options), shapes, outputs, list(emit), chunks, companions)
    return compile_cache.cached_compile(build, output_dir, inputs, model_path=source["path"])


def load(directory: str | os.PathLike) -> CompiledModel:
    """Load an artifact folder written by ``polyml build``."""
    return CompiledModel(directory)


__all__ = ["compile", "compile_graph", "load", "read_graph"]
