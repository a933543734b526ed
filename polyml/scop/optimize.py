"""``polyml opt``'s engine: a pipeline (or the default policy) over every SCoP of an IR file,
Polly's own optimizer for the functions left to it, and ``--tune``'s measured search.

Per SCoP the pipeline is the one given, or the default policy's
(:func:`polyml.passes.pipeline.choose`: polyml's pipeline, or ``polly`` for matrix products).
A function with a SCoP left to Polly is left to Polly entirely (Polly optimizes functions; a
function whose code polyml imported is no SCoP of the same shape any more): after the import
step ``opt -O3 -polly [-polly-parallel]`` runs on those functions only (``-polly-only-func``).
Polly may leave a SCoP as it is (its scheduler found nothing better, or its assumptions did not
hold); under the default policy such functions then get polyml's pipeline instead (the step
runs again with them kept from Polly), so that a hand-off to Polly never ends as plain -O3.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from polyml.driver import flags
from polyml.driver.toolchain import tool
from polyml.errors import PolymlError, ToolchainError
from polyml.passes import parse_pipeline, split_pipeline
from polyml.passes import pipeline as P
from polyml.passes import run as run_passes
from polyml.scop import exchange, importable
from polyml.scop.detect import Detection, detect


@dataclass
class Result:
    """What one ``polyml opt`` run did."""

    found: Detection
    #: new JSCoPs by file name (imported)
    new: dict[str, dict]
    #: pipeline by SCoP file name (every SCoP a pipeline ran on)
    pipelines: dict[str, str] = field(default_factory=dict)
    #: functions handed to Polly's own optimizer
    polly: list[str] = field(default_factory=list)
    #: functions Polly's optimizer left unchanged (under the default policy polyml's pipeline ran
    #: there instead, and they are not in ``polly``)
    dismissed: list[str] = field(default_factory=list)


def run(src: Path, out: Path, work: Path, pipeline: str | None, edited: Mapping[str, dict] | None = None,
        threads: int = 0, opt_level: int = 0, keep_jscop: Path | None = None, extra: Sequence[str] = (),
        keep_unchanged: bool = False, keep_failed: Path | None = None) -> Result:
    """Apply ``pipeline`` (None: the default policy; "": only ``edited``) to the SCoPs of ``src``.

    Under the default policy, functions Polly's optimizer left unchanged are taken from Polly and
    the whole step runs again with polyml's pipeline on them (on the same detection)."""
    edited = edited or {}
    found = detect(src)
    not_polly: frozenset[str] = frozenset()
    dismissed: set[str] = set()
    while True:
        result = _apply(src, out, work, found, pipeline, edited, not_polly, threads, opt_level=opt_level,
                        keep_jscop=keep_jscop, extra=extra, keep_unchanged=keep_unchanged, keep_failed=keep_failed)
        dismissed |= set(result.dismissed)
        if pipeline is not None or edited or not result.dismissed:
            result.dismissed = sorted(dismissed)
            return result
        not_polly |= frozenset(result.dismissed)  # never handed to Polly again: the loop ends


def _apply(src: Path, out: Path, work: Path, found: Detection, pipeline: str | None, edited: Mapping[str, dict],
           not_polly: frozenset[str], threads: int, **transform) -> Result:
    """One step of :func:`run`: choose per SCoP, import, then Polly on the functions left to it
    (``not_polly``: functions the default policy must not leave to Polly; ``transform``:
    :func:`polyml.scop.exchange.transform`'s options)."""
    chosen: dict[str, str] = {}
    ready: dict[str, dict] = {}  # the default policy's results, computed while choosing
    for s in found.scops:
        if pipeline is None:
            allow = s.function not in not_polly
            if P.choose(s.jscop, allow).pipeline == P.POLLY:
                chosen[s.file_name] = P.with_threads(P.POLLY, threads)
            else:
                ready[s.file_name], chosen[s.file_name] = P.apply_default(s.jscop, threads, allow)
        elif pipeline:
            chosen[s.file_name] = P.with_threads(pipeline, threads) if threads else pipeline
    to_polly = sorted({s.function for s in found.scops if _is_polly(chosen.get(s.file_name, ""))})
    parsed = {text: parse_pipeline(text) for text in set(chosen.values())}

    def rewrite(scop):
        if scop.function in to_polly:
            return None
        start = edited.get(scop.file_name)
        if start is None and scop.file_name in ready:
            return ready[scop.file_name]
        text = chosen.get(scop.file_name, "")
        if start is None and not text:
            return None
        return run_passes(parsed.get(text, []), start if start is not None else scop.jscop)

    found, new = exchange.transform(src, out, rewrite, work, found=found, **transform)
    drop_unroll_disable(out)
    dismissed: list[str] = []
    if to_polly:
        polly_optimize(out, to_polly, parallel=threads != 1 and any(
            _polly_parallel(chosen[s.file_name]) for s in found.scops if s.function in to_polly), threads=threads)
        dismissed = sorted(set(to_polly) - polly_functions(out.read_text()))
    pipelines = {k: v for k, v in chosen.items() if not any(s.file_name == k and s.function in to_polly for s in found.scops)}
    pipelines.update({s.file_name: "polly" for s in found.scops if s.function in to_polly})
    return Result(found, new, pipelines, to_polly, dismissed)


