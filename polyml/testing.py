"""Helpers shared by the tests, the benchmarks and the demo (onnxruntime is imported lazily)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

LIGHT_MODELS = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_model_path(name: str) -> Path:
    """Path of a 'light' model shipped in the onnx wheel (weights as ConstantOfShape)."""
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace every ConstantOfShape weight by a seeded random initializer.

    Tensors of rank ≥ 2 get He-style normal values (std √(2/fan_in)) so activations stay in
    range through deep nets; rank ≤ 1 tensors (biases, batch-norm parameters) get U(0.5, 1.5),
    positive so that variances are valid.
    """
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    keep = []
    for n in m.graph.node:
        if n.op_type == "ConstantOfShape" and n.input and n.input[0] in consts:
            shape = [int(d) for d in consts[n.input[0]].reshape(-1)]
            if len(shape) >= 2:
                fan_in = int(np.prod(shape[1:])) or 1
                arr = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape).astype(np.float32)
            else:
                arr = rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
            m.graph.initializer.append(numpy_helper.from_array(arr, n.output[0]))
        else:
            keep.append(n)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    used = {i for n in keep for i in n.input}
    inits = [i for i in m.graph.initializer if i.name in used or i.name in {o.name for o in m.graph.output}]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    graph_inputs = [i for i in m.graph.input if i.name not in consts or i.name in used]
    del m.graph.input[:]
    m.graph.input.extend(graph_inputs)
    return m


def expose_logits(model: onnx.ModelProto) -> onnx.ModelProto:
    """Also output the input of each final Softmax: with random weights a deep net's softmax
    often saturates to one-hot, which would hide errors in everything before it."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    outs = {o.name for o in m.graph.output}
    for n in m.graph.node:
        if n.op_type == "Softmax" and n.output[0] in outs and n.input[0] not in outs:
            m.graph.output.append(helper.make_empty_tensor_value_info(n.input[0]))
            outs.add(n.input[0])
    return m


def seeded_light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """Light CNN ``name`` of the onnx wheel with seeded random weights (:func:`randomize_weights`)
    and its logits exposed (:func:`expose_logits`): the model every CNN test and benchmark runs."""
    return expose_logits(randomize_weights(onnx.load(str(light_model_path(name))), seed=seed))


def random_inputs(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded data for every graph input that is not an initializer: standard-normal values
    for floating-point inputs (in the input's dtype), integers in [-100, 100) for the rest."""
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(-100, 100, size=shape).astype(dtype)
    return feeds


def onnxruntime_run(model: onnx.ModelProto | str | os.PathLike, feeds: dict[str, np.ndarray], threads: int = 0,
                    optimize: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime's outputs by name; ``optimize=False`` runs the graph node by node as written
    (no fusion, e.g. a QDQ sandwich stays float instead of becoming an integer QLinearConv)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref| (0 when both are all zero)."""
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if ref.size else 0.0
    return diff / scale if scale else diff


def compile_and_compare(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray] | None = None,
    output_dir: str | os.PathLike | None = None,
    **options,
) -> dict[str, float]:
    """Compile ``model`` with polyml, run it and onnxruntime on ``feeds``; relative errors per output."""
    from polyml.compiler import compile as polyml_compile

    feeds = feeds if feeds is not None else random_inputs(model)
    with tempfile.TemporaryDirectory(prefix="polyml-test-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save(model, str(path))
        compiled = polyml_compile(path, output_dir or Path(tmp) / "build", **options)
        got = compiled.run(feeds)
    ref = onnxruntime_run(model, feeds)
    return {k: rel_error(got[k], ref[k]) for k in ref}


def single_node_model(op_type: str, inputs: dict[str, np.ndarray | tuple], outputs=("y",), opset: int = 18,
                      initializers: dict[str, np.ndarray] | None = None, **attrs) -> onnx.ModelProto:
    """A one-node model; ``inputs`` maps names to arrays (their dtype/shape) or shapes (float32)."""
    vis = []
    for name, a in inputs.items():
        if isinstance(a, tuple):
            vis.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(a)))
        else:
            vis.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)))
    inits = [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()]
    node = helper.make_node(op_type, list(inputs) + list(initializers or {}), outputs, name=f"{op_type.lower()}0", **attrs)
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    graph = helper.make_graph([node], f"{op_type}_test", vis, outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
