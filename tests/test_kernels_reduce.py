"""ReduceMean / ReduceSum / ReduceMax / ReduceMin (kernels/reduce.py) against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from polyml.kernels.reduce import merged_view

from polyml.testing import compile_and_compare, single_node_model

TOL = 1e-5


@pytest.mark.parametrize(
    "op, shape, axes, keepdims, opset",
    [
        ("ReduceMean", (2, 3, 5, 7), [2, 3], 1, 13),  # global average pooling, NCHW
        ("ReduceMean", (2, 5, 6, 3), [1, 2], 0, 18),  # NHWC, axes as an input
        ("ReduceSum", (3, 4, 5, 6), [0, 2], 1, 13),  # two separate reduced groups
        ("ReduceMax", (4, 1, 6, 5), [-1, 1], 0, 18),  # size-1 and negative axes
        ("ReduceMin", (3, 8, 5), None, 0, 13),  # no axes: everything
    ],
)
def test_reduce_matches_onnxruntime(op: str, shape: tuple[int, ...], axes: list[int] | None, keepdims: int, opset: int) -> None:
    attrs: dict = {"keepdims": keepdims}
    inits = {}
    if axes is not None and (opset >= 18 or op == "ReduceSum"):
        inits["axes"] = np.array(axes, np.int64)
    elif axes is not None:
        attrs["axes"] = axes
    model = single_node_model(op, {"x": shape}, outputs=["y"], opset=opset, initializers=inits, **attrs)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    errs = compile_and_compare(model, {"x": x}, polly=False, threads=1)
    assert max(errs.values()) <= TOL, errs


def test_merged_view() -> None:
    assert merged_view((1, 64, 7, 7), [2, 3]) == ([64, 49], [False, True])
    assert merged_view((2, 7, 7, 64), [1, 2]) == ([2, 49, 64], [False, True, False])
    assert merged_view((1, 1, 1), [0]) == ([], [])
