"""``polyml cache ls|clear``: the compile cache (:mod:`polyml.cache`)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.markup import escape
from rich.table import Table

from polyml.commands._common import command, console, out


def _arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("ls", help="list cached builds, most recently used first")
    ls.add_argument("--json", action="store_true", help="print the entries as JSON")
    sub.add_parser("clear", help="delete every cached build")


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _options(opts: dict, emit: list[str]) -> str:
    """The options that differ from the defaults."""
    from polyml.driver.flags import Options

    defaults = Options().to_json()
    shown = [f"{k}={v}" for k, v in opts.items() if defaults.get(k, object()) != v]
    return " ".join(shown + [f"emit={','.join(emit)}"] * bool(emit)) or "defaults"


@command("cache", _arguments, "list or clear the compile cache")
def cmd_cache(args: argparse.Namespace) -> int:
    from polyml.cache import CompileCache

    cache = CompileCache()
    if args.action == "clear":
        n = cache.clear()
        console.print(f"removed {n} cached build(s) from {escape(str(cache.root))}", highlight=False)
        return 0
    rows = cache.entries()
    if args.json:
        sys.stdout.write(json.dumps({"dir": str(cache.root), "entries": rows}, indent=1) + "\n")
        return 0
    total = sum(r["bytes"] for r in rows)
    table = Table(title=f"{escape(str(cache.root))}: {len(rows)} build(s), {_size(total)}")
    for col in ("key", "model", "options", "size", "last used"):
        table.add_column(col, justify="right" if col == "size" else "left")
    for r in rows:
        table.add_row(r["key"][:12], escape(r["model"]), escape(_options(r["options"], r["emit"])), _size(r["bytes"]),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(r["last_used"])))
    out.print(table)
    return 0
