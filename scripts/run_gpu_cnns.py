"""Run the nine light CNNs on an NVIDIA GPU (``--target cuda``), check them against onnxruntime
and print the device latency next to the CPU build's.

Each model gets seeded random weights (polyml.testing.randomize_weights) and one random input;
the logits before the final softmax are exposed and compared too (polyml.testing.expose_logits).
Latencies are medians over ``--repeat`` runs after warm-up; the GPU figure includes the
host→device copy of the input and the device→host copy of the outputs.  Prints a markdown table
for docs/PERFORMANCE.md.

    python scripts/run_gpu_cnns.py [--models squeezenet,resnet50] [--repeat 20] [--sm sm_90] [--no-cpu]
                                   [--shared-memory] [--target cuda|cuda-emulated]

``--shared-memory`` also builds each model with shared-memory promotion and adds its latency
(and error) as a column.

Needs a CUDA device, its driver and ``pip install 'polyml[cuda]'``; without them it exits with
status 2 and says what is missing before compiling anything.  ``--target cuda-emulated`` runs
the same builds' kernels on the CPU emulator instead (no device; no latencies, which would mean
nothing: the table gives the error and the emulator's seconds per build variant).
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
from polyml.testing import LIGHT_MODELS, random_inputs, rel_error, seeded_light_model


def median_ms(fn, feeds: dict, repeat: int) -> float:  # noqa: ANN001
    fn(feeds)
    fn(feeds)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def prepared(name: str, work: Path) -> tuple[Path, dict, object, dict]:
    """Light CNN ``name`` with seeded random weights and its logits exposed, saved under ``work``:
    its path, random inputs, the onnxruntime CPU session and that session's outputs (the reference)."""
    import onnxruntime as ort

    model = seeded_light_model(name)
    path = work / f"{name}.onnx"
    onnx.save(model, path)
    feeds = random_inputs(model)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    return path, feeds, sess, ref


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(LIGHT_MODELS))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--sm", default="sm_90")
    ap.add_argument("--no-cpu", dest="cpu", action="store_false", help="skip the CPU build")
    ap.add_argument("--shared-memory", action="store_true", help="also run the build with shared-memory promotion")
    ap.add_argument("--target", choices=["cuda", "cuda-emulated"], default="cuda",
                    help="cuda-emulated: run the kernels on the CPU emulator (correctness only)")
    args = ap.parse_args()
    if args.target == "cuda-emulated":
        return emulated(args)
    try:
        require_device()
    except PolymlError as e:
        print(f"run_gpu_cnns: {e}", file=sys.stderr)
        return 2

    rows = []
    failures = 0
    with tempfile.TemporaryDirectory(prefix="polyml-gpu-cnns-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            path, feeds, sess, ref = prepared(name, work)
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


def emulated(args: argparse.Namespace) -> int:
    """The builds' kernels on the emulator: error vs onnxruntime and emulator seconds per variant."""
    from polyml.gpu.emulate import EmulatedModel

    rows = []
    failures = 0
    with tempfile.TemporaryDirectory(prefix="polyml-emu-cnns-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            path, feeds, sess, ref = prepared(name, work)
            for smem in (False, True) if args.shared_memory else (False,):
                out = work / f"{name}.{'smem' if smem else 'plain'}"
                t0 = time.perf_counter()
                m = build_cuda_artifact(read_graph(path), out, sm=args.sm, shared_memory=smem, ptx=False)
                build_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                emu = EmulatedModel(out)
                compile_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                try:
                    got = emu.run(feeds)
                    err = max(rel_error(got[k], ref[k]) for k in ref)
                except PolymlError as e:
                    print(f"{name}: {e}", file=sys.stderr)
                    err = float("inf")
                run_s = time.perf_counter() - t0
                ok = err <= 1e-3
                failures += not ok
                rows.append((name, smem, len(m["kernels"]), m["shared_memory_kernels"], build_s, compile_s, run_s, err, ok))
                print(f"{name} shared-memory {'on' if smem else 'off'}: max rel error {err:.2e} "
                      f"{'ok' if ok else 'MISMATCH'}, build {build_s:.0f} s, emulator compile {compile_s:.0f} s, "
                      f"run {run_s:.1f} s", file=sys.stderr, flush=True)
    print("| model | shared memory | kernels (shared) | build s | emulator compile s | emulator run s | max rel err |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, smem, nk, ns, bs, cs, rs, err, ok in rows:
        print(f"| {name} | {'on' if smem else 'off'} | {nk} ({ns}) | {bs:.0f} | {cs:.0f} | {rs:.1f} | "
              f"{err:.1e}{'' if ok else ' ✗'} |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
