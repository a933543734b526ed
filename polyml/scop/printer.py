"""Printers: SCoPs as JSON (machine) and aligned text (people), and the isl AST of a schedule.

The JSON of ``polyml scops --json`` has exactly these keys::

    {"scops": [{"function", "region",
                "statements": [{"name", "op", "domain", "schedule",
                                "accesses": [{"kind", "relation", "array"}]}],
                "dependences": {"raw", "war", "waw"},
                "ast"}],
     "rejected": [{"op", "reason"}]}

Every ``domain``, ``schedule``, ``relation`` and dependence is an isl string (islpy parses it);
``ast`` is the C-like code isl's AST generator makes from the schedule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import islpy as isl
from rich.console import Console
from rich.markup import escape

from polyml.scop import dependences as D
from polyml.scop import jscop as J
from polyml.scop.detect import Rejection, Scop


def ast_c(jscop: Mapping) -> str:
    """The loop nest isl generates for ``jscop``'s schedule, as C-like text."""
    context = J.parse(isl.Set, jscop.get("context", "{ : }"), "context")
    build = isl.AstBuild.from_context(context)
    node = build.node_from_schedule_map(J.schedule(jscop))
    return node.to_C_str()


def scop_json(scop: Scop, jscop: Mapping, op_of: Callable[[str], str], deps: D.Dependences | None = None,
              ops_of: Callable[[str], list[str]] | None = None) -> dict:
    """One SCoP's entry; ``jscop``: its (possibly transformed) JSCoP, ``deps``: the original's;
    ``ops_of``: every node running the function (identical ops share one)."""
    deps = deps or D.compute(scop.jscop, scop.access_kinds)
    op = op_of(scop.function)
    ops = ops_of(scop.function) if ops_of is not None else [op]
    statements = []
    for i, s in enumerate(jscop["statements"]):
        kinds = scop.access_kinds[i] if i < len(scop.access_kinds) else [a["kind"] for a in s["accesses"]]
        statements.append({
            "name": s["name"],
            "op": op,
            "ops": ops,
            "domain": s["domain"],
            "schedule": s["schedule"],
            "accesses": [{"kind": k, "relation": a["relation"], "array": J.array_name(a["relation"])}
                         for k, a in zip(kinds, s["accesses"])],
        })
    return {
        "function": scop.function,
        "region": scop.region,
        "statements": statements,
        "dependences": deps.to_json(),
        "ast": ast_c(jscop),
    }


def report_json(entries: list[dict], rejected: list[Rejection], op_of: Callable[[str], str]) -> dict:
    return {"scops": entries, "rejected": [{"op": op_of(r.function), "reason": r.reason} for r in rejected]}


def _access_groups(accesses: list[dict]) -> list[tuple[str, str, int, str]]:
    """(kind, array, count, relation) with the relations of one kind and array coalesced."""
    groups: dict[tuple[str, str], list[str]] = {}
    for a in accesses:
        groups.setdefault((a["kind"], a["array"]), []).append(a["relation"])
    out = []
    for (kind, array), rels in groups.items():
        if len(rels) == 1:
            out.append((kind, array, 1, rels[0]))
            continue
        u = isl.UnionMap("{ }")
        for r in rels:
            u = u.union(isl.UnionMap(r))
        out.append((kind, array, len(rels), str(u.coalesce())))
    return out


def print_text(report: Mapping, console: Console, title: str = "") -> None:
    """The report for people: per SCoP a header, one block per statement, dependences, AST."""
    scops = report["scops"]
    if title:
        console.print(f"[bold]{escape(title)}[/]: {len(scops)} SCoP(s), {len(report['rejected'])} rejected", soft_wrap=True)
    for k, s in enumerate(scops):
        ops = sorted({op for st in s["statements"] for op in st["ops"]})
        console.print()
        console.rule(f"[bold]SCoP {k + 1}/{len(scops)}[/]  {escape(s['function'])}  op {escape(', '.join(ops))}", align="left")
        console.print(f"  [dim]region[/]      {escape(s['region'])}", highlight=False, soft_wrap=True)
        for st in s["statements"]:
            console.print(f"\n  [bold cyan]{escape(st['name'])}[/]  [dim](op {escape(st['op'])})[/]", highlight=False, soft_wrap=True)
            console.print(f"    [dim]domain  [/]  {escape(st['domain'])}", highlight=False, soft_wrap=True)
            console.print(f"    [dim]schedule[/]  {escape(st['schedule'])}", highlight=False, soft_wrap=True)
            for kind, array, n, rel in _access_groups(st["accesses"]):
                count = f"x{n}" if n > 1 else ""
                console.print(f"    [dim]{kind:<9}[/] {escape(array):<16} {count:>5}  {escape(rel)}", highlight=False, soft_wrap=True)
        console.print("\n  [bold]dependences[/]", soft_wrap=True)
        for kind in D.KINDS:
            console.print(f"    [dim]{kind}[/]  {escape(s['dependences'][kind])}", highlight=False, soft_wrap=True)
        console.print("\n  [bold]ast[/]")
        for line in s["ast"].rstrip().splitlines():
            console.print(f"    {escape(line)}", highlight=False, soft_wrap=True)
    if report["rejected"]:
        console.print()
        console.rule("[bold red]rejected[/]", align="left")
        width = max(len(r["op"]) for r in report["rejected"])
        for r in report["rejected"]:
            console.print(f"  {escape(r['op']):<{width}}  {escape(r['reason'])}", highlight=False, soft_wrap=True)
