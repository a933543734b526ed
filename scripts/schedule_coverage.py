"""Which share of a model's FLOPs runs in functions on each lowering path.

Builds each model (default options unless given) and sums the manifest's ``functions[].flops``
by ``path``: ``schedule`` (plain nests under polyml schedule trees), ``hand`` (hand-scheduled
lowerings) and ``plain`` (nests left to opt).  The figure the polyhedral path is judged by:
the share of ``schedule``.

    python scripts/schedule_coverage.py MODEL.onnx [MODEL.onnx ...] [--gemm schedule|packed] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import defaultdict
from pathlib import Path

from polyml.compiler import compile as polyml_compile


def coverage(model: Path, work: Path, **options) -> dict:
    """FLOPs and functions per path, and the op types on each path, of one build."""
    out = work / model.stem
    polyml_compile(model, out, cache=False, **options)
    functions = json.loads((out / "manifest.json").read_text())["functions"]
    flops: dict[str, float] = defaultdict(float)
    ops: dict[str, set[str]] = defaultdict(set)
    for f in functions:
        flops[f["path"]] += f.get("flops") or 0.0
        ops[f["path"]].add(f["op_type"])
    total = sum(flops.values()) or 1.0
    return {"model": model.name, "total_flops": total,
            "share": {p: flops[p] / total for p in sorted(flops)},
            "op_types": {p: sorted(v) for p, v in sorted(ops.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--gemm", default="schedule")
    ap.add_argument("--json", dest="json_file")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="polyml-coverage-") as tmp:
        for m in args.models:
            r = coverage(m, Path(tmp), gemm=args.gemm)
            rows.append(r)
            shares = ", ".join(f"{p} {s:.1%}" for p, s in r["share"].items())
            print(f"{r['model']}: {r['total_flops'] / 1e9:.3f} GFLOP; {shares}")
            for p, types in r["op_types"].items():
                print(f"  {p}: {', '.join(types)}")
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
