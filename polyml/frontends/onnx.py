"""ONNX frontend: a ModelProto → polyml's graph IR with static shapes and folded constants.

Constant subgraphs (``Shape → Gather → Concat → Reshape`` chains, ``ConstantOfShape``, any
node whose inputs are all constants) are evaluated at compile time with ``onnx.reference``;
every other node must have a kernel, whose ``infer`` gives its output types.  Problems are
collected and reported together: all unsupported nodes at once, with names and op types.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from polyml.errors import GraphError, ModelFormatError, ShapeError, UnsupportedError
from polyml.graph import Graph, Node, TensorType
from polyml.kernels import Operand, registry

#: ops folded whenever their input's type is known, even if its value is not
SHAPE_OPS = {"Shape", "Size"}
#: ops never folded (their result is not a function of their inputs)
#: dtypes of constant DequantizeLinear inputs kept as nodes: quantized weights and biases
QUANTIZED_WEIGHTS = frozenset({"int8", "uint8", "int32"})
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read and check an ONNX file, with one clear error for each way it can be bad."""
    p = Path(path)
    if not p.is_file():
        raise ModelFormatError(f"{p}: no such model file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends
        raise ModelFormatError(f"{p}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not model.graph.node and not model.graph.output:
        raise ModelFormatError(f"{p}: not an ONNX model (empty graph; truncated or another format?)")
    check_strings(model, str(p))
    _load_external_data(model, p.parent.resolve())
    return model


def check_strings(model: onnx.ModelProto, where: str = "model") -> None:
    """Refuse names that are not valid UTF-8 (protobuf hands them over as bytes): a corrupted
    or byte-flipped file, reported once with every bad field instead of failing later."""
    bad: list[str] = []
    g = model.graph
    for i, n in enumerate(g.node):
        for field in ("op_type", "domain", "name"):
            if isinstance(getattr(n, field), bytes):
                bad.append(f"node #{i} {field} {getattr(n, field)!r}")
        for j, t in enumerate([*n.input, *n.output]):
            if isinstance(t, bytes):
                bad.append(f"node #{i} tensor name #{j} {t!r}")
    for kind, items in (("input", g.input), ("output", g.output), ("initializer", g.initializer)):
        for vi in items:
            if isinstance(vi.name, bytes):
                bad.append(f"graph {kind} name {vi.name!r}")
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ModelFormatError(f"{where}: not a valid ONNX model: {len(bad)} name(s) are not valid UTF-8 text "
                               f"({shown}). The file is probably corrupted; export the model again.")


def _load_external_data(model: onnx.ModelProto, base: Path) -> None:
    """Load external tensors, refusing any location outside the model's folder."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for t in _all_tensors(model):
        if not uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        target = (base / loc).resolve()
        if not loc or os.path.isabs(loc) or not target.is_relative_to(base):
            raise ModelFormatError(f"tensor {t.name!r}: external data {loc!r} lies outside the model's folder {base}")
        if not target.is_file():
            raise ModelFormatError(f"tensor {t.name!r}: external data file {target} is missing")
        try:
            load_external_data_for_tensor(t, str(base))
        except Exception as e:
            raise ModelFormatError(f"tensor {t.name!r}: cannot read external data {loc!r} ({e})") from None
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


def _all_tensors(model: onnx.ModelProto):
    yield from model.graph.initializer
    for n in model.graph.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t


def opset_of(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def _attr(a: onnx.AttributeProto):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode("utf-8", "replace") for x in v]
    return v


def _dtype_name(elem_type: int) -> str:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def from_onnx(
    model: onnx.ModelProto | str | os.PathLike,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    input_values: Mapping[str, np.ndarray] | None = None,
) -> Graph:
    """Build the static-shape graph of ``model``.

    ``input_shapes`` fixes graph inputs with symbolic dimensions; ``input_values`` turns graph
    inputs into constants (the backend specializes shape-like int64 inputs this way).
    """
    if not isinstance(model, onnx.ModelProto):
        model = load_model(model)
    else:
        check_strings(model)
    input_shapes = dict(input_shapes or {})
    input_values = dict(input_values or {})
    g = model.graph
    opset = opset_of(model)
    constants: dict[str, np.ndarray] = {}
    types: dict[str, TensorType] = {}
    for init in g.initializer:
        try:
            arr = numpy_helper.to_array(init)
        except Exception as e:
            raise ModelFormatError(f"initializer {init.name!r} is malformed ({e})") from None
        constants[init.name] = arr
        types[init.name] = TensorType(tuple(int(d) for d in arr.shape), arr.dtype.name)

    inputs: list[str] = []
    dynamic: list[str] = []
    for vi in g.input:
        if vi.name in constants:
            continue  # IR < 4 lists initializers as inputs too
        if vi.name in input_values:
            arr = np.asarray(input_values[vi.name])
            constants[vi.name] = arr
            types[vi.name] = TensorType(tuple(arr.shape), arr.dtype.name)
            continue
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise ModelFormatError(f"graph input {vi.name!r} is not a tensor")
        if vi.name in input_shapes:
            shape = tuple(int(d) for d in input_shapes[vi.name])
        else:
            if not tt.HasField("shape"):
                dynamic.append(f"{vi.name} (no shape)")
                continue
            dims = []
            for d in tt.shape.dim:
                if d.HasField("dim_value") and d.dim_value >= 0:
                    dims.append(int(d.dim_value))
                else:
                    dims.append(d.dim_param or "?")
            if not all(isinstance(d, int) for d in dims):
                dynamic.append(f"{vi.name} {dims}")
                continue
            shape = tuple(dims)
        types[vi.name] = TensorType(shape, _dtype_name(tt.elem_type))
        inputs.append(vi.name)
    if dynamic:
        raise ShapeError(
            "polyml compiles static shapes; these graph inputs have symbolic or unknown dimensions: "
            + "; ".join(dynamic)
            + ". Fix them with input_shapes / --input-shape NAME=1x3x224x224."
        )

    nodes: list[Node] = []
    seen: set[str] = set()
    for i, n in enumerate(g.node):
        name = n.name or (n.output[0] if n.output else f"{n.op_type}_{i}")
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        if n.domain not in ("", "ai.onnx"):
            op = f"{n.domain}.{n.op_type}"
        else:
            op = n.op_type
        nodes.append(Node(name, op, list(n.input), list(n.output), {a.name: _attr(a) for a in n.attribute}, n.name, opset))

    graph = Graph(g.name or "model", nodes, types, constants, inputs, [o.name for o in g.output])
    _drop_unused_optional_outputs(graph)
    if any(n.op_type == "com.microsoft.QGemm" for n in nodes):  # onnxruntime's QOperator Gemm
        from polyml.passes.quantize import qgemm_as_qlinear_matmul

        qgemm_as_qlinear_matmul(graph)
    graph.toposort()
    _fold_and_infer(graph, model)
    graph.prune()
    return graph


def _drop_unused_optional_outputs(graph: Graph) -> None:
    """Blank optional outputs (index ≥ 1) nobody reads, e.g. Dropout's mask in inference graphs."""
    used = {t for n in graph.nodes for t in n.inputs} | set(graph.outputs)
    for n in graph.nodes:
        n.outputs = [t if (i == 0 or t in used) else "" for i, t in enumerate(n.outputs)]


def _fold_and_infer(graph: Graph, model: onnx.ModelProto) -> None:
    kernels = registry()
    types, constants = graph.types, graph.constants
    problems: list[tuple[str, str, str]] = []
    unknown: set[str] = set()
    kept: list[Node] = []
    protos = {tuple(n.output): n for n in model.graph.node}
    for node in graph.nodes:
        ins = [t for t in node.inputs if t]
        undefined = [t for t in ins if t not in types and t not in unknown]
        if undefined:
            raise GraphError(f"{node.op_type} node {node.label!r} reads undefined tensor(s) {undefined}")
        if any(t in unknown for t in ins):
            unknown.update(node.outputs)
            if node.op_type not in kernels and node.op_type not in SHAPE_OPS:
                problems.append((node.label, node.op_type, "no lowering for this op type"))
            continue
        foldable = (node.op_type == "Constant" or (ins and all(t in constants for t in ins))) and node.op_type not in NONDETERMINISTIC
        if foldable and node.op_type == "DequantizeLinear" and types[ins[0]].dtype in QUANTIZED_WEIGHTS:
            foldable = False  # the QDQ pass (polyml.passes.quantize) reads it, and folds it if unused
        if node.op_type in SHAPE_OPS:
            foldable = True
        if foldable:
            _fold(node, graph, model, protos[tuple(node.outputs)])
            continue
        kernel = kernels.get(node.op_type)
        if kernel is None:
            problems.append((node.label, node.op_type, "no lowering for this op type"))
            unknown.update(node.outputs)
            continue
        ops = [Operand(t, types[t], constants.get(t)) if t else None for t in node.inputs]
        why = kernel.supports(node, ops)
        if why:
            problems.append((node.label, node.op_type, why))
            unknown.update(node.outputs)
            continue
        out_types = kernel.infer(node, ops)
        for t, tt in zip(node.outputs, out_types):
            if not t:
                continue
            if any((not isinstance(d, (int, np.integer))) or d < 0 for d in tt.shape):
                raise ShapeError(f"{node.op_type} node {node.label!r}: output {t!r} has non-static shape {tt.shape}")
            types[t] = TensorType(tuple(int(d) for d in tt.shape), tt.dtype)
        kept.append(node)
    if problems:
        raise UnsupportedError(problems)
    missing = [o for o in graph.outputs if o not in types]
    if missing:
        raise GraphError(f"graph outputs {missing} are not produced by any node")
    graph.nodes = kept


def _gather_elements(node: Node, data: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """GatherElements on constants.  onnx.reference (onnx ≤ 1.23) gathers with ``np.choose``,
    which takes at most 64 entries along the axis (numpy 2), and its 2-D fallback keeps one index
    per row: BERT exported without ``token_type_ids`` gathers 128 of 512 there."""
    axis = int(node.attrs.get("axis", 0))
    if idx.ndim != data.ndim or not -data.ndim <= axis < data.ndim:
        raise ShapeError(f"GatherElements node {node.label!r}: data {data.shape}, indices {idx.shape}, axis {axis}")
    axis %= data.ndim
    n = data.shape[axis]
    if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape)) if k != axis):
        raise ShapeError(f"GatherElements node {node.label!r}: indices {idx.shape} exceed data {data.shape} outside axis {axis}")
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ShapeError(f"GatherElements node {node.label!r}: index out of range [-{n}, {n})")
    idx = np.where(idx < 0, idx + n, idx).astype(np.int64)
    data = data[tuple(slice(None) if d == axis else slice(0, s) for d, s in enumerate(idx.shape))]
    return np.take_along_axis(data, idx, axis=axis)


