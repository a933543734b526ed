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

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from polyml import options as settings_registry
from polyml.driver.toolchain import host_target, target_data_caches
from polyml.errors import PolymlError
from polyml.options import CodegenConfig

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


#: Polly's GEMM micro-kernel on AVX-512 hosts.  Polly sizes its register tile from the FMA
#: latency x throughput product (defaults 8 x 1: a 16x8 tile, 8 zmm accumulators); 12 x 2
#: gives 32x12 (24 accumulators), 1024³ 2 threads measured 1.3-1.7x faster.
POLLY_GEMM_AVX512 = ["-polly-target-latency-vector-fma=12", "-polly-target-throughput-vector-fma=2"]
#: Polly allocates its packed B panel (Kc x Nc, Nc = quotient x Nr) on the stack of the calling
#: (OpenMP worker) thread; the default quotient 256 made 4-6 MiB arrays that overflowed it
POLLY_GEMM_NC_QUOTIENT = ["-polly-pattern-matching-nc-quotient=64"]
def polly_gemm_flags(tuned: bool = False) -> list[str]:
    """Polly's GEMM pattern optimizer tuned to this host: FMA shape and L1/L2 sizes (Polly's
    x86 defaults assume 32 KiB L1 and 256 KiB L2; the real 48 KiB / 2 MiB of the development
    machine measured 1.7x faster at 1024³).  Polly sizes the packed A block to fill the whole
    L2; it is told half, as B's panels stream through the same L2 (measured 8 % faster, and the
    block, a stack array of the calling thread, shrinks to 0.9 MiB).

    ``tuned`` is off by default: with the FMA or the cache flags Polly's GEMM miscompiled
    1024³ and 768³ products in one function (max rel err 0.4-0.8), while row blocks
    of 384-512 came out right; until that is understood only the stack-size fix is on.
    """
    flags = list(POLLY_GEMM_NC_QUOTIENT)
    if not tuned:
        return flags
    if "+avx512f" in host_target().features:
        flags += POLLY_GEMM_AVX512
    for level, name in ((1, "1st"), (2, "2nd")):
        if level in target_data_caches():
            size, ways = target_data_caches()[level]
            size = size // 2 if level == 2 else size
            flags += [f"-polly-target-{name}-cache-level-size={size}", f"-polly-target-{name}-cache-level-associativity={ways}"]
    return flags


