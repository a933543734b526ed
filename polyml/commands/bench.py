"""``polyml bench MODEL|DIR``: latency of a compiled model next to peers, measured in one run.

Runners (polyml, onnxruntime, openvino, tensorflow) alternate in blocks after warm-up
(:func:`polyml.benchmark.measure`: a settle sleep, then ``--block`` consecutive calls of which
the first is untimed, so the peers' spinning thread pools do not steal cores from the next
runner, while rounds still spread machine drift over all of them); the report gives medians,
min–max, GFLOP/s (Conv, Gemm and MatMul flops counted on polyml's graph) and each peer's ratio
to polyml.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from rich.table import Table

from polyml import benchmark
from polyml.commands._common import _add_build_options, _compile, _load_npz, command, console, out
from polyml.errors import PolymlError
from polyml.runtime.model import CompiledModel

PEERS = ("onnxruntime", "openvino", "tensorflow")


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file (.onnx, .pb) or artifact folder")
    p.add_argument("--compare", default="", help="comma-separated peers: onnxruntime, openvino, tensorflow")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per runner (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per runner before the blocks (default 3)")
    benchmark.add_options(p)
    p.add_argument("--target", choices=["cpu", "cuda", "cuda-emulated"], default="cpu",
                   help="cpu only: bench times CPU builds (cuda-emulated is a correctness tool, never timed)")
    p.add_argument("--inputs", default=None, help=".npz of inputs (default: seeded random data)")
    p.add_argument("--json", dest="json_file", default=None, help="write the results as JSON")
    p.add_argument("--plot", action="append", default=[], metavar="FILE",
                   help="draw a picture (.svg or .png; repeatable): a name with 'roofline' the op functions of --profile "
                        "against the host's measured GEMM peak and triad bandwidth, with 'latency' each runner's latency "
                        "distribution (other names: the roofline with --profile, else latency); needs "
                        "pip install 'polyml[plot]'")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also time each op function alone (polyml_step) and list the N slowest, with totals per op type")
    _add_build_options(p, outputs_flag="--output-names")


def random_feeds(model: CompiledModel, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs: standard-normal floats; integers and bools 0 or 1, valid wherever an
    integer input is an index (token ids, positions) or a mask (``--inputs`` for real data)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for n, (shape, dtype) in model.inputs.items():
        if np.issubdtype(dtype, np.floating):
            feeds[n] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[n] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def onnxruntime_runner(path: Path, threads: int, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise PolymlError("--compare onnxruntime: onnxruntime is not installed (pip install onnxruntime)") from None
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)


def openvino_runner(path: Path, threads: int, feeds: dict[str, np.ndarray]) -> Callable[[], object]:
    """OpenVINO's CPU plugin on the same model file (ONNX or frozen GraphDef), f32, latency hint."""
    try:
        import openvino as ov
    except ImportError:
        raise PolymlError("--compare openvino: OpenVINO is not installed (pip install 'polyml[bench]')") from None
    core = ov.Core()
    model = core.read_model(str(path))
    names = {p.get_any_name(): p for p in model.inputs}
    # a GraphDef's ports may be named "input:0" where the feeds say "input", and the other way round
    names.update({n.split(":")[0]: p for n, p in list(names.items()) if n.split(":")[0] not in names})
    missing = [n for n in feeds if n not in names and n.split(":")[0] not in names]
    if missing:
        raise PolymlError(f"--compare openvino: OpenVINO's model has no input(s) {missing} (it has {sorted(names)})")
    ports = {names[n if n in names else n.split(":")[0]]: v for n, v in feeds.items()}
    model.reshape({p: ov.PartialShape(list(v.shape)) for p, v in ports.items()})
    by_port = {p.get_any_name(): v for p, v in ports.items()}
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = threads
    request = core.compile_model(model, "CPU", config).create_infer_request()
    return lambda: request.infer(by_port)


