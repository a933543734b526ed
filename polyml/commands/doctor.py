"""``polyml doctor [--json]``: what polyml finds on this machine, and whether it is enough.

Required (exit 1 when one is missing): LLVM 19's opt (with Polly built in, probed by running it),
llc and clang, a linkable libgomp, llvmlite, islpy and a readable host CPU. Reported when present:
CUDA driver, nvcc and ptxas versions. Reported always: the lock files (requirements/runtime.txt and
test.txt, polyml.lockfile) with their sha256 and whether the installed packages are exactly
their pins; packages installed from pyproject.toml's ranges instead are no error.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from polyml import options
from polyml.commands._common import command, out

REQUIRED = ("opt", "llc", "clang", "polly", "openmp", "llvmlite", "islpy", "cpu")

# A loop Polly must model as a SCoP: the probe checks that -polly runs and exports its JSCoP.
PROBE_IR = """\
define void @probe(ptr noalias %a) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %n, %loop ]
  %p = getelementptr float, ptr %a, i64 %i
  store float 1.0, ptr %p
  %n = add i64 %i, 1
  %c = icmp slt i64 %n, 128
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""


def _run(cmd: list[str], cwd: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)


def _tool(name: str) -> dict:
    from polyml.driver.toolchain import tool, tool_version

    try:
        path = tool(name)
        return {"ok": True, "path": path, "version": tool_version(name)}
    except Exception as e:  # a missing tool or one that does not run
        return {"ok": False, "path": None, "version": None, "error": str(e)}


def _polly(opt: dict) -> dict:
    """Run opt with -polly on a one-loop module; Polly is there if it exports the loop's JSCoP."""
    if not opt["ok"]:
        return {"ok": False, "error": "opt is missing"}
    with tempfile.TemporaryDirectory(prefix="polyml-doctor-") as tmp:
        Path(tmp, "probe.ll").write_text(PROBE_IR)
        try:
            proc = _run([opt["path"], "-O3", "-polly", "-polly-process-unprofitable", "-polly-export",
                         "probe.ll", "-o", os.devnull], cwd=tmp)
            jscop = sorted(p.name for p in Path(tmp).glob("*.jscop"))
            helptext = _run([opt["path"], "--help-hidden"]).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            return {"ok": False, "error": str(e)}
    flags = {f: f"-{f}" in helptext for f in ("polly-export-jscop", "polly-import-jscop", "polly-import-jscop-dir",
                                                 "polly-parallel", "polly-vectorizer")}
    ok = proc.returncode == 0 and bool(jscop)
    report = {"ok": ok, "builtin": proc.returncode == 0, "scop_exported": bool(jscop), "flags": flags}
    if not ok:
        report["error"] = (proc.stderr.strip().splitlines() or ["no SCoP exported"])[0]
    return report


def _openmp(clang: dict) -> dict:
    if not clang["ok"]:
        return {"ok": False, "error": "clang is missing"}
    lib = _run([clang["path"], "-print-file-name=libgomp.so"]).stdout.strip()
    if "/" not in lib:
        return {"ok": False, "error": "libgomp.so not found by clang (install libgcc-12-dev)"}
    return {"ok": True, "libgomp": os.path.realpath(lib)}


def _llvmlite() -> dict:
    try:
        import llvmlite
        import llvmlite.binding as llvm

        return {"ok": True, "version": llvmlite.__version__, "llvm_version": ".".join(map(str, llvm.llvm_version_info))}
    except Exception as e:
        return {"ok": False, "version": None, "error": str(e)}


def _islpy() -> dict:
    try:
        import islpy

        return {"ok": True, "version": islpy.__version__, "isl": str(islpy.isl_version()).strip()}
    except Exception as e:
        return {"ok": False, "version": None, "error": str(e)}


def _cpu() -> dict:
    from polyml.driver.toolchain import TARGET_CPU_ENV, host_target, target_data_caches

    model = ""
    try:
        model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                      if ln.startswith("model name")), "")
    except OSError:
        pass
    try:
        t = host_target()
    except Exception as e:
        return {"ok": False, "name": None, "model": model or platform.processor(), "error": str(e)}
    # a cross build (POLYML_TARGET_CPU): the CPU builds are for, not this one
    cross = options.raw(TARGET_CPU_ENV) or None
    return {"ok": True, "name": t.cpu, "triple": t.triple, "model": model or platform.processor(),
            "vector_features": t.vector_features, "cross_target": cross,
            "caches": {f"L{level}": size for level, (size, _ways) in sorted(target_data_caches().items())}}


def _threads() -> dict:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_count": os.cpu_count(), "usable": usable, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}


def _cuda_tool(name: str) -> str | None:
    exe = shutil.which(name)
    if not exe:
        return None
    try:
        text = _run([exe, "--version"], timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release [\d.]+, V([\d.]+)", text) or re.search(r"release ([\d.]+)", text)
    return m.group(1) if m else (text.strip().splitlines() or [""])[-1]


def _cuda_driver() -> dict | None:
    version = None
    try:
        m = re.search(r"Kernel Module\s+([\d.]+)", Path("/proc/driver/nvidia/version").read_text())
        version = m.group(1) if m else None
    except OSError:
        pass
    api = None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) == 0:
            api = f"{v.value // 1000}.{v.value % 1000 // 10}"
    except (OSError, AttributeError):
        pass
    if version is None and api is None:
        return None
    return {"version": version, "cuda": api}


