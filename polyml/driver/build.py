"""The compile pipeline: graph → LLVM modules → opt (Polly) → llc → one shared object.

Stages and their outputs in the artifact folder:

1. ``lower``: one ``.ll`` module per Polly policy plus the entry module (kept with ``--emit ll``)
2. ``opt``: ``opt-19`` with the policy's flags (:mod:`polyml.driver.flags`), modules in parallel
3. ``llc``: object files for the host CPU
4. ``link``: ``model.so`` (clang-19, GNU OpenMP), ``weights.bin`` and ``manifest.json``

A failing tool leaves its input and the exact command under ``DIR/failed/`` for reproduction.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import llvmlite

from polyml import __version__
from polyml.codegen.builder import module_text
from polyml.codegen.gemm import blocking_for_host
from polyml.codegen.lower import LoweredModel, lower_graph
from polyml.driver import artifact, flags
from polyml.driver.toolchain import host_target, tool, tool_version
from polyml.errors import PolymlError, ToolchainError
from polyml.graph import Graph

if TYPE_CHECKING:
    from polyml.scop.exchange import Imports

MANIFEST = "manifest.json"
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
JSCOP_DIR = "jscop"  # --emit jscop: Polly's JSCoP of every SCoP
JSCOP_IMPORTED = "jscop-imported"  # --import-jscop: what was imported (edited and completing files)
#: --emit fusion.svg|fusion.png|fusion-dot: the graph after fusion (polyml.plot.fusion), file written
FUSION_PICTURES = {"fusion.svg": "fusion.svg", "fusion.png": "fusion.png", "fusion-dot": "fusion.dot"}


def run_tool(cmd: list[str], outdir: Path, inputs: list[Path], what: str, cwd: Path | None = None) -> None:
    """Run one toolchain command; on failure save its inputs and a reproducing command, then raise.

    Everything lands in ``outdir/failed/<input stem>.*``: the input files (a folder, e.g. of
    JSCoPs to import, is copied whole), ``.command.sh`` (the command with its input and ``-o``
    paths, also as ``-flag=PATH``, pointing into ``failed/``) and ``.stderr.txt``.  The error
    shows the tool's own message (:func:`tool_message`), not its crash backtrace.
    """
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    if proc.returncode == 0:
        return
    fail = outdir / "failed"
    fail.mkdir(parents=True, exist_ok=True)
    stem = inputs[0].stem if inputs else what.split()[0]
    moved = {str(p): str(fail / p.name) for p in inputs}
    for src, dst in moved.items():
        if Path(src).is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
        else:
            shutil.copy(src, dst)
    if cwd is not None:  # arguments relative to cwd name the same inputs
        moved |= {os.path.relpath(p, cwd): str(fail / p.name) for p in inputs}
    repro = []
    for i, arg in enumerate(cmd):
        if i > 0 and cmd[i - 1] == "-o":
            arg = str(fail / f"{Path(arg).stem}.out{Path(arg).suffix}")
        flag, eq, value = str(arg).partition("=")
        if eq and flag.startswith("-") and value in moved:
            arg = f"{flag}={moved[value]}"
        repro.append(moved.get(str(arg), str(arg)))
    command = shlex.join(repro)
    (fail / f"{stem}.command.sh").write_text(command + "\n")
    (fail / f"{stem}.stderr.txt").write_text(proc.stderr)
    raise ToolchainError(
        f"{what} failed (exit {proc.returncode}): {tool_message(proc.stderr) or 'no message'}\n"
        f"  input saved to: {', '.join(dict.fromkeys(moved.values())) or '-'}\n  reproduce with: {command}"
    )


#: where an LLVM tool's own message ends and its crash report (backtrace) begins
_CRASH_REPORT = ("PLEASE submit a bug report", "Stack dump:")
#: progress notes, not messages (Polly's JSCoP importer and exporter)
_PROGRESS = ("Reading JScop ", "Writing JScop ")


def tool_message(stderr: str, limit: int = 6) -> str:
    """The tool's own message in ``stderr``: for a crash, the lines it printed before LLVM's
    crash report (an ``Assertion ... failed``, ``LLVM ERROR: ...`` and the reason before it,
    an isl error), without progress notes; otherwise the first line that says error."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    crash = next((i for i, ln in enumerate(lines) if ln.startswith(_CRASH_REPORT)), None)
    if crash is not None:
        own = [ln for ln in lines[:crash] if not ln.startswith(_PROGRESS)]
        if own:
            return "\n".join(own[-limit:])
    lines = [ln for ln in lines if not ln.startswith(_PROGRESS)]
    return next((ln for ln in lines if "error" in ln.lower() or "unknown" in ln.lower()), lines[0] if lines else "")


