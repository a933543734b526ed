"""``polyml opt IN.ll --passes P -o OUT.ll``: polyml's JSCoP passes on any LLVM IR, through Polly."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rich.markup import escape

from polyml.cli import command, console
from polyml.errors import PolymlError


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", help="LLVM IR (.ll), e.g. clang-19 -O1 -Xclang -disable-llvm-passes -S -emit-llvm")
    p.add_argument("-o", "--output", required=True, help="IR file to write")
    p.add_argument("--passes", default="", help="pass pipeline, e.g. 'tile' or 'interchange{dims=2,3},tile{sizes=32,32}'")
    p.add_argument("--import-jscop", metavar="DIR", default="", help="start from the edited JSCoP files in DIR (others as detected)")
    p.add_argument("--jscop-dir", metavar="DIR", default="", help="also write every SCoP's JSCoP (and .new: what was imported)")
    p.add_argument("-O", dest="opt_level", type=int, choices=[0, 1, 2, 3], default=0,
                   help="run LLVM's default<On> pipeline after Polly's code generation (default 0: none)")
    p.add_argument("--opt-arg", action="append", default=[], metavar="ARG",
                   help="extra opt-19 argument for the import step, e.g. --opt-arg=-polly-codegen-emit-rtc-print")


@command("opt", _arguments, "apply JSCoP passes (or edited JSCoPs) to the SCoPs of an LLVM IR file")
def cmd_opt(args: argparse.Namespace) -> int:
    from polyml import passes
    from polyml.scop import exchange

    if not args.passes and not args.import_jscop:
        raise PolymlError("polyml opt: give --passes PIPELINE and/or --import-jscop DIR")
    pipeline = passes.parse_pipeline(args.passes) if args.passes else []
    edited = exchange.load_dir(args.import_jscop) if args.import_jscop else {}
    src = Path(args.input)
    if not src.is_file():
        raise PolymlError(f"{src}: no such IR file")

    def rewrite(scop):
        start = edited.get(scop.file_name)
        if start is None and not pipeline:
            return None
        return passes.run(pipeline, start if start is not None else scop.jscop)

    out = Path(args.output).resolve()  # a failing opt leaves its IR, JSCoPs and command in failed/ next to it
    # the identity round trip re-imports unchanged schedules; other pipelines leave them alone
    round_trip = bool(pipeline) and all(p.name == "identity" for p in pipeline)
    with tempfile.TemporaryDirectory(prefix="polyml-opt-") as tmp:
        found, new = exchange.transform(src, out, rewrite, Path(tmp), opt_level=args.opt_level,
                                        keep_jscop=Path(args.jscop_dir) if args.jscop_dir else None, extra=args.opt_arg,
                                        keep_unchanged=round_trip, keep_failed=out.parent)
    unknown = sorted(set(edited) - {s.file_name for s in found.scops})
    if unknown:
        console.print(f"[yellow]note:[/] no SCoP for {escape(', '.join(unknown))}")
    for s in found.scops:
        state = "transformed" if s.file_name in new else "unchanged"
        console.print(f"{escape(s.function)} {escape(s.region)}: {len(s.jscop['statements'])} statement(s), {state}", highlight=False)
    for r in found.rejected:
        console.print(f"[yellow]not a SCoP[/] {escape(r.function)}: {escape(r.reason)}", highlight=False)
    console.print(f"wrote {escape(args.output)}")
    return 0
