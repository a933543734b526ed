"""A/B of polyml builds of one model next to onnxruntime, in one process: the way kernel changes
are judged on a host whose neighbour moves medians by up to 2x.

Each artifact folder (built from the same model, e.g. before and after a change, or with a
codegen switch such as ``POLYML_WINOGRAD=0``) and onnxruntime run in alternating blocks
(:func:`polyml.benchmark.measure`, 0.3 s settle before each block so onnxruntime's spinning pool
does not tax the next runner). Prints minimum and median per runner and the ratios to the first
build and to onnxruntime. ``--clock cpu`` times process CPU time (robust at one thread when
the other core is busy; meaningless for more threads)::

    .venv/bin/python scripts/ab_builds.py build/models/mobilenet_v2.onnx A.polyml B.polyml \\
        --threads 1 --clock cpu --repeat 60

``--steps [TEXT]``: instead, step by step (:meth:`CompiledModel.profile`, the op functions of
two builds of one model matched by node), the minimum over ``--repeat`` profiles taken
alternately from A and B, for the steps whose detail contains TEXT (all by default), and
their sums: where a change lands inside a model, without the whole model's noise.  Then a
summary per op (convolutions per lowering mode) of the first build: milliseconds and
GFLOP/s, the figures behind "Conv:pointwise at 41 GFLOP/s" in docs/PERFORMANCE.md::

    .venv/bin/python scripts/ab_builds.py build/models/squeezenet.onnx A.polyml B.polyml --steps gemm --repeat 6
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from polyml import benchmark
from polyml.commands.bench import onnxruntime_runner, random_feeds
from polyml.runtime.model import CompiledModel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="the .onnx the builds came from (onnxruntime runs it)")
    p.add_argument("builds", type=Path, nargs="+", help="artifact folders")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=40)
    p.add_argument("--block", type=int, default=benchmark.BLOCK)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--no-ort", action="store_true", help="builds only")
    p.add_argument("--steps", nargs="?", const="", default=None, metavar="TEXT",
                   help="compare two builds step by step (steps whose detail contains TEXT)")
    args = p.parse_args()
    if args.steps is not None:
        compare_steps(args.builds, args.steps, args.repeat)
        return
    models = [CompiledModel(b) for b in args.builds]
    feeds = random_feeds(models[0])
    runners = {f"{i}:{b.name}": (lambda m=m: m.run(feeds)) for i, (b, m) in enumerate(zip(args.builds, models))}
    if not args.no_ort:
        runners["onnxruntime"] = onnxruntime_runner(args.model, args.threads, feeds)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    times = benchmark.measure(runners, warmup=3, repeat=args.repeat, block=args.block, clock=clock)
    first = next(iter(runners))
    lo0, med0 = min(times[first]), statistics.median(times[first])
    print(f"{args.model.name} threads={args.threads} clock={args.clock} repeat={args.repeat}")
    for name, t in times.items():
        lo, med = min(t), statistics.median(t)
        line = f"  {name:<40} min {lo * 1e3:8.3f} ms  median {med * 1e3:8.3f} ms  /first min {lo / lo0:5.3f} med {med / med0:5.3f}"
        if "onnxruntime" in times and name != "onnxruntime":
            ort = times["onnxruntime"]
            line += f"  /ort min {lo / min(ort):5.3f} med {med / statistics.median(ort):5.3f}"
        print(line)


def compare_steps(builds: list[Path], text: str, repeat: int) -> None:
    """Per-step minima of builds A and B (profiles alternated) and a per-op summary of A."""
    if len(builds) != 2:
        raise SystemExit("--steps compares exactly two builds")
    a, b = (CompiledModel(d) for d in builds)
    feeds = random_feeds(a)
    runs: tuple[list, list] = ([], [])
    for _ in range(repeat):
        for model, out in zip((a, b), runs):
            out.append(model.profile(feeds, repeat=3))
    lows = [[min(r[i]["min_s"] for r in rs) for i in range(len(rs[0]))] for rs in runs]
    steps_b = {f["node"]: (t, f) for t, f in zip(lows[1], runs[1][0])}
    sums = [0.0, 0.0]
    print(f"{'A ms':>8} {'B ms':>8} {'B/A':>5}  step (A | B's mode)")
    for t, f in zip(lows[0], runs[0][0]):
        if f["node"] not in steps_b:
            continue
        t2, f2 = steps_b[f["node"]]
        detail, detail2 = f.get("detail") or f["op_type"], f2.get("detail") or f2["op_type"]
        if text in detail or text in detail2:
            sums[0], sums[1] = sums[0] + t, sums[1] + t2
            print(f"{t * 1e3:8.3f} {t2 * 1e3:8.3f} {t2 / t:5.2f}  {detail} | {detail2.split()[-1]}")
    if sums[0]:
        print(f"{sums[0] * 1e3:8.3f} {sums[1] * 1e3:8.3f} {sums[1] / sums[0]:5.3f}  sum")
    by_op: dict[str, list[float]] = {}
    for t, f in zip(lows[0], runs[0][0]):
        key = f["op_type"] + (":" + f["detail"].split()[-1] if f["op_type"] == "Conv" and f.get("detail") else "")
        ms_flops = by_op.setdefault(key, [0.0, 0.0])
        ms_flops[0] += t * 1e3
        ms_flops[1] += f.get("flops") or 0.0
    print(f"A by op: {sum(lows[0]) * 1e3:.2f} ms in all")
    for key, (ms, flops) in sorted(by_op.items(), key=lambda kv: -kv[1][0]):
        print(f"  {key:<24} {ms:8.2f} ms" + (f"  {flops / ms / 1e6:6.1f} GFLOP/s" if flops else ""))


if __name__ == "__main__":
    main()
