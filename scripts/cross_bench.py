"""Build here, measure on another machine: polyml's CPU builds cross-compiled for a named CPU
(``POLYML_TARGET_CPU`` / ``POLYML_TARGET_CACHES``) and CUDA builds, packed with their ONNX models,
then run next to onnxruntime (and numpy's OpenBLAS for MatMul) where no LLVM toolchain is needed.

Made for the ``device`` machines of this workplace (AVX-512 CPU and an NVIDIA GPU, no LLVM 19, no
islpy, a 64 MiB upload): the big weights are rounded to 255 levels per tensor so the payload
compresses about 4x (latency does not depend on the values; the errors are still checked)::

    .venv/bin/python scripts/cross_bench.py prep --cpu rocketlake --caches 48K,2M,32M \\
        --models mobilenet_v2,efficientnet_b0,squeezenet,shufflenet --cuda squeezenet,shufflenet,bert_small \\
        --torch-models build/models --work build/cross          # ~13 min on 2 cores
    # there, from the repository root (numpy, onnx, onnxruntime; cuda-bindings for the GPU rows):
    python3 scripts/cross_bench.py run --payload build/cross/payload.tar.xz --out "$OUT"

``run`` pins itself to two CPUs on different physical cores, prints markdown tables (CPU models
at 1 and 2 threads, MatMul 1024³/2048³ against OpenBLAS, the CUDA builds on the GPU with their
error against onnxruntime; the transformer fixtures of tests/fixtures/onnx exercise Gather's
index checks on the device) and writes ``results.json``.  Each row that fails prints its error and
the rest go on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from polyml.testing import LIGHT_MODELS, random_inputs, rel_error, seeded_light_model  # noqa: E402

MATMUL_SIZES = (1024, 2048)


def round_weights(model: onnx.ModelProto, levels: int = 255) -> onnx.ModelProto:
    """Conv/Gemm/MatMul weight initializers rounded to ``levels`` evenly spaced values per tensor."""
    weights = {n.input[1] for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and len(n.input) > 1}
    for i, init in enumerate(model.graph.initializer):
        if init.name in weights and init.data_type == onnx.TensorProto.FLOAT:
            a = numpy_helper.to_array(init)
            step = float(np.abs(a).max()) / (levels // 2) or 1.0
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array((np.round(a / step) * step).astype(np.float32), init.name))
    return model


FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "onnx"


def prep_model(name: str, models: Path, torch_models: Path) -> Path:
    path = models / f"{name}.onnx"
    if not path.exists():
        if (FIXTURES / f"{name}.onnx").is_file():  # exported transformers and CNNs, with their inputs
            shutil.copy(FIXTURES / f"{name}.onnx", path)
            shutil.copy(FIXTURES / f"{name}.inputs.npz", models / f"{name}.inputs.npz")
            return path
        if name in LIGHT_MODELS:
            m = seeded_light_model(name)
        elif (torch_models / f"{name}.onnx").is_file():
            m = onnx.load(str(torch_models / f"{name}.onnx"))
        else:
            raise SystemExit(f"{name}: not a light model and no {torch_models / name}.onnx "
                             "(scripts/bench_models.py table exports torchvision models there)")
        onnx.save(round_weights(m), str(path))
    return path


def cmd_prep(args: argparse.Namespace) -> None:
    os.environ["POLYML_TARGET_CPU"] = args.cpu
    os.environ["POLYML_TARGET_CACHES"] = args.caches
    from polyml.compiler import compile as polyml_compile
    from polyml.compiler import read_graph
    from polyml.driver import toolchain
    from polyml.gpu.build import build_cuda_artifact
    from polyml.testing import single_node_model

    toolchain.host_target.cache_clear()
    toolchain.target_data_caches.cache_clear()
    payload = Path(args.work) / "payload"
    (payload / "models").mkdir(parents=True, exist_ok=True)
    shared_weights = []
    for name in [m for m in args.models.split(",") if m]:
        for t in (1, 2):
            t0 = time.perf_counter()
            polyml_compile(prep_model(name, payload / "models", Path(args.torch_models)), payload / f"{name}.t{t}.polyml",
                           cache=False, threads=t)
            print(f"{name} {args.cpu} t{t}: {time.perf_counter() - t0:.0f} s", flush=True)
        shared_weights.append(name)
    for n in MATMUL_SIZES:
        path = payload / "models" / f"matmul{n}.onnx"
        onnx.save(single_node_model("MatMul", {"a": (n, n), "b": (n, n)}), str(path))
        for t in (1, 2):
            polyml_compile(path, payload / f"matmul{n}.t{t}.polyml", cache=False, threads=t)
    for name in [m for m in args.cuda.split(",") if m]:
        for shared in (False, True):
            t0 = time.perf_counter()
            graph = read_graph(prep_model(name, payload / "models", Path(args.torch_models)))
            build_cuda_artifact(graph, payload / f"{name}.cuda{'.shared' if shared else ''}", shared_memory=shared)
            print(f"{name} cuda{' shared' if shared else ''}: {time.perf_counter() - t0:.0f} s", flush=True)
    # the 2-thread build's weights are the 1-thread build's: packed once, copied back by `run`
    skip = {str(Path("payload") / f"{n}.t2.polyml" / "weights.bin") for n in shared_weights}
    out = Path(args.work) / "payload.tar.xz"
    with tarfile.open(out, "w:xz", preset=6) as tar:
        tar.add(payload, arcname="payload", filter=lambda info: None if info.name in skip else info)
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB", flush=True)


def _unpack(payload: Path) -> Path:
    if payload.is_dir():
        return payload
    root = payload.parent / "unpacked"
    with tarfile.open(payload) as tar:
        tar.extractall(root, filter="data")
    for d in (root / "payload").glob("*.t2.polyml"):
        if not (d / "weights.bin").exists():
            (d / "weights.bin").write_bytes((d.with_name(d.name.replace(".t2.", ".t1.")) / "weights.bin").read_bytes())
    return root / "payload"


def _two_cores() -> list[int]:
    """Two CPUs of this process's affinity on different physical cores (SMT siblings avoided)."""
    rows = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True).stdout.splitlines()
    mine, chosen, seen = os.sched_getaffinity(0), [], set()
    for cpu, core, sock in (r.split(",") for r in rows if r[:1].isdigit()):
        if int(cpu) in mine and (core, sock) not in seen:
            seen.add((core, sock))
            chosen.append(int(cpu))
    return chosen[:2] or sorted(mine)[:2]


