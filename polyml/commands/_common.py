"""What the ``polyml`` command line and its subcommands share: the consoles, the subcommand
registry (:func:`command`), and the build options and helpers of ``build``/``run``/``bench``.

:mod:`polyml.cli` and every module of :mod:`polyml.commands` import from here (the subcommands
never import :mod:`polyml.cli`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console

from polyml.errors import InputError, PolymlError

console = Console(stderr=True, soft_wrap=True)
out = Console()


def parse_shape(spec: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=1x3x224x224`` → (NAME, (1, 3, 224, 224))."""
    name, sep, dims = spec.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 0 for d in shape):
        raise PolymlError(f"--input-shape {spec!r}: expected NAME=D0xD1x...")
    return name, shape


def _add_build_options(p: argparse.ArgumentParser, outputs_flag: str = "--outputs") -> None:
    p.add_argument("--polly", action=argparse.BooleanOptionalAction, default=True, help="optimize with Polly (default on)")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help="operator fusion (default on; --no-fuse keeps one nest per op)")
    p.add_argument("--fuse-attention", action=argparse.BooleanOptionalAction, default=True,
                   help="with --fuse: each attention head's MatMul → scale/mask → Softmax → MatMul as one nest (default on)")
    p.add_argument("--schedule", action=argparse.BooleanOptionalAction, default=True,
                   help="polyml's schedule trees for the op families on them (default on; --no-schedule emits "
                        "their plain nests for opt -O3, the baseline the schedules are measured against)")
    p.add_argument("--threads", type=int, default=0, help="OpenMP threads (default: all cores)")
    p.add_argument("--tile-sizes", default="auto", metavar="auto|off|l1=48K,l2=2M,conv=1M",
                   help="cache tiling of the conv nests: host cache sizes (auto), off, or explicit sizes")
    p.add_argument("--gemm", choices=("schedule", "packed", "polly"), default="schedule",
                   help="matrix products: the GEMM nest under polyml's BLIS schedule with the micro-kernel as its "
                        "intrinsic where it applies, else the packed GEMM (default); the hand-written packed GEMM "
                        "everywhere; or Polly's GEMM pattern")
    p.add_argument("--conv", choices=("auto", "gemm", "direct"), default="auto",
                   help="convolutions: packed GEMM or direct nests chosen by shape (auto), or one of them where possible")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="fix the shape of a graph input with symbolic dimensions (repeatable)")
    p.add_argument(outputs_flag, dest="output_names", default=None,
                   help="comma-separated output tensor names (TensorFlow graphs; default: the graph's sinks)")
    p.add_argument("--no-cache", dest="cache", action="store_const", const=False, default=None,
                   help="build even when the compile cache has this build (see `polyml cache`)")
    p.add_argument("--import-jscop", metavar="DIR", default="",
                   help="import the hand-edited JSCoP files in DIR (from --emit jscop), legality-checked first")
    p.add_argument("--import-schedules", metavar="DIR", default="",
                   help="import the schedule files in DIR (from --emit schedules): edited tiles (GEMM-family mc, kc, nc; "
                        "depthwise group or band), legality-checked; a build's own files change nothing")
    p.add_argument("--passes", default="", metavar="PIPELINE",
                   help="JSCoP pass pipeline for the SCoPs of op functions with policy polly/tile, legality-checked "
                        "('default': polyml opt's pipeline; recorded in the manifest)")


def _compile(args: argparse.Namespace, model: Path, outdir: Path, emit: list[str]):
    from polyml.compiler import compile as polyml_compile

    shapes = dict(parse_shape(s) for s in args.input_shape)
    outputs = args.output_names.split(",") if args.output_names else None
    return polyml_compile(model, outdir, input_shapes=shapes, outputs=outputs, emit=emit, polly=args.polly, fuse=args.fuse,
                          attention=getattr(args, "fuse_attention", True), threads=args.threads, tile_sizes=getattr(args, "tile_sizes", "auto"), gemm=getattr(args, "gemm", "schedule"),
                          schedule=getattr(args, "schedule", True),
                          conv=getattr(args, "conv", "auto"), cache=getattr(args, "cache", None),
                          import_jscop=str(Path(args.import_jscop).resolve()) if getattr(args, "import_jscop", "") else "",
                          import_schedules=str(Path(args.import_schedules).resolve()) if getattr(args, "import_schedules", "") else "",
                          passes=getattr(args, "passes", "") or "")


def _load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise InputError(f"{path}: no such inputs file") from None
    except Exception as e:
        raise InputError(f"{path}: not a readable .npz file ({e})") from None


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, add_arguments: Callable[[argparse.ArgumentParser], None], help: str):
    """Decorator registering ``fn(args) -> exit code`` as ``polyml NAME``."""

    def wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (fn, add_arguments, help)
        return fn

    return wrap
