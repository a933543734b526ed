"""Quantized ONNX models made with onnxruntime's own quantization tool.

Static (QDQ) models: a float model is pre-processed (``quant_pre_process``: shape inference and
onnxruntime's graph optimizations, which fold batch norms into convolutions), then quantized
with ``quantize_static(QuantFormat.QDQ, per_channel=True, activation_type=QUInt8,
weight_type=QInt8)`` calibrated (MinMax) on ``--calib`` seeded random inputs.  Dynamic models:
``quantize_dynamic`` (MatMulInteger + DynamicQuantizeLinear, QInt8 weights).

Models (``--models``, comma separated; default all):

    resnet18        torchvision resnet18, random weights (make_models.randomize), 224x224,
                    exported with torch.onnx.export (TorchScript exporter, opset 17)
    mobilenet_v2    torchvision mobilenet_v2, the same way
    resnet50        onnx's light resnet50 (tests/test_cnns.py), random weights
                    (polyml.testing.randomize_weights), upgraded to opset 13 (version_converter)
    bert            /work/models/bert.onnx (scripts/make_models.py) with quantize_dynamic
    fixtures        tiny nets for CI under tests/fixtures/onnx (``--fixtures DIR``): a QDQ conv
                    net (conv+relu, max pool, residual add, concat, global average pool, flatten,
                    gemm), the same net in the QOperator format, a QDQ matmul net and a dynamically
                    quantized MLP

Outputs, per model NAME (``--out``, default /work/models; fixtures to ``--fixtures``)::

    NAME_int8.onnx           the quantized model
    NAME_int8.inputs.npz     seeded inputs (not the calibration data)
    NAME_int8.ref.npz        onnxruntime's outputs of the quantized model, and under ``fp32:<name>``
                             those of the float model (to show how far int8 is from fp32)
    NAME_fp32.onnx           the float model that was quantized (CNNs; for int8-vs-fp32 benchmarks)

torchvision models need PyTorch (``/work/torchenv/bin/python``, see scripts/make_models.py); the
others only onnx and onnxruntime::

    /work/torchenv/bin/python scripts/make_quantized.py --out /work/models
    .venv/bin/python scripts/make_quantized.py --models fixtures
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
ALL = ("resnet18", "mobilenet_v2", "resnet50", "bert", "fixtures")


def _testing():
    """polyml.testing without importing polyml (whose compiler needs llvmlite)."""
    spec = importlib.util.spec_from_file_location("polyml_testing", ROOT / "polyml" / "testing.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _image(seed: int, shape=(1, 3, 224, 224)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def torchvision_model(name: str) -> onnx.ModelProto:
    import torch
    import torchvision

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_models import randomize

    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).eval()
    randomize(model, seed=0)
    buf = io.BytesIO()
    torch.onnx.export(model, (torch.from_numpy(_image(0)),), buf, dynamo=False, opset_version=17,
                      input_names=["input"], output_names=["logits"])
    return onnx.load_from_string(buf.getvalue())


def light_resnet50() -> onnx.ModelProto:
    from onnx import version_converter

    t = _testing()
    m = t.randomize_weights(onnx.load(str(t.light_model_path("resnet50"))), seed=0)
    # weights become initializers that are not graph inputs: IR >= 4 (the light file is IR 3)
    m.ir_version = max(m.ir_version, 7)
    inits = {i.name for i in m.graph.initializer}
    keep = [vi for vi in m.graph.input if vi.name not in inits]  # else onnxruntime cannot fold them
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m = version_converter.convert_version(m, 13)
    # the light model ends in Softmax, which saturates with random weights: output the logits
    return t.expose_logits(m)


class Calibration:
    """onnxruntime's CalibrationDataReader over seeded standard-normal inputs."""

    def __init__(self, model: onnx.ModelProto, count: int, seed: int = 100):
        inits = {i.name for i in model.graph.initializer}
        self.items = []
        for k in range(count):
            feeds = {}
            for vi in model.graph.input:
                if vi.name in inits:
                    continue
                shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
                feeds[vi.name] = _image(seed + k, tuple(shape))
            self.items.append(feeds)
        self.pos = 0

    def get_next(self):
        if self.pos >= len(self.items):
            return None
        self.pos += 1
        return self.items[self.pos - 1]

    def rewind(self):
        self.pos = 0


