"""SCoP detection: run Polly over LLVM IR, collect its SCoPs as JSCoPs and why it rejected others.

One ``opt`` run (:func:`polyml.driver.flags.scop_export_flags`): Polly's early-position
canonicalization, then per function ``print<loops>`` (which blocks lie in loops),
``print<polly-function-scops>`` (access kinds, incl. may-writes the JSCoP calls "write") and
``polly-export-jscop``.  Rejections come from three places:

* Polly's detection remarks (``-pass-remarks-missed=polly-detect``): a region that is not a
  SCoP and why ("This function call cannot be handled", "The array subscript ... is not affine");
* its SCoP-building remarks (``polly-scops``): a detected region dismissed because an
  assumption it would need is false (e.g. "Delinearization assumption: { : false }" when one
  array is accessed with two different shapes);
* coverage: a store in a loop whose block is no statement of any SCoP (named blocks only).

Only functions with loops count: a rejected region without loops is no loop nest.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from polyml.driver import flags
from polyml.driver.toolchain import tool
from polyml.errors import ToolchainError
from polyml.scop import jscop as J

ACCESS_KINDS = {"ReadAccess": "read", "MustWriteAccess": "write", "MayWriteAccess": "may_write"}


@dataclass
class Scop:
    """One SCoP: where it is and its JSCoP as Polly exported it."""

    function: str
    region: str
    jscop: dict
    #: per statement, per access: "read", "write" or "may_write" (from Polly's printer)
    access_kinds: list[list[str]] = field(default_factory=list)

    @property
    def file_name(self) -> str:
        return J.file_name(self.function, self.region)


@dataclass(frozen=True)
class Rejection:
    function: str
    reason: str


@dataclass
class Detection:
    scops: list[Scop]
    rejected: list[Rejection]

    def by_function(self) -> dict[str, list[Scop]]:
        out: dict[str, list[Scop]] = {}
        for s in self.scops:
            out.setdefault(s.function, []).append(s)
        return out


def detect(ll: str | Path, functions: Sequence[str] | None = None, keep: str | Path | None = None) -> Detection:
    """Detect the SCoPs of the IR file ``ll`` (optionally only in ``functions``).

    ``keep``: a folder to leave Polly's JSCoP files in (otherwise a temporary one).
    """
    with tempfile.TemporaryDirectory(prefix="polyml-scops-") as tmp:
        work = Path(tmp)
        out_dir = Path(keep) if keep else work / "jscop"
        out_dir.mkdir(parents=True, exist_ok=True)
        remarks = work / "remarks.yaml"
        canon = work / "canonical.ll"
        cmd = [tool("opt"), *flags.scop_export_flags(str(out_dir), list(functions or []), str(remarks)),
               str(ll), "-S", "-o", str(canon)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise ToolchainError(f"SCoP detection failed (exit {proc.returncode}):\n{tail}\n  reproduce with: {shlex.join(cmd)}")
        kinds = parse_printed_scops(proc.stderr)
        loops = parse_loops(proc.stderr)
        scops = []
        for path in sorted(out_dir.glob(f"*{J.SUFFIX}")):
            function, region = J.split_file_name(path.name)
            if functions and function not in functions:
                continue
            data = J.load(path)
            found = kinds.get((function, region), {})
            ak = [found.get(s["name"], [a["kind"] for a in s["accesses"]]) for s in data["statements"]]
            ak = [k if len(k) == len(s["accesses"]) else [a["kind"] for a in s["accesses"]] for k, s in zip(ak, data["statements"])]
            scops.append(Scop(function, region, data, ak))
        # a region without loops (an OpenMP worker's call) is no nest: its rejection is noise
        rejected = [r for r in parse_remarks(remarks.read_text() if remarks.exists() else "") if loops.get(r.function)]
        text = canon.read_text() if canon.exists() else ""
        rejected += _uncovered(text, loops, scops, {r.function for r in rejected} | polly_skipped(text))
    return Detection(scops, rejected)


# -- Polly's printer ----------------------------------------------------------------------------

def parse_printed_scops(text: str) -> dict[tuple[str, str], dict[str, list[str]]]:
    """``{(function, region): {statement: [access kinds]}}`` from ``print<polly-function-scops>``."""
    out: dict[tuple[str, str], dict[str, list[str]]] = {}
    function = region = ""
    current: list[str] | None = None
    in_stmts = False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Function: "):
            function, in_stmts = s[len("Function: "):], False
        elif s.startswith("Region: "):
            region = s[len("Region: "):]
            out[(function, region)] = {}
        elif s == "Statements {":
            in_stmts = True
        elif in_stmts and line.startswith("    \t"):
            current = out[(function, region)].setdefault(s, [])
        elif in_stmts and current is not None:
            head = s.split(" :=", 1)[0]
            if head in ACCESS_KINDS:
                current.append(ACCESS_KINDS[head])
        if s == "}" and in_stmts and line.startswith("    }"):
            in_stmts, current = False, None
    return out


def parse_loops(text: str) -> dict[str, set[str]]:
    """``{function: blocks inside loops}`` from ``print<loops>``."""
    out: dict[str, set[str]] = {}
    function = ""
    for line in text.splitlines():
        m = re.match(r"Loop info for function '(.*)':", line)
        if m:
            function = m.group(1)
            out.setdefault(function, set())
        elif line.startswith("Loop at depth ") and " containing: " in line:
            for b in line.split(" containing: ", 1)[1].split(","):
                out.setdefault(function, set()).add(re.sub(r"<[^>]*>", "", b.strip()).lstrip("%").strip('"'))
    return out


# -- remarks ------------------------------------------------------------------------------------

def _yaml_scalar(v: str) -> str:
    v = v.strip()
    if len(v) >= 2 and v[0] == v[-1] == "'":
        return v[1:-1].replace("''", "'")
    if len(v) >= 2 and v[0] == v[-1] == '"':
        return bytes(v[1:-1], "utf-8").decode("unicode_escape")
    return v


def parse_remark_docs(text: str) -> list[dict]:
    """LLVM's ``-pass-remarks-output`` YAML as ``[{kind, Pass, Name, Function, message}]``."""
    docs: list[dict] = []
    cur: dict | None = None
    last: str | None = None
    for line in text.splitlines():
        if line.startswith("--- !"):
            cur = {"kind": line[5:].strip(), "args": []}
            docs.append(cur)
            last = None
            continue
        if cur is None or line.strip() in ("...", ""):
            continue
        m = re.match(r"^(\w+):\s*(.*)$", line)
        if m:
            cur[m.group(1)] = _yaml_scalar(m.group(2))
            last = None
            continue
        m = re.match(r"^\s+- (\w+):\s*(.*)$", line)
        if m:
            if m.group(1) == "String":
                cur["args"].append(m.group(2))
                last = "args"
            else:
                last = None
            continue
        if last == "args" and cur["args"] and line.startswith("   "):
            cur["args"][-1] += " " + line.strip()  # a folded long string
    for d in docs:
        d["message"] = "".join(_yaml_scalar(a) for a in d.pop("args"))
    return docs


