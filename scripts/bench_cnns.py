"""Compile time and latency of polyml builds next to onnxruntime on the nine light CNNs.

Each model gets seeded random weights (polyml.testing.randomize_weights) and one random input.
Latencies are medians of ``--repeat`` timed runs per runner, the three runners alternating in
blocks after warm-up (``polyml.benchmark.measure``: a settle sleep, then ``--block`` calls of
which the first is untimed), all in this process and with the same thread count. Prints a
markdown table (for docs/PERFORMANCE.md).

    python scripts/bench_cnns.py [--models resnet50,vgg19] [--repeat 10] [--threads 2] [--block 6] [--settle 0.3] \
        [--variants 'default:;polly-gemm:gemm=polly,conv=direct'] [--json out.json]

``--variants`` names the builds to compare (default: polyml with and without Polly); the first
one's GFLOP/s and ratio to onnxruntime are reported.

``--fuse`` compares fused and unfused builds (both with Polly) instead: latency, loop nests,
intermediate bytes, and peak memory as the resident-set growth (``ru_maxrss``) of a fresh
subprocess that loads the model and runs it once (polyml artifact / onnxruntime session):
``VmHWM`` after minus ``VmRSS`` before, the peak reset through ``/proc/self/clear_refs``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

import polyml
from polyml import benchmark
from polyml.compiler import read_graph
from polyml.flops import graph_flops
from polyml.testing import LIGHT_MODELS, random_inputs, rel_error, seeded_light_model


def timed(runners: dict, repeat: int, timing: dict, label: str) -> dict[str, dict[str, float]]:
    """Median/min/max ms of ``runners`` in alternating blocks (``timing``: warmup, block, settle_s)."""
    with benchmark.rich_progress(label=label) as progress:
        return benchmark.summarize(benchmark.measure(runners, repeat=repeat, progress=progress, **timing))


#: build variants compared by default: label -> compile options
DEFAULT_VARIANTS = "default:;no-polly:polly=0"


def parse_variants(spec: str) -> dict[str, dict]:
    """``"label:opt=val,opt=val;label2:..."`` → {label: compile options} (values: ints where
    they parse, else strings: ``gemm=polly``, ``conv=direct``, ``polly=0``, ``fuse=0``)."""
    out: dict[str, dict] = {}
    for item in filter(None, spec.split(";")):
        label, _, opts = item.partition(":")
        options = {}
        for kv in filter(None, opts.split(",")):
            key, _, value = kv.partition("=")
            options[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
        for key in ("polly", "fuse"):
            if key in options:
                options[key] = bool(options[key])
        out[label.strip()] = options
    if not out:
        raise SystemExit(f"--variants {spec!r}: no variant")
    return out


def bench_model(name: str, repeat: int, threads: int, work: Path, timing: dict | None = None,
                variants: dict[str, dict] | None = None) -> dict:
    """Every build variant and onnxruntime on one light model: medians, GFLOP/s, compile time
    and per-stage seconds of each build, and errors against onnxruntime."""
    import onnxruntime as ort

    variants = variants or parse_variants(DEFAULT_VARIANTS)
    model = seeded_light_model(name)
    path = work / f"{name}.onnx"
    onnx.save(model, str(path))
    feeds = random_inputs(model, seed=1)
    flops = graph_flops(read_graph(path))

    runners = {}
    compile_s = {}
    for label, options in variants.items():
        t0 = time.perf_counter()
        runners[label] = polyml.compile(path, work / f"{name}.{label}", threads=threads, cache=False, **options)
        compile_s[label] = time.perf_counter() - t0
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(names, feeds)))
    errors = {k: max(rel_error(got[n], ref[n]) for n in names) for k, r in runners.items() for got in [r.run(feeds)]}

    calls = {k: (lambda r=r: r.run(feeds)) for k, r in runners.items()}
    calls["onnxruntime"] = lambda: sess.run(names, feeds)
    stats = timed(calls, repeat, timing or {}, name)
    med = {k: s["median_ms"] / 1e3 for k, s in stats.items()}
    first = next(iter(variants))
    return {
        "model": name,
        "gflop": flops / 1e9,
        "variants": {k: dict(v) for k, v in variants.items()},
        "compile_s": compile_s,
        "median_ms": {k: s["median_ms"] for k, s in stats.items()},
        "min_ms": {k: s["min_ms"] for k, s in stats.items()},
        "max_ms": {k: s["max_ms"] for k, s in stats.items()},
        "gflops": {k: flops / v / 1e9 for k, v in med.items()},
        "ratio_vs_ort": {k: med[k] / med["onnxruntime"] for k in runners},
        "rel_error": errors,
        "stages_s": runners[first].manifest["seconds"],
    }


_RSS = """
import sys, numpy as np
kind, path, feeds_path = sys.argv[1:4]
feeds = dict(np.load(feeds_path))
if kind == "ort":
    import onnxruntime as ort
else:
    import polyml
def status(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":"))
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
before = status("VmRSS")
if kind == "ort":
    so = ort.SessionOptions(); so.intra_op_num_threads = int(sys.argv[4])
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]); s.run(None, feeds)
else:
    polyml.load(path).run(feeds)
print(status("VmHWM") - before)
"""


def rss_delta_mb(kind: str, path: Path, feeds_path: Path, threads: int) -> float:
    """Peak resident-set growth (MB) of loading ``path`` and running it once, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _RSS, kind, str(path), str(feeds_path), str(threads)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1]) / 1024


