"""Polly's JSCoP format (``lib/Exchange/JSONExporter.cpp``): read, write, hash, and isl views.

A JSCoP is one SCoP as JSON::

    {"name": "%entry---%exit", "context": "{ : }",
     "arrays": [{"name": "MemRef_A", "sizes": ["*", "64"], "type": "float"}],
     "statements": [{"name": "Stmt_b", "domain": "{ Stmt_b[i0, i1] : ... }",
                     "schedule": "{ Stmt_b[i0, i1] -> [i0, i1] }",
                     "accesses": [{"kind": "read", "relation": "{ Stmt_b[i0, i1] -> MemRef_A[i0, i1] }"}]}]}

Polly writes one file per SCoP, ``<function>___<region>.jscop``, and on import matches
statements and accesses *by position*, so transforms here keep every list in order and change
only schedules.  JSCoPs are plain dicts; functions here never mutate their argument.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import islpy as isl

from polyml.errors import PolymlError

SUFFIX = ".jscop"
SEPARATOR = "___"
#: polyml's own key in a JSCoP (the band tree passes hand on, :mod:`polyml.scop.schedule`);
#: Polly never sees it (:func:`for_polly`)
META = "polyml"


class JscopError(PolymlError):
    """A JSCoP file is unreadable, malformed, or does not fit the SCoP it is meant for."""


# -- files --------------------------------------------------------------------------------------

def file_name(function: str, region: str) -> str:
    """Polly's file name for a SCoP: ``<function>___<region>.jscop``."""
    return f"{function}{SEPARATOR}{region}{SUFFIX}"


def split_file_name(name: str) -> tuple[str, str]:
    """``(function, region)`` from a JSCoP file name (a ``.jscop`` name Polly would read)."""
    base = Path(name).name
    if not base.endswith(SUFFIX) or SEPARATOR not in base:
        raise JscopError(f"{name}: not a JSCoP file name (expected <function>{SEPARATOR}<region>{SUFFIX})")
    function, region = base[: -len(SUFFIX)].split(SEPARATOR, 1)
    return function, region


def load(path: str | os.PathLike) -> dict:
    """Read and structurally check one JSCoP file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise JscopError(f"{path}: no such JSCoP file") from None
    except (OSError, ValueError) as e:
        raise JscopError(f"{path}: not valid JSON ({e})") from None
    check_structure(data, str(path))
    return data


def dumps(jscop: Mapping) -> str:
    """JSON text as Polly writes it (3-space indent, sorted keys)."""
    return json.dumps(jscop, indent=3, sort_keys=True) + "\n"


def dump(jscop: Mapping, path: str | os.PathLike) -> None:
    Path(path).write_text(dumps(jscop))


def digest(jscop: Mapping) -> str:
    """sha256 of the canonical JSON (key order and whitespace do not count)."""
    return hashlib.sha256(json.dumps(jscop, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def digest_dir(folder: str | os.PathLike) -> dict[str, str]:
    """``{file name: digest}`` of every JSCoP file in ``folder`` (for manifests and caches)."""
    return {p.name: digest(load(p)) for p in sorted(Path(folder).glob(f"*{SUFFIX}"))}


def check_structure(data: object, where: str) -> None:
    """The keys and types Polly's importer relies on."""
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise JscopError(f"{where}: {what}")

    need(isinstance(data, dict), "a JSCoP is a JSON object")
    assert isinstance(data, dict)
    for key in ("name", "context", "statements"):
        need(key in data, f"missing key {key!r}")
    need(isinstance(data["statements"], list), "'statements' must be a list")
    for i, s in enumerate(data["statements"]):
        need(isinstance(s, dict), f"statement {i} must be an object")
        for key in ("name", "domain", "schedule", "accesses"):
            need(key in s, f"statement {i} ({s.get('name', '?')}): missing key {key!r}")
        need(isinstance(s["accesses"], list), f"statement {s['name']}: 'accesses' must be a list")
        for j, a in enumerate(s["accesses"]):
            need(isinstance(a, dict) and "kind" in a and "relation" in a,
                 f"statement {s['name']}: access {j} needs 'kind' and 'relation'")


# -- isl views ----------------------------------------------------------------------------------

def parse(kind: Callable[[str], isl.Set | isl.Map | isl.UnionMap], text: str, where: str):
    """Parse an isl string, turning isl's error into one that names the JSCoP entry."""
    try:
        return kind(text)
    except isl.Error as e:
        raise JscopError(f"{where}: cannot parse {text!r} as an isl {getattr(kind, '__name__', 'object')} ({e})") from None


def domain(stmt: Mapping) -> isl.Set:
    return parse(isl.Set, stmt["domain"], f"statement {stmt['name']}: domain")


def schedule_map(stmt: Mapping) -> isl.Map:
    return parse(isl.Map, stmt["schedule"], f"statement {stmt['name']}: schedule")


def domains(jscop: Mapping) -> isl.UnionSet:
    """The iteration domains of all statements, ``{ S[i] : ... ; T[j] : ... }``."""
    u = isl.UnionSet("{ }")
    for s in jscop["statements"]:
        u = u.union(isl.UnionSet.from_set(domain(s)))
    return u


def schedule(jscop: Mapping, pad_to: int | None = None) -> isl.UnionMap:
    """The schedule as one union map restricted to the domains, ranges padded to one length."""
    width = pad_to if pad_to is not None else schedule_width(jscop)
    u = isl.UnionMap("{ }")
    for s in jscop["statements"]:
        u = u.union(isl.UnionMap.from_map(pad_map(schedule_map(s), width).intersect_domain(domain(s))))
    return u


