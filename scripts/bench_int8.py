"""Quantized models: polyml's int8 build next to polyml's fp32 build of the same network and
onnxruntime on the int8 model, interleaved in one process (:func:`polyml.benchmark.measure`).

Models come from ``scripts/make_quantized.py`` (``NAME_int8.onnx`` with its inputs, and the
float model ``NAME_fp32.onnx``) in ``--models-dir``.  ``--clock cpu`` times this process's CPU
time per call instead of the wall clock: on a shared, loaded host that is the robust figure
(with ``--threads 1`` it is the latency; with more threads the summed thread time).

    python scripts/bench_int8.py [--models resnet18,mobilenet_v2] [--threads 1] [--clock cpu|wall] [--repeat 18]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from polyml import benchmark
from polyml.compiler import compile as polyml_compile


def bench_model(name: str, models: Path, threads: int, repeat: int, warmup: int, block: int, settle_s: float,
                clock: str, work: Path) -> dict:
    import onnxruntime as ort

    feeds = dict(np.load(models / f"{name}_int8.inputs.npz"))
    int8 = polyml_compile(models / f"{name}_int8.onnx", work / f"{name}_int8", cache=False, threads=threads)
    fp32 = polyml_compile(models / f"{name}_fp32.onnx", work / f"{name}_fp32", cache=False, threads=threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(models / f"{name}_int8.onnx"), so, providers=["CPUExecutionProvider"])
    fp32_feeds = {name: x for name, x in zip(fp32.inputs, feeds.values())}
    runners = {"polyml_int8": lambda: int8.run(feeds), "polyml_fp32": lambda: fp32.run(fp32_feeds),
               "onnxruntime_int8": lambda: sess.run(None, feeds)}
    times = benchmark.measure(runners, warmup, repeat, block=block, settle_s=settle_s,
                              clock=time.process_time if clock == "cpu" else time.perf_counter)
    row = {"model": name, **benchmark.summarize(times)}
    row["int8_over_ort"] = row["polyml_int8"]["median_ms"] / row["onnxruntime_int8"]["median_ms"]
    row["fp32_over_int8"] = row["polyml_fp32"]["median_ms"] / row["polyml_int8"]["median_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--models-dir", default="/work/models")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("--repeat", type=int, default=18)
    ap.add_argument("--warmup", type=int, default=3)
    benchmark.add_options(ap)
    args = ap.parse_args()
    print(benchmark.describe(args.repeat, args.block, args.settle), f"clock={args.clock} threads={args.threads}")
    with tempfile.TemporaryDirectory(prefix="polyml-int8-") as tmp:
        for name in args.models.split(","):
            r = bench_model(name, Path(args.models_dir), args.threads, args.repeat, args.warmup, args.block, args.settle,
                            args.clock, Path(tmp))
            i8, f32, o = r["polyml_int8"], r["polyml_fp32"], r["onnxruntime_int8"]
            print(f"{name}: polyml int8 {i8['median_ms']:.2f} ms, polyml fp32 {f32['median_ms']:.2f} ms, onnxruntime int8 "
                  f"{o['median_ms']:.2f} ms; int8/onnxruntime {r['int8_over_ort']:.2f}x, fp32/int8 "
                  f"{r['fp32_over_int8']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