def quantize_static_qdq(model: onnx.ModelProto, calib: int, preprocess: bool = True, qoperator: bool = False,
                        op_types: list[str] | None = None) -> onnx.ModelProto:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self, c: Calibration):
            self.c = c

        def get_next(self):
            return self.c.get_next()

    with tempfile.TemporaryDirectory() as tmp:
        src, pre, dst = Path(tmp) / "f.onnx", Path(tmp) / "p.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, str(src))
        if preprocess:
            quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        else:
            pre = src
        fmt = QuantFormat.QOperator if qoperator else QuantFormat.QDQ
        quantize_static(str(pre), str(dst), Reader(Calibration(model, calib)), quant_format=fmt,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        op_types_to_quantize=op_types)
        return onnx.load(str(dst))


def quantize_dynamic_model(path: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "q.onnx"
        quantize_dynamic(str(path), str(dst), weight_type=QuantType.QInt8)
        return onnx.load(str(dst))


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    d = float(np.max(np.abs(ref - got))) if ref.size else 0.0
    return d / scale if scale > 0 else d


def save(name: str, out: Path, qmodel: onnx.ModelProto, fmodel: onnx.ModelProto | None, feeds: dict[str, np.ndarray],
         keep_float: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(qmodel, str(out / f"{name}_int8.onnx"))
    if keep_float and fmodel is not None:  # the float model, for polyml bench int8 vs fp32
        onnx.save(fmodel, str(out / f"{name}_fp32.onnx"))
    np.savez(out / f"{name}_int8.inputs.npz", **feeds)
    ref = ort_run(qmodel, feeds)
    extra = {}
    note = ""
    if fmodel is not None:
        fp = ort_run(fmodel, feeds)
        extra = {f"fp32:{k}": v for k, v in fp.items() if k in ref}
        note = ", int8 vs fp32 " + ", ".join(f"{k} {rel_err(fp[k], ref[k]):.4f}" for k in ref if k in fp)
    np.savez(out / f"{name}_int8.ref.npz", **ref, **extra)
    ops: dict[str, int] = {}
    for n in qmodel.graph.node:
        key = f"{n.domain}.{n.op_type}" if n.domain else n.op_type
        ops[key] = ops.get(key, 0) + 1
    print(f"{name}_int8: {len(qmodel.graph.node)} nodes {dict(sorted(ops.items()))}{note}")


# -- tiny fixtures --------------------------------------------------------------------------

def _w(rng, *shape, scale=None) -> np.ndarray:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (rng.standard_normal(shape) * (scale or np.sqrt(2.0 / fan_in))).astype(np.float32)


def tiny_conv_net() -> onnx.ModelProto:
    """conv+relu, max pool, two branches (1x1 conv / 3x3 conv+clip) added and concatenated,
    global average pool, flatten, gemm: every QDQ pattern of the CNNs at 16x16."""
    rng = np.random.default_rng(7)
    inits = {"w1": _w(rng, 8, 3, 3, 3), "b1": _w(rng, 8, scale=0.1), "w2": _w(rng, 8, 8, 1, 1), "b2": _w(rng, 8, scale=0.1),
             "w3": _w(rng, 8, 8, 3, 3), "b3": _w(rng, 8, scale=0.1), "wd": _w(rng, 8, 1, 3, 3), "bd": _w(rng, 8, scale=0.1),
             "fc": _w(rng, 10, 24), "fcb": _w(rng, 10, scale=0.1),
             "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)}
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"]),
        helper.make_node("Conv", ["p1", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c3", "lo", "hi"], ["r3"]),
        helper.make_node("Add", ["c2", "r3"], ["a"]),
        helper.make_node("Relu", ["a"], ["ar"]),
        helper.make_node("Conv", ["ar", "wd", "bd"], ["dw"], pads=[1, 1, 1, 1], group=8),
        helper.make_node("Concat", ["ar", "p1", "dw"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1),
    ]
    g = helper.make_graph(nodes, "tiny_conv", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def tiny_matmul_net(dynamic: bool = False) -> onnx.ModelProto:
    """MatMul+bias+relu, MatMul, residual Add, Mul by a computed tensor, Transpose/Reshape."""
    rng = np.random.default_rng(8)
    inits = {"w1": _w(rng, 32, 48), "b1": _w(rng, 48, scale=0.1), "w2": _w(rng, 48, 32), "b2": _w(rng, 32, scale=0.1),
             "shape": np.array([1, 8, 2, 16], np.int64)}
    nodes = [
        helper.make_node("MatMul", ["input", "w1"], ["m1"]),
        helper.make_node("Add", ["m1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"]),
        helper.make_node("Add", ["m2", "b2"], ["a2"]),
        helper.make_node("Add", ["a2", "input"], ["res"]),
        helper.make_node("Mul", ["res", "input"], ["prod"]),
        helper.make_node("Reshape", ["prod", "shape"], ["rs"]),
        helper.make_node("Transpose", ["rs"], ["out"], perm=[0, 2, 1, 3]),
    ]
    g = helper.make_graph(nodes, "tiny_matmul", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 8, 32])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 2, 8, 16])],
                          initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def make_fixtures(out: Path, calib: int) -> None:
    conv = tiny_conv_net()
    save("tiny_conv", out, quantize_static_qdq(conv, calib, preprocess=False), conv, {"input": _image(1, (1, 3, 16, 16))})
    # the same net in onnxruntime's QOperator format: QLinearConv, com.microsoft QLinearAdd/Concat/... as emitted
    # (its Gemm becomes com.microsoft.QGemm)
    save("tiny_conv_qop", out, quantize_static_qdq(conv, calib, preprocess=False, qoperator=True), conv,
         {"input": _image(1, (1, 3, 16, 16))})
    mm = tiny_matmul_net()
    feeds = {"input": _image(2, (1, 8, 32))}
    save("tiny_matmul", out, quantize_static_qdq(mm, calib, preprocess=False), mm, feeds)
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "mm.onnx"
        onnx.save(mm, str(p))
        save("tiny_matmul_dynamic", out, quantize_dynamic_model(p), mm, feeds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(ALL))
    ap.add_argument("--out", type=Path, default=Path("/work/models"))
    ap.add_argument("--fixtures", type=Path, default=ROOT / "tests" / "fixtures" / "onnx")
    ap.add_argument("--calib", type=int, default=8, help="calibration inputs (seeded standard normal)")
    ap.add_argument("--bert", type=Path, default=Path("/work/models/bert.onnx"))
    args = ap.parse_args(argv)
    for name in args.models.split(","):
        if name in ("resnet18", "mobilenet_v2"):
            f = torchvision_model(name)
            save(name, args.out, quantize_static_qdq(f, args.calib), f, {"input": _image(1)}, keep_float=True)
        elif name == "resnet50":
            f = light_resnet50()
            feeds = {f.graph.input[0].name: _image(1)}
            save(name, args.out, quantize_static_qdq(f, args.calib), f, feeds, keep_float=True)
        elif name == "bert":
            feeds = dict(np.load(args.bert.with_suffix(".inputs.npz")))
            save(name, args.out, quantize_dynamic_model(args.bert), onnx.load(str(args.bert)), feeds)
        elif name == "fixtures":
            make_fixtures(args.fixtures, args.calib)
        else:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(ALL)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
