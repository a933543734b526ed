"""The ``polyml`` command line: build, run (more subcommands register in ``COMMANDS``)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

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
    p.add_argument("--threads", type=int, default=0, help="OpenMP threads (default: all cores)")
    p.add_argument("--tile-sizes", default="auto", metavar="auto|off|l1=48K,l2=2M,conv=1M",
                   help="cache tiling of the conv nests: host cache sizes (auto), off, or explicit sizes")
    p.add_argument("--gemm", choices=("packed", "polly"), default="packed",
                   help="matrix products: polyml's packed micro-kernel GEMM (default) or Polly's GEMM pattern")
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
    p.add_argument("--passes", default="", metavar="PIPELINE",
                   help="JSCoP pass pipeline for the SCoPs of op functions with policy polly/tile, legality-checked "
                        "('default': polyml opt's pipeline; recorded in the manifest)")


def _compile(args: argparse.Namespace, model: Path, outdir: Path, emit: list[str]):
    from polyml.compiler import compile as polyml_compile

    shapes = dict(parse_shape(s) for s in args.input_shape)
    outputs = args.output_names.split(",") if args.output_names else None
    return polyml_compile(model, outdir, input_shapes=shapes, outputs=outputs, emit=emit, polly=args.polly, fuse=args.fuse,
                          attention=getattr(args, "fuse_attention", True), threads=args.threads, tile_sizes=getattr(args, "tile_sizes", "auto"), gemm=getattr(args, "gemm", "packed"),
                          conv=getattr(args, "conv", "auto"), cache=getattr(args, "cache", None),
                          import_jscop=str(Path(args.import_jscop).resolve()) if getattr(args, "import_jscop", "") else "",
                          passes=getattr(args, "passes", "") or "")


def cmd_build(args: argparse.Namespace) -> int:
    if getattr(args, "from_manifest", None):
        from polyml.repro import cmd_rebuild

        return cmd_rebuild(args, console)
    if not args.model or not args.output:
        raise PolymlError("polyml build: give MODEL and -o DIR (or --from-manifest MANIFEST)")
    if getattr(args, "target", "cpu") == "cuda":
        from polyml.commands.gpu_map import build_cuda

        return build_cuda(args)
    model = Path(args.model)
    if any(e.startswith("fusion") for e in args.emit):  # before a long build: the plot extra is there
        from polyml.plot import _extra

        if "fusion-dot" in args.emit:
            _extra.graphviz("--emit fusion-dot")
        if {"fusion.svg", "fusion.png"} & set(args.emit):
            _extra.require("--emit fusion.svg")
    t0 = time.perf_counter()
    compiled = _compile(args, model, Path(args.output), args.emit)
    m = compiled.manifest
    hit = (getattr(compiled, "cache", None) or {}).get("hit")
    note = " (cache hit: stage times of the cached build)" if hit else ""
    table = Table(title=f"polyml build {model.name} → {args.output}{note}", show_header=True)
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    for k, v in m["seconds"].items():
        if isinstance(v, (int, float)):
            table.add_row(k, f"{v:.3f}")
    table.add_row("total", f"{time.perf_counter() - t0:.3f}")
    console.print(table)
    policies: dict[str, int] = {}
    for f in m["functions"]:
        policies[f["policy"]] = policies.get(f["policy"], 0) + 1
    console.print(
        f"{len(m['functions'])} op functions ({', '.join(f'{v} {k}' for k, v in sorted(policies.items()))}); "
        f"weights {m['weights_bytes'] / 1e6:.1f} MB, arena {m['arena_bytes'] / 1e6:.1f} MB; "
        f"{m['loop_nests']} loop nests, intermediates {m['intermediate_bytes'] / 1e6:.1f} MB"
    )
    print_fusion(m.get("fusion"), verbose=args.verbose)
    if m.get("quantization"):  # which quantized ops became integer code, which ran in float
        console.print(m["quantization"]["summary"])
    return 0


def print_fusion(fusion: dict | None, verbose: bool = False, limit: int = 12) -> None:
    """The fusion report: which ops became which nest, and why candidates were refused."""
    if not fusion:
        return
    groups, blocked, folded = fusion["groups"], fusion["blocked"], fusion["folded"]
    nests = [g for g in groups if g["kind"] != "concat-in-place"]
    fused_ops = sum(len(g["ops"]) for g in nests)
    console.print(f"fusion: {fused_ops} ops in {len(nests)} fused nests, {len(groups) - len(nests)} concat inputs stored in "
                  f"place, {len(folded)} folded into conv weights, "
                  f"{len(blocked)} candidates refused (all in manifest.json)")
    shown = groups if verbose else groups[:limit]
    for g in shown:
        console.print(f"  nest {escape(g['nest'])} ({g['kind']}): {escape(' + '.join(g['ops']))}", highlight=False)
    if len(shown) < len(groups):
        console.print(f"  … {len(groups) - len(shown)} more (--verbose)")
    for b in blocked if verbose else blocked[:limit]:
        console.print(f"  not fused: {escape(b['producer'])} → {escape(b['consumer'])}: {escape(b['reason'])}", highlight=False)


def _load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise InputError(f"{path}: no such inputs file") from None
    except Exception as e:
        raise InputError(f"{path}: not a readable .npz file ({e})") from None


def cmd_run(args: argparse.Namespace) -> int:
    target = Path(args.model)
    feeds = _load_npz(args.inputs)
    tmp = None
    kind = getattr(args, "target", "cpu")
    if target.is_dir():
        from polyml.gpu.runtime import load_artifact

        # a CUDA build runs on the device (or says there is none), or on the emulator
        compiled = load_artifact(target, kind if kind != "cpu" else None)
    elif kind != "cpu":
        from polyml.compiler import read_graph
        from polyml.gpu.build import compile_cuda

        shapes = dict(parse_shape(s) for s in args.input_shape)
        graph = read_graph(target, input_shapes=shapes, outputs=args.output_names.split(",") if args.output_names else None)
        compiled = compile_cuda(graph, None, kind, fuse=args.fuse, shared_memory=args.shared_memory, sm=args.sm)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="polyml-run-")
        compiled = _compile(args, target, Path(tmp.name), [])
    try:
        results = compiled.run(feeds)
        if args.outputs_file:
            np.savez(args.outputs_file, **results)
        for name, a in results.items():
            out.print(f"{name}: {a.dtype}{list(a.shape)} min {a.min():.6g} max {a.max():.6g} mean {a.mean():.6g}"
                      if a.size else f"{name}: {a.dtype}{list(a.shape)} (empty)")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


COMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, add_arguments: Callable[[argparse.ArgumentParser], None], help: str):
    """Decorator registering ``fn(args) -> exit code`` as ``polyml NAME``."""

    def wrap(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS[name] = (fn, add_arguments, help)
        return fn

    return wrap


def _load_commands() -> None:
    import importlib
    import pkgutil

    import polyml.commands

    for info in pkgutil.iter_modules(polyml.commands.__path__):
        importlib.import_module(f"polyml.commands.{info.name}")


def _build_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="model file (.onnx, .pb, .pbtxt)")
    p.add_argument("-o", "--output", help="artifact folder to write (required unless --from-manifest)")
    p.add_argument("--from-manifest", metavar="MANIFEST", default=None,
                   help="rebuild what a manifest.json records (MODEL overrides its model path) and report any difference")
    p.add_argument("-v", "--verbose", action="store_true", help="print the whole fusion report")
    p.add_argument("--emit", action="append", default=[], choices=["ll", "jscop", "fusion.svg", "fusion.png", "fusion-dot"],
                   help="also write the IR before and after opt (ll), Polly's JSCoP of every SCoP into jscop/ (jscop), "
                        "the graph after fusion with each refused candidate's reason (fusion.svg, fusion.png: needs "
                        "pip install 'polyml[plot]'; fusion-dot: fusion.dot for Graphviz)")
    p.add_argument("--target", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: a shared object for this host (default); cuda: PTX kernels (docs/GPU.md)")
    p.add_argument("--sm", default="sm_90", help="with --target cuda: the GPU architecture of the PTX (default sm_90)")
    p.add_argument("--shared-memory", action="store_true",
                   help="with --target cuda: copy reused conv/matmul input tiles into shared memory (docs/GPU.md)")
    _add_build_options(p)


def _run_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="artifact folder, or a model file (compiled first with the defaults)")
    p.add_argument("--inputs", required=True, help=".npz keyed by graph input names")
    p.add_argument("--outputs", dest="outputs_file", default=None, help=".npz to write, keyed by output names")
    p.add_argument("--target", choices=["cpu", "cuda", "cuda-emulated"], default="cpu",
                   help="a model file: build for the CPU (default) or CUDA and run on the device or on the CPU "
                        "emulator (cuda-emulated, bounds-checked: docs/GPU.md); an artifact folder of a CUDA build: "
                        "the device, or the emulator with cuda-emulated")
    p.add_argument("--sm", default="sm_90", help="with --target cuda: the GPU architecture of the PTX (default sm_90)")
    p.add_argument("--shared-memory", action="store_true",
                   help="with --target cuda/cuda-emulated and a model file: shared-memory promotion (docs/GPU.md)")
    _add_build_options(p, outputs_flag="--output-names")


COMMANDS["build"] = (cmd_build, _build_parser, "compile a model to an artifact folder")
COMMANDS["run"] = (cmd_run, _run_parser, "run a model or artifact on inputs from an .npz")


def main(argv: list[str] | None = None) -> int:
    _load_commands()
    parser = argparse.ArgumentParser(prog="polyml", description="polyhedral compiler for ONNX and TensorFlow models")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, add, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        add(p)
        p.set_defaults(func=fn)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except PolymlError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # `python -m polyml.cli`: run the imported module's main, the one subcommands register with
    from polyml.cli import main as cli_main

    sys.exit(cli_main())
