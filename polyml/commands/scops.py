"""``polyml scops MODEL``: every SCoP Polly finds, with dependences and isl AST, and what it rejected.

``--target cuda``: instead, the GPU mapping of every kernel (see :mod:`polyml.commands.gpu_map`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from polyml.commands._common import command, console, out, parse_shape


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file (.onnx, .pb, .pbtxt) or LLVM IR (.ll)")
    p.add_argument("--json", action="store_true", help="machine-readable output (the keys are documented in docs/SCOP_WORKFLOW.md)")
    p.add_argument("--after", metavar="PASSES", default="",
                   help="show the schedules after these passes (e.g. 'tile{sizes=32,32}'), legality-checked")
    p.add_argument("--function", metavar="REGEX", default="", help="only functions whose name matches REGEX")
    p.add_argument("--schedules", action="store_true",
                   help="the schedule trees of the functions a build lowers through polyml's own schedules (path "
                        "'schedule' in the manifest), each with the loops isl generates from it, instead of Polly's SCoPs")
    p.add_argument("--write-jscop", metavar="DIR", default="",
                   help="write the JSCoP of every SCoP shown (after --after) into DIR, ready for build --import-jscop")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True, help="lower with operator fusion, as build does")
    p.add_argument("--threads", type=int, default=0, help="lower as build --threads N does (1: no parallel outlining)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="fix the shape of a graph input with symbolic dimensions (repeatable)")
    p.add_argument("--outputs", dest="output_names", default=None, help="comma-separated output tensor names (TensorFlow)")
    p.add_argument("--target", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: per kernel, which band loops became blockIdx/threadIdx, tiles, grid/block, loops "
                        "left in the thread and shared-memory promotion (as polyml gpu-map)")
    p.add_argument("--shared-memory", action="store_true", help="with --target cuda: map as build --shared-memory does")
    p.add_argument("--plot", metavar="DIR", default="",
                   help="draw each statement's domain into DIR: a 2-D slice's points coloured by tile, the execution "
                        "order, dependence arrows; with --after the original and the new schedule side by side "
                        "(needs pip install 'polyml[plot]')")
    p.add_argument("--plot-dims", metavar="A,B", default="", help="the two domain dimensions to draw (default: the innermost pair; statements without them are skipped)")
    p.add_argument("--plot-fix", metavar="NAME=V,...", default="",
                   help="values of the dimensions not drawn and of the parameters (default: the smallest in the domain)")
    p.add_argument("--plot-window", metavar="HxW", default="32x32",
                   help="at most H values of the outer and W of the inner drawn dimension, from the smallest (default 32x32)")
    p.add_argument("--plot-format", choices=["svg", "png"], default="svg", help="picture format (default svg)")


@command("scops", _arguments, "list the SCoPs of a model or .ll file: statements, accesses, dependences, AST")
def cmd_scops(args: argparse.Namespace) -> int:
    if args.target == "cuda":
        from polyml.commands.gpu_map import show_gpu_mapping
        from polyml.errors import PolymlError

        if Path(args.model).suffix == ".ll" or args.after or args.write_jscop or args.plot:
            raise PolymlError("polyml scops --target cuda: give a model file (no .ll, --after, --write-jscop or --plot)")
        return show_gpu_mapping(args)
    from polyml import passes
    from polyml.scop import dependences, legality, printer
    from polyml.scop import jscop as J
    from polyml.scop.detect import detect
    from polyml.scop.exchange import model_sources

    if args.schedules:
        return _show_schedules(args)
    pipeline = passes.parse_pipeline(args.after) if args.after else []
    spec = None
    if args.plot:
        from polyml.plot import _extra, domain

        _extra.require("polyml scops --plot")
        spec = domain.SliceSpec(tuple(d for d in args.plot_dims.split(",") if d), domain.parse_fix(args.plot_fix),
                                domain.parse_window(args.plot_window))
        taken: set[str] = set()
        pictures = 0
    shapes = dict(parse_shape(s) for s in args.input_shape)
    outputs = args.output_names.split(",") if args.output_names else None
    jobs = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="polyml-scops-") as tmp:
        src = model_sources(Path(args.model), Path(tmp), shapes, outputs, args.fuse, chunks=jobs, parallel=args.threads != 1)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            found = list(pool.map(detect, src.files.values()))
    keep = re.compile(args.function) if args.function else None
    scops = [s for d in found for s in d.scops if keep is None or keep.search(s.function)]
    rejected = [r for d in found for r in d.rejected if keep is None or keep.search(r.function)]
    entries = []
    for s in scops:
        deps = dependences.compute(s.jscop, s.access_kinds)
        jscop = s.jscop
        if pipeline:
            jscop = passes.run(pipeline, s.jscop)
            legality.check(s.jscop, jscop, f"{s.function} {s.region} after {args.after}", deps, s.access_kinds)
        entries.append(printer.scop_json(s, jscop, src.op_of, deps, src.ops_of))
        if spec is not None:
            pictures += len(domain.plot_scop(s.jscop, deps, args.plot, spec, s.function, [st["op"] for st in entries[-1]["statements"]],
                                             jscop if pipeline else None, args.after, args.plot_format, taken))
        if args.write_jscop:
            Path(args.write_jscop).mkdir(parents=True, exist_ok=True)
            J.dump(J.padded(jscop), Path(args.write_jscop) / s.file_name)
    report = printer.report_json(entries, rejected, src.op_of)
    if spec is not None:
        from polyml.errors import PolymlError

        if spec.dims and not pictures:
            raise PolymlError(f"--plot-dims {args.plot_dims}: no statement has these dimensions")
        console.print(f"{pictures} domain pictures in {args.plot}", highlight=False)
    if args.json:
        sys.stdout.write(json.dumps(report, indent=1) + "\n")
    else:
        title = f"{args.model}" + (f" after {args.after}" if args.after else "")
        printer.print_text(report, out, title)
    return 0


def _show_schedules(args: argparse.Namespace) -> int:
    """``--schedules``: lower the model as ``polyml build`` does and show, per function on the
    schedule path, its tree (isl's block YAML) and the loops isl's AST generator makes of it."""
    from polyml.codegen.lower import lower_graph
    from polyml.driver.flags import Options
    from polyml.driver.toolchain import host_target
    from polyml.errors import PolymlError
    from polyml.passes.fuse import FuseOperators
    from polyml.pipeline import prepare
    from polyml.schedule import exchange as schedule_exchange

    if Path(args.model).suffix == ".ll" or args.after or args.write_jscop or args.plot:
        raise PolymlError("polyml scops --schedules: give a model file (no .ll, --after, --write-jscop or --plot)")
    shapes = dict(parse_shape(s) for s in args.input_shape)
    outputs = args.output_names.split(",") if args.output_names else None
    parallel = args.threads != 1
    config = Options(fuse=args.fuse, threads=args.threads).codegen(True, parallel)
    graph = prepare(Path(args.model), input_shapes=shapes, outputs=outputs,
                    fusion=FuseOperators(config=config) if args.fuse else None).graph
    lowered = lower_graph(graph, host_target(), parallel=parallel, config=config)
    keep = re.compile(args.function) if args.function else None
    entries = []
    for step in lowered.steps:
        if not step.schedules or (keep is not None and not keep.search(step.function)):
            continue
        for text in step.schedules:
            entries.append({"function": step.function, "node": step.node, "op_type": step.op_type,
                            "detail": step.detail, "tree": text, "loops": schedule_exchange.loops(text)})
    if args.json:
        sys.stdout.write(json.dumps({"schedules": entries}, indent=1) + "\n")
        return 0
    for e in entries:
        out.print(f"[bold]{e['function']}[/bold] ({e['op_type']} {e['node']}: {e['detail']})")
        sys.stdout.write(e["tree"].rstrip() + "\n\n" + e["loops"].rstrip() + "\n\n")  # unwrapped: isl's text
    if not entries:
        out.print("no function of this model is on polyml's schedules (see the manifest's functions[].path)")
    return 0
