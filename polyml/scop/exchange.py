"""The JSCoP round trip through ``opt``: export SCoPs, check edited ones, import them.

Both directions run Polly at the same place (after its early canonicalization, on the nests as
the lowering emitted them; :data:`polyml.driver.flags.SCOP_CANONICALIZE`), so the regions and
statements of an exported file are exactly those the importer sees.  Import is its own ``opt``
step before the module's policy pipeline::

    lowered.ll ─ canonicalize, polly-import-jscop, polly-codegen ─▶ scop.ll ─ policy opt (-O3 …) ─▶ .o

and the policy pipeline's Polly (if any) leaves the imported functions alone
(``-polly-ignore-func``), so the imported schedule is what runs.  Every edited JSCoP is checked
first: same SCoP (statements, domains, accesses) and a legal schedule under the dependences of
the original (:mod:`polyml.scop.legality`).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import islpy as isl

from polyml.codegen.identical import callers
from polyml.codegen.lower import lower_graph
from polyml.driver import flags
from polyml.driver.toolchain import host_target, run_tool, tool
from polyml.errors import ToolchainError
from polyml.passes.fuse import FuseOperators
from polyml.pipeline import prepare
from polyml.scop import importable, legality
from polyml.scop import jscop as J
from polyml.scop.detect import Detection, Scop, detect


def defined_functions(ll_text: str) -> list[str]:
    """Names of the functions an LLVM IR text defines."""
    return [m.group(1).strip('"') for m in re.finditer(r'^define [^@]*@("(?:[^"\\]|\\.)*"|[\w.$-]+)\(', ll_text, re.M)]


def export(sources: Sequence[Path], out_dir: Path, jobs: int = 1, keep_failed: Path | None = None) -> list[Path]:
    """Write the JSCoP of every SCoP of the IR files ``sources`` into ``out_dir`` (Polly's
    files as they are; :func:`polyml.scop.detect.detect` also collects rejections).
    ``keep_failed``: if opt fails, keep its input IR and the command under
    ``keep_failed/failed/`` (as ``polyml build`` does) and report opt's own message."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def one(src: Path) -> None:
        cmd = [tool("opt"), *flags.scop_export_flags(str(out_dir.resolve()), inspect=False), src.name, "-disable-output"]
        if keep_failed is not None:
            run_tool(cmd, keep_failed, [src.resolve()], "JSCoP export (opt)", cwd=src.parent)
            return
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=src.parent)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise ToolchainError(f"JSCoP export failed (exit {proc.returncode}):\n{tail}\n  reproduce with: {shlex.join(cmd)}")

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, sources))
    return J.find(out_dir)


@dataclass
class Imports:
    """JSCoPs checked and staged for import, by module."""

    stage: Path
    #: module name → functions whose SCoPs are imported there
    functions: dict[str, list[str]] = field(default_factory=dict)
    #: user file name → digest of what was imported
    files: dict[str, str] = field(default_factory=dict)
    #: module name → extra import flags (Polly's OpenMP code where a pass asked for it)
    extra: dict[str, list[str]] = field(default_factory=dict)


def stage_imports(edited: Mapping[str, dict], sources: Mapping[str, Path], stage: Path,
                  detected: Mapping[str, Detection] | None = None, skip_unchanged: bool = True) -> Imports:
    """Check ``edited`` (``{file name: JSCoP}``) against freshly detected SCoPs of ``sources``
    (``{module name: IR file}``) and write the folder Polly imports from.

    Every SCoP of an imported function needs a file (Polly's importer stops otherwise): the
    ones not edited are staged as exported.  With ``skip_unchanged``, a file equal to the
    build's own export (:func:`same_scop`) imports nothing, so a build's JSCoPs imported
    unchanged give the same code; a function is imported where at least one of its files
    differs (``polyml opt`` imports every file, an unchanged one too: Polly's own round trip).  ``detected``: detections (of all functions) of
    modules already at hand, by module name.
    """
    stage.mkdir(parents=True, exist_ok=True)
    owner: dict[str, str] = {}
    for module, path in sources.items():
        for fn in defined_functions(path.read_text()):
            owner.setdefault(fn, module)
    wanted: dict[str, dict[str, dict]] = {}
    for name, data in edited.items():
        fn, region = J.split_file_name(name)
        if fn not in owner:
            known = ", ".join(sorted(owner)[:12]) + (" ..." if len(owner) > 12 else "")
            raise J.JscopError(f"{name}: no function {fn!r} in this build (functions: {known})")
        wanted.setdefault(fn, {})[region] = data
    imports = Imports(stage)
    for fn in wanted:
        imports.functions.setdefault(owner[fn], []).append(fn)
    for module, fns in imports.functions.items():
        found = (detected or {}).get(module) or detect(sources[module], functions=fns)
        by_fn = found.by_function()
        for fn in fns:
            originals = {s.region: s for s in by_fn.get(fn, [])}
            for region, data in list(wanted[fn].items()):
                name = J.file_name(fn, region)
                orig = originals.get(region)
                if orig is None:
                    have = ", ".join(sorted(originals)) or "none"
                    raise J.JscopError(f"{name}: {fn} has no SCoP {region!r} (its SCoPs: {have}); re-export with --emit jscop")
                if skip_unchanged and same_scop(orig.jscop, data):  # as the build exports it: nothing to import
                    del wanted[fn][region]
                    continue
                legality.check(orig.jscop, data, name, access_kinds=orig.access_kinds)
                wanted[fn][region] = importable.prepare(data, name)
            if not wanted[fn]:  # every file as exported: the function keeps its own code
                continue
            for region, orig in originals.items():
                data = wanted[fn].get(region, orig.jscop)
                J.dump(J.padded(J.for_polly(data)), stage / orig.file_name)
                if region in wanted[fn]:
                    imports.files[orig.file_name] = J.digest(data)
    for module in list(imports.functions):
        imports.functions[module] = [fn for fn in imports.functions[module] if wanted[fn]]
        if not imports.functions[module]:
            del imports.functions[module]
    return imports


