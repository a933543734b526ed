"""Integer GEMM throughput: polyml's int8 MatMulInteger next to polyml's fp32 MatMul and
onnxruntime's MatMulInteger at the same shapes.

Per shape ``MxKxN``: ``A`` (M×K, uint8, computed) times a constant ``B`` (K×N, int8, a
weight: pre-packed at compile time by both compilers), ``a_zero_point`` constant; the fp32
model is the same product in float32 with a constant B.  All runners live in this process
with the same thread count and run in alternating blocks after warm-up
(:func:`polyml.benchmark.measure`), so a shared machine's load hits them alike: read the
ratios.  Prints GOPS (2·M·N·K per call) per runner, int8/fp32 and polyml/onnxruntime ratios,
and checks polyml's int8 result against numpy exactly.

    python scripts/bench_igemm.py [--shapes 1024x1024x1024,128x768x768] [--threads 2] [--repeat 20] \
        [--clock wall|cpu] [--variant vnni|madd|madd8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from polyml import benchmark
from polyml.compiler import compile as polyml_compile

#: square products, BERT-base's projections and FFN at sequence 128, a ResNet 3x3 layer as im2col
SHAPES = "1024x1024x1024,128x768x768,128x768x3072,128x3072x768,3136x576x64"


def int8_model(m: int, k: int, n: int, b: np.ndarray, za: int) -> onnx.ModelProto:
    node = helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"])
    g = helper.make_graph([node], "igemm", [helper.make_tensor_value_info("a", TensorProto.UINT8, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, [m, n])],
                          initializer=[numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(za, np.uint8), "za")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def fp32_model(m: int, k: int, n: int, b: np.ndarray) -> onnx.ModelProto:
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    g = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          initializer=[numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def ort_session(model: onnx.ModelProto, threads: int):  # noqa: ANN201
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def bench_shape(m: int, k: int, n: int, threads: int, repeat: int, warmup: int, work: Path, block: int,
                settle_s: float, clock: str = "wall") -> dict:
    rng = np.random.default_rng(0)
    a8 = rng.integers(0, 256, (m, k)).astype(np.uint8)
    b8 = rng.integers(-128, 128, (k, n)).astype(np.int8)
    za = 128
    a32 = rng.standard_normal((m, k), dtype=np.float32)
    b32 = rng.standard_normal((k, n), dtype=np.float32)
    models = {"int8": int8_model(m, k, n, b8, za), "fp32": fp32_model(m, k, n, b32)}
    compiled, compile_s = {}, {}
    for name, model in models.items():
        path = work / f"{name}_{m}x{k}x{n}.onnx"
        onnx.save(model, str(path))
        t0 = time.perf_counter()
        compiled[name] = polyml_compile(path, work / f"build_{name}_{m}x{k}x{n}", cache=False, threads=threads)
        compile_s[name] = round(time.perf_counter() - t0, 2)
    got = compiled["int8"].run({"a": a8})["y"]
    exact = bool(np.array_equal(got, (a8.astype(np.int64) - za) @ b8.astype(np.int64)))
    sess = ort_session(models["int8"], threads)
    runners = {
        "polyml_int8": lambda: compiled["int8"].run({"a": a8}),
        "polyml_fp32": lambda: compiled["fp32"].run({"a": a32}),
        "ort_int8": lambda: sess.run(["y"], {"a": a8}),
    }
    times = benchmark.measure(runners, warmup, repeat, block=block, settle_s=settle_s,
                              clock=time.process_time if clock == "cpu" else time.perf_counter)
    ops = 2.0 * m * n * k
    row: dict = {"shape": f"{m}x{k}x{n}", "exact": exact, "compile_s": compile_s}
    for name, st in benchmark.summarize(times).items():
        row[name] = {**st, "gops": ops / (st["median_ms"] / 1e3) / 1e9}
    row["int8_over_fp32"] = row["polyml_int8"]["gops"] / row["polyml_fp32"]["gops"]
    row["polyml_over_ort"] = row["polyml_int8"]["gops"] / row["ort_int8"]["gops"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated MxKxN")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: this process's CPU time per call (robust on a loaded host; with --threads 1 it is the "
                         "latency, with more the summed thread time)")
    ap.add_argument("--variant", choices=("vnni", "madd", "madd8"), help="force the integer micro-kernel (POLYML_IGEMM)")
    benchmark.add_options(ap)
    ap.add_argument("--json", dest="json_file")
    args = ap.parse_args()
    if args.variant:
        os.environ["POLYML_IGEMM"] = args.variant  # the builds below read it at their edge
    from polyml.codegen.igemm import blocking_for_host

    blk = blocking_for_host(override=args.variant or "")
    print(f"integer micro-kernel {blk.variant} {blk.mr}x{blk.nr} on {blk.width} lanes, kc={blk.kc} mc={blk.mc} nc={blk.nc}")
    print(benchmark.describe(args.repeat, args.block, args.settle))
    rows = []
    with tempfile.TemporaryDirectory(prefix="polyml-igemm-") as tmp:
        for shape in args.shapes.split(","):
            m, k, n = (int(v) for v in shape.lower().split("x"))
            r = bench_shape(m, k, n, args.threads, args.repeat, args.warmup, Path(tmp), args.block, args.settle, args.clock)
            rows.append(r)
            p, f, o = r["polyml_int8"], r["polyml_fp32"], r["ort_int8"]
            print(f"{r['shape']} threads={args.threads}: polyml int8 {p['gops']:.0f} GOPS ({p['median_ms']:.3f} ms), "
                  f"polyml fp32 {f['gops']:.0f} ({f['median_ms']:.3f} ms), onnxruntime int8 {o['gops']:.0f} "
                  f"({o['median_ms']:.3f} ms); int8/fp32 {r['int8_over_fp32']:.2f}x, polyml/ort {r['polyml_over_ort']:.2f}x, "
                  f"exact {r['exact']}", flush=True)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
