"""An ``onnx.backend.base.Backend`` for polyml, so ONNX's backend test suite can drive it.

polyml compiles static shapes, so a prepared model is compiled once per *specialization*:

* int64 graph inputs that feed only shape-like operand positions (Reshape's shape, Pad's pads,
  Squeeze/Unsqueeze axes, ConstantOfShape's shape: the kernels' ``static_inputs``) become
  compile-time constants with the values given at run time;
* graph inputs whose declared shape is symbolic take the shape of the array given at run time.

Compiled models are cached by those values and shapes.  A model that needs neither is compiled
in :meth:`PolymlBackend.prepare`, so unsupported models fail there with polyml's errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.backend.base import Backend, BackendRep

from polyml.compiler import compile_graph
from polyml.errors import InputError, ModelFormatError
from polyml.frontends.onnx import from_onnx
from polyml.kernels import registry
from polyml.runtime.model import CompiledModel

#: shape-like operands of ops that have no kernel because the frontend always folds them
FOLDED_SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {"ConstantOfShape": (0,)}

#: graph input dtypes specialized as constants: int64/int32 shape operands (CumSum's axis,
#: Range's bounds), float32 ones (Resize's scales and roi), int8/uint8 ones (QLinearConv's and
#: QLinearMatMul's zero points, folded into their integer kernels)
SPECIALIZED_DTYPES = (TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT, TensorProto.INT8, TensorProto.UINT8)

#: cache key of one specialization: (input name, shape, value bytes or b"") per input
Key = tuple[tuple[str, tuple[int, ...], bytes], ...]


def shape_operand_positions(op_type: str) -> tuple[int, ...]:
    """Input positions of ``op_type`` that polyml needs as compile-time constants."""
    if op_type in FOLDED_SHAPE_OPERANDS:
        return FOLDED_SHAPE_OPERANDS[op_type]
    kernel = registry().get(op_type)
    return kernel.static_inputs if kernel is not None else ()


def shape_like_inputs(model: onnx.ModelProto) -> list[str]:
    """int64 graph inputs consumed only at shape-like operand positions (and not outputs),
    directly or through nodes whose every output is itself only so consumed (a Slice's
    ``starts`` computed by ``Sub(Shape(x), shape)``)."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    outputs = {o.name for o in g.output}
    uses: dict[str, list[tuple[str, int, onnx.NodeProto]]] = {}
    for n in g.node:
        for pos, t in enumerate(n.input):
            if t:
                uses.setdefault(t, []).append((n.op_type if n.domain in ("", "ai.onnx") else "", pos, n))
    memo: dict[str, bool] = {}

    def shape_like(t: str) -> bool:
        if t not in memo:
            memo[t] = False  # a cycle (malformed graph) is not shape-like
            u = uses.get(t, [])
            memo[t] = t not in outputs and bool(u) and all(
                pos in shape_operand_positions(op) or (op and any(n.output) and all(shape_like(o) for o in n.output if o))
                for op, pos, n in u)
        return memo[t]

    found = []
    for vi in g.input:
        if vi.name in inits or vi.type.tensor_type.elem_type not in SPECIALIZED_DTYPES:
            continue
        if shape_like(vi.name):
            found.append(vi.name)
    return found