def same_scop(original: Mapping, edited: Mapping) -> bool:
    """Whether ``edited`` has ``original``'s statements with the same domains, schedules and
    accesses (as isl sets and maps, so a re-printed relation is the same): a build's own
    export, imported unchanged."""
    a, b = original.get("statements", []), edited.get("statements", [])
    if [s.get("name") for s in a] != [s.get("name") for s in b]:
        return False
    try:
        for s, t in zip(a, b):
            if not isl.Set(s["domain"]).is_equal(isl.Set(t["domain"])) or \
                    not isl.Map(s["schedule"]).is_equal(isl.Map(t["schedule"])):
                return False
            acc_a, acc_b = s.get("accesses", []), t.get("accesses", [])
            if len(acc_a) != len(acc_b) or any(
                    x.get("kind") != y.get("kind") or not isl.Map(x["relation"]).is_equal(isl.Map(y["relation"]))
                    for x, y in zip(acc_a, acc_b)):
                return False
    except (isl.Error, KeyError, TypeError):
        return False  # malformed: the legality check reports it
    return True


def load_dir(folder: str | Path) -> dict[str, dict]:
    """``{file name: JSCoP}`` of a folder of (edited) JSCoP files."""
    files = J.find(folder)
    if not files:
        raise J.JscopError(f"{folder}: no {J.SUFFIX} files to import")
    return {p.name: J.load(p) for p in files}


def apply_imports(src: Path, dst: Path, stage: Path, functions: list[str], opt_level: int = 0,
                  extra: Sequence[str] = (), keep_failed: Path | None = None) -> None:
    """``opt``: import the staged JSCoPs of ``functions`` into ``src`` and generate their code.

    ``keep_failed``: if opt fails, keep its input IR, the staged JSCoPs and the command under
    ``keep_failed/failed/`` (as ``polyml build`` does) and report opt's own message."""
    cmd = [tool("opt"), *flags.scop_import_flags(str(stage.resolve()), functions, opt_level), *extra, src.name, "-S",
           "-o", str(dst)]
    if keep_failed is not None:
        run_tool(cmd, keep_failed, [src.resolve(), stage.resolve()], "JSCoP import (opt)", cwd=src.parent)
        return
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=src.parent)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise ToolchainError(f"JSCoP import failed (exit {proc.returncode}):\n{tail}\n"
                             f"  reproduce with: cd {shlex.quote(str(src.parent))} && {shlex.join(cmd)}")