def schedule_width(jscop: Mapping) -> int:
    return max((schedule_map(s).dim(isl.dim_type.out) for s in jscop["statements"]), default=0)


def pad_map(m: isl.Map, width: int) -> isl.Map:
    """Append constant-zero output dimensions up to ``width`` (Polly needs one range space)."""
    n = m.dim(isl.dim_type.out)
    if n >= width:
        return m
    m = m.add_dims(isl.dim_type.out, width - n)
    for d in range(n, width):
        m = m.fix_val(isl.dim_type.out, d, isl.Val.zero(m.get_ctx()))
    return m


_ARRAY = re.compile(r"->\s*([A-Za-z_][\w.]*)\s*\[")


def array_name(relation: str | isl.Map) -> str:
    """The array an access relation reaches (its range tuple name)."""
    if isinstance(relation, str):
        m = _ARRAY.search(relation)
        if m:
            return m.group(1)
    m = relation if isinstance(relation, isl.Map) else isl.Map(relation)
    return m.get_tuple_name(isl.dim_type.out) or ""


def _body(text: str) -> str:
    """The part of ``{ [params] -> } { ... : ... }`` between the braces of the (only) set."""
    return text[text.index("{") + 1 : text.rindex("}")].strip()


def accesses(jscop: Mapping, kinds: Iterable[str], access_kinds: list[list[str]] | None = None) -> isl.UnionMap:
    """The union of the access relations of the given kinds, restricted to the domains.

    ``access_kinds`` overrides the file's kinds (Polly's JSCoP writes a may-write as "write";
    :mod:`polyml.scop.detect` recovers ``may_write`` from Polly's SCoP printer).  The relations
    of one statement are parsed together (polyml's convolutions have hundreds).
    """
    want = set(kinds)
    u = isl.UnionMap("{ }")
    for i, s in enumerate(jscop["statements"]):
        rels = [a["relation"] for j, a in enumerate(s["accesses"])
                if (access_kinds[i][j] if access_kinds else a["kind"]) in want]
        if not rels:
            continue
        joined = None
        prefixes = {r[: r.index("{")].strip() if "{" in r else None for r in rels}
        if len(prefixes) == 1 and None not in prefixes:  # same parameters: one parse for all
            try:
                joined = isl.UnionMap(f"{prefixes.pop()} {{ " + "; ".join(_body(r) for r in rels if _body(r)) + " }")
            except isl.Error:
                joined = None
        if joined is None:
            joined = isl.UnionMap("{ }")
            for j, r in enumerate(rels):
                joined = joined.union(isl.UnionMap.from_map(parse(isl.Map, r, f"statement {s['name']}: access {j}")))
        u = u.union(joined.intersect_domain(isl.UnionSet.from_set(domain(s))).coalesce())
    return u


def for_polly(jscop: Mapping) -> dict:
    """A copy without polyml's metadata (:data:`META`): the JSCoP as Polly reads it."""
    return {k: v for k, v in jscop.items() if k != META}


def statement_names(jscop: Mapping) -> list[str]:
    return [s["name"] for s in jscop["statements"]]


def with_schedules(jscop: Mapping, schedules: Mapping[str, str | isl.Map]) -> dict:
    """A copy of ``jscop`` whose statements named in ``schedules`` get the new schedule."""
    out = copy.deepcopy(dict(jscop))
    for s in out["statements"]:
        if s["name"] in schedules:
            new = schedules[s["name"]]
            s["schedule"] = new if isinstance(new, str) else map_str(new)
    return out


def padded(jscop: Mapping) -> dict:
    """A copy whose schedules all have the same number of output dimensions."""
    width = schedule_width(jscop)
    return with_schedules(jscop, {s["name"]: pad_map(schedule_map(s), width) for s in jscop["statements"]})


def map_str(m: isl.Map) -> str:
    """isl's text for a map: as a function (``S[i] -> [floor((i)/32), i]``) where the map is
    one, else as a relation (both are what Polly reads)."""
    if m.is_single_valued():
        try:
            pma = isl.PwMultiAff.from_map(m)
        except isl.Error:
            return str(m)
        if pma.n_piece() == 1:
            for text in (_unparenthesize(str(pma)), str(pma)):
                if isl.Map(text).is_equal(m):
                    return text
    return str(m)


def _unparenthesize(text: str) -> str:
    """``[(i0), (floor((i1)/32))]`` → ``[i0, floor((i1)/32)]`` in isl's multi-aff text."""
    head, sep, rest = text.partition("-> [")
    body, sep2, tail = rest.rpartition("]")
    if not sep or not sep2:
        return text
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += {"(": 1, ")": -1}.get(ch, 0)
        cur += ch
    parts.append(cur.strip())

    def strip(p: str) -> str:
        if p.startswith("(") and p.endswith(")"):
            depth = 0
            for i, ch in enumerate(p):
                depth += {"(": 1, ")": -1}.get(ch, 0)
                if depth == 0 and i < len(p) - 1:
                    return p  # "(a) + (b)": the outer parentheses are not one group
            return p[1:-1]
        return p

    return f"{head}-> [{', '.join(strip(p) for p in parts)}]{tail}"


def find(folder: str | os.PathLike) -> list[Path]:
    """The JSCoP files in ``folder``, sorted by name."""
    p = Path(folder)
    if not p.is_dir():
        raise JscopError(f"{folder}: no such JSCoP folder")
    return sorted(p.glob(f"*{SUFFIX}"))
