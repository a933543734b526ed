"""Per-shape convolution speed: polyml's lowerings of each shape against each other and onnxruntime.

``--variants`` names the builds compared (the first against the second): ``gemm`` (the GEMM on
the im2col matrix packed on the fly, ``--conv gemm``: on the schedule path), ``packed`` (the
same on the hand-written packed GEMM, ``--gemm packed``), ``direct`` (the register-blocked
direct nests, ``--conv direct``), ``auto`` (the build's own choice per shape), ``hand`` (that
choice with the hand-written packed GEMM, ``--gemm packed``), ``plain``
(``--no-schedule``: the plain nest).

Every distinct Conv of ResNet-50 (batch 1, 224x224) by default, or the convs of any ONNX model
(``--model``); each becomes a one-node model with random weights, bias and a fused Relu, built
both ways, checked against onnxruntime, and timed in alternating blocks
(:func:`polyml.benchmark.measure`).  Prints GFLOP/s and the ratio gemm/direct per shape; this
table (gemm against direct) decides :func:`polyml.kernels.conv.prefer_gemm`.

    python scripts/bench_conv.py [--threads 2] [--repeat 10] [--model m.onnx] [--variants gemm,direct] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from polyml import benchmark
from polyml.compiler import compile as polyml_compile
from polyml.testing import rel_error

#: (C_in, H, W, C_out, kernel, stride, pad) of ResNet-50's distinct convolutions
RESNET50 = [
    (3, 224, 224, 64, 7, 2, 3),
    (64, 56, 56, 64, 1, 1, 0), (64, 56, 56, 64, 3, 1, 1), (64, 56, 56, 256, 1, 1, 0), (256, 56, 56, 64, 1, 1, 0),
    (256, 56, 56, 128, 1, 1, 0), (128, 56, 56, 128, 3, 2, 1), (128, 28, 28, 512, 1, 1, 0), (256, 56, 56, 512, 1, 2, 0),
    (512, 28, 28, 128, 1, 1, 0), (128, 28, 28, 128, 3, 1, 1),
    (512, 28, 28, 256, 1, 1, 0), (256, 28, 28, 256, 3, 2, 1), (256, 14, 14, 1024, 1, 1, 0), (512, 28, 28, 1024, 1, 2, 0),
    (1024, 14, 14, 256, 1, 1, 0), (256, 14, 14, 256, 3, 1, 1),
    (1024, 14, 14, 512, 1, 1, 0), (512, 14, 14, 512, 3, 2, 1), (512, 7, 7, 2048, 1, 1, 0), (1024, 14, 14, 2048, 1, 2, 0),
    (2048, 7, 7, 512, 1, 1, 0), (512, 7, 7, 512, 3, 1, 1),
]


def conv_model(c: int, h: int, w: int, m: int, k: int, s: int, p: int, seed: int = 0) -> onnx.ModelProto:
    """Conv (+bias) → Relu with random weights, one input ``x``."""
    rng = np.random.default_rng(seed)
    wt = (rng.standard_normal((m, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    bias = rng.standard_normal(m).astype(np.float32)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, oh, ow])],
                              [helper.make_tensor("w", TensorProto.FLOAT, wt.shape, wt.ravel()),
                               helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def model_convs(path: Path) -> list[tuple[int, ...]]:
    """The distinct square, group-1 convolutions of a model (shapes by onnx shape inference)."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in
              [*model.graph.value_info, *model.graph.input]}
    inits = {t.name: list(t.dims) for t in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type != "Conv":
            continue
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        xs, ws = shapes.get(node.input[0]), inits.get(node.input[1])
        if not xs or not ws or a.get("group", 1) != 1 or ws[2] != ws[3]:
            continue
        row = (xs[1], xs[2], xs[3], ws[0], ws[2], a.get("strides", [1])[0], a.get("pads", [0])[0])
        if row not in out:
            out.append(row)
    return out


#: each variant's build options
VARIANTS = {"gemm": {"conv": "gemm"}, "packed": {"conv": "gemm", "gemm": "packed"}, "direct": {"conv": "direct"},
            "auto": {}, "hand": {"gemm": "packed"}, "plain": {"schedule": False}}


def bench_shape(shape: tuple[int, ...], threads: int, repeat: int, block: int, settle: float, work: Path,
                variants: tuple[str, ...] = ("gemm", "direct")) -> dict:
    import onnxruntime as ort

    c, h, w, m, k, s, p = shape
    model = conv_model(*shape)
    path = work / "conv.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(1).standard_normal((1, c, h, w)).astype(np.float32)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ref = sess.run(None, {"x": x})[0]
    runners, errors, modes = {}, {}, {}
    for name in variants:
        compiled = polyml_compile(path, work / name, cache=False, threads=threads, **VARIANTS[name])
        errors[name] = rel_error(compiled.run({"x": x})["y"], ref)
        runners[name] = (lambda c=compiled: c.run({"x": x}))
        conv = json.loads((work / name / "manifest.json").read_text())["functions"][0]
        modes[name] = f"{conv['detail'].split()[-1]}/{conv['path']}"
    runners["onnxruntime"] = lambda: sess.run(None, {"x": x})
    times = benchmark.measure(runners, 2, repeat, block=block, settle_s=settle)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    flop = 2.0 * m * c * k * k * oh * ow
    row = {"shape": shape, "gflop": flop / 1e9, "max_rel_err": errors, "modes": modes}
    for name, ts in times.items():
        row[name] = flop / statistics.median(ts) / 1e9
    row["ratio"] = row[variants[0]] / row[variants[1]]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--model", type=Path, default=None, help="take the conv shapes of this ONNX model")
    ap.add_argument("--variants", default="gemm,direct", help=f"two or more of {', '.join(VARIANTS)}")
    ap.add_argument("--json", dest="json_file", default=None)
    benchmark.add_options(ap)
    args = ap.parse_args()
    shapes = model_convs(args.model) if args.model else RESNET50
    variants = tuple(args.variants.split(","))
    rows = []
    print(f"{'Cin':>5} {'HxW':>8} {'Cout':>5} {'k':>2} {'s':>2}  " + " ".join(f"{v:>7}" for v in variants)
          + f" {'ort':>7} GFLOP/s  {variants[0]}/{variants[1]}  err      lowerings")
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            row = bench_shape(shape, args.threads, args.repeat, args.block, args.settle, Path(tmp), variants)
            rows.append(row)
            c, h, w, m, k, s, _ = shape
            err = max(row["max_rel_err"].values())
            print(f"{c:>5} {f'{h}x{w}':>8} {m:>5} {k:>2} {s:>2}  " + " ".join(f"{row[v]:7.1f}" for v in variants)
                  + f" {row['onnxruntime']:7.1f}          {row['ratio']:5.2f}     {err:.1e}  "
                  + " ".join(row["modes"].values()), flush=True)
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