@dataclass(frozen=True)
class Options:
    """What a user chooses for one build (recorded in manifest.json)."""

    polly: bool = True
    fuse: bool = True  # passes/fuse.py: elementwise chains, conv epilogues, batch-norm folding
    #: with ``fuse``: each head's MatMul → chain → Softmax → MatMul in one nest (passes/attention.py)
    attention: bool = True
    threads: int = 0  # 0: all cores (OMP default)
    parallel: bool = True  # -polly-parallel (OpenMP)
    extra_opt_flags: tuple[str, ...] = field(default_factory=tuple)
    #: a folder of hand-edited JSCoP files to import (``--import-jscop``, :mod:`polyml.scop.exchange`)
    import_jscop: str = ""
    #: a folder of schedule files to import (``--import-schedules``, from ``--emit schedules``:
    #: the tiles of GEMM-family and depthwise schedules, :mod:`polyml.schedule.exchange`)
    import_schedules: str = ""
    #: polyml's JSCoP pass pipeline on the SCoPs of every op function whose policy is ``polly``
    #: or ``tile`` (``--passes``; ``default``: ``polyml opt``'s per-SCoP policy), legality-checked
    passes: str = ""
    #: cache tiling of the fused nests (:mod:`polyml.codegen.tiling`): ``auto`` (host caches),
    #: ``off``, or ``l1=48K,l2=2M,conv=1M``
    tile_sizes: str = "auto"
    #: matrix products (MatMul, Gemm): ``schedule`` — 2-D products of computed operands as
    #: the GEMM nest under its BLIS schedule, the register tiles on the micro-kernel intrinsic
    #: (:mod:`polyml.schedule.gemm`), the others as ``packed``; ``packed`` — polyml's
    #: hand-written packed GEMM with a vector micro-kernel (:mod:`polyml.codegen.gemm`);
    #: ``polly`` — nests for Polly's GEMM pattern (also what the SCoP tools show)
    gemm: str = "schedule"
    #: False (``--no-schedule``): the op families on polyml's schedules emit their plain nests
    #: under the initial schedule instead (no tiling, packing, threads or intrinsics), compiled
    #: by ``opt -O3`` without Polly: the baseline a schedule's speed is measured against
    schedule: bool = True
    #: convolutions: ``auto`` (packed GEMM or direct nests by shape), ``gemm`` (the packed GEMM
    #: wherever eligible), ``direct`` (the register-blocked nests)
    conv: str = "auto"
    #: the code-changing settings of :mod:`polyml.options` (``POLYML_*`` name → text) the build
    #: is made with; None: the environment's, read once, when the options are made (the CLI and
    #: API edge).  A manifest's options give them back, so ``--from-manifest`` rebuilds with them.
    settings: tuple[tuple[str, str], ...] | Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        given = settings_registry.codegen_settings() if self.settings is None else dict(self.settings)
        unknown = sorted(k for k in given if k not in settings_registry.BY_NAME or not settings_registry.BY_NAME[k].codegen)
        if unknown:
            raise PolymlError(f"settings {unknown}: not code-changing settings of polyml.options (`polyml options`)")
        object.__setattr__(self, "settings", tuple(sorted(given.items())))
        object.__setattr__(self, "extra_opt_flags", tuple(self.extra_opt_flags))
        if self.gemm not in ("packed", "schedule", "polly"):
            raise PolymlError(f"gemm={self.gemm!r}: expected 'packed', 'schedule' or 'polly'")
        if self.conv not in ("auto", "gemm", "direct"):
            raise PolymlError(f"conv={self.conv!r}: expected 'auto', 'gemm' or 'direct'")

    def to_json(self) -> dict:
        d = asdict(self)
        d["extra_opt_flags"] = list(self.extra_opt_flags)
        d["settings"] = dict(self.settings)
        return d

    def codegen(self, packed: bool, threaded: bool) -> CodegenConfig:
        """The kernels' configuration for this build: ``packed`` GEMM products, ``threaded``
        (more than one thread), ``conv`` and the settings."""
        return CodegenConfig.from_settings(dict(self.settings), packed=packed, conv=self.conv, threaded=threaded,
                                           schedule=self.gemm == "schedule", plain_nests=not self.schedule)


def opt_flags(policy: str, options: Options) -> list[str]:
    """``opt`` arguments (without input/output) for one policy module."""
    t = host_target()
    flags = [*OPT_BASE, f"-mtriple={t.triple}", f"-mcpu={t.cpu}"]
    polly = POLLY_BY_POLICY[policy] if options.polly else None
    if polly is not None:
        flags += POLLY_COMMON + polly + (polly_gemm_flags() if policy == "polly" else [])
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
#: (``instcombine<no-verify-fixpoint>``: a pipeline that names instcombine makes LLVM 19 abort
#: when one run leaves work for another, which the packed GEMM's block functions trigger.)
SCOP_CANONICALIZE = (
    "function(mem2reg,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,tailcallelim,"
    "simplifycfg,reassociate,loop(loop-rotate),instcombine<no-verify-fixpoint>,loop(indvars))"
)
#: statements and arrays named after LLVM values (``Stmt_<op>_L<level>_<loop>_body``,
#: ``MemRef_in0``); one statement per basic block (Polly's default splits a block into
#: independent computations: a fused Conv's epilogue block became 256 statements and its
#: SCoP took 3 minutes to build instead of 0.9 s); SCoPs kept even when Polly's cost model
#: would drop them; calls to functions that touch only their arguments' memory (MatMul's
#: batched 2-D GEMM) modeled as statements with may-accesses
SCOP_COMMON = ["-polly-use-llvm-names", "-polly-stmt-granularity=bb", "-polly-process-unprofitable",
               "-polly-allow-modref-calls"]