def toolchain_versions() -> dict[str, str]:
    return {
        "polyml": __version__,
        "opt": tool_version("opt"),
        "llc": tool_version("llc"),
        "clang": tool_version("clang"),
        "llvmlite": llvmlite.__version__,
        **artifact.library_versions(),
    }


def build_artifact(
    graph: Graph,
    options: flags.Options,
    outdir: str | os.PathLike,
    emit: frozenset[str] = frozenset(),
    model_sha256: str = "",
    frontend_seconds: float = 0.0,
    chunks: int | None = None,
    source: dict | None = None,
) -> dict:
    """Compile ``graph`` into the folder ``outdir``; returns the manifest written there.

    ``chunks``: modules per policy (default: one per core; recorded for rebuilds);
    ``source``: how the graph was read (model path, input shapes, outputs), for the manifest.
    """
    out = Path(outdir)
    _check_jscop_folder(options, out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "failed").exists() and shutil.rmtree(out / "failed")
    artifact.clean_previous(out)
    chunks = chunks or os.cpu_count() or 1
    seconds: dict[str, float] = {"frontend": round(frontend_seconds, 4)}
    target = host_target()

    from polyml.passes.quantize import QuantizeQDQ

    t0 = time.perf_counter()
    graph, quantization = QuantizeQDQ().apply(graph)  # QDQ sandwiches → integer ops (no-op without Q/DQ)
    seconds["quantize"] = time.perf_counter() - t0
    fusion = None
    unfused = graph
    packed = options.gemm == "packed" and not options.import_jscop
    parallel = options.parallel and options.threads != 1
    if options.fuse:
        from polyml.codegen.gemm import packed_gemm
        from polyml.passes.fuse import FuseOperators

        t0 = time.perf_counter()
        with packed_gemm(packed, options.conv, parallel):  # some fused forms exist for some kernels only
            graph, fusion = FuseOperators(attention=options.attention).apply(graph)
        seconds["fuse"] = time.perf_counter() - t0
    from polyml.codegen.tiling import resolve as resolve_tiles

    tiles = resolve_tiles(options.tile_sizes)
    t0 = time.perf_counter()
    lowered = lower_graph(graph, target, chunks=chunks, parallel=parallel, in_place_concat=options.fuse,
                          tile_bytes=tiles.conv_bytes, packed_gemm=packed, conv=options.conv)
    if fusion is not None:  # the lowering decides Concat placement; its entries join the report
        fusion.groups.extend(lowered.concat_in_place)
        fusion.blocked.extend(lowered.concat_blocked)
    seconds["lower"] = time.perf_counter() - t0
    for kind in sorted(emit & FUSION_PICTURES.keys()):  # the graph after fusion, refusals labelled
        from polyml.plot import fusion as fusion_picture

        fusion_picture.write(unfused, fusion.to_json() if fusion is not None else None, out / FUSION_PICTURES[kind],
                             title=f"{graph.name}: fusion" + ("" if options.fuse else " (--no-fuse)"))

    with tempfile.TemporaryDirectory(prefix="polyml-") as tmp:
        work = Path(tmp)
        modules = {**{f"ops.{p}": m for p, m in lowered.modules.items()}, "entry": lowered.entry}
        t0 = time.perf_counter()
        sources = {}
        for name, m in modules.items():
            path = work / f"{name}.ll"
            path.write_text(module_text(m))
            sources[name] = path
        seconds["emit"] = time.perf_counter() - t0
        scop_imports = _stage_jscop_imports(options, sources, out, seconds, {s.function: s.policy for s in lowered.steps})

        def optimize(name: str) -> tuple[Path, float]:
            t = time.perf_counter()
            policy = name.split(".")[1] if name.startswith("ops.") else "off"
            dst = work / f"{name}.opt.ll"
            # input relative to cwd: opt names the module (ModuleID, source_filename, the object's
            # FILE symbol) after it, and the temporary folder must not leak into the artifact
            src, imported = sources[name], scop_imports.functions.get(name, []) if scop_imports else []
            if imported:  # Polly imports the edited schedules first; the policy pipeline keeps them
                src = work / f"{name}.scop.ll"
                cmd = [tool("opt"), *flags.scop_import_flags(str(scop_imports.stage.resolve()), imported),
                       *scop_imports.extra.get(name, []), sources[name].name, "-S", "-o", str(src)]
                run_tool(cmd, out, [sources[name]], f"JSCoP import ({name})", cwd=work)
            cmd = [tool("opt"), *flags.opt_flags(policy, options), *flags.ignore_functions_flags(imported), src.name,
                   "-S", "-o", str(dst)]
            run_tool(cmd, out, [src], f"opt ({name})", cwd=work)
            obj = work / f"{name}.o"
            run_tool([tool("llc"), *flags.llc_flags(), str(dst), "-o", str(obj)], out, [dst], f"llc ({name})")
            return obj, time.perf_counter() - t

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
            results = dict(zip(modules, pool.map(optimize, modules)))
        seconds["opt+llc"] = time.perf_counter() - t0
        seconds["opt+llc per module"] = {k: round(v[1], 4) for k, v in results.items()}

        t0 = time.perf_counter()
        lib = out / LIBRARY
        objs = [str(o) for o, _ in results.values()]
        run_tool([tool("clang"), *flags.link_flags(), *objs, "-o", str(lib)], out, [], "link")
        seconds["link"] = time.perf_counter() - t0

        if "jscop" in emit:  # the SCoPs of the lowered modules, as Polly exports them
            from polyml.scop import exchange

            t0 = time.perf_counter()
            exchange.export([p for k, p in sources.items() if k != "entry"], out / JSCOP_DIR, jobs=os.cpu_count() or 1,
                            keep_failed=out)
            seconds["jscop export"] = time.perf_counter() - t0
        if "ll" in emit:
            for name, path in sources.items():
                shutil.copy(path, out / f"{name}.ll")
                shutil.copy(work / f"{name}.opt.ll", out / f"{name}.opt.ll")
                if (work / f"{name}.scop.ll").exists():  # after the JSCoP import, before the policy opt
                    shutil.copy(work / f"{name}.scop.ll", out / f"{name}.scop.ll")

    (out / WEIGHTS).write_bytes(lowered.weights)
    manifest = _manifest(graph, lowered, options, model_sha256, seconds, out)
    manifest["fusion"] = fusion.to_json() if fusion is not None else None
    quantized = quantization.integer or quantization.ran_in_float or quantization.folded_constants
    manifest["quantization"] = {"summary": quantization.summary(), **quantization.to_json()} if quantized else None
    manifest["tiling"] = tiles.to_json()
    build_inputs = dict(source or {})
    manifest["model"]["path"] = build_inputs.pop("path", "")
    manifest["build"] = {"chunks": chunks, "emit": sorted(emit), **build_inputs}
    manifest["jscop"] = {f: h for f, h in manifest["files"].items() if f.endswith(".jscop")}
    manifest["artifact_sha256"] = artifact.artifact_sha256(manifest)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    return manifest


