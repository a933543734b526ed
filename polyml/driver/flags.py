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
    fuse: bool = True  # passes/fuse.py: elementwise chains, conv epilogues, batch-norm folding
    threads: int = 0  # 0: all cores (OMP default)
    parallel: bool = True  # -polly-parallel (OpenMP)
    extra_opt_flags: tuple[str, ...] = field(default_factory=tuple)
    #: a folder of hand-edited JSCoP files to import (``--import-jscop``, :mod:`polyml.scop.exchange`)
    import_jscop: str = ""

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


# -- the SCoP layer (polyml.scop): Polly as a JSCoP exporter / importer ------------------------

#: Polly's own canonicalization, the passes it runs at ``-polly-position=early`` in LLVM 19
#: (``buildCanonicalicationPassesForNPM``), spelled as a pipeline: Polly sees every nest as the
#: lowering emitted it, in rotated canonical form, before LICM, unrolling or loop-idiom can change
#: it.  Export, detection and import all run Polly here, so region and statement names match.
SCOP_CANONICALIZE = (
    "function(mem2reg,early-cse<memssa>,instcombine,simplifycfg,tailcallelim,simplifycfg,"
    "reassociate,loop(loop-rotate),instcombine,loop(indvars))"
)
#: statements and arrays named after LLVM values (``Stmt_<op>_L<level>_<loop>_body``,
#: ``MemRef_in0``); SCoPs kept even when Polly's cost model would drop them; calls to
#: functions that touch only their arguments' memory (MatMul's batched 2-D GEMM) modeled as
#: statements with may-accesses
SCOP_COMMON = ["-polly-use-llvm-names", "-polly-process-unprofitable", "-polly-allow-modref-calls"]


def _function_regex(functions: list[str]) -> str:
    """``-polly-only-func``/``-polly-ignore-func`` value: comma-separated, anchored regexes."""
    import re

    return ",".join(f"^{re.escape(f)}$" for f in functions)


def scop_export_flags(jscop_dir: str, functions: list[str] | None = None, remarks: str | None = None) -> list[str]:
    """Detect SCoPs, print them (access kinds) and write one JSCoP per SCoP into ``jscop_dir``.

    Polly writes ``<function>___<region>.jscop`` into ``-polly-import-jscop-dir`` (its export
    and import share the folder option).  ``remarks``: a YAML file for Polly's detection
    (``polly-detect``) and SCoP-building (``polly-scops``) remarks, the rejection reasons.
    """
    flags = [
        f"-passes={SCOP_CANONICALIZE},function(polly-prepare,print<loops>,print<polly-function-scops>,scop(polly-export-jscop))",
        *SCOP_COMMON,
        f"-polly-import-jscop-dir={jscop_dir}",
    ]
    if functions:
        flags.append(f"-polly-only-func={_function_regex(functions)}")
    if remarks:
        flags += ["-pass-remarks-missed=polly-detect", "-pass-remarks-analysis=polly-scops", f"-pass-remarks-output={remarks}"]
    return flags


def scop_import_flags(jscop_dir: str, functions: list[str], postopts: bool = False, opt_level: int = 0) -> list[str]:
    """Import ``jscop_dir``'s JSCoPs for ``functions`` and generate code from their schedules.

    The phase order is explicit: ``polly-import-jscop`` then ``polly-codegen``, with no
    ``polly-opt-isl`` in between, so the imported schedule is what runs (in Polly's ``-polly``
    pipeline the import is followed by the isl rescheduler unless ``-polly-optimizer=none``).
    ``postopts``: run ``polly-opt-isl`` with ``-polly-reschedule=0``, which keeps the imported
    schedule but applies Polly's post-scheduling tiling and GEMM pattern optimization.
    ``opt_level`` > 0 appends LLVM's ``default<On>`` pipeline.
    """
    scop = "polly-import-jscop,polly-opt-isl,polly-codegen" if postopts else "polly-import-jscop,polly-codegen"
    pipeline = f"{SCOP_CANONICALIZE},function(polly-prepare,scop({scop}))"
    if opt_level:
        pipeline += f",default<O{opt_level}>"
    flags = [f"-passes={pipeline}", *SCOP_COMMON, f"-polly-import-jscop-dir={jscop_dir}",
             f"-polly-only-func={_function_regex(functions)}"]
    if postopts:
        flags += ["-polly-reschedule=0", "-polly-postopts"]
    return flags


def ignore_functions_flags(functions: list[str]) -> list[str]:
    """Keep the policy pipeline's Polly off functions whose schedule was imported."""
    return [f"-polly-ignore-func={_function_regex(functions)}"] if functions else []
