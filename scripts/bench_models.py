"""Model measurements: CNN latency of polyml next to onnxruntime and OpenVINO, and the
per-layer comparisons behind the kernel choices.

``table``: every model at each thread count, polyml / onnxruntime / OpenVINO medians of
alternating blocks in one process (:func:`polyml.benchmark.measure`, the method of ``polyml
bench``), the ratios polyml/peer, polyml's error against onnxruntime (max|Δ|/max|ref|), and
the geometric mean of each ratio per thread count.  Peer ``hand``: polyml built with
``--gemm packed`` (the hand-written packed GEMM instead of the schedules), for the schedule
path's ratio to it.  Models: the nine light CNNs of the onnx
wheel with seeded random weights (:func:`polyml.testing.randomize_weights`), torchvision
``efficientnet_b0`` and ``mobilenet_v2`` (random weights, ``torch.onnx.export`` opset 17,
exported with ``--torch-python`` if missing), and the Keras MobileNetV2 frozen ``.pb``
(``scripts/freeze_keras.py mobilenet_v2 --size 224 -o build/tf``; onnxruntime runs the tf2onnx
conversion next to it, ``build/tf/mobilenet_v2_224.onnx``, if present, OpenVINO the ``.pb``)::

    .venv/bin/python scripts/bench_models.py table --threads 1,2 --repeat 20 \\
        --work build/models --torch-python /work/torchenv/bin/python --keras build/tf/mobilenet_v2_224.pb \\
        [--models squeezenet,efficientnet_b0] [--peers onnxruntime,openvino,hand] [--json out.json]

``layers``: single-node convolutions (with the activation of the model they come from) built
with the new kernel paths (``conv=auto``) and with the old nests (``conv=direct``), next to
onnxruntime, interleaved in one process; and the SiLU rewrite (:mod:`polyml.passes.silu`) on and
off after the convolutions that carry it in EfficientNet-B0::

    .venv/bin/python scripts/bench_models.py layers --threads 2 --repeat 30 [--winograd]
    .venv/bin/python scripts/bench_models.py layers --threads 1 --clock cpu   # robust on a loaded host
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from polyml import benchmark
from polyml.compiler import compile as polyml_compile
from polyml.testing import LIGHT_MODELS, random_inputs, rel_error, seeded_light_model

TORCHVISION = ("efficientnet_b0", "mobilenet_v2")
EXPORT = """
import sys, torch, torchvision
torch.manual_seed(0)
m = getattr(torchvision.models, sys.argv[1])(weights=None).eval()
torch.onnx.export(m, torch.randn(1, 3, 224, 224), sys.argv[2], opset_version=17, input_names=["input"],
                  output_names=["logits"], dynamo=False)
