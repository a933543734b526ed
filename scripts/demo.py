"""`make demo`: compile a small CNN with Polly, check it against onnxruntime, time both.

The model is SqueezeNet 1.0 from the onnx wheel's 'light' set with seeded random weights
(its shipped weights are ConstantOfShape zeros/ones). Latencies are medians of alternating
runs in this process.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

import polyml
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

    times: dict[str, list[float]] = {"polyml": [], "onnxruntime": []}
    for _ in range(3):  # warm-up
        compiled.run(feeds)
        sess.run(None, feeds)
    for _ in range(15):  # alternate so that drift hits both alike
        t = time.perf_counter()
        compiled.run(feeds)
        times["polyml"].append(time.perf_counter() - t)
        t = time.perf_counter()
        sess.run(None, feeds)
        times["onnxruntime"].append(time.perf_counter() - t)

    out = got[out_name]
    print(f"model      {name} ({path})")
    print(f"compiled   {compiled.dir} in {compile_s:.1f} s (stages: "
          + ", ".join(f"{k} {v:.2f}s" for k, v in compiled.manifest["seconds"].items() if isinstance(v, float)) + ")")
    print(f"output     {out_name}: shape {list(out.shape)}, top-5 classes {[int(i) for i in np.argsort(-out.reshape(-1))[:5]]}, "
          f"sum {out.sum():.4f}")
    print(f"accuracy   max|Δ|/max|ref| vs onnxruntime = {err:.2e}")
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    for k, v in times.items():
        print(f"latency    {k:<12} median {med[k]:8.2f} ms  (min {min(v) * 1e3:.2f}, max {max(v) * 1e3:.2f}, n={len(v)})")
    print(f"ratio      polyml / onnxruntime = {med['polyml'] / med['onnxruntime']:.2f}")
    return 0 if err <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