def _lock() -> dict:
    from polyml import lockfile

    return {name: lockfile.status(name) for name in lockfile.LOCKS}


def _lock_details(s: dict) -> str:
    if s["file"] is None:
        return s["differences"][0]
    where = f"sha256 {s['sha256'][:12]}, {s['packages']} pins"
    if s["matches"]:
        return f"installed packages are the locked ones ({where})"
    more = len(s["differences"]) - 3
    return (f"{len(s['differences'])} differ ({where}): " + "; ".join(s["differences"][:3])
            + (f"; {more} more" if more > 0 else ""))


def _cache() -> dict:
    from polyml.cache import CompileCache

    c = CompileCache()
    rows = c.entries()
    return {"dir": str(c.root), "entries": len(rows), "bytes": sum(r["bytes"] for r in rows)}


def collect() -> dict:
    """Everything ``polyml doctor`` reports, as JSON-ready data."""
    from polyml._version import __version__

    report: dict = {
        "polyml": {"version": __version__, "path": str(Path(__file__).resolve().parents[1])},
        "python": {"version": platform.python_version(), "executable": sys.executable},
    }
    for name in ("opt", "llc", "clang"):
        report[name] = _tool(name)
    report["polly"] = _polly(report["opt"])
    report["openmp"] = _openmp(report["clang"])
    report["llvmlite"] = _llvmlite()
    report["islpy"] = _islpy()
    report["cpu"] = _cpu()
    report["threads"] = _threads()
    report["lock"] = _lock()
    report["cuda"] = {"driver": _cuda_driver(), "nvcc": _cuda_tool("nvcc"), "ptxas": _cuda_tool("ptxas")}
    try:
        report["cache"] = _cache()
    except OSError as e:
        report["cache"] = {"error": str(e)}
    report["missing"] = [k for k in REQUIRED if not report[k].get("ok")]
    report["ok"] = not report["missing"]
    return report


def _details(key: str, r: dict) -> str:
    if r.get("error"):
        return r["error"]
    if key in ("opt", "llc", "clang"):
        return f"{r['version']}  {r['path']}"
    if key == "polly":
        accepted = [f"-{f}" for f, ok in r["flags"].items() if ok]
        return f"built in; a probe SCoP exported as JSCoP; accepts {' '.join(accepted)}"
    if key == "openmp":
        return r["libgomp"]
    if key == "llvmlite":
        return f"{r['version']} (LLVM {r['llvm_version']})"
    if key == "islpy":
        return f"{r['version']} (isl {r['isl']})"
    if key == "cpu":
        text = f"{r['name']} ({r['triple']}; {r['model']}): {' '.join(r['vector_features'])}"
        return text + (f" — builds for {r['cross_target']} (POLYML_TARGET_CPU), not for this CPU" if r.get("cross_target") else "")
    return ""


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the report as JSON")


@command("doctor", _arguments, "check the toolchain and machine polyml builds with")
def cmd_doctor(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
        return 0 if report["ok"] else 1
    table = Table(title=f"polyml {report['polyml']['version']} doctor", show_header=True)
    for col in ("component", "status", "details"):
        table.add_column(col)
    for key in REQUIRED:
        r = report[key]
        table.add_row(key, "[green]ok[/]" if r.get("ok") else "[bold red]missing[/]", escape(_details(key, r)))
    t = report["threads"]
    table.add_row("threads", "", f"{t['usable']} usable of {t['cpu_count']}; OMP_NUM_THREADS={t['OMP_NUM_THREADS'] or 'unset'}")
    cuda = report["cuda"]
    drv = cuda["driver"]
    table.add_row("cuda driver", "" if drv else "[dim]none[/]", escape(f"{drv['version'] or ''} (CUDA {drv['cuda']})" if drv else "no NVIDIA driver"))
    for k in ("nvcc", "ptxas"):
        table.add_row(k, "" if cuda[k] else "[dim]none[/]", cuda[k] or "not on PATH")
    for name, s in report["lock"].items():
        table.add_row(f"lock {name}", "[green]matches[/]" if s["matches"] else "[yellow]differs[/]", escape(_lock_details(s)))
    c = report["cache"]
    table.add_row("cache", "", escape(c.get("error") or f"{c['entries']} build(s), {c['bytes'] / 1e6:.1f} MB in {c['dir']}"))
    table.add_row("python", "", escape(f"{report['python']['version']}  {report['python']['executable']}"))
    out.print(table)
    if report["missing"]:
        out.print(f"[bold red]missing:[/] {', '.join(report['missing'])} — `make setup` (scripts/install.sh) installs "
                  "LLVM 19 with Polly and the Python packages", highlight=False)
        return 1
    return 0