#: clang -O1 marks every loop ``llvm.loop.unroll.disable`` (its -O1 does not unroll): kept,
#: the -O3 that compiles polyml's output would not unroll the loops polyml left alone either
#: (floyd-warshall compiled from that IR: 0.92-1.04 s, from the source or from -O3 IR 0.62-0.80 s)
UNROLL_DISABLE = '!{!"llvm.loop.unroll.disable"}'


def drop_unroll_disable(ll: Path) -> bool:
    """Turn clang -O1's ``llvm.loop.unroll.disable`` hints in ``ll`` into a no-op loop property
    (``llvm.loop.mustprogress``, which every such loop already has); True if there were any."""
    text = ll.read_text()
    if UNROLL_DISABLE not in text:
        return False
    ll.write_text(text.replace(UNROLL_DISABLE, '!{!"llvm.loop.mustprogress"}'))
    return True


def _is_polly(text: str) -> bool:
    return bool(text) and any(name == "polly" for name, _ in split_pipeline(text))


def _polly_parallel(text: str) -> bool:
    return all(opts.get("parallel", "1").lower() in ("1", "true", "yes") for name, opts in split_pipeline(text)
               if name == "polly")


#: Polly at the start of the -O3 pipeline, on the IR polyml detected its SCoPs in.  At clang's
#: default position (before the vectorizer) the -O3 passes before it have rewritten the nests:
#: with sizes as ``int`` arguments Polly then assumes out-of-bounds accesses and dismisses
#: 2mm's SCoP (``-Rpass-analysis=polly-scops``: "Inbounds assumption: false"), which it
#: optimizes from the start
POLLY_POSITION = "-polly-position=early"


_DEFINE = re.compile(r"^define [^@]*@\"?([^\"(]+)\"?\(.*?^}$", re.M | re.S)
_POLLY_BLOCK = re.compile(r"^polly\.[\w.]*:", re.M)


def polly_functions(ir: str) -> set[str]:
    """The functions of the IR text ``ir`` that hold code Polly generated (its blocks are named
    ``polly.*`` and survive -O3, ``polly.split_new_and_old`` in every one): where Polly's
    optimizer took a SCoP rather than leaving it to the rest of -O3."""
    return {m.group(1) for m in _DEFINE.finditer(ir) if _POLLY_BLOCK.search(m.group(0))}


def polly_flags(functions: list[str], parallel: bool, threads: int = 0) -> list[str]:
    """``opt`` flags for Polly's own optimizer on ``functions`` (what ``clang -O3 -mllvm -polly``
    runs, restricted to them)."""
    out = ["-O3", "-polly", POLLY_POSITION, f"-polly-only-func={flags._function_regex(functions)}"]
    if parallel:
        out += ["-polly-parallel", "-polly-omp-backend=GNU", *([f"-polly-num-threads={threads}"] if threads > 1 else [])]
    return out


