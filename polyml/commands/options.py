"""``polyml options``: every environment setting polyml reads (:mod:`polyml.options`), its type,
default, current value and whether it changes generated code."""

from __future__ import annotations

import argparse
import json
import sys

from rich.markup import escape
from rich.table import Table

from polyml import options
from polyml.commands._common import command, out


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="each setting as JSON (name, type, default, doc, section, "
                   "changes_code, value, set)")
    p.add_argument("--markdown", action="store_true", help="the registry as docs/OPTIONS.md's table")


@command("options", _arguments, "list the POLYML_* settings: type, default, current value, whether they change code")
def cmd_options(args: argparse.Namespace) -> int:
    if args.markdown:
        sys.stdout.write(options.markdown_table())
        return 0
    rows = options.listing()
    if args.json:
        sys.stdout.write(json.dumps({"settings": rows, "unknown": options.unknown()}, indent=1) + "\n")
        return 0
    table = Table(show_header=True, header_style="bold")
    for col in ("setting", "type", "value", "code", "what it does"):
        table.add_column(col)
    for r in rows:
        shown = f"[bold]{escape(r['value'])}[/]" if r["set"] else escape(r["value"])
        table.add_row(escape(r["name"]), r["type"], shown, "yes" if r["changes_code"] else "no", escape(r["doc"]))
    out.print(table)
    for name in options.unknown():
        out.print(f"[yellow]warning:[/] {escape(name)} is set but is no polyml setting")
    return 0