def _check_jscop_folder(options: flags.Options, out: Path) -> None:
    """A rebuild deletes the previous artifact's files: edited JSCoPs must live elsewhere."""
    if options.import_jscop and out.resolve() in [Path(options.import_jscop).resolve(), *Path(options.import_jscop).resolve().parents]:
        raise PolymlError(f"--import-jscop {options.import_jscop}: the folder lies inside the artifact folder {out} that this "
                          "build replaces; copy the edited files elsewhere first (e.g. cp -r ART/jscop edits)")


def _stage_jscop_imports(options: flags.Options, sources: dict[str, Path], out: Path, seconds: dict,
                         policies: dict[str, str] | None = None) -> Imports | None:
    """``--import-jscop`` / ``--passes``: check the edited JSCoPs, or the pipeline's results
    (same SCoPs, legal schedules) and stage them in the artifact's ``jscop-imported/``
    (:mod:`polyml.scop.exchange`); None without either.  Edited files win over the pipeline."""
    if not options.import_jscop and not options.passes:
        return None
    from polyml.scop import exchange

    t0 = time.perf_counter()
    stage = out / JSCOP_IMPORTED
    shutil.rmtree(stage, ignore_errors=True)
    ops = {k: p for k, p in sources.items() if k != "entry"}
    edited = exchange.load_dir(options.import_jscop) if options.import_jscop else {}
    detected = None
    if options.passes:
        from polyml.scop.optimize import pipeline_jscops

        found, piped = pipeline_jscops(ops, options.passes, policies or {}, options.threads)
        edited = {**piped, **edited}
        detected = found
        seconds["jscop passes"] = time.perf_counter() - t0
    imports = exchange.stage_imports(edited, ops, stage, detected)
    if options.parallel and options.threads != 1:
        for module, fns in imports.functions.items():
            asks = [edited[n] for n in edited if n.split(exchange.J.SEPARATOR, 1)[0] in fns]
            imports.extra[module] = exchange.parallel_flags(asks)
    seconds["jscop import check"] = time.perf_counter() - t0
    return imports