def bench_fusion(name: str, repeat: int, threads: int, work: Path, timing: dict | None = None) -> dict:
    """Fused vs unfused polyml (Polly on) vs onnxruntime: latency medians, memory."""
    import numpy as np
    import onnxruntime as ort

    model = seeded_light_model(name)
    path = work / f"{name}.onnx"
    onnx.save(model, str(path))
    feeds = random_inputs(model, seed=1)
    feeds_path = work / f"{name}.in.npz"
    np.savez(feeds_path, **feeds)
    runners = {label: polyml.compile(path, work / f"{name}.{label}", fuse=fuse, threads=threads, cache=False)
               for label, fuse in (("fused", True), ("unfused", False))}
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(names, feeds)))
    errors = {k: max(rel_error(r.run(feeds)[n], ref[n]) for n in names) for k, r in runners.items()}
    # blocks with a settle sleep: onnxruntime's pool threads keep spinning after a run and, with
    # call-by-call alternation, slowed whichever polyml build came next (10-40 %)
    calls = {k: (lambda r=r: r.run(feeds)) for k, r in runners.items()}
    calls["onnxruntime"] = lambda: sess.run(names, feeds)
    stats = timed(calls, repeat, timing or {}, name)
    rss = {k: rss_delta_mb("polyml", work / f"{name}.{k}", feeds_path, threads) for k in runners}
    rss["onnxruntime"] = rss_delta_mb("ort", path, feeds_path, threads)
    man = {k: r.manifest for k, r in runners.items()}
    return {
        "model": name,
        "median_ms": {k: s["median_ms"] for k, s in stats.items()},
        "loop_nests": {k: m["loop_nests"] for k, m in man.items()},
        "intermediate_mb": {k: m["intermediate_bytes"] / 1e6 for k, m in man.items()},
        "arena_weights_mb": {k: (m["arena_bytes"] + m["weights_bytes"]) / 1e6 for k, m in man.items()},
        "rss_mb": rss,
        "rel_error": errors,
    }


def markdown_fusion(rows: list[dict]) -> str:
    lines = [
        "| model | fused ms | unfused ms | ORT ms | fused/unfused | loop nests (fused / unfused) "
        "| intermediate MB (fused / unfused) | arena+weights MB (fused / unfused) | peak RSS MB (fused / unfused / ORT) "
        "| max rel err (fused / unfused) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m, n, i, a, rs, e = (r[k] for k in ("median_ms", "loop_nests", "intermediate_mb", "arena_weights_mb", "rss_mb", "rel_error"))
        lines.append(
            f"| {r['model']} | {m['fused']:.1f} | {m['unfused']:.1f} | {m['onnxruntime']:.1f} | {m['fused'] / m['unfused']:.2f} "
            f"| {n['fused']} / {n['unfused']} | {i['fused']:.1f} / {i['unfused']:.1f} | {a['fused']:.1f} / {a['unfused']:.1f} "
            f"| {rs['fused']:.0f} / {rs['unfused']:.0f} / {rs['onnxruntime']:.0f} | {e['fused']:.1e} / {e['unfused']:.1e} |"
        )
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    """One row per model: each variant's median ms, the first variant's compile seconds,
    GFLOP/s and ratio to onnxruntime, and the worst error of all variants."""
    labels = list(rows[0]["variants"]) if rows else []
    first = labels[0] if labels else ""
    head = " | ".join(f"{k} ms" for k in labels)
    lines = [
        f"| model | GFLOP | compile s ({first}) | {head} | onnxruntime ms | {first} GFLOP/s | ORT GFLOP/s "
        f"| ratio {first}/ORT | max rel err |",
        "|---|---:|---:|" + "---:|" * len(labels) + "---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["median_ms"]
        cells = " | ".join(f"{m[k]:.1f}" for k in labels)
        lines.append(
            f"| {r['model']} | {r['gflop']:.2f} | {r['compile_s'][first]:.1f} | {cells} | {m['onnxruntime']:.1f} "
            f"| {r['gflops'][first]:.1f} | {r['gflops']['onnxruntime']:.1f} | {r['ratio_vs_ort'][first]:.2f} "
            f"| {max(r['rel_error'].values()):.1e} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(LIGHT_MODELS))
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs per runner before the blocks (default 1)")
    benchmark.add_options(ap)
    ap.add_argument("--json", default=None)
    ap.add_argument("--fuse", action="store_true", help="fused vs unfused vs onnxruntime, with memory")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS,
                    help="builds to compare, 'label:opt=val,...;label2:...' (compile options: polly=0, fuse=0, "
                         f"gemm=polly, conv=direct|gemm; default {DEFAULT_VARIANTS!r})")
    args = ap.parse_args()
    timing = {"warmup": args.warmup, "block": args.block, "settle_s": args.settle}
    method = f"threads={args.threads}, {benchmark.describe(args.repeat, args.block, args.settle)}"
    rows = []
    if args.fuse:
        with tempfile.TemporaryDirectory(prefix="polyml-bench-") as tmp:
            for name in args.models.split(","):
                rows.append(bench_fusion(name, args.repeat, args.threads, Path(tmp), timing))
                print(f"{name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in rows[-1]["median_ms"].items()), file=sys.stderr, flush=True)
                if args.json:
                    Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"{method} (medians)\n")
        print(markdown_fusion(rows))
        return 0
    with tempfile.TemporaryDirectory(prefix="polyml-bench-") as tmp:
        for name in args.models.split(","):
            r = bench_model(name, args.repeat, args.threads, Path(tmp), timing, parse_variants(args.variants))
            rows.append(r)
            print(f"{name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in r["median_ms"].items())
                  + ", compile " + ", ".join(f"{k} {v:.1f}s" for k, v in r["compile_s"].items()), file=sys.stderr, flush=True)
    print(f"{method} (medians)\n")
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
