"""Locating LLVM 19 tools and reading the host target as LLVM 19 sees it.

polyml emits IR with llvmlite (LLVM 22) but optimizes and compiles it with Debian's LLVM 19
(the newest whose ``opt`` has Polly built in with the JSCoP flags used here), so the host CPU name
and feature list must come from LLVM 19: LLVM 22 knows features that 19 rejects.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from polyml.errors import ToolchainError

LLVM_MAJOR = 19
TOOLS = ("opt", "llc", "clang", "llvm-link")


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
    """Ask clang-19 what ``-march=native`` means here (``-###`` prints the cc1 command line)."""
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