CONSTANT_ATTRS = {
    "value": None,
    "value_float": np.float32,
    "value_floats": np.float32,
    "value_int": np.int64,
    "value_ints": np.int64,
}


def _fold(node: Node, graph: Graph, model: onnx.ModelProto, proto: onnx.NodeProto) -> None:
    """Evaluate ``node`` now with onnx.reference and turn its outputs into constants."""
    types, constants = graph.types, graph.constants
    if node.op_type == "Shape":
        shape = np.array(types[node.inputs[0]].shape, dtype=np.int64)
        start = node.attrs.get("start", 0)
        end = node.attrs.get("end", None)
        results = [shape[start:end]]
    elif node.op_type == "Size":
        results = [np.array(types[node.inputs[0]].size, dtype=np.int64)]
    elif node.op_type == "Constant" and any(k in node.attrs for k in CONSTANT_ATTRS):
        key = next(k for k in CONSTANT_ATTRS if k in node.attrs)
        results = [np.asarray(node.attrs[key], dtype=CONSTANT_ATTRS[key])]
    elif node.op_type == "ConstantOfShape":
        fill = np.asarray(node.attrs.get("value", np.zeros(1, np.float32))).reshape(-1)
        shape = [int(d) for d in constants[node.inputs[0]].reshape(-1)]
        if any(d < 0 for d in shape):
            raise ShapeError(f"ConstantOfShape node {node.label!r}: negative shape {shape}")
        results = [np.full(shape, fill[0], dtype=fill.dtype)]
    elif node.op_type == "GatherElements":
        results = [_gather_elements(node, constants[node.inputs[0]], constants[node.inputs[1]])]
    else:
        from onnx.reference import ReferenceEvaluator

        feeds = {t: constants[t] for t in node.inputs if t}
        try:
            tiny = helper.make_model(
                helper.make_graph(
                    [proto],
                    "fold",
                    [helper.make_tensor_value_info(t, helper.np_dtype_to_tensor_dtype(constants[t].dtype), constants[t].shape) for t in feeds],
                    [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.outputs if o],
                ),
                opset_imports=list(model.opset_import),
                ir_version=model.ir_version,
            )
            results = ReferenceEvaluator(tiny).run(None, feeds)
        except Exception as e:
            raise GraphError(f"cannot evaluate constant {node.op_type} node {node.label!r} at compile time: {e}") from None
    for t, v in zip([o for o in node.outputs if o], results):
        arr = np.asarray(v)
        constants[t] = arr
        types[t] = TensorType(tuple(int(d) for d in arr.shape), arr.dtype.name)