def _function_regex(functions: list[str]) -> str:
    """``-polly-only-func``/``-polly-ignore-func`` value: comma-separated, anchored regexes."""
    import re

    return ",".join(f"^{re.escape(f)}$" for f in functions)


def scop_export_flags(jscop_dir: str, functions: list[str] | None = None, remarks: str | None = None,
                      inspect: bool = True) -> list[str]:
    """Detect SCoPs and write one JSCoP per SCoP into ``jscop_dir``; ``inspect``: also print
    the loops and SCoPs (access kinds, for :mod:`polyml.scop.detect`).

    Polly writes ``<function>___<region>.jscop`` into ``-polly-import-jscop-dir`` (its export
    and import share the folder option).  ``remarks``: a YAML file for Polly's detection
    (``polly-detect``) and SCoP-building (``polly-scops``) remarks, the rejection reasons.
    """
    prints = "print<loops>,print<polly-function-scops>," if inspect else ""
    flags = [
        f"-passes={SCOP_CANONICALIZE},function(polly-prepare,{prints}scop(polly-export-jscop))",
        *SCOP_COMMON,
        f"-polly-import-jscop-dir={jscop_dir}",
    ]
    if functions:
        flags.append(f"-polly-only-func={_function_regex(functions)}")
    if remarks:
        flags += ["-pass-remarks-missed=polly-detect", "-pass-remarks-analysis=polly-scops", f"-pass-remarks-output={remarks}"]
    return flags


def scop_import_flags(jscop_dir: str, functions: list[str], opt_level: int = 0) -> list[str]:
    """Import ``jscop_dir``'s JSCoPs for ``functions`` and generate code from their schedules.

    The phase order is explicit: ``polly-import-jscop`` then ``polly-codegen`` and nothing in
    between, so the imported schedule is what runs.  (In Polly's ``-polly`` pipeline the order
    is import → simplify/DCE → ``polly-opt-isl`` → export → codegen: an imported schedule is
    rescheduled by isl unless ``-polly-optimizer=none``, and ``-polly-export`` writes the
    rescheduled one.  ``-polly-reschedule=0`` keeps it but its post-scheduling tiling and GEMM
    pattern need permutable bands, and LLVM 19's importer turns a flat JSCoP schedule into one
    band that is not marked permutable, so they do nothing to an imported schedule: tile with
    :mod:`polyml.passes.tile` instead.)  ``opt_level`` > 0 appends LLVM's ``default<On>``.
    """
    pipeline = f"{SCOP_CANONICALIZE},function(polly-prepare,scop(polly-import-jscop,polly-codegen))"
    if opt_level:
        pipeline += f",default<O{opt_level}>"
    return [f"-passes={pipeline}", *SCOP_COMMON, f"-polly-import-jscop-dir={jscop_dir}",
            f"-polly-only-func={_function_regex(functions)}"]


def polly_parallel_flags(threads: int = 0) -> list[str]:
    """OpenMP code for an imported schedule's parallel loops (the ``parallel`` pass asks for it):
    Polly's code generation checks each loop of the imported schedule against its dependences
    and outlines the outermost parallel one into GNU OpenMP calls; ``threads`` > 0 fixes the
    team size (``-polly-num-threads``), 0 leaves it to ``OMP_NUM_THREADS``.  Polly gives up on
    dependences after 500 000 isl operations and then finds no parallel loop; a time-tiled
    jacobi-2d needs more (3 s of ``opt``), so the limit is off."""
    return ["-polly-parallel", "-polly-omp-backend=GNU", "-polly-dependences-computeout=0",
            *([f"-polly-num-threads={threads}"] if threads > 0 else [])]


def ignore_functions_flags(functions: list[str]) -> list[str]:
    """Keep the policy pipeline's Polly off functions whose schedule was imported."""
    return [f"-polly-ignore-func={_function_regex(functions)}"] if functions else []
