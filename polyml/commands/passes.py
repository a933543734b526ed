"""``polyml passes``: the graph passes (:mod:`polyml.passes.graph`) and the registered JSCoP passes
(polyml's and the ``polyml.passes`` entry points)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from rich.markup import escape
from rich.table import Table

from polyml.commands._common import command, out


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="name, kind (graph or jscop), origin, summary and options of each pass as JSON")


@command("passes", _arguments, "list the graph passes and the JSCoP passes (built in and from the polyml.passes entry-point group)")
def cmd_passes(args: argparse.Namespace) -> int:
    from polyml.passes import available
    from polyml.passes.graph import graph_passes, summary

    rows = [{"name": n, "kind": "graph", "origin": f"polyml ({c.__module__})", "summary": summary(c),
             "options": [f.name for f in dataclasses.fields(c)]} for n, c in graph_passes().items()]
    rows += [{"name": i.name, "kind": "jscop", "origin": i.origin, "summary": i.summary or i.error,
              "options": [f.name for f in dataclasses.fields(i.cls)] if i.cls else [], "error": i.error}
             for i in available().values()]
    if args.json:
        sys.stdout.write(json.dumps([{k: v for k, v in r.items() if k != "error"} for r in rows], indent=1) + "\n")
        return 0
    table = Table(show_header=True, header_style="bold")
    for col in ("pass", "kind", "options", "origin", "what it does"):  # wrapped, never cut: names stay whole
        table.add_column(col, overflow="fold", no_wrap=col in ("pass", "kind", "origin"))
    for r in rows:
        what = escape(r["summary"]) if not r.get("error") else f"[red]{escape(r['error'])}[/]"
        origin = "polyml" if r["origin"].startswith("polyml (") else r["origin"]  # the module is in --json
        table.add_row(escape(r["name"]), r["kind"], escape(", ".join(r["options"])), escape(origin), what)
    out.print(table)
    return 0