def transform(src: Path, dst: Path, rewrite: Callable[[Scop], dict | None], work: Path, opt_level: int = 0,
              keep_jscop: Path | None = None, extra: Sequence[str] = (), keep_unchanged: bool = False,
              keep_failed: Path | None = None, found: Detection | None = None) -> tuple[Detection, dict[str, dict]]:
    """Detect the SCoPs of ``src``, rewrite each with ``rewrite`` (None: leave it alone), check
    and import the results into ``dst``.  Returns the detection and the new JSCoPs by file.

    A rewritten SCoP whose schedule orders every instance as before is left alone unless
    ``keep_unchanged`` (the ``identity`` round trip): regenerating the same order buys nothing,
    and Polly's importer re-analyses each SCoP of a function after generating the code of the
    one before, which can stop matching the exported file (measured: two va_arg regions of one
    function, each importable alone, abort opt together: "The number of memory accesses in the
    JSop file and the number of memory accesses differ").  ``keep_failed``: see
    :func:`apply_imports`.  ``found``: ``src``'s detection if the caller has it."""
    found = found or detect(src)
    new: dict[str, dict] = {}
    for s in found.scops:
        data = rewrite(s)
        if data is not None and (keep_unchanged or not importable.same_schedules(s.jscop, data)):
            new[s.file_name] = data
    if keep_jscop is not None:
        keep_jscop.mkdir(parents=True, exist_ok=True)
        for s in found.scops:
            J.dump(s.jscop, keep_jscop / s.file_name)
            if s.file_name in new:
                J.dump(new[s.file_name], keep_jscop / (s.file_name + ".new"))
    work.mkdir(parents=True, exist_ok=True)
    local = work / src.name
    if local.resolve() != src.resolve():
        shutil.copy(src, local)
    imports = stage_imports(new, {"input": local}, work / "stage", {"input": found}, skip_unchanged=False) \
        if new else None
    functions = imports.functions.get("input", []) if imports is not None else []
    if not functions:  # nothing rewritten, or every rewrite the schedule it had
        if opt_level:
            run_opt(local, dst, [f"-O{opt_level}"], keep_failed)
        else:
            shutil.copy(src, dst)
        return found, new
    extra = [*extra, *parallel_flags(new.values())]
    apply_imports(local, dst, imports.stage, functions, opt_level, extra, keep_failed)
    return found, new


def parallel_flags(jscops: Iterable[Mapping]) -> list[str]:
    """Polly's OpenMP flags if a pass asked for parallel loops in one of ``jscops`` (metadata
    ``parallel``, :mod:`polyml.passes.parallel`), with the largest thread count asked for."""
    asks = [d[J.META]["parallel"] for d in jscops if isinstance(d.get(J.META), dict) and "parallel" in d[J.META]]
    if not asks:
        return []
    threads = [int(a.get("threads", 0)) for a in asks]
    return flags.polly_parallel_flags(0 if 0 in threads else max(threads))


def run_opt(src: Path, dst: Path, args: list[str], keep_failed: Path | None = None) -> None:
    """``opt ARGS src -o dst``; ``keep_failed``: as in :func:`apply_imports`."""
    cmd = [tool("opt"), *args, src.name, "-S", "-o", str(dst)]
    if keep_failed is not None:
        run_tool(cmd, keep_failed, [src.resolve()], "opt", cwd=src.parent)
        return
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=src.parent)
    if proc.returncode != 0:
        raise ToolchainError(f"opt failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}\n  reproduce with: {shlex.join(cmd)}")


@dataclass
class Sources:
    """IR files to find SCoPs in, and the op each function belongs to."""

    files: dict[str, Path]
    #: function → the graph node labels of the ops that call it, the one it was lowered from
    #: first (several where their bodies were identical: :mod:`polyml.codegen.identical`)
    callers: dict[str, list[str]] = field(default_factory=dict)

    def op_of(self, function: str) -> str:
        """The node a function was lowered from (helpers ``<fn>.gemm2d``, ``<fn>.par0`` belong
        to ``<fn>``); the function's own name outside a model."""
        return self.ops_of(function)[0]

    def ops_of(self, function: str) -> list[str]:
        """Every node whose op runs ``function`` (or its helper), the first :meth:`op_of`'s."""
        name = function
        while name not in self.callers and "." in name:
            name = name.rsplit(".", 1)[0]
        return self.callers.get(name, [function])


def model_sources(model: Path, work: Path, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
                  outputs: list[str] | None = None, fuse: bool = True, chunks: int = 1, parallel: bool = True) -> Sources:
    """Lower a model file (or take an ``.ll`` file as is) into IR files as ``polyml build`` does
    (``fuse``, ``parallel``: its ``--fuse`` and ``--threads N`` ≠ 1), so that function, region
    and statement names are the ones a build exports and imports."""
    if model.suffix == ".ll":
        if not model.is_file():
            raise J.JscopError(f"{model}: no such IR file")
        return Sources({"input": model})
    # as build does: quantized models' integer ops, then fusion
    graph = prepare(model, input_shapes=input_shapes, outputs=outputs, fusion=FuseOperators() if fuse else None).graph
    # products in the plain form (Polly's GEMM pattern): the packed GEMM's nests are not affine
    lowered = lower_graph(graph, host_target(), chunks=chunks, parallel=parallel, packed_gemm=False)
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, module in lowered.modules.items():
        path = work / f"ops.{name}.ll"
        path.write_text(str(module))
        files[f"ops.{name}"] = path
    return Sources(files, callers(lowered.steps))
