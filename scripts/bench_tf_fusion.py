"""Fused vs unfused polyml next to TensorFlow on frozen .pb models with stored inputs/outputs.

    python scripts/bench_tf_fusion.py /tmp/tfm/mobilenet_v2_224 /tmp/tfm/resnet50_224

Each argument is a stem: STEM.pb, STEM.in.npz, STEM.out.npz (written by scripts/freeze_keras.py).
Prints one markdown row per model: fused and unfused medians of alternating rounds, then
TensorFlow in its own block (its spinning threads would slow whichever build ran next).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import polyml
from polyml.commands.bench import tensorflow_runner
from polyml.testing import rel_error


def medians(runners: dict[str, Callable[[], object]], rounds: int = 15, warmup: int = 3) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(warmup):
        for f in runners.values():
            f()
    for _ in range(rounds):
        for k, f in runners.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="polyml-tf-fusion-"))
    for stem in map(Path, sys.argv[1:]):
        feeds = dict(np.load(f"{stem}.in.npz"))
        ref = dict(np.load(f"{stem}.out.npz"))
        builds, info = {}, {}
        for fuse in (True, False):
            c = polyml.compile(f"{stem}.pb", work / f"{stem.name}_{int(fuse)}", fuse=fuse, threads=2, cache=False)
            got = c.run(feeds)
            err = max(rel_error(got[k], ref[k]) for k in ref)
            info[fuse] = (err, c.manifest["loop_nests"], c.manifest["intermediate_bytes"] / 1e6)
            builds[fuse] = c
        fused, unfused = builds[True], builds[False]
        med = medians({"fused": lambda m=fused, x=feeds: m.run(x), "unfused": lambda m=unfused, x=feeds: m.run(x)})
        tf = medians({"tf": tensorflow_runner(Path(f"{stem}.pb"), 2, feeds, list(builds[True].outputs))})["tf"]
        (e1, n1, b1), (e0, n0, b0) = info[True], info[False]
        print(f"| {stem.name} | {med['fused']:.1f} | {med['unfused']:.1f} | {tf:.1f} | {n1} / {n0} | {b1:.1f} / {b0:.1f} "
              f"| {e1:.1e} / {e0:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