#: detection remarks that frame a rejection rather than give its reason
_FRAMING = {"RejectionErrors", "InvalidScopEnd", "ScopEntry", "ScopEnd", "SuggestedFix"}


def parse_remarks(text: str) -> list[Rejection]:
    """Rejections (one per function and reason) from Polly's remarks."""
    by_function: dict[str, list[str]] = {}
    dismissed: set[str] = set()
    assumptions: dict[str, list[str]] = {}
    for d in parse_remark_docs(text):
        fn = d.get("Function", "")
        if d.get("Pass") == "polly-detect" and d["kind"] == "Missed" and d.get("Name") not in _FRAMING:
            by_function.setdefault(fn, []).append(d["message"])
        elif d.get("Pass") == "polly-scops":
            if d.get("Name") == "ScopEnd" and "dismissed" in d["message"]:
                dismissed.add(fn)
            elif d.get("Name") not in _FRAMING and "false" in d["message"]:
                assumptions.setdefault(fn, []).append(d["message"])
    out = []
    for fn, msgs in by_function.items():
        for msg, n in _counted(msgs):
            out.append(Rejection(fn, f"not a SCoP: {msg}" + (f" (x{n})" if n > 1 else "")))
    for fn in sorted(dismissed):
        why = "; ".join(f"{m}" + (f" (x{n})" if n > 1 else "") for m, n in _counted(assumptions.get(fn, [])))
        out.append(Rejection(fn, "SCoP dismissed while building it: " + (why or "its assumptions are infeasible")))
    return out


def _counted(msgs: list[str]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for m in msgs:
        counts[" ".join(m.split())] = counts.get(" ".join(m.split()), 0) + 1
    return list(counts.items())


# -- coverage -----------------------------------------------------------------------------------

def stmt_name(block: str) -> str:
    """Polly's statement name for a named block (``-polly-use-llvm-names``)."""
    return "Stmt_" + re.sub(r"[^A-Za-z0-9_]", "_", block)


def store_blocks(ir_text: str) -> dict[str, list[str]]:
    """``{function: named blocks that contain a store}`` of an LLVM IR text."""
    out: dict[str, list[str]] = {}
    function = block = None
    for line in ir_text.splitlines():
        if line.startswith("define "):
            m = re.search(r'@("(?:[^"\\]|\\.)*"|[\w.$-]+)\(', line)
            function = m.group(1).strip('"') if m else None
            block = None
            if function is not None:
                out.setdefault(function, [])
            continue
        if function is None:
            continue
        if line.startswith("}"):
            function = None
            continue
        m = re.match(r'^("(?:[^"\\]|\\.)*"|[\w.$-]+):', line)
        if m:
            block = m.group(1).strip('"')
            continue
        if block and re.match(r"\s+store ", line) and (not out[function] or out[function][-1] != block):
            out[function].append(block)
    return out


def polly_skipped(ir_text: str) -> set[str]:
    """Functions of an LLVM IR text marked ``"polly.skip.fn"``: kernels written as explicit
    vectors (depthwise planes, max pools in registers) that Polly is told to leave alone; their
    loops are no nests it could model, so they are not reported as rejected."""
    groups = {m.group(1) for m in re.finditer(r'^attributes #(\d+) = \{[^\n]*"polly\.skip\.fn"', ir_text, re.M)}
    out = set()
    for m in re.finditer(r'^define [^\n]*@("(?:[^"\\]|\\.)*"|[\w.$-]+)\([^\n]*$', ir_text, re.M):
        if groups & set(re.findall(r"#(\d+)", m.group(0).split(")")[-1])):
            out.add(m.group(1).strip('"'))
    return out


def _uncovered(ir_text: str, loops: Mapping[str, set[str]], scops: list[Scop], skip: set[str]) -> list[Rejection]:
    names: dict[str, set[str]] = {}
    for s in scops:
        names.setdefault(s.function, set()).update(J.statement_names(s.jscop))
    out = []
    for fn, blocks in store_blocks(ir_text).items():
        if fn in skip:
            continue
        in_loops = loops.get(fn, set())
        missing = [b for b in blocks if b in in_loops and not b.isdigit() and stmt_name(b) not in names.get(fn, ())]
        if missing:
            out.append(Rejection(fn, f"stores in loop blocks outside every SCoP: {', '.join(missing[:6])}"
                                     + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")))
    return out
