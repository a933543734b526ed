"""Every flag polyml passes to LLVM 19's tools, in one place.

Polly runs per module, and the lowering puts op functions into one module per *policy*:

``polly``  Polly's full pipeline: isl rescheduling, tiling, the BLIS-like GEMM pattern
           optimizer, OpenMP parallel loops and strip-mined vectorization.
``tile``   keep the lowering's schedule (``-polly-reschedule=0``) but let Polly tile and
           parallelize it: for nests whose original order is already good and that the isl
           scheduler would make slower (direct convolutions, pooling).
``off``    plain ``-O3``: nests too small or too memory-bound for Polly to help.

``--no-polly`` maps every policy to ``off``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from polyml.driver.toolchain import host_target

POLICIES = ("polly", "tile", "off")

OPT_BASE = ["-O3"]

POLLY_COMMON = [
    "-polly",
    # Loop-idiom recognition runs before Polly and turns zero-fill or row-copy init nests into
    # memset/memcpy calls, after which Polly drops the whole region (measured: a 512² Gemm with
    # bias fell from 110 to 52 GFLOP/s and lost the GEMM pattern).
    "-disable-loop-idiom-all",
    "-polly-process-unprofitable",
    "-polly-vectorizer=stripmine",
]

POLLY_BY_POLICY = {
    "polly": [],
    "tile": ["-polly-reschedule=0"],
    "off": None,
}


@dataclass(frozen=True)
class Options:
    """What a user chooses for one build (recorded in manifest.json)."""

    polly: bool = True
    fuse: bool = False
    threads: int = 0  # 0: all cores (OMP default)
    parallel: bool = True  # -polly-parallel (OpenMP)
    extra_opt_flags: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        d = asdict(self)
        d["extra_opt_flags"] = list(self.extra_opt_flags)
        return d


def opt_flags(policy: str, options: Options) -> list[str]:
    """``opt`` arguments (without input/output) for one policy module."""
    t = host_target()
    flags = [*OPT_BASE, f"-mtriple={t.triple}", f"-mcpu={t.cpu}"]
    polly = POLLY_BY_POLICY[policy] if options.polly else None
    if polly is not None:
        flags += POLLY_COMMON + polly
        if options.parallel:
            flags += ["-polly-parallel", "-polly-omp-backend=GNU"]
    return flags + list(options.extra_opt_flags)


def llc_flags() -> list[str]:
    t = host_target()
    return ["-O3", f"-mtriple={t.triple}", f"-mcpu={t.cpu}", "-relocation-model=pic", "-filetype=obj"]


def link_flags() -> list[str]:
    """clang-19 as the linker: a shared object using GNU OpenMP (Polly's parallel backend)."""
    return ["-shared", "-fopenmp=libgomp", "-lm", "-Wl,-z,noexecstack"]
