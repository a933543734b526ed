"""``polyml opt IN.ll [--passes P] -o OUT.ll``: polyml's JSCoP passes (default: its pipeline, passes/pipeline.py) on any LLVM IR, through Polly."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.markup import escape

from polyml.commands._common import command, console
from polyml.errors import PolymlError


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="LLVM IR (.ll), e.g. clang-19 -O1 -Xclang -disable-llvm-passes -S -emit-llvm")
    p.add_argument("-o", "--output", required=True, help="IR file to write")
    p.add_argument("--passes", default="", help="pass pipeline, e.g. 'tile' or 'interchange{dims=2,3},tile{sizes=32,32}'")
    p.add_argument("--import-jscop", metavar="DIR", default="", help="start from the edited JSCoP files in DIR (others as detected)")
    p.add_argument("--jscop-dir", metavar="DIR", default="", help="also write every SCoP's JSCoP (and .new: what was imported)")
    p.add_argument("-O", dest="opt_level", type=int, choices=[0, 1, 2, 3], default=0,
                   help="run LLVM's default<On> pipeline after Polly's code generation (default 0: none)")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="OpenMP threads of the parallel loops (0: OMP_NUM_THREADS / all cores; 1: no parallel code)")
    p.add_argument("--tune", type=int, default=0, metavar="N",
                   help="build up to N pipeline/tile-size variants (the IR needs a main), time them, keep the fastest; "
                        "the choice is written to OUTPUT.tune.json")
    p.add_argument("--opt-arg", action="append", default=[], metavar="ARG",
                   help="extra opt-19 argument for the import step, e.g. --opt-arg=-polly-codegen-emit-rtc-print")


@command("opt", _arguments, "apply JSCoP passes (or edited JSCoPs) to the SCoPs of an LLVM IR file")
def cmd_opt(args: argparse.Namespace) -> int:
    from polyml import passes
    from polyml.passes import pipeline as P
    from polyml.scop import exchange, optimize

    if args.threads < 0:
        raise PolymlError(f"--threads {args.threads}: expected 0 (all cores) or a positive count")
    # no --passes (and nothing to import): the default policy (passes/pipeline.py)
    text: str | None = args.passes or ("" if args.import_jscop else None)
    pipeline = passes.parse_pipeline(text) if text else []
    edited = exchange.load_dir(args.import_jscop) if args.import_jscop else {}
    src = Path(args.input)
    if not src.is_file():
        raise PolymlError(f"{src}: no such IR file")
    out = Path(args.output).resolve()  # a failing opt leaves its IR, JSCoPs and command in failed/ next to it
    if args.tune:
        if edited:
            raise PolymlError("polyml opt: --tune and --import-jscop do not go together")
        variants = [text] if text else P.tune_variants(args.tune)
        chosen, trials = optimize.tune(src, out, variants[: args.tune], threads=args.threads,
                                       log=lambda t: console.print(
                                           f"  {escape(t.pipeline)}: " + (f"{t.seconds:.3f} s" if t.seconds is not None
                                                                           else f"[red]failed[/] {escape(t.error)}"),
                                           highlight=False))
        record = out.with_name(out.name + ".tune.json")
        optimize.write_choice(record, chosen, trials, args.threads)
        console.print(f"kept {escape(chosen.pipeline)} ({chosen.seconds:.3f} s); wrote {escape(args.output)} and "
                      f"{escape(str(record))}", highlight=False)
        return 0
    # the identity round trip re-imports unchanged schedules; other pipelines leave them alone
    round_trip = bool(pipeline) and all(p.name == "identity" for p in pipeline)
    with tempfile.TemporaryDirectory(prefix="polyml-opt-") as tmp:
        result = optimize.run(src, out, Path(tmp), text, edited, threads=args.threads, opt_level=args.opt_level,
                              keep_jscop=Path(args.jscop_dir) if args.jscop_dir else None, extra=args.opt_arg,
                              keep_unchanged=round_trip, keep_failed=out.parent)
    found, new = result.found, result.new
    unknown = sorted(set(edited) - {s.file_name for s in found.scops})
    if unknown:
        console.print(f"[yellow]note:[/] no SCoP for {escape(', '.join(unknown))}")
    for s in found.scops:
        state = ("left to Polly's optimizer" if s.function in result.polly
                 else "transformed" if s.file_name in new else "unchanged")
        how = f" ({result.pipelines[s.file_name]})" if text is None and s.file_name in result.pipelines else ""
        if s.function in result.dismissed:
            # the default policy ran its pipeline there instead; an explicit pipeline keeps -O3's code
            how += ", which left it unchanged (-O3's code)" if s.function in result.polly else \
                ": Polly's optimizer left it unchanged"
        console.print(f"{escape(s.function)} {escape(s.region)}: {len(s.jscop['statements'])} statement(s), {state}"
                      f"{escape(how)}", highlight=False)
    for r in found.rejected:
        console.print(f"[yellow]not a SCoP[/] {escape(r.function)}: {escape(r.reason)}", highlight=False)
    console.print(f"wrote {escape(args.output)}")
    return 0
