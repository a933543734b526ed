"""Locating LLVM 19 tools and reading the target (by default this host) as LLVM 19 sees it.

polyml emits IR with llvmlite (LLVM 22) but optimizes and compiles it with Debian's LLVM 19
(the newest whose ``opt`` has Polly built in with the JSCoP flags used here), so the CPU name
and feature list must come from LLVM 19: LLVM 22 knows features that 19 rejects.

Cross builds for another x86-64 machine: ``POLYML_TARGET_CPU`` names its CPU as clang's
``-march`` does (``sapphirerapids``, ``znver4``, ``x86-64-v4``...) and ``POLYML_TARGET_CACHES``
its data caches (``48K,2M,105M``: L1, L2, L3), which size the GEMM blocks and conv tiles; without
them polyml builds for the machine it runs on.  The artifact records the target; it loads
anywhere but refuses to run on a CPU that lacks its vector features (:mod:`polyml.runtime.model`).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import llvmlite

from polyml import options
from polyml._version import __version__
from polyml.driver import artifact
from polyml.errors import ToolchainError

LLVM_MAJOR = 19
TOOLS = ("opt", "llc", "clang", "llvm-link")
TARGET_CPU_ENV = "POLYML_TARGET_CPU"
TARGET_CACHES_ENV = "POLYML_TARGET_CACHES"
SYS_CACHE = "/sys/devices/system/cpu/cpu0/cache"
#: associativity assumed for a cache given by size alone (POLYML_TARGET_CACHES)
DEFAULT_WAYS = {1: 8, 2: 16, 3: 16}


def tool(name: str) -> str:
    """Absolute path of an LLVM 19 tool; ``POLYML_LLVM_BIN`` overrides the search."""
    override = options.raw("POLYML_LLVM_BIN")
    candidates = []
    if override:
        candidates.append(os.path.join(override, name))
    candidates += [f"/usr/lib/llvm-{LLVM_MAJOR}/bin/{name}", shutil.which(f"{name}-{LLVM_MAJOR}") or ""]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise ToolchainError(
        f"{name}-{LLVM_MAJOR} not found: install Debian's llvm-{LLVM_MAJOR} clang-{LLVM_MAJOR} "
        f"libpolly-{LLVM_MAJOR}-dev (`make setup` does) or set POLYML_LLVM_BIN"
    )


@functools.cache
def tool_version(name: str) -> str:
    out = subprocess.run([tool(name), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip().splitlines()[0]


@dataclass(frozen=True)
class HostTarget:
    """Triple, datalayout, CPU name and feature string for the machine polyml runs on."""

    triple: str
    datalayout: str
    cpu: str
    features: str

    @property
    def vector_features(self) -> list[str]:
        keep = ("sse", "avx", "fma", "neon", "sve", "amx")
        return sorted(f[1:] for f in self.features.split(",") if f.startswith("+") and f[1:].startswith(keep))


@functools.cache
def host_target() -> HostTarget:
    """Ask clang-19 what ``-march=native`` means here (``-###`` prints the cc1 command line), or,
    for a cross build, what ``-march=$POLYML_TARGET_CPU`` means (:func:`named_target`)."""
    march = options.raw(TARGET_CPU_ENV)
    if march:
        return named_target(march)
    clang = tool("clang")
    proc = subprocess.run(
        [clang, "-march=native", "-###", "-x", "c", "-c", "/dev/null", "-o", "/dev/null"],
        capture_output=True,
        text=True,
    )
    args = re.findall(r'"([^"]*)"', proc.stderr)
    triple = cpu = ""
    features: list[str] = []
    for i, a in enumerate(args[:-1]):
        if a == "-triple":
            triple = args[i + 1]
        elif a == "-target-cpu":
            cpu = args[i + 1]
        elif a == "-target-feature":
            features.append(args[i + 1])
    if not triple or not cpu:
        raise ToolchainError(f"could not read the host target from `{clang} -march=native -###`")
    return HostTarget(triple, _datalayout(triple, cpu), cpu, ",".join(features))


def named_target(march: str) -> HostTarget:
    """The x86-64 target clang-19 means by ``-march=NAME``: the CPU's implied features are not on
    the cc1 command line, so they are read off a compiled function's ``target-features``."""
    proc = subprocess.run(
        [tool("clang"), f"-march={march}", "-S", "-emit-llvm", "-x", "c", "-", "-o", "-"],
        input="void polyml_probe(void) {}\n",
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        message = proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else f"exit status {proc.returncode}"
        raise ToolchainError(f"{TARGET_CPU_ENV}={march!r}: clang-19 does not know this CPU ({message})")
    found = {key: re.search(pattern, proc.stdout) for key, pattern in (
        ("triple", r'target triple = "([^"]+)"'), ("datalayout", r'target datalayout = "([^"]+)"'),
        ("cpu", r'"target-cpu"="([^"]+)"'), ("features", r'"target-features"="([^"]*)"'))}
    if not all(found.values()):
        raise ToolchainError(f"{TARGET_CPU_ENV}={march!r}: could not read the target from clang-19's IR")
    return HostTarget(**{key: m.group(1) for key, m in found.items()})


def _datalayout(triple: str, cpu: str) -> str:
    """The datalayout LLVM 19 uses for ``triple`` (read from a compiled empty module)."""
    proc = subprocess.run(
        [tool("clang"), "-target", triple, f"-mcpu={cpu}" if "x86" not in triple else f"-march={cpu}",
         "-S", "-emit-llvm", "-x", "c", "/dev/null", "-o", "-"],
        capture_output=True,
        text=True,
    )
    m = re.search(r'target datalayout = "([^"]+)"', proc.stdout)
    if not m:
        raise ToolchainError(f"could not read the datalayout for {triple}: {proc.stderr.strip()}")
    return m.group(1)


def parse_size(text: str) -> int:
    """Bytes in ``48K``, ``2M``, ``1048576`` (sysfs and option spelling)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 48K, 2M, 1048576)")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


@functools.cache
def target_data_caches(root: str = SYS_CACHE) -> dict[int, tuple[int, int]]:
    """Level -> (bytes, associativity) of the target's data/unified caches: ``POLYML_TARGET_CACHES``
    (``L1,L2[,L3]`` sizes) where set, else this host's from sysfs ({} if unknown)."""
    override = options.raw(TARGET_CACHES_ENV)
    if override:
        try:
            sizes = [parse_size(t) for t in override.split(",")]
        except ValueError as e:
            raise ToolchainError(f"{TARGET_CACHES_ENV}={override!r}: {e}") from None
        if not 1 <= len(sizes) <= 3 or min(sizes) <= 0:
            raise ToolchainError(f"{TARGET_CACHES_ENV}={override!r}: expected L1,L2[,L3] sizes such as 48K,2M,105M")
        return {level: (size, DEFAULT_WAYS[level]) for level, size in enumerate(sizes, start=1)}
    out: dict[int, tuple[int, int]] = {}
    for d in sorted(Path(root).glob("index*")):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            level = int((d / "level").read_text())
            size = parse_size((d / "size").read_text())
        except (OSError, ValueError):
            continue
        try:
            ways = int((d / "ways_of_associativity").read_text())
        except (OSError, ValueError):
            ways = DEFAULT_WAYS.get(level, 16)
        out[level] = (size, ways)
    return out


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
    """polyml's, the LLVM 19 tools' and llvmlite's versions and the Python side's
    (:func:`polyml.driver.artifact.library_versions`): a manifest's ``versions``, part of a cache key."""
    return {
        "polyml": __version__,
        "opt": tool_version("opt"),
        "llc": tool_version("llc"),
        "clang": tool_version("clang"),
        "llvmlite": llvmlite.__version__,
        **artifact.library_versions(),
    }
