"""Fused vs unfused polyml next to TensorFlow on frozen .pb models with stored inputs/outputs.

    python scripts/bench_tf_fusion.py /tmp/tfm/mobilenet_v2_224 /tmp/tfm/resnet50_224 [--repeat 15] [--threads 2] \\
        [--block 6] [--settle 0.3]

Each argument is a stem: STEM.pb, STEM.in.npz, STEM.out.npz (written by scripts/freeze_keras.py).
Prints one markdown row per model: medians of fused, unfused and TensorFlow, the three runners
alternating in blocks (``polyml.benchmark.measure``: a settle sleep before each block, so
TensorFlow's spinning threads do not slow whichever build runs next; the first call of each
block untimed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import polyml
from polyml import benchmark
from polyml.commands.bench import tensorflow_runner
from polyml.testing import rel_error


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("stems", nargs="+", help="STEM of STEM.pb, STEM.in.npz, STEM.out.npz")
    ap.add_argument("--repeat", type=int, default=15, help="timed runs per runner (default 15)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs per runner before the blocks (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    benchmark.add_options(ap)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="polyml-tf-fusion-"))
    print(f"threads={args.threads}, {benchmark.describe(args.repeat, args.block, args.settle)} (medians)", file=sys.stderr)
    for stem in map(Path, args.stems):
        feeds = dict(np.load(f"{stem}.in.npz"))
        ref = dict(np.load(f"{stem}.out.npz"))
        builds, info = {}, {}
        for fuse in (True, False):
            c = polyml.compile(f"{stem}.pb", work / f"{stem.name}_{int(fuse)}", fuse=fuse, threads=args.threads, cache=False)
            got = c.run(feeds)
            err = max(rel_error(got[k], ref[k]) for k in ref)
            info[fuse] = (err, c.manifest["loop_nests"], c.manifest["intermediate_bytes"] / 1e6)
            builds[fuse] = c
        fused, unfused = builds[True], builds[False]
        runners = {"fused": lambda m=fused, x=feeds: m.run(x), "unfused": lambda m=unfused, x=feeds: m.run(x),
                   "tf": tensorflow_runner(Path(f"{stem}.pb"), args.threads, feeds, list(fused.outputs))}
        with benchmark.rich_progress(label=stem.name) as progress:
            times = benchmark.measure(runners, args.warmup, args.repeat, block=args.block, settle_s=args.settle,
                                      progress=progress)
        med = {k: s["median_ms"] for k, s in benchmark.summarize(times).items()}
        (e1, n1, b1), (e0, n0, b0) = info[True], info[False]
        print(f"| {stem.name} | {med['fused']:.1f} | {med['unfused']:.1f} | {med['tf']:.1f} | {n1} / {n0} | {b1:.1f} / {b0:.1f} "
              f"| {e1:.1e} / {e0:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
