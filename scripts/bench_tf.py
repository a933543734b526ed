"""Latency of polyml next to TensorFlow on frozen Keras applications (needs TensorFlow).

For each model: freeze it with ``scripts/freeze_keras.py`` (unless ``build/tf/NAME.pb`` exists),
compile it with polyml (``--polly``, and each ``--layouts`` variant of the TF frontend), run
TensorFlow on the same frozen GraphDef in a ``tf.compat.v1.Session`` (intra-op threads =
``--threads``, inter-op 1), check the outputs against TensorFlow's, then time all runners in
alternating blocks after warm-up (``polyml.benchmark.measure``: a settle sleep, then ``--block``
calls of which the first is untimed), in this process, with the same thread count.  Prints a
markdown table of medians (for docs/PERFORMANCE.md and docs/TENSORFLOW.md).

    python scripts/bench_tf.py [--models mobilenet_v2_224,resnet50_224] [--repeat 20] [--threads 2] \\
        [--layouts nchw,nhwc] [--block 6] [--settle 0.3] [--json out.json]

Where ``WORK/NAME.onnx`` exists, onnxruntime runs it too: the frozen graph converted to ONNX,
e.g. ``python -m tf2onnx.convert --graphdef build/tf/NAME.pb --inputs input:0 --outputs
Identity_1:0 --output build/tf/NAME.onnx --opset 17`` (tf2onnx is not a polyml dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import polyml  # noqa: E402
from polyml import benchmark  # noqa: E402
from polyml.compiler import compile_graph  # noqa: E402
from polyml.flops import graph_flops  # noqa: E402
from polyml.frontends.tensorflow import from_graphdef  # noqa: E402
from polyml.testing import rel_error  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FREEZE = {  # stem → freeze_keras.py arguments
    "mobilenet_v2_224": ["mobilenet_v2", "--size", "224"],
    "resnet50_224": ["resnet50", "--size", "224"],
    "mobilenet_v2_224_tf1": ["mobilenet_v2", "--size", "224", "--tf1"],
    "resnet50_224_tf1": ["resnet50", "--size", "224", "--tf1"],
}


def ensure_frozen(stem: str, work: Path) -> Path:
    pb = work / f"{stem}.pb"
    if not pb.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "freeze_keras.py"), *FREEZE[stem], "-o", str(work)], check=True)
    return pb


def tf_session(pb: Path, threads: int):
    import tensorflow as tf

    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(pb.read_bytes())
    g = tf.Graph()
    with g.as_default():
        tf.compat.v1.import_graph_def(gd, name="")
    cfg = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=1)
    return tf.compat.v1.Session(graph=g, config=cfg)


def bench(stem: str, repeat: int, threads: int, layouts: list[str], work: Path, timing: dict | None = None) -> dict:
    """``timing``: keyword arguments of :func:`polyml.benchmark.measure` (warmup, block, settle_s)."""
    pb = ensure_frozen(stem, work)
    with np.load(work / f"{stem}.in.npz") as z:
        feeds = {k: z[k] for k in z.files}
    with np.load(work / f"{stem}.out.npz") as z:
        ref = {k: z[k] for k in z.files}
    runners, compile_s, errors = {}, {}, {}
    flops = 0
    for layout in layouts:
        t0 = time.perf_counter()
        graph = from_graphdef(pb, layout=layout)
        frontend = time.perf_counter() - t0
        flops = graph_flops(graph)
        m = compile_graph(graph, work / f"{stem}.{layout}.polyml", polly=True, threads=threads, frontend_seconds=frontend)
        compile_s[layout] = time.perf_counter() - t0
        got = m.run(feeds)
        errors[layout] = max(rel_error(got[k], ref[k]) for k in ref)
        runners[f"polyml-{layout}"] = (lambda m=m: m.run(feeds))
        transposes = sum(1 for n in graph.nodes if n.op_type == "Transpose")
        compile_s[f"{layout}-transposes"] = transposes
    sess = tf_session(pb, threads)
    fetch = [f"{k}:0" for k in ref]
    feed = {f"{k}:0": v for k, v in feeds.items()}
    tf_out = dict(zip(ref, sess.run(fetch, feed)))
    errors["tensorflow-session"] = max(rel_error(tf_out[k], ref[k]) for k in ref)
    runners["tensorflow"] = lambda: sess.run(fetch, feed)
    converted = work / f"{stem}.onnx"
    if converted.is_file():  # the frozen graph converted to ONNX (tf2onnx), for onnxruntime
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        osess = ort.InferenceSession(str(converted), so, providers=["CPUExecutionProvider"])
        ofeed = {i.name: feeds[i.name.split(":")[0]] for i in osess.get_inputs()}
        onames = [o.name for o in osess.get_outputs()]
        oout = dict(zip([n.split(":")[0] for n in onames], osess.run(onames, ofeed)))
        errors["onnxruntime"] = max(rel_error(oout[k], ref[k]) for k in ref if k in oout)
        runners["onnxruntime"] = lambda: osess.run(onames, ofeed)
    with benchmark.rich_progress(label=stem) as progress:
        stats = benchmark.summarize(benchmark.measure(runners, repeat=repeat, progress=progress, **(timing or {})))
    return {"model": stem, "gflop": flops / 1e9, "median_ms": {k: s["median_ms"] for k, s in stats.items()},
            "min_ms": {k: s["min_ms"] for k, s in stats.items()}, "max_ms": {k: s["max_ms"] for k, s in stats.items()},
            "compile_s": compile_s, "rel_error": errors}


def markdown(rows: list[dict], layouts: list[str]) -> str:
    ort = any("onnxruntime" in r["median_ms"] for r in rows)
    first = f"polyml-{layouts[0]}"
    head = ["model", "GFLOP", *[f"polyml {lay} ms" for lay in layouts], f"polyml {layouts[0]} GFLOP/s", "TensorFlow ms",
            f"ratio polyml {layouts[0]}/TF", *(["onnxruntime ms", f"ratio polyml {layouts[0]}/ORT"] if ort else []),
            "max rel err", "compile s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for r in rows:
        med = r["median_ms"]
        ort_cells = []
        if ort:
            o = med.get("onnxruntime")
            ort_cells = [f"{o:.1f}", f"{med[first] / o:.2f}"] if o else ["-", "-"]
        cells = [r["model"], f"{r['gflop']:.2f}", *[f"{med[f'polyml-{lay}']:.1f}" for lay in layouts],
                 f"{r['gflop'] / med[first] * 1e3:.1f}", f"{med['tensorflow']:.1f}", f"{med[first] / med['tensorflow']:.2f}",
                 *ort_cells, f"{max(r['rel_error'][lay] for lay in layouts):.1e}", f"{r['compile_s'][layouts[0]]:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mobilenet_v2_224,resnet50_224")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layouts", default="nchw", help="comma-separated TF frontend layouts (nchw, nhwc)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed runs per runner before the blocks (default 3)")
    benchmark.add_options(ap)
    ap.add_argument("--work", default=str(ROOT / "build" / "tf"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    layouts = args.layouts.split(",")
    polyml.runtime.model.set_num_threads(args.threads)
    rows = []
    for stem in args.models.split(","):
        r = bench(stem, args.repeat, args.threads, layouts, work,
                  {"warmup": args.warmup, "block": args.block, "settle_s": args.settle})
        rows.append(r)
        print(json.dumps(r), file=sys.stderr)
    print(f"threads={args.threads}, {benchmark.describe(args.repeat, args.block, args.settle)} (medians)\n")
    print(markdown(rows, layouts))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