"""


def prepare(name: str, work: Path, torch_python: str) -> Path:
    """The model file of ``name`` in ``work`` (made on first use)."""
    path = work / f"{name}.onnx"
    if path.is_file():
        return path
    if name in LIGHT_MODELS:
        onnx.save(seeded_light_model(name), str(path))
    elif name in TORCHVISION:
        subprocess.run([torch_python, "-c", EXPORT, name, str(path)], check=True)
    else:
        raise SystemExit(f"unknown model {name!r}")
    return path


def feeds_for(path: Path) -> dict[str, np.ndarray]:
    if path.suffix == ".pb":
        npz = path.with_suffix(".in.npz")
        if npz.is_file():
            return dict(np.load(npz))
        return {"input": np.random.default_rng(1).standard_normal((1, 224, 224, 3)).astype(np.float32)}
    return random_inputs(onnx.load(str(path), load_external_data=False), seed=1)


def bench_model(path: Path, threads: int, peers: list[str], repeat: int, timing: dict, work: Path) -> dict:
    """polyml and the peers on one model at one thread count: medians (ms), ratios, error."""
    from polyml.commands.bench import onnxruntime_runner, openvino_runner

    feeds = feeds_for(path)
    shapes = {k: v.shape for k, v in feeds.items()} if path.suffix == ".pb" else None
    compiled = polyml_compile(path, work / f"{path.stem}.t{threads}.polyml", threads=threads, input_shapes=shapes)
    runners: dict[str, Callable[[], object]] = {"polyml": lambda: compiled.run(feeds)}
    ort_path = path.with_suffix(".onnx")
    row: dict = {"model": path.stem, "threads": threads}
    for p in peers:
        if p == "onnxruntime" and ort_path.is_file():
            # a tf2onnx conversion names the inputs "input:0"
            names = [i.name for i in onnx.load(str(ort_path), load_external_data=False).graph.input]
            ort_feeds = {n: feeds[n.split(":")[0]] for n in names if n.split(":")[0] in feeds}
            runners[p] = onnxruntime_runner(ort_path, threads, ort_feeds)
        elif p == "openvino":
            runners[p] = openvino_runner(path, threads, feeds)
        elif p == "hand":  # polyml with the hand-written packed GEMM (--gemm packed) instead of the schedules
            hand = polyml_compile(path, work / f"{path.stem}.t{threads}.hand", threads=threads, input_shapes=shapes,
                                  gemm="packed")
            runners[p] = lambda hand=hand: hand.run(feeds)
    got = compiled.run(feeds)
    if "onnxruntime" in runners:
        # outputs matched by name (a tf2onnx conversion appends ':0'), every one compared
        names = [o.name.split(":")[0] for o in onnx.load(str(ort_path), load_external_data=False).graph.output]
        pairs = [(got[n], r) for n, r in zip(names, runners["onnxruntime"]()) if n in got]
        row["err"] = max(rel_error(g, r) for g, r in pairs) if pairs else float("nan")
    times = benchmark.summarize(benchmark.measure(runners, repeat=repeat, **timing))
    for name, s in times.items():
        row[name] = s["median_ms"]
    for p in peers:
        if p in row:
            row[f"/{p}"] = row["polyml"] / row[p]
    return row


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def cmd_table(args: argparse.Namespace) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    names = args.models.split(",") if args.models else [*LIGHT_MODELS, *TORCHVISION]
    paths = [prepare(n, work, args.torch_python) for n in names]
    if args.keras:
        paths.append(Path(args.keras))
    peers = [p for p in args.peers.split(",") if p]
    timing = {"warmup": args.warmup, "block": args.block, "settle_s": args.settle, **cpu_clock(args)}
    rows = []
    head = "| model | threads | polyml ms | " + " | ".join(f"{p} ms" for p in peers) + " | " + \
        " | ".join(f"polyml/{p}" for p in peers) + " | max rel err |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for threads in [int(t) for t in args.threads.split(",")]:
        for path in paths:
            row = bench_model(path, threads, peers, args.repeat, timing, work)
            rows.append(row)
            cells = [row["model"], str(threads), f"{row['polyml']:.2f}",
                     *[f"{row[p]:.2f}" if p in row else "-" for p in peers],
                     *[f"{row['/' + p]:.2f}" if "/" + p in row else "-" for p in peers],
                     f"{row['err']:.1e}" if "err" in row else "-"]
            print("| " + " | ".join(cells) + " |", flush=True)
        means = [f"{geomean([r['/' + p] for r in rows if r['threads'] == threads and '/' + p in r]):.2f}" for p in peers]
        print(f"| **geomean** | {threads} | | {' | '.join('' for _ in peers)} | {' | '.join(means)} | |", flush=True)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=1))


# -- per-layer comparisons --------------------------------------------------------------------

#: (C, H=W, kernel, stride, activation) of MobileNetV2's and EfficientNet-B0's depthwise convs
DEPTHWISE = [(32, 112, 3, 1, "relu6"), (96, 112, 3, 2, "relu6"), (144, 56, 3, 1, "relu6"), (144, 56, 3, 2, "relu6"),
             (192, 28, 3, 1, "relu6"), (576, 14, 3, 2, "relu6"), (960, 7, 3, 1, "relu6"), (240, 28, 5, 1, "silu"),
             (672, 14, 5, 1, "silu"), (1152, 7, 5, 1, "silu")]
#: (C_in, H=W, C_out) of 3x3/1 convolutions: ResNet-50, VGG-19, SqueezeNet, DenseNet-121, Inception
WINOGRAD = [(64, 56, 64), (128, 28, 128), (256, 14, 256), (512, 7, 512), (64, 224, 64), (128, 112, 128), (256, 56, 256),
            (512, 28, 512), (512, 14, 512), (16, 55, 64), (32, 27, 128), (48, 13, 192), (64, 13, 256), (128, 56, 32),
            (128, 14, 32), (128, 7, 32), (64, 56, 192), (64, 28, 96), (96, 28, 96), (160, 7, 224)]
#: (C_in, H=W, C_out, kernel, group) of EfficientNet-B0 convolutions followed by SiLU
SILU = [(16, 112, 96, 1, 1), (40, 28, 240, 1, 1), (112, 14, 672, 1, 1), (144, 56, 144, 3, 144), (672, 14, 672, 5, 672)]


def conv_act_model(c: int, h: int, m: int, k: int, s: int, group: int, act: str) -> onnx.ModelProto:
    """Conv (+bias) → activation (relu6: Clip 0..6; silu: x·Sigmoid(x)) with seeded weights."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((m, c // group, k, k)) / np.sqrt(c // group * k * k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4,
                              group=group)]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()), helper.make_tensor("b", TensorProto.FLOAT, [m], b)]
    if act == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["sg"]), helper.make_node("Mul", ["c", "sg"], ["y"])]
    else:
        inits += [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
                              [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def compare_builds(model: onnx.ModelProto, builds: dict[str, Callable[[Path, Path], object]], threads: int, repeat: int,
                   timing: dict, work: Path) -> dict[str, float]:
    """Median ms of each build and onnxruntime on one single-node model, errors checked."""
    from polyml.commands.bench import onnxruntime_runner

    path = work / "layer.onnx"
    onnx.save(model, str(path))
    feeds = random_inputs(model, seed=1)
    ort = onnxruntime_runner(path, threads, feeds)
    ref = ort()[0]
    runners: dict[str, Callable[[], object]] = {}
    for label, build in builds.items():
        compiled = build(path, work / label)
        err = rel_error(compiled.run(feeds)["y"], ref)
        if err > 1e-4:
            raise SystemExit(f"{label}: error {err:.1e} against onnxruntime")
        runners[label] = (lambda c=compiled: c.run(feeds))
    runners["onnxruntime"] = ort
    return {k: statistics.median(v) * 1e3 for k, v in benchmark.measure(runners, repeat=repeat, **timing).items()}


def cpu_clock(args: argparse.Namespace) -> dict:
    """``--clock cpu``: process CPU time per call (all threads summed; robust on a loaded host at
    1 thread, where it is the kernel's own time, not the time it waited for a core)."""
    return {"clock": time.process_time} if args.clock == "cpu" else {}


def cmd_layers(args: argparse.Namespace) -> None:
    import polyml.passes.fuse as fuse

    timing = {"warmup": args.warmup, "block": args.block, "settle_s": args.settle, **cpu_clock(args)}
    t = args.threads

    def conv_build(choice: str) -> Callable[[Path, Path], object]:
        return lambda p, out: polyml_compile(p, out, cache=False, threads=t, conv=choice)

    def silu_build(on: bool) -> Callable[[Path, Path], object]:
        def build(p: Path, out: Path) -> object:
            saved = fuse.FoldSilu.rewrite  # the build's FuseOperators runs it; off: a pass that rewrites nothing
            if not on:
                fuse.FoldSilu.rewrite = lambda self, g: fuse.GraphReport()
            try:
                return polyml_compile(p, out, cache=False, threads=t)
            finally:
                fuse.FoldSilu.rewrite = saved
        return build

    def winograd_build(tile: str) -> Callable[[Path, Path], object]:
        def build(p: Path, out: Path) -> object:
            saved = os.environ.get("POLYML_WINOGRAD")
            os.environ["POLYML_WINOGRAD"] = tile
            try:
                return polyml_compile(p, out, cache=False, threads=t)
            finally:
                if saved is None:
                    del os.environ["POLYML_WINOGRAD"]
                else:
                    os.environ["POLYML_WINOGRAD"] = saved
        return build

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.winograd:
            print(f"3x3/1 conv + relu6, {t} threads: median ms of Winograd F(2x2), F(4x4), the packed GEMM, onnxruntime")
            print("| C->K @HxW | F2 | F4 | gemm | onnxruntime | F2/gemm | F4/gemm | best/ort |\n|---|---|---|---|---|---|---|---|")
            for c, h, m in WINOGRAD:
                med = compare_builds(conv_act_model(c, h, m, 3, 1, 1, "relu6"),
                                     {"F2": winograd_build("2"), "F4": winograd_build("4"), "gemm": winograd_build("0")},
                                     t, args.repeat, timing, work)
                best = min(med["F2"], med["F4"], med["gemm"])
                print(f"| {c}->{m} @{h} | {med['F2']:.3f} | {med['F4']:.3f} | {med['gemm']:.3f} | {med['onnxruntime']:.3f} | "
                      f"{med['F2'] / med['gemm']:.2f} | {med['F4'] / med['gemm']:.2f} | {best / med['onnxruntime']:.2f} |",
                      flush=True)
            return
        print(f"depthwise, {t} threads: median ms of kernels/depthwise.py (new), the direct nests (old), onnxruntime")
        print("| C | HxW | k/s | act | new | old | onnxruntime | new/old | new/ort |\n|---|---|---|---|---|---|---|---|---|")
        for c, h, k, s, act in DEPTHWISE:
            med = compare_builds(conv_act_model(c, h, c, k, s, c, act), {"new": conv_build("auto"), "old": conv_build("direct")},
                                 t, args.repeat, timing, work)
            print(f"| {c} | {h}x{h} | {k}x{k}/{s} | {act} | {med['new']:.3f} | {med['old']:.3f} | {med['onnxruntime']:.3f} | "
                  f"{med['new'] / med['old']:.2f} | {med['new'] / med['onnxruntime']:.2f} |", flush=True)
        print(f"\nSiLU after a conv, {t} threads: Swish epilogue (on) or Sigmoid+Mul nest (off)")
        print("| conv | on | off | onnxruntime | on/off |\n|---|---|---|---|---|")
        for c, h, m, k, g in SILU:
            med = compare_builds(conv_act_model(c, h, m, k, 1, g, "silu"), {"on": silu_build(True), "off": silu_build(False)},
                                 t, args.repeat, timing, work)
            print(f"| {k}x{k} {c}->{m}{f' g{g}' if g > 1 else ''} @{h} | {med['on']:.3f} | {med['off']:.3f} | "
                  f"{med['onnxruntime']:.3f} | {med['on'] / med['off']:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    table = sub.add_parser("table", help="the model table (polyml vs onnxruntime vs OpenVINO)")
    table.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    table.add_argument("--models", default="", help=f"comma-separated (default: {', '.join([*LIGHT_MODELS, *TORCHVISION])})")
    table.add_argument("--peers", default="onnxruntime,openvino")
    table.add_argument("--work", default="build/models", help="where the model files and builds go")
    table.add_argument("--torch-python", default="/work/torchenv/bin/python", help="a Python with torch + torchvision")
    table.add_argument("--keras", default="", help="Keras MobileNetV2 .pb (scripts/freeze_keras.py)")
    table.add_argument("--repeat", type=int, default=20)
    table.add_argument("--json", dest="json_file", default="")
    table.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                       help="cpu: process CPU time per call (meaningful at --threads 1 on a loaded host)")
    layers = sub.add_parser("layers", help="per-layer new path vs old nests vs onnxruntime")
    layers.add_argument("--threads", type=int, default=2)
    layers.add_argument("--repeat", type=int, default=30)
    layers.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: process CPU time per call (use with --threads 1 on a loaded host)")
    layers.add_argument("--winograd", action="store_true", help="the 3x3/1 table: Winograd F(2x2), F(4x4), packed GEMM")
    for p in (table, layers):
        p.add_argument("--warmup", type=int, default=3, help="untimed runs per runner before the blocks")
        benchmark.add_options(p)
    args = ap.parse_args()
    (cmd_table if args.cmd == "table" else cmd_layers)(args)


if __name__ == "__main__":
    main()
