"""Every setting polyml reads from the environment, declared once: name, type, default, a one-line
doc, and whether it changes generated code.

This module is the only one that reads ``POLYML_*`` variables.  ``polyml options [--json]`` lists
the registry; the compile cache keys on :func:`codegen_settings` and every manifest records them
(``manifest["settings"]``), so ``polyml build --from-manifest`` can rebuild an A/B build with the
same knobs.  Build choices a user makes per build (``--polly``, ``--threads``...) are
:class:`polyml.driver.flags.Options`; the ones here are machine and experiment knobs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

#: sections of the registry, in the order ``polyml options`` lists them
SECTIONS = ("target", "toolchain", "cache", "gemm", "conv", "depthwise", "int8", "tests", "install")


@dataclass(frozen=True)
class Setting:
    """One environment setting: ``kind`` is ``bool`` (``0`` is off), ``int`` or ``str``."""

    name: str
    kind: str
    default: str
    doc: str
    section: str
    #: the value changes the code a build generates (cache key, manifest)
    codegen: bool = True

    def parse(self, raw: str) -> bool | int | str:
        if self.kind == "bool":
            return raw.strip() != "0"
        if self.kind == "int":
            try:
                return int(raw)
            except ValueError:
                from polyml.errors import PolymlError

                raise PolymlError(f"{self.name}={raw!r}: expected an integer") from None
        return raw.strip()

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.kind, "default": self.default, "doc": self.doc,
                "section": self.section, "changes_code": self.codegen}


def _s(name: str, kind: str, default: str, section: str, doc: str, codegen: bool = True) -> Setting:
    return Setting(f"POLYML_{name}", kind, default, doc, section, codegen)


REGISTRY: tuple[Setting, ...] = (
    _s("TARGET_CPU", "str", "", "target", "cross build: the CPU as clang's -march names it (sapphirerapids, znver4, x86-64-v4)"),
    _s("TARGET_CACHES", "str", "", "target", "cross build: the target's data caches, e.g. l1=48K,l2=2M,l3=32M"),
    _s("LLVM_BIN", "str", "", "toolchain", "folder of opt-19/llc-19/clang-19 (default: PATH, then /usr/lib/llvm-19/bin)", codegen=False),
    _s("CACHE_DIR", "str", "", "cache", "compile cache folder (default: platformdirs' user cache folder)", codegen=False),
    _s("NO_CACHE", "bool", "0", "cache", "1: skip the compile cache (as --no-cache)", codegen=False),
    _s("CACHE_MAX_MB", "int", "4096", "cache", "size the cache is pruned to after each store, MiB", codegen=False),
    _s("GEMM_BLOCKING", "str", "", "gemm", "packed GEMM blocks: mr=..,nr=..,mc=..,kc=..,nc=..[,width=..] (default: from the caches)"),
    _s("CONV_INPLACE", "str", "auto", "conv", "im2col packed in place: auto, 1 (always) or 0 (never)"),
    _s("WINOGRAD", "str", "", "conv", "force Winograd: 0 (off), 2 (F(2x2,3x3)) or 4 (F(4x4,3x3)); default: by layer shape"),
    _s("DW_PRODUCT", "bool", "1", "depthwise", "1x1 expansions computed inside the depthwise Conv that reads them"),
    _s("IGEMM", "str", "", "int8", "force the int8 micro-kernel: vnni|madd|madd8[,mr=..,nr=..,kc=..,mc=..,nc=..]"),
    _s("IGEMM_ROWS", "str", "", "int8", "int8 convolutions as rows: 1 (always), 0 (never); default: by shape"),
    # read by the test suite, not by builds
    _s("EMULATOR_FULL", "bool", "0", "tests", "the long CUDA emulator runs (make test-emulator)", codegen=False),
    _s("SKIP_GPU", "bool", "0", "tests", "1: skip the tests that run on a CUDA device", codegen=False),
    _s("MODELS", "str", "/work/models", "tests", "folder of the exported acceptance models (scripts/make_models.py --out)", codegen=False),
    _s("AFFINE_PASSES", "str", "", "tests", "the affine C suite under another pass pipeline than polyml opt's default", codegen=False),
    # read by scripts/install.sh and docker/build.sh (shell), listed so that none looks like a typo
    _s("EXTRAS", "str", "test", "install", "pip extras scripts/install.sh installs", codegen=False),
    _s("WHEELHOUSE", "str", "", "install", "install offline from this folder of wheels", codegen=False),
    _s("INSTALL_STEPS", "str", "", "install", "only these steps of scripts/install.sh (default apt,python)", codegen=False),
    _s("INSTALL_DRY_RUN", "bool", "0", "install", "1: print what scripts/install.sh would run", codegen=False),
    _s("LLVM_APT_VERSION", "str", "", "install", "exact apt version of llvm-19 clang-19 libpolly-19-dev", codegen=False),
    _s("PYTHON_APT_VERSION", "str", "", "install", "exact apt version of python3 python3-venv", codegen=False),
    _s("IMAGE", "str", "", "install", "tag of the image docker/build.sh builds", codegen=False),
    _s("DOCKER_CONTEXT", "str", "", "install", "docker/build.sh's build context folder", codegen=False),
)

BY_NAME: dict[str, Setting] = {s.name: s for s in REGISTRY}


def _setting(name: str) -> Setting:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name}: not a registered setting (polyml/options.py)") from None


def raw(name: str, environ: Mapping[str, str] | None = None) -> str:
    """The setting's text: the environment's value if set (and not blank), else its default."""
    env = os.environ if environ is None else environ
    value = env.get(_setting(name).name, "")
    return value if value.strip() else _setting(name).default


def value(name: str, environ: Mapping[str, str] | None = None) -> bool | int | str:
    """The setting parsed as its type."""
    return _setting(name).parse(raw(name, environ))


def is_set(name: str, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get(_setting(name).name, "").strip())


def codegen_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The code-changing settings given in the environment (name → text): cache key, manifest."""
    env = os.environ if environ is None else environ
    return {s.name: env[s.name] for s in REGISTRY if s.codegen and env.get(s.name, "").strip()}


def unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """``POLYML_*`` variables in the environment that no setting declares (typos)."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("POLYML_") and k not in BY_NAME)


def listing(environ: Mapping[str, str] | None = None) -> list[dict]:
    """Every setting with its current value (``polyml options --json``)."""
    env = os.environ if environ is None else environ
    return [{**s.to_json(), "value": raw(s.name, env), "set": is_set(s.name, env)} for s in REGISTRY]


def markdown_table() -> str:
    """The registry as the table of docs/OPTIONS.md."""
    rows = ["| variable | type | default | changes code | what it does |", "|---|---|---|---|---|"]
    for section in SECTIONS:
        for s in (s for s in REGISTRY if s.section == section):
            rows.append(f"| `{s.name}` | {s.kind} | `{s.default}` | {'yes' if s.codegen else 'no'} | {s.doc} |")
    return "\n".join(rows) + "\n"


@dataclass(frozen=True)
class CodegenConfig:
    """What the lowering chooses beyond the graph, passed to every kernel explicitly
    (:meth:`polyml.kernels.Kernel.configured`, :attr:`polyml.codegen.KernelBuilder.config`).

    ``packed``: products on polyml's packed GEMM (False: the plain nests Polly's GEMM pattern
    matches, also what CUDA and the SCoP tools lower); ``conv``: ``auto``, ``gemm`` or
    ``direct`` (:attr:`polyml.driver.flags.Options.conv`); ``threaded``: the build may split loops
    over threads (some GEMM/direct choices differ by thread count).  The rest are the
    code-changing settings of :data:`REGISTRY`, as text (``""``: by shape / from the caches)."""

    packed: bool = False
    #: products through schedules of their plain nests (:mod:`polyml.schedule`) rather than
    #: the hand-written packed GEMM
    schedule: bool = False
    #: with ``schedule``: those products as their plain nests, unscheduled (``--no-schedule``)
    plain_nests: bool = False
    conv: str = "auto"
    threaded: bool = True
    gemm_blocking: str = ""
    conv_inplace: str = "auto"
    winograd: str = ""
    dw_product: bool = True
    igemm: str = ""
    igemm_rows: str = ""
    #: imported tiles of this node's schedule (``--import-schedules``, given per node by the
    #: lowering: :func:`polyml.schedule.exchange.with_tiles`, :func:`~polyml.schedule.exchange.with_depthwise_tiles`);
    #: empty: the cost model's
    schedule_tiles: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_settings(cls, settings: Mapping[str, str], **build: bool | str) -> CodegenConfig:
        """The configuration for ``settings`` (name → text, as :func:`codegen_settings` gives)
        and the build's choices ``build`` (``packed``, ``conv``, ``threaded``)."""
        fields = {f: value(f"POLYML_{f.upper()}", settings) for f in _SETTING_FIELDS}
        return cls(**build, **fields)


#: CodegenConfig fields that come from a registry setting of the same name
_SETTING_FIELDS = ("gemm_blocking", "conv_inplace", "winograd", "dw_product", "igemm", "igemm_rows")
