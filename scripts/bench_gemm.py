"""GFLOP/s of a polyml-compiled single MatMul model next to numpy's OpenBLAS SGEMM.

Both run in this process with the same thread count, in alternating blocks after warm-up
(``polyml.benchmark.measure``: OpenBLAS's threads busy-wait ~0.1-0.2 s after a call and halved
polyml's speed when the two alternated call by call); prints medians (and min-max) per size and
the ratio polyml / OpenBLAS, plus polyml's max relative error against numpy.
``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` are removed from the environment before numpy
loads (an image that pins Haswell halves OpenBLAS's speed).

    python scripts/bench_gemm.py [--sizes 1024,512] [--threads 2] [--repeat 20] [--block 6] [--settle 0.3] \
        [--gemm schedule,packed] [--weights] [--op Gemm] [--json out.json]

``--gemm``: the product paths to build (``schedule``: the GEMM nest under its BLIS schedule,
:mod:`polyml.schedule.gemm`; ``packed``: the hand-written packed GEMM; ``plain``: the nest
unscheduled, ``--no-schedule``), each timed in the same alternating blocks as OpenBLAS; the
ratio columns are per path.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
    os.environ.pop(_var, None)

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from polyml import benchmark  # noqa: E402
from polyml.compiler import compile as polyml_compile  # noqa: E402
from polyml.testing import rel_error, single_node_model  # noqa: E402


def _blas_threads(n: int) -> str:
    """Limit OpenBLAS to ``n`` threads (threadpoolctl when installed); describe the library."""
    try:
        from threadpoolctl import threadpool_info, threadpool_limits
    except ImportError:
        return "threadpoolctl not installed: OpenBLAS uses its default thread count"
    threadpool_limits(n, user_api="blas")
    info = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return ", ".join(f"{i['internal_api']} {i['version']} {i.get('architecture', '')} threads={i['num_threads']}" for i in info)


def bench_size(n: int | tuple[int, int, int], threads: int, repeat: int, warmup: int, work: Path,
               block: int = benchmark.BLOCK, settle_s: float = benchmark.SETTLE_S, paths: tuple[str, ...] = ("schedule",),
               weights: bool = False, op: str = "MatMul", **options) -> dict:
    """Median times of polyml (one build per product path) and numpy on an ``m × n × k``
    float32 product (``n``: an int for a cube), in alternating blocks.  ``weights``: B is a
    constant of the model; ``op`` ``Gemm``: a Gemm with a bias of N (numpy adds it too)."""
    m, n, kk = (n, n, n) if isinstance(n, int) else n
    path = work / f"{op}{m}x{n}x{kk}.onnx"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, kk), dtype=np.float32)
    b = rng.standard_normal((kk, n), dtype=np.float32)
    bias = rng.standard_normal((n,), dtype=np.float32)
    extra = {"c": bias} if op == "Gemm" else {}
    if weights:
        model = single_node_model(op, {"a": (m, kk)}, initializers={"b": b, **extra})
        model.graph.node[0].input[:] = ["a", "b", *extra]
        feeds = {"a": a}
    else:
        model = single_node_model(op, {"a": (m, kk), "b": (kk, n), **{k: v.shape for k, v in extra.items()}})
        feeds = {"a": a, "b": b, **extra}
    onnx.save(model, str(path))
    ref = a.astype(np.float64) @ b.astype(np.float64) + (bias if op == "Gemm" else 0.0)
    row: dict = {"n": n, "m": m, "k": kk, "op": op, "weights": weights, "block": block, "settle_s": settle_s,
                 "compile_s": {}, "max_rel_err": {}}
    runners = {}
    for gemm in paths:
        t0 = time.perf_counter()
        choice = {"gemm": "schedule", "schedule": False} if gemm == "plain" else {"gemm": gemm}
        compiled = polyml_compile(path, work / f"build{n}.{gemm}", cache=False, threads=threads, **choice, **options)
        row["compile_s"][gemm] = round(time.perf_counter() - t0, 2)
        row["max_rel_err"][gemm] = rel_error(compiled.run(feeds)["y"], ref)
        runners[f"polyml.{gemm}"] = lambda compiled=compiled: compiled.run(feeds)
    runners["openblas"] = (lambda: np.matmul(a, b) + bias) if op == "Gemm" else (lambda: np.matmul(a, b))
    times = benchmark.measure(runners, warmup, repeat, block=block, settle_s=settle_s)
    flop = 2.0 * m * n * kk
    for name, st in benchmark.summarize(times).items():
        row[name] = {**st, "gflops": flop / (st["median_ms"] / 1e3) / 1e9}
    row["ratio"] = {g: row[f"polyml.{g}"]["gflops"] / row["openblas"]["gflops"] for g in paths}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024", help="comma-separated sizes: N (a cube) or MxNxK")
    ap.add_argument("--weights", action="store_true", help="B is a constant of the model (weights)")
    ap.add_argument("--op", default="MatMul", choices=("MatMul", "Gemm"), help="Gemm: with a bias of N")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    benchmark.add_options(ap)
    ap.add_argument("--no-polly", action="store_true")
    ap.add_argument("--gemm", default="schedule", help="comma-separated product paths: schedule, packed, plain")
    ap.add_argument("--json", dest="json_file")
    args = ap.parse_args()
    print(_blas_threads(args.threads))
    print(benchmark.describe(args.repeat, args.block, args.settle))
    rows = []
    with tempfile.TemporaryDirectory(prefix="polyml-gemm-") as tmp:
        for text in args.sizes.split(","):
            n = tuple(int(x) for x in text.split("x")) if "x" in text else int(text)
            paths = tuple(args.gemm.split(","))
            r = bench_size(n, args.threads, args.repeat, args.warmup, Path(tmp), block=args.block, settle_s=args.settle,
                           paths=paths, weights=args.weights, op=args.op, polly=not args.no_polly)
            rows.append(r)
            o = r["openblas"]
            shape = f"{n}³" if isinstance(n, int) else "x".join(map(str, n))
            print(f"{args.op} {shape}{' weights' if args.weights else ''} threads={args.threads}: OpenBLAS {o['gflops']:.1f} GFLOP/s ({o['median_ms']:.2f} ms)", flush=True)
            for g in paths:
                p = r[f"polyml.{g}"]
                print(f"  polyml {g}: {p['gflops']:.1f} GFLOP/s ({p['median_ms']:.2f} ms, {p['min_ms']:.2f}-"
                      f"{p['max_ms']:.2f}), ratio {r['ratio'][g]:.2f}, max rel err {r['max_rel_err'][g]:.1e}, "
                      f"compile {r['compile_s'][g]} s", flush=True)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
