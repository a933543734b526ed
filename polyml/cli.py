"""The ``polyml`` command line: build, run (more subcommands register in ``COMMANDS``)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

from polyml.commands._common import COMMANDS, _add_build_options, _compile, _load_npz, console, out, parse_shape
from polyml.errors import PolymlError


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


def cmd_run(args: argparse.Namespace) -> int:
    target = Path(args.model)
    feeds = _load_npz(args.inputs)
    tmp = None
    kind = getattr(args, "target", "cpu")
    if target.is_dir():
        from polyml.gpu.load import load_artifact

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
    p.add_argument("--emit", action="append", default=[], choices=["ll", "jscop", "schedules", "fusion.svg", "fusion.png", "fusion-dot"],
                   help="also write the IR before and after opt (ll), Polly's JSCoP of every SCoP into jscop/ (jscop), "
                        "the plan, schedule trees and loops of every function on polyml's schedules into schedules/ "
                        "(schedules: edit the tiles and build with --import-schedules), "
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
