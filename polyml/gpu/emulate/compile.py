"""The emulator's native code: host modules of a CUDA artifact's kernels plus ``runtime.c``,
compiled with clang-19 at ``-O2`` into one shared object, cached by content.

The cache lives in polyml's cache folder (``$POLYML_CACHE_DIR`` or platformdirs'), under
``emulator/<sha256>.so``; the key covers the host modules' text (hence the kernel IR and the
rewriter), ``runtime.c`` and clang's version, so a rebuilt model or a changed emulator compiles
anew and an unchanged one loads at once.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from polyml.driver.toolchain import tool, tool_version
from polyml.errors import ToolchainError
from polyml.userdirs import cache_dir

RUNTIME_C = Path(__file__).with_name("runtime.c")
#: clang flags of every object: -O2, position independent, and plain _longjmp (no fortify
#: check: the runtime jumps between fibre stacks on purpose)
CFLAGS = ["-O2", "-fPIC", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0", "-w"]
#: libraries kept in the cache folder (least recently used ones beyond this are deleted)
KEEP = 256


def _clang() -> str:
    return tool("clang")


def library_key(host_modules: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(f"clang {tool_version('clang')} {' '.join(CFLAGS)}\n".encode())
    h.update(RUNTIME_C.read_bytes())
    for name in sorted(host_modules):
        h.update(f"\n;; {name}\n".encode())
        h.update(host_modules[name].encode())
    return h.hexdigest()


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        msg = "\n".join(proc.stderr.strip().splitlines()[:20])
        raise ToolchainError(f"emulated CUDA: clang-19 failed to compile {what}:\n{msg}")


def build_library(host_modules: dict[str, str], jobs: int | None = None) -> Path:
    """The shared object of ``host_modules`` (name → host IR text) and the runtime, from the
    cache or compiled now (one clang process per module, ``jobs`` at a time)."""
    key = library_key(host_modules)
    folder = cache_dir() / "emulator"
    lib = folder / f"{key}.so"
    if lib.is_file():
        os.utime(lib)
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    clang = _clang()
    with tempfile.TemporaryDirectory(prefix="polyml-emu-") as tmp:
        work = Path(tmp)
        jobs_: list[tuple[list[str], str]] = [([clang, *CFLAGS, "-c", str(RUNTIME_C), "-o", str(work / "runtime.o")],
                                               "the emulator runtime")]
        for i, (name, text) in enumerate(sorted(host_modules.items())):
            src = work / f"m{i}.ll"
            src.write_text(text)
            jobs_.append(([clang, *CFLAGS, "-x", "ir", "-c", str(src), "-o", str(work / f"m{i}.o")], f"kernels of {name}"))
        with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
            for f in [pool.submit(_run, cmd, what) for cmd, what in jobs_]:
                f.result()
        objs = sorted(str(p) for p in work.glob("*.o"))
        tmp_lib = folder / f".{key}.{os.getpid()}.so"
        _run([clang, "-shared", *objs, "-lm", "-o", str(tmp_lib)], "the emulator library (link)")
        os.replace(tmp_lib, lib)
    _prune(folder)
    return lib


def _prune(folder: Path) -> None:
    libs = sorted(folder.glob("*.so"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in libs[KEEP:]:
        try:
            old.unlink()
        except OSError:
            pass


__all__ = ["build_library", "library_key"]
