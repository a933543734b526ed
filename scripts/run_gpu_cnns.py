"""Run the nine light CNNs on an NVIDIA GPU (``--target cuda``), check them against onnxruntime
and print the device latency next to the CPU build's.

Each model gets seeded random weights (polyml.testing.randomize_weights) and one random input;
the logits before the final softmax are exposed and compared too (polyml.testing.expose_logits).
Latencies are medians over ``--repeat`` runs after warm-up; the GPU figure includes the
host→device copy of the input and the device→host copy of the outputs.  Prints a markdown table
for docs/PERFORMANCE.md.

    python scripts/run_gpu_cnns.py [--models squeezenet,resnet50] [--repeat 20] [--sm sm_90] [--no-cpu]
                                   [--shared-memory]

``--shared-memory`` also builds each model with shared-memory promotion and adds its latency
(and error) as a column.

Needs a CUDA device, its driver and ``pip install 'polyml[cuda]'``; without them it exits with
status 2 and says what is missing before compiling anything.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx

import polyml
from polyml.compiler import read_graph
from polyml.errors import PolymlError
from polyml.gpu.build import build_cuda_artifact
from polyml.gpu.runtime import CudaModel, require_device
from polyml.testing import LIGHT_MODELS, expose_logits, light_model_path, random_inputs, randomize_weights, rel_error


def median_ms(fn, feeds: dict, repeat: int) -> float:  # noqa: ANN001
    fn(feeds)
    fn(feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(LIGHT_MODELS))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--sm", default="sm_90")
    ap.add_argument("--no-cpu", dest="cpu", action="store_false", help="skip the CPU build")
    ap.add_argument("--shared-memory", action="store_true", help="also run the build with shared-memory promotion")
    args = ap.parse_args()
    try:
        require_device()
    except PolymlError as e:
        print(f"run_gpu_cnns: {e}", file=sys.stderr)
        return 2
    import onnxruntime as ort

    rows = []
    failures = 0
    with tempfile.TemporaryDirectory(prefix="polyml-gpu-cnns-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            model = expose_logits(randomize_weights(onnx.load(str(light_model_path(name))), seed=0))
            path = work / f"{name}.onnx"
            onnx.save(model, path)
            feeds = random_inputs(model)
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
            t0 = time.perf_counter()
            build_cuda_artifact(read_graph(path), work / f"{name}.cuda", sm=args.sm)
            build_s = time.perf_counter() - t0
            gpu = CudaModel(work / f"{name}.cuda")
            got = gpu.run(feeds)
            err = max(rel_error(got[k], ref[k]) for k in ref)
            ok = err < 1e-3
            failures += not ok
            gpu_ms = median_ms(gpu.run, feeds, args.repeat)
            smem_ms = None
            if args.shared_memory:
                build_cuda_artifact(read_graph(path), work / f"{name}.smem", sm=args.sm, shared_memory=True)
                smem = CudaModel(work / f"{name}.smem")
                smem_err = max(rel_error(v, ref[k]) for k, v in smem.run(feeds).items() if k in ref)
                failures += smem_err >= 1e-3
                err = max(err, smem_err)
                ok = ok and smem_err < 1e-3
                smem_ms = median_ms(smem.run, feeds, args.repeat)
                smem.close()
            cpu_ms = None
            if args.cpu:
                cpu = polyml.compile(path, work / f"{name}.cpu")
                cpu_ms = median_ms(cpu.run, feeds, args.repeat)
            ort_ms = median_ms(lambda f, s=sess: s.run(None, f), feeds, args.repeat)
            rows.append((name, len(gpu.manifest["kernels"]), build_s, gpu_ms, smem_ms, cpu_ms, ort_ms, err, ok))
            gpu.close()
            print(f"{name}: gpu {gpu_ms:.2f} ms, cpu {cpu_ms if cpu_ms is None else f'{cpu_ms:.2f}'} ms, "
                  f"max rel error {err:.2e} {'ok' if ok else 'MISMATCH'}", file=sys.stderr, flush=True)
    print("| model | kernels | build s | polyml GPU ms | GPU shared-mem ms | polyml CPU ms | onnxruntime CPU ms | max rel err |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, nk, bs, g, sm, c, o, err, ok in rows:
        cpu = "-" if c is None else f"{c:.2f}"
        smem = "-" if sm is None else f"{sm:.2f}"
        print(f"| {name} | {nk} | {bs:.1f} | {g:.2f} | {smem} | {cpu} | {o:.2f} | {err:.1e}{'' if ok else ' ✗'} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
