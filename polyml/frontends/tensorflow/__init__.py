"""TensorFlow frontend: a frozen GraphDef (``.pb`` binary, ``.pbtxt`` text) → polyml's graph IR.

Problems follow the ONNX frontend's contract: a missing, truncated or non-GraphDef file is a
:class:`~polyml.errors.ModelFormatError`; every node whose op (or use of an op) polyml cannot
lower is listed in one :class:`~polyml.errors.UnsupportedError` with its TF node name and op type.

The package, laid out like ``kernels/``:

``loader``
    reading ``.pb`` / ``.pbtxt`` files and their format errors; TensorProto and AttrValue contents.
``functions``
    inlining the calls into the graph's function library (``PartitionedCall``,
    ``StatefulPartitionedCall``, a node whose op is a library function), as frozen Keras graphs
    contain them.
``importer``
    GraphDef → :class:`~polyml.graph.Graph`: inputs, outputs, node order, and the layout
    tracking (TF's NHWC held as NCHW) that every converter works through.
``values``
    how a TF tensor is held in the IR (``Val``: an IR tensor and a permutation) and the state
    and emission helpers converters work through (``TFValues``, the base of the importer).
``convert/``
    the converters, one module per op family, registered by TF op type with
    ``@converter("Op", ...)``; every module there is imported on first use, so adding a TF op is
    adding a function (or a file) there.
``rewrites``
    the exact graph rewrites after the translation (pad and affine folding into Conv, Gemm
    bias, Transpose composition).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from polyml.frontends.tensorflow.functions import inline_functions
from polyml.frontends.tensorflow.importer import Importer
from polyml.frontends.tensorflow.loader import check_graphdef, load_graphdef, tensor_to_numpy
from polyml.frontends.tensorflow.rewrites import optimize
from polyml.frontends.tensorflow.values import LAYOUTS
from polyml.graph import Graph


def from_graphdef(
    model,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    outputs: Sequence[str] | None = None,
    layout: str = "nchw",
) -> Graph:
    """Build the static-shape graph of a frozen GraphDef (a path to ``.pb``/``.pbtxt`` or a
    ``GraphDef`` message).  ``input_shapes`` fixes Placeholder shapes, ``outputs`` names the
    output tensors (default: the sinks), ``layout`` is ``"nchw"`` (tracked) or ``"nhwc"``."""
    if isinstance(model, (str, os.PathLike)):
        gd = load_graphdef(model)
        name, where = Path(model).stem, str(Path(model))
    else:
        gd = model
        check_graphdef(gd)
        name = where = "graph"
    gd = inline_functions(gd, where)
    return Importer(gd, name, input_shapes, outputs, layout).run()


__all__ = ["from_graphdef", "load_graphdef", "inline_functions", "tensor_to_numpy", "optimize", "LAYOUTS"]