def cmd_run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = _unpack(Path(args.payload))
    info = subprocess.run("lscpu | grep -E 'Model name|^CPU\\(s\\)|Thread|Core|Socket|L1d|L2|L3'; "
                          "grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\\n' | grep -E 'avx512|amx' | tr '\\n' ' '; echo; "
                          "nvidia-smi -L 2>&1", shell=True, capture_output=True, text=True).stdout
    cpus = _two_cores()
    os.sched_setaffinity(0, set(cpus))
    print(info + f"pinned to CPUs {cpus}", flush=True)
    results: dict = {"machine": info, "cpus": cpus, "cpu": [], "matmul": [], "gpu": []}

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=1))

    from polyml import benchmark
    from polyml.commands.bench import onnxruntime_runner
    from polyml.runtime.model import CompiledModel

    names = sorted({p.name.split(".")[0] for p in payload.glob("*.t1.polyml")} - {f"matmul{n}" for n in MATMUL_SIZES})
    print("\n| model | threads | polyml ms | onnxruntime ms | polyml/onnxruntime (medians) | (minima) | max rel err |\n"
          "|---|---|---|---|---|---|---|", flush=True)
    for threads in (1, 2):
        for name in names:
            try:
                path = payload / "models" / f"{name}.onnx"
                proto = onnx.load(str(path))
                feeds = random_inputs(proto, seed=1)
                model = CompiledModel(payload / f"{name}.t{threads}.polyml")
                ort = onnxruntime_runner(path, threads, feeds)
                got, ref = model.run(feeds), ort()
                err = max(rel_error(got[o.name], r) for o, r in zip(proto.graph.output, ref) if o.name in got)
                s = benchmark.summarize(benchmark.measure({"polyml": lambda m=model, f=feeds: m.run(f), "onnxruntime": ort},
                                                          repeat=args.repeat))
                results["cpu"].append({"model": name, "threads": threads, "err": err, **s})
                p, o = s["polyml"], s["onnxruntime"]
                print(f"| {name} | {threads} | {p['median_ms']:.2f} | {o['median_ms']:.2f} | {p['median_ms'] / o['median_ms']:.2f} | "
                      f"{p['min_ms'] / o['min_ms']:.2f} | {err:.1e} |", flush=True)
            except Exception:
                traceback.print_exc()
            save()
    try:
        from threadpoolctl import threadpool_info, threadpool_limits

        print("\n" + ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')}" for i in threadpool_info()
                               if i.get("user_api") == "blas"))
        print("| MatMul | threads | polyml GFLOP/s | OpenBLAS GFLOP/s | ratio | max rel err |\n|---|---|---|---|---|---|", flush=True)
        for threads in (1, 2):
            threadpool_limits(threads, user_api="blas")
            for n in MATMUL_SIZES:
                model = CompiledModel(payload / f"matmul{n}.t{threads}.polyml")
                rng = np.random.default_rng(0)
                feeds = {"a": rng.standard_normal((n, n), dtype=np.float32), "b": rng.standard_normal((n, n), dtype=np.float32)}
                err = rel_error(model.run(feeds)["y"], feeds["a"].astype(np.float64) @ feeds["b"].astype(np.float64))
                s = benchmark.summarize(benchmark.measure(
                    {"polyml": lambda m=model, f=feeds: m.run(f), "openblas": lambda f=feeds: np.matmul(f["a"], f["b"])}, repeat=12))
                g = {k: 2.0 * n**3 / (v["median_ms"] / 1e3) / 1e9 for k, v in s.items()}
                results["matmul"].append({"n": n, "threads": threads, "err": err, **s})
                print(f"| {n}³ | {threads} | {g['polyml']:.1f} | {g['openblas']:.1f} | {g['polyml'] / g['openblas']:.2f} | {err:.1e} |",
                      flush=True)
                save()
    except Exception:
        traceback.print_exc()
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    cuda = sorted(payload.glob("*.cuda*"))
    if cuda:
        print("\n| CUDA build | max rel err | GPU ms (median, copies included) | GPU ms (min) | load s |\n|---|---|---|---|---|", flush=True)
    for d in cuda:
        try:
            import onnxruntime as ort_module

            from polyml.gpu.runtime import CudaModel

            path = payload / "models" / f"{d.name.split('.')[0]}.onnx"
            proto = onnx.load(str(path))
            saved = path.with_suffix(".inputs.npz")
            feeds = dict(np.load(saved)) if saved.is_file() else random_inputs(proto, seed=1)
            t0 = time.perf_counter()
            model = CudaModel(d)
            load_s = time.perf_counter() - t0
            got = model.run(feeds)
            ref = ort_module.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
            err = max(rel_error(got[o.name], r) for o, r in zip(proto.graph.output, ref) if o.name in got)
            model.run(feeds)
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                model.run(feeds)
                times.append((time.perf_counter() - t) * 1e3)
            times.sort()
            results["gpu"].append({"build": d.name, "err": err, "median_ms": times[len(times) // 2], "min_ms": times[0], "load_s": load_s})
            print(f"| {d.name} | {err:.1e} | {times[len(times) // 2]:.2f} | {times[0]:.2f} | {load_s:.1f} |", flush=True)
        except Exception:
            traceback.print_exc()
        save()
    save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prep", help="cross-build and pack (needs polyml's toolchain)")
    p.add_argument("--cpu", default="rocketlake", help="clang -march name of the target CPU")
    p.add_argument("--caches", default="48K,2M,32M", help="its L1,L2,L3 data caches")
    p.add_argument("--models", default="mobilenet_v2,efficientnet_b0,squeezenet,shufflenet")
    p.add_argument("--cuda", default="squeezenet,shufflenet,bert_small,gpt2_small,mobilenet_v3_large_small,convnext_tiny_small",
                   help="models built with --target cuda too: light CNNs or tests/fixtures/onnx models ('' for none)")
    p.add_argument("--torch-models", default="build/models", help="folder of torchvision ONNX exports")
    p.add_argument("--work", default="build/cross")
    r = sub.add_parser("run", help="run a payload (numpy, onnx, onnxruntime; no toolchain)")
    r.add_argument("--payload", default="build/cross/payload.tar.xz")
    r.add_argument("--repeat", type=int, default=30)
    r.add_argument("--out", default="build/cross/out")
    args = ap.parse_args()
    cmd_prep(args) if args.cmd == "prep" else cmd_run(args)


if __name__ == "__main__":
    main()