def tensorflow_runner(path: Path, threads: int, feeds: dict[str, np.ndarray], outputs: list[str]) -> Callable[[], object]:
    try:
        import tensorflow as tf
    except ImportError:
        raise PolymlError("--compare tensorflow: TensorFlow is not installed (pip install 'polyml[tf]')") from None
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    gd = tf.compat.v1.GraphDef()
    gd.ParseFromString(path.read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(gd, name="")
    sess = tf.compat.v1.Session(graph=graph)
    fetches = [f"{o.split(':')[0]}:0" for o in outputs]
    feed = {f"{k.split(':')[0]}:0": v for k, v in feeds.items()}
    return lambda: sess.run(fetches, feed)


def measure(runners: dict[str, Callable[[], object]], warmup: int, repeat: int, block: int = benchmark.BLOCK,
            settle_s: float = benchmark.SETTLE_S) -> dict[str, list[float]]:
    """:func:`polyml.benchmark.measure` with a progress bar on stderr."""
    with benchmark.rich_progress(console) as progress:
        return benchmark.measure(runners, warmup, repeat, block=block, settle_s=settle_s, progress=progress)


def _refuse_cuda(kind: str, target: Path) -> None:
    """bench times CPU builds: a CUDA target or artifact is refused with what to use instead."""
    from polyml.gpu.runtime import is_cuda_artifact

    if kind == "cuda-emulated":
        raise PolymlError("polyml bench: --target cuda-emulated is a correctness tool, not a performance target: the "
                          "emulator runs each CUDA thread on the CPU with bounds checks, so its times say nothing about "
                          "a GPU. Check results with polyml run MODEL --target cuda-emulated; time a GPU build on a "
                          "device with scripts/run_gpu_cnns.py")
    if kind == "cuda" or (target.is_dir() and is_cuda_artifact(target)):
        raise PolymlError(f"polyml bench: {target if kind != 'cuda' else '--target cuda'}: bench times CPU builds; "
                          "time a CUDA build on a device with scripts/run_gpu_cnns.py (docs/GPU.md)")


@command("bench", _arguments, "latency of a model next to onnxruntime/openvino/tensorflow (medians of alternating blocks of runs)")
def cmd_bench(args: argparse.Namespace) -> int:
    from polyml.compiler import read_graph
    from polyml.flops import graph_flops

    target = Path(args.model)
    _refuse_cuda(args.target, target)
    peers = [p for p in args.compare.split(",") if p]
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise PolymlError(f"--compare: unknown peer(s) {unknown}; choose from {list(PEERS)}")
    if args.block < 1 or args.settle < 0 or args.repeat < 1 or args.warmup < 0:
        raise PolymlError("need --block >= 1, --settle >= 0, --repeat >= 1, --warmup >= 0")
    plots = plot_kinds(args.plot, bool(args.profile))
    tmp = None
    if target.is_dir():
        compiled = CompiledModel(target)
        model_path = Path(compiled.manifest.get("model", {}).get("path", ""))
        if peers and not model_path.is_file():
            raise PolymlError(f"{target}: its manifest names no readable model file to run peers on")
    else:
        model_path = target
        tmp = tempfile.TemporaryDirectory(prefix="polyml-bench-")
        with console.status(f"compiling {target.name} …"):
            compiled = _compile(args, target, Path(tmp.name), [])
    try:
        feeds = random_feeds(compiled)
        if args.inputs:
            feeds = _load_npz(args.inputs)
        flops = 0.0
        if model_path.is_file():
            shapes = {n: s for n, (s, _) in compiled.inputs.items()}
            outputs = list(compiled.outputs)
            flops = graph_flops(read_graph(model_path, input_shapes=shapes, outputs=outputs if model_path.suffix != ".onnx" else None))
        runners: dict[str, Callable[[], object]] = {"polyml": lambda: compiled.run(feeds)}
        threads = args.threads
        for p in peers:
            if p == "onnxruntime":
                runners[p] = onnxruntime_runner(model_path, threads, feeds)
            elif p == "openvino":
                runners[p] = openvino_runner(model_path, threads, feeds)
            else:
                runners[p] = tensorflow_runner(model_path, threads, feeds, list(compiled.outputs))
        times = measure(runners, args.warmup, args.repeat, args.block, args.settle)
        profile = compiled.profile(feeds, repeat=max(3, args.repeat // 2)) if args.profile else None
    finally:
        if tmp is not None:
            tmp.cleanup()

    stats = benchmark.summarize(times)
    med = {k: v["median_ms"] / 1e3 for k, v in stats.items()}
    table = Table(title=f"polyml bench {target.name} (threads={threads or 'all'}, "
                        f"{benchmark.describe(args.repeat, args.block, args.settle)})")
    for col, just in (("runner", "left"), ("median ms", "right"), ("min–max ms", "right"), ("GFLOP/s", "right"), ("time / polyml", "right")):
        table.add_column(col, justify=just)
    results = {}
    for k, st in stats.items():
        gflops = flops / med[k] / 1e9 if flops else None
        ratio = med[k] / med["polyml"]
        results[k] = {"median_ms": st["median_ms"], "min_ms": st["min_ms"], "max_ms": st["max_ms"], "gflops": gflops,
                      "ratio_to_polyml": ratio}
        table.add_row(k, f"{st['median_ms']:.3f}", f"{st['min_ms']:.3f}–{st['max_ms']:.3f}",
                      f"{gflops:.1f}" if gflops else "-", f"{ratio:.2f}")
    out.print(table)
    if flops:
        out.print(f"{flops / 1e9:.3f} GFLOP per run (Conv, Gemm, MatMul)")
    if profile:
        print_profile(profile, args.profile)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps({"model": str(target), "gflop": flops / 1e9, "threads": threads,
                                                    "repeat": args.repeat, "warmup": args.warmup, "block": args.block,
                                                    "settle_s": args.settle, "results": results,
                                                    **({"profile": profile} if profile else {})}, indent=1))
    roofs = None
    for path, kind in plots.items():
        if kind == "latency":
            from polyml.plot import latency

            latency.draw(times, path, f"polyml bench {target.name} (threads={threads or 'all'}, "
                                      f"{benchmark.describe(args.repeat, args.block, args.settle)})")
        else:
            from polyml.plot import roofline

            if roofs is None:
                with console.status("measuring the roofs (packed GEMM peak, triad bandwidth) …"):
                    roofs = roofline.measure_roofs(threads)
            roofline.draw(roofline.points(profile or []), roofs, path, f"polyml bench {target.name} --profile")
        console.print(f"{kind} picture: {path}", highlight=False)
    return 0


def plot_kinds(files: list[str], profile: bool) -> dict[str, str]:
    """``{file: "roofline" | "latency"}`` for ``--plot``; checks the plot extra before any work."""
    kinds: dict[str, str] = {}
    if not files:
        return kinds
    from polyml.plot import _extra

    _extra.require("polyml bench --plot")
    for f in files:
        _extra.picture_format(f)
        stem = Path(f).stem.lower()
        kind = "roofline" if "roofline" in stem else "latency" if "latency" in stem else (
            "roofline" if profile else "latency")
        if kind == "roofline" and not profile:
            raise PolymlError(f"--plot {f}: the roofline needs the per-op times of --profile N")
        kinds[f] = kind
    return kinds


def print_profile(rows: list[dict], top: int) -> None:
    """The ``top`` slowest op functions and the time per op type (medians of step-by-step runs)."""
    total = sum(r["median_s"] for r in rows) or 1.0
    table = Table(title=f"per op (step by step, sum {total * 1e3:.2f} ms)")
    for col in ("function", "op", "what", "ms", "GFLOP/s", "%"):
        table.add_column(col, justify="left" if col in ("function", "op", "what") else "right")
    for r in sorted(rows, key=lambda r: -r["median_s"])[:top]:
        gflops = r.get("flops", 0.0) / r["median_s"] / 1e9 if r.get("flops") else None
        table.add_row(r["function"], r["op_type"], r.get("detail", ""), f"{r['median_s'] * 1e3:.3f}",
                      f"{gflops:.1f}" if gflops else "-", f"{100 * r['median_s'] / total:.1f}")
    out.print(table)
    by_type: dict[str, list[float]] = {}
    for r in rows:
        by_type.setdefault(r["op_type"], []).append(r["median_s"])
    table = Table(title="per op type")
    for col in ("op", "count", "ms", "%"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for op, ts in sorted(by_type.items(), key=lambda kv: -sum(kv[1])):
        table.add_row(op, str(len(ts)), f"{sum(ts) * 1e3:.3f}", f"{100 * sum(ts) / total:.1f}")
    out.print(table)