def polly_optimize(ll: Path, functions: list[str], parallel: bool, threads: int = 0) -> None:
    """Run Polly's optimizer on ``functions`` of the IR file ``ll`` in place."""
    tmp = ll.with_name(ll.name + ".polly.ll")
    cmd = [tool("opt"), *polly_flags(functions, parallel, threads), str(ll), "-S", "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
        raise ToolchainError(f"Polly's optimizer failed (exit {proc.returncode}):\n{tail}\n  reproduce with: {shlex.join(cmd)}")
    tmp.replace(ll)


# -- --tune ----------------------------------------------------------------------------------------

@dataclass
class Trial:
    pipeline: str
    seconds: float | None  # best wall time of the runs; None: failed
    error: str = ""


def _has_main(ll: Path) -> bool:
    return "main" in exchange.defined_functions(ll.read_text())


def time_program(exe: Path, runs: int, threads: int, timeout: float) -> float:
    """Best wall time of ``runs`` runs of ``exe`` (OMP_NUM_THREADS=threads when > 0)."""
    env = dict(os.environ)
    env.setdefault("GOMP_SPINCOUNT", "1000")
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([str(exe)], capture_output=True, env=env, timeout=timeout, cwd=exe.parent)
        dt = time.perf_counter() - t0
        if proc.returncode != 0:
            raise ToolchainError(f"{exe.name} exited with {proc.returncode}: {proc.stderr.decode(errors='replace')[-300:]}")
        best = min(best, dt)
    return best


def tune(src: Path, out: Path, variants: list[str], threads: int = 0, runs: int = 2, timeout: float = 120.0,
         cflags: Sequence[str] = ("-O3", "-march=native"), log=None) -> tuple[Trial, list[Trial]]:
    """Build ``src`` with each pipeline of ``variants`` (``polyml opt``, then clang with
    ``cflags``), time the programs (``src`` needs a ``main``), keep the fastest as ``out``.
    Also tried: the input without any transform (``none``), so tuning never loses to it."""
    if not _has_main(src):
        raise PolymlError(f"{src}: --tune runs the program: the IR needs a main function")
    trials: list[Trial] = []
    best: tuple[float, Path, Trial] | None = None
    with tempfile.TemporaryDirectory(prefix="polyml-tune-") as tmp:
        work = Path(tmp)
        for i, text in enumerate(["none", *variants]):
            ll, exe = work / f"v{i}.ll", work / f"v{i}"
            try:
                if text == "none":
                    shutil.copy(src, ll)
                else:
                    run(src, ll, work / f"w{i}", text, threads=threads)
                cmd = [tool("clang"), *cflags, str(ll), "-o", str(exe), "-lm", "-fopenmp=libgomp"]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise ToolchainError(f"clang failed: {proc.stderr.strip()[-300:]}")
                secs = time_program(exe, runs, threads, timeout)
                trial = Trial(text, secs)
                if best is None or secs < best[0]:
                    best = (secs, ll, trial)
            except (PolymlError, subprocess.TimeoutExpired) as e:
                trial = Trial(text, None, str(e).splitlines()[0][:300])
            trials.append(trial)
            if log:
                log(trial)
        if best is None:
            raise PolymlError(f"{src}: no variant built and ran ({trials[0].error})")
        shutil.copy(best[1], out)
    return best[2], trials


def write_choice(path: Path, chosen: Trial, trials: list[Trial], threads: int) -> None:
    """The tuning record: every pipeline tried with its seconds, and the one kept."""
    path.write_text(json.dumps({"chosen": asdict(chosen), "threads": threads, "trials": [asdict(t) for t in trials]},
                               indent=1) + "\n")


# -- polyml build --passes -------------------------------------------------------------------------

#: op-function policies whose SCoPs ``polyml build --passes`` transforms (``off``: nests too
#: small or memory-bound for a schedule change to pay, kept as plain -O3)
PASS_POLICIES = ("polly", "tile")


def _policy(function: str, policies: Mapping[str, str]) -> str:
    name = function
    while name not in policies and "." in name:
        name = name.rsplit(".", 1)[0]
    return policies.get(name, "")


def pipeline_jscops(sources: Mapping[str, Path], text: str, policies: Mapping[str, str],
                    threads: int = 0) -> tuple[dict[str, Detection], dict[str, dict]]:
    """The SCoPs of the modules ``sources`` (``{module: IR file}``) detected, and the pipeline
    ``text`` (``default``: the default policy per SCoP) applied to those of functions whose
    policy is in :data:`PASS_POLICIES`: ``({module: detection}, {JSCoP file: new JSCoP})`` with
    only the SCoPs whose schedule changed (SCoPs left to Polly stay with the policy's Polly)."""
    names = list(sources)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        found = dict(zip(names, pool.map(lambda m: detect(sources[m]), names)))
    parsed: dict[str, list] = {}
    out: dict[str, dict] = {}
    for det in found.values():
        for s in det.scops:
            if _policy(s.function, policies) not in PASS_POLICIES:
                continue
            if text == "default":
                if P.choose(s.jscop).pipeline == P.POLLY:
                    continue
                new, _ = P.apply_default(s.jscop, threads)
            else:
                chosen = P.with_threads(text, threads) if threads else text
                if _is_polly(chosen):
                    continue
                if chosen not in parsed:
                    parsed[chosen] = parse_pipeline(chosen)
                new = run_passes(parsed[chosen], s.jscop)
            if not importable.same_schedules(s.jscop, new):
                out[s.file_name] = new
    return found, out
