"""The affine kernel suite (``benchmarks/affine/``): build a kernel four ways, run it, compare.

Each kernel is one C file (float64 arrays; sizes ``-DSMALL`` for CI, LARGE by default) whose
``main`` times one call of the kernel function and, given a path, dumps the output arrays as raw
float64 (``benchmarks/affine/affine.h``).  The kernel function takes its sizes as ``int``
arguments, in two forms (:data:`FORMS`): ``parametric`` (the default) uses them in its loop
bounds and VLA array parameters, so its SCoPs have the sizes as parameters; ``constant``
(``-DAFFINE_CONSTANT``) uses the compile-time constants instead.  Both give bit-identical
outputs.  The builds:

``O3``              ``clang-19 -O3 -march=native``                        (the reference)
``polly``           ``... -mllvm -polly``
``polly-parallel``  ``... -mllvm -polly -mllvm -polly-parallel`` (GNU OpenMP)
``polyml``          clang's IR (``-O1 -Xclang -disable-llvm-passes``), ``polyml opt`` (its default
                    pipeline, or ``passes``), then ``clang-19 -O3 -march=native`` on the result

All builds use ``-fno-math-errno`` (so ``sqrt`` is the ``llvm.sqrt`` intrinsic, not a call that
may write ``errno``, which no SCoP may contain).  The IR keeps value names
(``-fno-discard-value-names``) so statements are ``Stmt_for_body4``, not ``Stmt_%14``.

Outputs are compared with the ``O3`` build's, normwise: ``max|x - ref| <= rtol * max|ref|``
with ``rtol = 1e-9`` (:data:`RTOL`).  A legal schedule keeps every element's updates in order,
so polyml's builds so far are bit-exact; Polly may reassociate reductions (its dependences
relax reduction chains), which moves sums by ~n·ε ≈ 1e-13 relative.  1e-9 is far above that and
far below what a wrong schedule gives (O(1) errors).  Whether a build is bit-exact is reported.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyml.driver.toolchain import tool
from polyml.errors import PolymlError, ToolchainError

SUITE = Path(__file__).resolve().parent.parent / "benchmarks" / "affine"

#: every kernel of the suite, in the order tables list them
KERNELS = (
    "gemm", "2mm", "3mm", "atax", "bicg", "mvt", "gemver", "gesummv", "syrk", "syr2k", "trmm", "symm", "doitgen",
    "lu", "cholesky", "trisolv", "correlation", "covariance", "floyd-warshall",
    "jacobi-1d", "jacobi-2d", "seidel-2d", "heat-3d", "fdtd-2d", "adi",
)
#: the stencils (time-iterated nests), for the issue's "1.5x faster than Polly on stencils"
STENCILS = ("jacobi-1d", "jacobi-2d", "seidel-2d", "heat-3d", "fdtd-2d", "adi")
VARIANTS = ("O3", "polly", "polly-parallel", "polyml")
SIZES = ("small", "large")
FORMS = ("parametric", "constant")
RTOL = 1e-9

COMMON = ["-march=native", "-fno-math-errno"]
IR_FLAGS = ["-O1", "-Xclang", "-disable-llvm-passes", "-fno-discard-value-names", "-S", "-emit-llvm"]
VARIANT_FLAGS = {
    "O3": ["-O3"],
    "polly": ["-O3", "-mllvm", "-polly"],
    "polly-parallel": ["-O3", "-mllvm", "-polly", "-mllvm", "-polly-parallel"],
}
LIBS = ["-lm", "-fopenmp=libgomp"]  # Polly's parallel code (and polyml's) calls GNU OpenMP


def source(kernel: str) -> Path:
    if kernel not in KERNELS:
        raise PolymlError(f"unknown kernel {kernel!r} (kernels: {', '.join(KERNELS)})")
    return SUITE / f"{kernel}.c"


def size_flags(size: str) -> list[str]:
    if size not in SIZES:
        raise PolymlError(f"unknown size {size!r} (sizes: {', '.join(SIZES)})")
    return ["-DSMALL"] if size == "small" else []


def form_flags(form: str) -> list[str]:
    if form not in FORMS:
        raise PolymlError(f"unknown form {form!r} (forms: {', '.join(FORMS)})")
    return ["-DAFFINE_CONSTANT"] if form == "constant" else []


def polyml_command() -> list[str]:
    """``polyml`` of this interpreter (the console script next to it, else ``python -c``)."""
    exe = Path(sys.executable).parent / "polyml"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "import sys; from polyml.cli import main; sys.exit(main())"]


def _run(cmd: list[str], what: str, cwd: Path | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} took more than {timeout:.0f} s\n  command: {' '.join(cmd)}") from None
    if proc.returncode != 0:
        raise ToolchainError(f"{what} failed (exit {proc.returncode}):\n{(proc.stderr or proc.stdout).strip()[-2000:]}\n"
                             f"  command: {' '.join(cmd)}")
    return proc


@dataclass(frozen=True)
class Build:
    """One built executable and how it was made."""

    kernel: str
    variant: str
    size: str
    exe: Path
    commands: tuple[str, ...]
    opt_output: str = ""  # polyml opt's report (SCoPs transformed, ...)
    form: str = "parametric"


def build(kernel: str, variant: str, size: str, work: Path, passes: str | None = None,
          opt_args: Sequence[str] = (), opt_timeout: float | None = None, form: str = "parametric") -> Build:
    """Build ``kernel`` as ``variant`` into ``work``; ``passes``: polyml's pipeline (None: the
    default pipeline of ``polyml opt``), ``opt_args``: more ``polyml opt`` arguments,
    ``opt_timeout``: seconds ``polyml opt`` may take (an error after that), ``form``: one of
    :data:`FORMS`.  File names carry neither size nor form: give each its own ``work``."""
    src = source(kernel)
    work.mkdir(parents=True, exist_ok=True)
    stem = f"{kernel}.{variant}"
    exe = work / stem
    clang = tool("clang")
    flags = [*COMMON, *size_flags(size), *form_flags(form)]
    if variant in VARIANT_FLAGS:
        cmd = [clang, *VARIANT_FLAGS[variant], *flags, str(src), "-o", str(exe), *LIBS]
        _run(cmd, f"{kernel}: clang ({variant})")
        return Build(kernel, variant, size, exe, (" ".join(cmd),), form=form)
    if variant != "polyml":
        raise PolymlError(f"unknown variant {variant!r} (variants: {', '.join(VARIANTS)})")
    ll, opt_ll = work / f"{kernel}.ll", work / f"{kernel}.opt.ll"
    c1 = [clang, *IR_FLAGS, *flags, str(src), "-o", str(ll)]
    _run(c1, f"{kernel}: clang IR")
    c2 = [*polyml_command(), "opt", str(ll), "-o", str(opt_ll), *(["--passes", passes] if passes else []), *opt_args]
    proc = _run(c2, f"{kernel}: polyml opt", timeout=opt_timeout)
    c3 = [clang, "-O3", *COMMON, str(opt_ll), "-o", str(exe), *LIBS]
    _run(c3, f"{kernel}: clang on polyml's IR")
    return Build(kernel, variant, size, exe, tuple(" ".join(c) for c in (c1, c2, c3)), proc.stdout + proc.stderr,
                 form=form)


_SECONDS = re.compile(r"^seconds ([0-9.eE+-]+)$", re.M)


_ADDRESS = re.compile(r"\b(0x)?[0-9a-f]{4,}\b(?= <)")


def kernel_code(exe: Path, kernel: str) -> str:
    """The machine code of ``kernel_<kernel>`` in ``exe`` (llvm-objdump, addresses dropped, jump
    targets kept as ``<symbol+offset>``): two builds whose texts are equal run the same kernel."""
    sym = "kernel_" + kernel.replace("-", "_")
    proc = _run([tool("llvm-objdump"), "-d", "--no-show-raw-insn", "--no-leading-addr",
                 f"--disassemble-symbols={sym}", str(exe)], f"{kernel}: llvm-objdump")
    body = proc.stdout.split(f"<{sym}>:", 1)
    return _ADDRESS.sub("", body[1]).strip() if len(body) == 2 else ""


#: the stack (KiB) builds run with, at least: Polly's GEMM optimizer keeps its packed copies of the
#: factors on the stack, sized for the caches when the sizes are parameters (8.4 MB in the
#: parametric 3mm), which overflows the usual 8 MiB
STACK_KIB = 65536


def _with_stack(cmd: list[str]) -> list[str]:
    """``cmd`` with a stack of :data:`STACK_KIB` (or the hard limit), unless it has that already."""
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    want = STACK_KIB * 1024 if hard == resource.RLIM_INFINITY else min(STACK_KIB * 1024, hard)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return cmd
    return ["sh", "-c", f'ulimit -s {want // 1024} && exec "$0" "$@"', *cmd]


def run(b: Build, threads: int = 1, dump: Path | None = None) -> float:
    """Run a build once (``OMP_NUM_THREADS=threads``, a :data:`STACK_KIB` stack); the kernel's seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT", "1000")}
    cmd = _with_stack([str(b.exe), *([str(dump)] if dump else [])])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = _SECONDS.search(proc.stdout)
    if proc.returncode != 0 or not m:
        raise ToolchainError(f"{b.kernel} ({b.variant}, {b.form}) failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return float(m.group(1))


@dataclass(frozen=True)
class Comparison:
    """A build's dumped arrays against the reference's."""

    exact: bool
    max_rel: float  # max|x - ref| / max|ref|
    finite: bool

    @property
    def ok(self) -> bool:
        return self.finite and self.max_rel <= RTOL

    def __str__(self) -> str:
        return "exact" if self.exact else f"rel {self.max_rel:.1e}" + ("" if self.ok else " MISMATCH")


def compare(ref: Path, got: Path) -> Comparison:
    a, b = np.fromfile(ref, dtype=np.float64), np.fromfile(got, dtype=np.float64)
    if a.shape != b.shape:
        return Comparison(False, float("inf"), False)
    exact = bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))
    finite = bool(np.isfinite(b).all() == np.isfinite(a).all())
    scale = float(np.max(np.abs(a))) if a.size else 0.0
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    return Comparison(exact, 0.0 if exact else err / (scale or 1.0), finite and bool(np.isfinite(a).all()))
