"""The front half every build shares: read the model, QDQ quantization, operator fusion.

``polyml build`` (:func:`polyml.driver.build.build_artifact`), the SCoP tools
(:func:`polyml.scop.exchange.model_sources`) and CUDA builds (:mod:`polyml.gpu.build`) each call
:func:`prepare` and lower its graph themselves.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polyml.errors import ModelFormatError
from polyml.graph import Graph
from polyml.passes.fuse import FuseOperators, FusionReport
from polyml.passes.quantize import QuantizationReport, QuantizeQDQ


def read_graph(
    path: str | os.PathLike,
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    outputs: list[str] | None = None,
) -> Graph:
    """Dispatch on the file type to a frontend."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".onnx":
        from polyml.frontends.onnx import from_onnx  # imports onnx

        return from_onnx(p, input_shapes=input_shapes)
    if suffix in (".pb", ".pbtxt"):
        try:
            from polyml.frontends.tensorflow import from_graphdef  # optional (tensorboard's protos)
        except ImportError:
            raise ModelFormatError(f"{p}: the TensorFlow GraphDef frontend is not available in this build") from None
        return from_graphdef(p, input_shapes=input_shapes, outputs=outputs)
    raise ModelFormatError(f"{p}: unknown model format {suffix!r} (expected .onnx, .pb or .pbtxt)")


def cuda_fusion() -> FuseOperators:
    """The fusion of CUDA builds: the grid mapping takes constant-bound nests only."""
    return FuseOperators(attention=False, conv_scales=False, depthwise_products=False)


@dataclass
class Prepared:
    """The graph to lower and what the passes before the lowering did."""

    graph: Graph
    #: the graph before fusion (after quantization): what the fusion pictures draw
    unfused: Graph
    #: None where quantization was not asked for
    quantization: QuantizationReport | None = None
    #: None where the graph was not fused
    fusion: FusionReport | None = None
    #: seconds of the passes that ran: ``quantize``, ``fuse``
    seconds: dict[str, float] = field(default_factory=dict)
    #: each graph pass that ran, in order: name and options (``GraphPass.record``; timings in ``seconds``)
    graph_passes: list[dict] = field(default_factory=list)


def prepare(model: Graph | str | os.PathLike, *, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
            outputs: list[str] | None = None, quantize: bool = True, fusion: FuseOperators | None = None) -> Prepared:
    """``model`` (a graph, or a model file read with :func:`read_graph` and ``input_shapes``,
    ``outputs``) with QDQ sandwiches turned into integer ops (``quantize``; a no-op without
    Q/DQ) and then fused by ``fusion``, the configured pass (None: not fused)."""
    graph = model if isinstance(model, Graph) else read_graph(model, input_shapes=input_shapes, outputs=outputs)
    seconds: dict[str, float] = {}
    records: list[dict] = []
    quantization = None
    if quantize:
        t0 = time.perf_counter()
        quantizer = QuantizeQDQ()
        graph, quantization = quantizer.apply(graph)
        seconds[quantizer.name] = time.perf_counter() - t0
        records.append(quantizer.record())
    unfused = graph
    report = None
    if fusion is not None:
        t0 = time.perf_counter()
        graph, report = fusion.apply(graph)
        seconds[fusion.name] = time.perf_counter() - t0
        records.append(fusion.record())
    return Prepared(graph, unfused, quantization, report, seconds, records)


__all__ = ["Prepared", "cuda_fusion", "prepare", "read_graph"]
