"""A/B of polyml builds of one model next to onnxruntime, in one process: the way kernel changes
of issue 14 were judged on a host whose neighbour moves medians by up to 2x.

Each artifact folder (built from the same model, e.g. before and after a change, or with a
codegen switch such as ``POLYML_CONV_ROWS=0``) and onnxruntime run in alternating blocks
(:func:`polyml.benchmark.measure`, 0.3 s settle before each block so onnxruntime's spinning pool
does not tax the next runner). Prints minimum and median per runner and the ratios to the first
build and to onnxruntime. ``--clock cpu`` times process CPU time (robust at one thread when
the other core is busy; meaningless for more threads)::

    .venv/bin/python scripts/ab_builds.py build/issue14/mobilenet_v2.onnx A.polyml B.polyml \\
        --threads 1 --clock cpu --repeat 60
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
    args = p.parse_args()
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


if __name__ == "__main__":
    main()
