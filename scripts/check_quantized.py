"""Acceptance table for int8: polyml against onnxruntime's int8 outputs on the quantized models.

For each ``NAME_int8.onnx`` made by ``scripts/make_quantized.py`` (in ``--models``, default
/work/models): compile with polyml, run on ``NAME_int8.inputs.npz``, and print per output the
relative error ``max|Δ| / max|ref|`` against onnxruntime's int8 result (``NAME_int8.ref.npz``)
and, for scale, onnxruntime's int8-vs-fp32 difference; then the ops the build left in float.

    .venv/bin/python scripts/check_quantized.py [--threads 2] [resnet18 ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import polyml

DEFAULT = ("resnet18", "mobilenet_v2", "resnet50", "bert")
INTEGER_OPS = {"MatMulInteger", "ConvInteger", "DynamicQuantizeLinear", "QuantizeLinear", "DequantizeLinear"}
BOUND = {"bert": 1e-2}


def rel(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    return float(np.abs(ref - got).max() / max(np.abs(ref).max(), 1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", default=list(DEFAULT))
    ap.add_argument("--models", type=Path, default=Path("/work/models"))
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args(argv)
    failed = 0
    print("| model | output | rel err vs ORT int8 | bound | ORT int8 vs fp32 | integer ops | ran in float | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.names:
        path = args.models / f"{name}_int8.onnx"
        feeds = dict(np.load(args.models / f"{name}_int8.inputs.npz"))
        ref = dict(np.load(args.models / f"{name}_int8.ref.npz"))
        t0 = time.perf_counter()
        model = polyml.compile(path, cache=False, threads=args.threads)
        seconds = time.perf_counter() - t0
        got = model.run(feeds)
        q = model.manifest.get("quantization") or {}
        floats: dict[str, int] = {}
        for e in q.get("ran_in_float", []):
            floats[e["op_type"]] = floats.get(e["op_type"], 0) + 1
        ints: dict[str, int] = {}  # op functions computing on quantized tensors (QDQ rewrites, QOperator, dynamic)
        for f in model.manifest["functions"]:
            op = f["op_type"].removeprefix("com.microsoft.")
            if op.startswith("QLinear") or op in INTEGER_OPS:
                ints[op] = ints.get(op, 0) + 1
        bound = BOUND.get(name, 5e-3)
        for k, v in got.items():
            err = rel(ref[k], v)
            fp = f"{rel(ref[k], ref['fp32:' + k]):.2e}" if f"fp32:{k}" in ref else "-"
            failed += err > bound
            print(f"| {name} | {k} | {err:.2e}{' FAIL' if err > bound else ''} | {bound:g} | {fp} | "
                  f"{', '.join(f'{o}×{c}' for o, c in sorted(ints.items())) or '-'} | "
                  f"{', '.join(f'{o}×{c}' for o, c in sorted(floats.items())) or 'none'} | {seconds:.0f} |")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
