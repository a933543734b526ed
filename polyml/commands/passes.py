"""``polyml passes``: the registered JSCoP passes (polyml's and the ``polyml.passes`` entry points)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from rich.markup import escape
from rich.table import Table

from polyml.commands._common import command, out


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="name, origin, summary and options of each pass as JSON")


@command("passes", _arguments, "list the JSCoP passes (built in and from the polyml.passes entry-point group)")
def cmd_passes(args: argparse.Namespace) -> int:
    from polyml.passes import available

    infos = available()
    if args.json:
        rows = [{"name": i.name, "origin": i.origin, "summary": i.summary or i.error,
                 "options": [f.name for f in dataclasses.fields(i.cls)] if i.cls else []} for i in infos.values()]
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return 0
    table = Table(show_header=True, header_style="bold")
    table.add_column("pass")
    table.add_column("options")
    table.add_column("origin")
    table.add_column("what it does")
    for i in infos.values():
        opts = ", ".join([f.name for f in dataclasses.fields(i.cls)]) if i.cls else ""
        table.add_row(escape(i.name), escape(opts), escape(i.origin), escape(i.summary or f"[red]{i.error}[/]"))
    out.print(table)
    return 0