def _passes_record(text: str) -> list[dict]:
    if not text:
        return []
    if text == "default":
        return [{"name": "default", "options": {}}]
    from polyml.passes import parse_pipeline

    return [{"name": p.name, "options": {k: list(v) if isinstance(v, tuple) else v for k, v in p.options().items()}}
            for p in parse_pipeline(text)]


def _manifest(graph: Graph, lowered: LoweredModel, options: flags.Options, model_sha256: str, seconds: dict, out: Path) -> dict:
    for k, v in seconds.items():
        if isinstance(v, float):
            seconds[k] = round(v, 4)
    target = host_target()
    return {
        "format": 1,
        "model": {"name": graph.name, "sha256": model_sha256},
        "versions": toolchain_versions(),
        "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features},
        "options": options.to_json(),
        "opt_flags": {p: flags.opt_flags(p, options) for p in sorted({k.split(".")[0] for k in lowered.modules})},
        "llc_flags": flags.llc_flags(),
        "link_flags": flags.link_flags(),
        # polyml's JSCoP passes in order, each {"name": ..., "options": {...}} (--passes)
        "passes": _passes_record(options.passes),
        "inputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in lowered.inputs.items()],
        "outputs": [{"name": n, "shape": list(t.shape), "dtype": t.dtype} for n, t in lowered.outputs.items()],
        "slots": [s.to_json() for s in lowered.slots],
        "arena_bytes": lowered.arena_bytes,
        "weights_bytes": len(lowered.weights),
        "intermediate_bytes": lowered.intermediate_bytes,
        "loop_nests": lowered.loop_nests,
        "gemm_blocking": dataclasses.asdict(blocking_for_host()),
        "functions": [
            {"function": s.function, "node": s.node, "op_type": s.op_type, "policy": s.policy, "detail": s.detail,
             "flops": s.flops, "bytes": s.bytes, "out_elements": s.out_elements} for s in lowered.steps
        ],
        "seconds": seconds,
        "files": artifact.file_hashes(out),  # every file written (JSCoP included), sorted
    }
