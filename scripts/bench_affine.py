"""The affine kernel suite (benchmarks/affine/) built four ways and timed: clang-19 -O3, -O3 with
Polly, -O3 with Polly's OpenMP code, and polyml (clang's IR through ``polyml opt``, its default
pipeline unless ``--passes``, then clang -O3).  See :mod:`polyml.affine_suite` for the builds
and how outputs are compared.  ``--form`` picks the kernels' form: ``parametric`` (the default:
sizes are the kernel function's int arguments, parameters of its SCoPs) or ``constant``
(``-DAFFINE_CONSTANT``: compile-time sizes).

Every build's dumped arrays are checked against the -O3 build's first (normwise relative error
<= 1e-9, bit-exactness reported); then each kernel's builds run in interleaved rounds (one run of
each build per round, the order rotating) and the table shows the median seconds of
``--repeat`` rounds at each thread count, plus speed ratios (>1: polyml faster).  Kernels whose
polyml build has the same machine code as -O3's (``llvm-objdump`` of the kernel function, e.g.
where the default pipeline keeps the source order) are marked "same code": their ratio is the
run-to-run noise of one binary run twice.  The -O3 and
-O3 -polly builds are serial: they are timed once, at 1 thread.

    python scripts/bench_affine.py [--kernels gemm,lu] [--size small|large] [--form parametric|constant] \
        [--repeat 5] [--threads 1,2] [--passes PIPELINE] [--variants O3,polly,polly-parallel,polyml] [--jobs 2] \
        [--work DIR] [--json out.json]

Exit status 1 if a build fails or polyml's output differs from -O3's; other builds whose output
differs (Polly's GEMM pattern miscompiles symm at the large size) are flagged in the table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from polyml import affine_suite as A
from polyml.errors import PolymlError

SERIAL = ("O3", "polly")


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kernels", default=",".join(A.KERNELS), help="comma-separated (default: all 25)")
    p.add_argument("--size", choices=A.SIZES, default="large")
    p.add_argument("--form", choices=A.FORMS, default="parametric",
                   help="sizes as the kernel's int arguments (parametric) or compile-time constants")
    p.add_argument("--repeat", type=int, default=5, help="timed rounds per kernel and thread count (median)")
    p.add_argument("--threads", default="1,2", help="OMP_NUM_THREADS values to time the parallel builds at")
    p.add_argument("--passes", default=None, help="polyml opt pipeline (default: polyml opt's default pipeline)")
    p.add_argument("--variants", default=",".join(A.VARIANTS))
    p.add_argument("--jobs", type=int, default=2, help="parallel builds")
    p.add_argument("--work", default="", help="build folder (default: a temporary one)")
    p.add_argument("--json", default="", help="write all results here")
    args = p.parse_args(argv)

    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    threads = [int(t) for t in args.threads.split(",")]
    for k in kernels:
        A.source(k)
    if "O3" not in variants:
        variants.insert(0, "O3")  # the reference
    with tempfile.TemporaryDirectory(prefix="bench-affine-") as tmp:
        work = Path(args.work or tmp)
        results = run_suite(kernels, variants, threads, args, work)
    print_table(results, variants, threads, args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    bad = [r["kernel"] for r in results if r.get("error") or
           not all(c["ok"] for key, c in r["checks"].items() if key.startswith("polyml."))]
    wrong = [f"{r['kernel']} ({key})" for r in results for key, c in r["checks"].items()
             if not key.startswith("polyml.") and not c["ok"]]
    if wrong:
        print(f"\nnote: outputs of other builds differ from -O3's: {', '.join(wrong)}", file=sys.stderr)
    if bad:
        print(f"\nFAILED (polyml): {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


def run_suite(kernels: list[str], variants: list[str], threads: list[int], args: argparse.Namespace,
              work: Path) -> list[dict]:
    work = work / f"{args.size}-{args.form}"  # runs of another size or form may share --work

    def build(kv: tuple[str, str]):
        k, v = kv
        t0 = time.perf_counter()
        try:
            b = A.build(k, v, args.size, work / k, passes=args.passes, form=args.form)
            return kv, b, time.perf_counter() - t0, ""
        except PolymlError as e:
            return kv, None, time.perf_counter() - t0, str(e)

    jobs = [(k, v) for k in kernels for v in variants]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        built = {kv: (b, secs, err) for kv, b, secs, err in pool.map(build, jobs)}
    results = []
    for k in kernels:
        r: dict = {"kernel": k, "size": args.size, "form": args.form, "passes": args.passes or "(default)",
                   "builds": {}, "checks": {}, "seconds": {}}
        builds = {}
        for v in variants:
            b, secs, err = built[(k, v)]
            r["builds"][v] = {"seconds": round(secs, 2), "commands": list(b.commands) if b else [], "error": err}
            if b is None:
                r["error"] = f"{v}: {err}"
                print(f"{k} ({v}): {err}", file=sys.stderr)
            else:
                builds[v] = b
        if "O3" not in builds:
            results.append(r)
            continue
        if "polyml" in builds:  # an unchanged kernel: any gap to -O3 is run-to-run noise
            r["same_code"] = A.kernel_code(builds["polyml"].exe, k) == A.kernel_code(builds["O3"].exe, k)
        ref = work / k / "O3.bin"
        A.run(builds["O3"], dump=ref)
        for v, b in builds.items():
            if v == "O3":
                continue
            for t in [1] if v in SERIAL else threads:
                dump = work / k / f"{v}.t{t}.bin"
                try:
                    A.run(b, threads=t, dump=dump)
                except PolymlError as e:
                    r["error"] = f"{v} at {t} thread(s): {e}"
                    continue
                c = A.compare(ref, dump)
                r["checks"][f"{v}.t{t}"] = {"ok": c.ok, "exact": c.exact, "max_rel": c.max_rel}
        # interleaved rounds: every build once per round, the order rotating
        slots = [(v, t) for v in builds for t in ([1] if v in SERIAL else threads)]
        times: dict[str, list[float]] = {f"{v}.t{t}": [] for v, t in slots}
        for i in range(args.repeat):
            for v, t in slots[i % len(slots):] + slots[: i % len(slots)]:
                try:
                    times[f"{v}.t{t}"].append(A.run(builds[v], threads=t))
                except PolymlError as e:
                    r["error"] = f"{v} at {t} thread(s): {e}"
        r["seconds"] = {key: statistics.median(ts) for key, ts in times.items() if ts}
        r["all_seconds"] = times
        results.append(r)
        print(f"{k}: " + ", ".join(f"{key} {s:.4f}" for key, s in r["seconds"].items()), file=sys.stderr, flush=True)
    return results


def _check_cell(checks: dict[str, dict]) -> str:
    """polyml's outputs (``exact``, ``ok (rel ..)``, ``MISMATCH``), then any other build whose
    outputs differ from -O3's (Polly's own builds can be wrong too)."""
    def state(cs: list[dict]) -> str:
        if not cs:
            return "—"
        if all(c["exact"] for c in cs):
            return "exact"
        worst = max(c["max_rel"] for c in cs)
        return f"{'ok' if all(c['ok'] for c in cs) else 'MISMATCH'} (rel {worst:.1e})"

    mine = [c for key, c in checks.items() if key.startswith("polyml.")]
    wrong = sorted({key.split(".t")[0] for key, c in checks.items() if not key.startswith("polyml.") and not c["ok"]})
    return state(mine) + "".join(f"; {v} MISMATCH (rel {max(c['max_rel'] for k, c in checks.items() if k.startswith(v + '.t')):.1e})"
                                 for v in wrong)


def print_table(results: list[dict], variants: list[str], threads: list[int], args: argparse.Namespace) -> None:
    cols = [(v, t) for v in variants for t in ([1] if v in SERIAL else threads)]
    tmax = max(threads)
    head = ["kernel", *[f"{v} {t}t" for v, t in cols], "check", "polyml/O3 1t", f"polyml/polly-par {tmax}t"]
    print(f"\nseconds, median of {args.repeat} interleaved runs, size {args.size}, form {args.form}, polyml passes: "
          f"{args.passes or '(default pipeline)'}; ratios are speedups (>1: polyml faster)\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    vs_o3, vs_par, stencil_par, stencil_polly = [], [], [], []
    for r in results:
        s = r["seconds"]
        cells = [r["kernel"]] + [f"{s[f'{v}.t{t}']:.4g}" if f"{v}.t{t}" in s else "—" for v, t in cols]
        cells.append("error" if r.get("error") else _check_cell(r["checks"]))
        pm1, o3 = s.get("polyml.t1"), s.get("O3.t1")
        pmn, parn, polly = s.get(f"polyml.t{tmax}"), s.get(f"polly-parallel.t{tmax}"), s.get("polly.t1")
        a = o3 / pm1 if pm1 and o3 else float("nan")
        b = parn / pmn if pmn and parn else float("nan")
        vs_o3.append(a)
        vs_par.append(b)
        if r["kernel"] in A.STENCILS:
            stencil_par.append(b)
            stencil_polly.append(polly / pmn if polly and pmn else float("nan"))
        cells += [f"{a:.2f}" + (" (same code)" if r.get("same_code") else ""), f"{b:.2f}"]
        print("| " + " | ".join(cells) + " |")
    changed = [a for a, r in zip(vs_o3, results) if not r.get("same_code")]
    same = [r["kernel"] for r in results if r.get("same_code")]
    print(f"\ngeomean speedup of polyml: vs -O3 (1 thread) {_geomean(vs_o3):.2f}x, min {min(vs_o3, default=float('nan')):.2f}x "
          f"(min where the kernel's machine code differs from -O3's: {f'{min(changed):.2f}x' if changed else 'none differs'}); "
          f"vs -O3 -polly -polly-parallel ({tmax} threads) {_geomean(vs_par):.2f}x")
    if same:
        print(f"same machine code as -O3 (llvm-objdump of the kernel function; their ratio is run-to-run noise): "
              f"{', '.join(same)}")
    if stencil_par:
        print(f"stencils ({', '.join(k for k in A.STENCILS if any(r['kernel'] == k for r in results))}): "
              f"vs polly-parallel ({tmax} threads) {_geomean(stencil_par):.2f}x, "
              f"polyml {tmax} threads vs serial -polly {_geomean(stencil_polly):.2f}x")


if __name__ == "__main__":
    sys.exit(main())
