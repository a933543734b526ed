"""The attention fusion's effect by sequence length: one BERT-base-shaped attention block (12
heads of 64, additive mask, the exporters' NaN guard) built with and without
``--fuse-attention``, next to onnxruntime, 2 threads, medians of alternating blocks
(polyml.benchmark.measure).

    .venv/bin/python scripts/bench_attention.py --seq 128,512,1024 [--threads 2] [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import onnx

import polyml
from polyml import benchmark
from polyml.testing import onnxruntime_run, rel_error

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_attention import attention_model  # noqa: E402  (the model the tests check)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", default="128,512,1024")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    import onnxruntime as ort

    print(f"{'seq':>5} {'fused ms':>9} {'unfused ms':>11} {'ort ms':>8} {'unfused/fused':>14} {'fused/ort':>10} {'scores MB':>10}")
    for s in (int(x) for x in args.seq.split(",")):
        model, feeds = attention_model(1, args.heads, s, 64, mask="nan-guard")
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "attention.onnx"
            onnx.save(model, str(path))
            fused = polyml.compile(path, Path(tmp) / "fused", threads=args.threads, cache=False)
            unfused = polyml.compile(path, Path(tmp) / "unfused", threads=args.threads, cache=False, attention=False)
            ref = onnxruntime_run(model, feeds)["o"]
            for m in (fused, unfused):
                assert rel_error(m.run(feeds)["o"], ref) < 1e-4
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            runners = {"fused": lambda m=fused, f=feeds: m.run(f), "unfused": lambda m=unfused, f=feeds: m.run(f),
                       "ort": lambda s=sess, f=feeds: s.run(None, f)}
            t = benchmark.measure(runners, repeat=args.repeat)
            med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        print(f"{s:>5} {med['fused']:>9.3f} {med['unfused']:>11.3f} {med['ort']:>8.3f} "
              f"{med['unfused'] / med['fused']:>14.2f} {med['fused'] / med['ort']:>10.2f} {args.heads * s * s * 4 / 2**20:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
