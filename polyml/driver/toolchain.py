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
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

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
    override = os.environ.get("POLYML_LLVM_BIN")
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
    march = os.environ.get(TARGET_CPU_ENV, "").strip()
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
    override = os.environ.get(TARGET_CACHES_ENV, "").strip()
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
