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
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from polyml.codegen.builder import module_text
from polyml.codegen.gemm import blocking_for_host
from polyml.codegen.lower import LoweredModel, lower_graph
from polyml.codegen.tiling import resolve as resolve_tiles
from polyml.driver import artifact, flags
from polyml.driver.toolchain import host_target, run_tool, tool, tool_message, toolchain_versions  # noqa: F401 - re-exported
from polyml.errors import PolymlError
from polyml.graph import Graph
from polyml.passes import parse_pipeline
from polyml.passes.fuse import FuseOperators
from polyml.pipeline import prepare
from polyml.schedule import exchange as schedule_exchange
from polyml.scop import exchange
from polyml.scop.exchange import Imports
from polyml.scop.optimize import pipeline_jscops

MANIFEST = "manifest.json"
LIBRARY = "model.so"
WEIGHTS = "weights.bin"
JSCOP_DIR = "jscop"  # --emit jscop: Polly's JSCoP of every SCoP
JSCOP_IMPORTED = "jscop-imported"  # --import-jscop: what was imported (edited and completing files)
#: --emit fusion.svg|fusion.png|fusion-dot: the graph after fusion (polyml.plot.fusion), file written
FUSION_PICTURES = {"fusion.svg": "fusion.svg", "fusion.png": "fusion.png", "fusion-dot": "fusion.dot"}


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

    # the same lowering with or without --import-jscop: the files name the functions it makes
    packed = options.gemm in ("packed", "schedule")
    parallel = options.parallel and options.threads != 1
    # QDQ sandwiches → integer ops (no-op without Q/DQ), then fusion
    config = options.codegen(packed, parallel)
    prepared = prepare(graph, fusion=FuseOperators(attention=options.attention, config=config) if options.fuse else None)
    graph, unfused, quantization, fusion = prepared.graph, prepared.unfused, prepared.quantization, prepared.fusion
    seconds.update(prepared.seconds)
    tiles = resolve_tiles(options.tile_sizes)
    t0 = time.perf_counter()
    edits = schedule_exchange.load(options.import_schedules) if options.import_schedules else {}
    lowered = lower_graph(graph, target, chunks=chunks, parallel=parallel, in_place_concat=options.fuse,
                          tile_bytes=tiles.conv_bytes, config=config,
                          schedule_tiles={n: dict(e.tiles) for n, e in edits.items() if e.tiles})
    schedule_exchange.check_applied(edits, lowered.steps)
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

        if "schedules" in emit:  # what polyml's schedules ran: plans, trees, loops (--import-schedules reads them)
            schedule_exchange.write(out / schedule_exchange.FOLDER, lowered.steps)
        if "jscop" in emit:  # the SCoPs of the lowered modules, as Polly exports them
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
    manifest["graph_passes"] = prepared.graph_passes
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
    """A rebuild deletes the previous artifact's files: edited JSCoPs and schedules must live elsewhere."""
    for flag, folder, sub in (("--import-jscop", options.import_jscop, JSCOP_DIR),
                              ("--import-schedules", options.import_schedules, schedule_exchange.FOLDER)):
        if folder and out.resolve() in [Path(folder).resolve(), *Path(folder).resolve().parents]:
            raise PolymlError(f"{flag} {folder}: the folder lies inside the artifact folder {out} that this "
                              f"build replaces; copy the edited files elsewhere first (e.g. cp -r ART/{sub} edits)")


def _stage_jscop_imports(options: flags.Options, sources: dict[str, Path], out: Path, seconds: dict,
                         policies: dict[str, str] | None = None) -> Imports | None:
    """``--import-jscop`` / ``--passes``: check the edited JSCoPs, or the pipeline's results
    (same SCoPs, legal schedules) and stage them in the artifact's ``jscop-imported/``
    (:mod:`polyml.scop.exchange`); None without either.  Edited files win over the pipeline."""
    if not options.import_jscop and not options.passes:
        return None
    t0 = time.perf_counter()
    stage = out / JSCOP_IMPORTED
    shutil.rmtree(stage, ignore_errors=True)
    ops = {k: p for k, p in sources.items() if k != "entry"}
    edited = exchange.load_dir(options.import_jscop) if options.import_jscop else {}
    detected = None
    if options.passes:
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
        "gemm_blocking": dataclasses.asdict(blocking_for_host(options.codegen(False, False).gemm_blocking)),
        "functions": [
            {"function": s.function, "node": s.node, "op_type": s.op_type, "policy": s.policy, "detail": s.detail,
             "flops": s.flops, "bytes": s.bytes, "out_elements": s.out_elements, "path": s.path, "reason": s.reason,
             **({"schedules": list(s.schedules)} if s.schedules else {}),
             **({"plans": list(s.plans)} if s.plans else {}),
             **({"shared": True} if s.shared else {})} for s in lowered.steps
        ],
        "seconds": seconds,
        "files": artifact.file_hashes(out),  # every file written (JSCoP included), sorted
    }
