"""`make demo`: compile a small CNN with Polly, check it against onnxruntime, time both.

The model is SqueezeNet 1.0 from the onnx wheel's 'light' set with seeded random weights
(its shipped weights are ConstantOfShape zeros/ones). Latencies are medians of 15 timed
runs each, the two runners alternating in blocks in this process (polyml.benchmark.measure).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import onnx

import polyml
from polyml import benchmark
from polyml.testing import light_model_path, onnxruntime_run, random_inputs, randomize_weights, rel_error

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "squeezenet"
    work = ROOT / "build" / "demo"
    work.mkdir(parents=True, exist_ok=True)
    model = randomize_weights(onnx.load(str(light_model_path(name))), seed=0)
    path = work / f"{name}.onnx"
    onnx.save(model, str(path))
    feeds = random_inputs(model, seed=1)

    t0 = time.perf_counter()
    compiled = polyml.compile(path, work / f"{name}.polyml", polly=True)
    compile_s = time.perf_counter() - t0
    got = compiled.run(feeds)

    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out_name = sess.get_outputs()[0].name
    ref = onnxruntime_run(model, feeds)[out_name]
    err = rel_error(got[out_name], ref)

    stats = benchmark.summarize(benchmark.measure({"polyml": lambda: compiled.run(feeds),
                                                   "onnxruntime": lambda: sess.run(None, feeds)}, warmup=2, repeat=15))

    out = got[out_name]
    print(f"model      {name} ({path})")
    print(f"compiled   {compiled.dir} in {compile_s:.1f} s (stages: "
          + ", ".join(f"{k} {v:.2f}s" for k, v in compiled.manifest["seconds"].items() if isinstance(v, float)) + ")")
    print(f"output     {out_name}: shape {list(out.shape)}, top-5 classes {[int(i) for i in np.argsort(-out.reshape(-1))[:5]]}, "
          f"sum {out.sum():.4f}")
    print(f"accuracy   max|Δ|/max|ref| vs onnxruntime = {err:.2e}")
    for k, st in stats.items():
        print(f"latency    {k:<12} median {st['median_ms']:8.2f} ms  (min {st['min_ms']:.2f}, max {st['max_ms']:.2f}, n={st['n']})")
    print(f"ratio      polyml / onnxruntime = {stats['polyml']['median_ms'] / stats['onnxruntime']['median_ms']:.2f}")
    return 0 if err <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