def _static_shape(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    return vi.type.HasField("tensor_type") and tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


class PolymlRep(BackendRep):
    """A prepared model: ``run(inputs) -> [outputs]`` in graph output order."""

    def __init__(self, model: onnx.ModelProto, options: Mapping[str, Any]):
        self.model = model
        self.options = dict(options)
        g = model.graph
        inits = {i.name for i in g.initializer}
        #: runtime (non-initializer) graph inputs, in graph order: positional ``run`` arguments
        self.input_names = [vi.name for vi in g.input if vi.name not in inits]
        self.output_names = [o.name for o in g.output]
        #: int64 inputs compiled in as constants (their values are part of the cache key)
        self.specialized = shape_like_inputs(model)
        self.specialized_dtypes = {vi.name: np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
                                   for vi in g.input if vi.name in self.specialized}
        #: inputs whose shape is taken from the run's arrays
        self.dynamic = [vi.name for vi in g.input if vi.name not in inits and not _static_shape(vi)]
        self.dynamic = [n for n in self.dynamic if n not in self.specialized]
        self._cache: dict[Key, CompiledModel] = {}
        if not self.specialized and not self.dynamic:
            self._cache[()] = self._compile({})

    def _compile(self, feeds: Mapping[str, np.ndarray]) -> CompiledModel:
        graph = from_onnx(
            self.model,
            input_shapes={n: tuple(feeds[n].shape) for n in self.dynamic},
            input_values={n: feeds[n] for n in self.specialized},
        )
        return compile_graph(graph, **self.options)

    def _feeds(self, inputs: Sequence[Any] | Mapping[str, Any]) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            inputs = list(inputs)
            if len(inputs) != len(self.input_names):
                raise InputError(f"got {len(inputs)} inputs, the model takes {len(self.input_names)}: {self.input_names}")
            feeds = dict(zip(self.input_names, inputs))
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            raise InputError(f"missing inputs {missing}; the model takes {self.input_names}")
        return {n: np.asarray(v) for n, v in feeds.items()}

    def compiled_for(self, feeds: Mapping[str, np.ndarray]) -> CompiledModel:
        """The compiled model for these inputs' shape-like values and dynamic shapes."""
        key: Key = tuple(
            (n, tuple(feeds[n].shape), feeds[n].tobytes() if n in self.specialized else b"")
            for n in (*self.specialized, *self.dynamic)
        )
        model = self._cache.get(key)
        if model is None:
            for n in self.specialized:
                want = self.specialized_dtypes[n]
                if feeds[n].dtype != want:
                    raise InputError(f"input {n!r}: dtype {feeds[n].dtype}, the model expects {want}")
            model = self._cache[key] = self._compile(feeds)
        return model

    def run(self, inputs: Sequence[Any] | Mapping[str, Any], **kwargs: Any) -> list[np.ndarray]:
        """Run on ``inputs`` (a list in graph input order, or a dict by name)."""
        feeds = self._feeds(inputs)
        compiled = self.compiled_for(feeds)
        outs = compiled.run({n: feeds[n] for n in compiled.inputs})
        return [outs[n] for n in self.output_names]


class PolymlBackend(Backend):
    """ONNX backend API over polyml (CPU only)."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PolymlRep:
        """Compile ``model`` now, or at first run if it has shape-like inputs to specialize on.

        The model is validated by polyml's frontend (as ``polyml.compile`` does), not by
        ``onnx.checker``.  ``kwargs`` are compile options (:class:`polyml.driver.flags.Options`).
        """
        if not cls.supports_device(device):
            raise ModelFormatError(f"polyml runs on CPU only, not {device!r}")
        if not isinstance(model, onnx.ModelProto):
            raise ModelFormatError(f"expected an onnx.ModelProto, got {type(model).__name__}")
        return PolymlRep(model, kwargs)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> list[np.ndarray]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> list[np.ndarray]:
        """Run one node by wrapping it in a one-node model (``opset_version`` in ``kwargs``)."""
        opset = int(kwargs.pop("opset_version", onnx.defs.onnx_opset_version()))
        names = [t for t in node.input if t]
        if isinstance(inputs, Mapping):
            arrays = {n: np.asarray(inputs[n]) for n in names}
        else:
            arrays = {n: np.asarray(a) for n, a in zip(names, inputs)}
        vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in arrays.items()]
        outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in node.output if o]
        graph = helper.make_graph([node], f"{node.op_type}_node", vis, outs)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only the host CPU (``"CPU"`` or ``"CPU:0"``)."""
        return device in ("CPU", "CPU:0")


prepare = PolymlBackend.prepare
run_model = PolymlBackend.run_model
run_node = PolymlBackend.run_node
supports_device = PolymlBackend.supports_device

__all__ = ["PolymlBackend", "PolymlRep", "prepare", "run_model", "run_node", "supports_device"]
