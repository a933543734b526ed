"""MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool and LRN against onnxruntime on seeded
data.

Pooling cases cover pads, auto_pad, strides, dilations, ceil_mode (including a last window
that onnxruntime drops because it would start in the end padding), count_include_pad, 1-3
spatial dims, windows small enough to unroll and large enough to loop, and a few opsets.  LRN
sizes onnxruntime does not implement (even sizes, non-4-D inputs) are checked against numpy.
Errors are max|Δ| / max|ref| ≤ 1e-4; MaxPool on float32, int8 and uint8 data must equal
onnxruntime's exactly, on both its lowerings (the row form of padded windows and the unrolled
form), with one thread and with the parallel nests, and on the CUDA build (the emulator).
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from polyml.compiler import compile as polyml_compile
from polyml.errors import UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.graph import TensorType
from polyml.kernels.pool import pool_window, separable_max
from polyml.testing import compile_and_compare, onnxruntime_run, rel_error
from polyml.testing import single_node_model as node_model

TOL = 1e-4




def x_feed(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options) -> None:
    errs = compile_and_compare(model, feeds, **options)
    assert errs and max(errs.values()) <= TOL, errs


# (x shape, attributes); every case runs as MaxPool and AveragePool
WINDOWS = [
    ((1, 2, 8, 8), {"kernel_shape": [2, 2]}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ((1, 2, 10, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 10, 11), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 6, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 10, 11), {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 1], "pads": [1, 1, 2, 1], "ceil_mode": 1}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), {"kernel_shape": [4, 4], "strides": [2, 3], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 9, 10), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 9, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    ((2, 3, 12), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
    ((1, 2, 14, 15), {"kernel_shape": [7, 7], "pads": [3, 3, 3, 3]}),
    ((1, 2, 14, 15), {"kernel_shape": [7, 5], "strides": [2, 3], "pads": [3, 2, 3, 2], "ceil_mode": 1}),
    ((1, 3, 7, 7), {"kernel_shape": [7, 7]}),
    ((1, 3, 40, 37), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
]


def _id(xs: tuple[int, ...], attrs: dict) -> str:
    return f"x{'x'.join(map(str, xs))}-" + "-".join(f"{k}{v}" for k, v in attrs.items())


def _opset(attrs: dict) -> int:
    return 19 if "dilations" in attrs else 18  # AveragePool has dilations from opset 19


@pytest.mark.parametrize("xs,attrs", WINDOWS, ids=[_id(*c) for c in WINDOWS])
def test_maxpool(xs, attrs) -> None:
    check(node_model("MaxPool", {"x": xs}, opset=_opset(attrs), **attrs), x_feed(xs))


AVG = [(xs, a) for xs, a in WINDOWS] + [
    (xs, {**a, "count_include_pad": 1}) for xs, a in WINDOWS if "pads" in a or "auto_pad" in a or a.get("ceil_mode")
]


@pytest.mark.parametrize("xs,attrs", AVG, ids=[_id(*c) for c in AVG])
def test_averagepool(xs, attrs) -> None:
    check(node_model("AveragePool", {"x": xs}, opset=_opset(attrs), **attrs), x_feed(xs))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("idx", [2, 5, 14])
def test_pool_no_polly(op, idx) -> None:
    xs, attrs = WINDOWS[idx]
    check(node_model(op, {"x": xs}, **attrs), x_feed(xs), polly=False)


# (x shape, attributes, whether the row form computes it); each runs on float32, int8, uint8
MAX_EXACT = [
    # ResNet's 3x3/2 pad 1, large enough for the parallel nests (>= 32K elements)
    ((1, 16, 56, 56), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, True),
    ((1, 3, 7, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, True),
    # unpadded: the unrolled nest from 16 output columns, rows below (ROWS_MAX_UNPADDED_WIDTH)
    ((1, 16, 56, 56), {"kernel_shape": [2, 2], "strides": [2, 2]}, False),
    ((1, 3, 7, 9), {"kernel_shape": [2, 2], "strides": [2, 2]}, True),
    ((1, 4, 7, 9), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, True),
    ((1, 4, 7, 9), {"kernel_shape": [3, 3]}, True),
    ((1, 3, 8, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, True),
    ((1, 3, 8, 10), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, True),
    ((1, 3, 7, 9), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [0, 1, 2, 0]}, True),
    ((1, 3, 7, 9), {"kernel_shape": [3, 3], "strides": [1, 2], "pads": [2, 0, 1, 2]}, True),
    ((1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, True),
    # a dilated leading dim whose taps leave the input: the padded copy
    ((1, 3, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]}, False),
    # dilated last dim (read from the padded row), dilated leading dim that stays inside
    ((1, 3, 9, 11), {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [3, 2], "pads": [0, 2, 0, 2]}, True),
    ((1, 3, 9, 11), {"kernel_shape": [2, 3], "strides": [1, 2], "dilations": [1, 2], "pads": [0, 1, 1, 1]}, True),
    ((2, 3, 13), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, True),
    ((2, 3, 13), {"kernel_shape": [3], "strides": [2]}, True),
    ((1, 2, 5, 7, 9), {"kernel_shape": [3, 3, 3], "strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}, True),
    ((1, 2, 5, 7, 9), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1], "ceil_mode": 1}, True),
    # 49 taps: the row form unrolls 7 + 7 (the unrolled form would loop over the taps)
    ((1, 2, 14, 15), {"kernel_shape": [7, 7], "strides": [2, 2], "pads": [3, 3, 3, 3]}, True),
    # a padded row wider than MAX_ROW: the padded copy
    ((1, 2, 16390), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, False),
    # unpadded at the width where the unrolled nest takes over
    ((1, 2, 5, 31), {"kernel_shape": [3, 3], "strides": [2, 2]}, True),
    ((1, 2, 5, 33), {"kernel_shape": [3, 3], "strides": [2, 2]}, False),
    # SqueezeNet's pools (float32 on AVX-512: in registers, any width; _max_rows_vectors):
    # one masked block, a whole and a masked block, four blocks
    ((1, 8, 27, 27), {"kernel_shape": [3, 3], "strides": [2, 2]}, True),
    ((1, 4, 55, 55), {"kernel_shape": [3, 3], "strides": [2, 2]}, False),
    ((1, 2, 9, 111), {"kernel_shape": [3, 3], "strides": [2, 2]}, False),
    ((1, 3, 10, 64), {"kernel_shape": [2, 2], "strides": [2, 2]}, False),
]
DTYPES_8 = ["float32", "int8", "uint8"]


def typed_feed(shape: tuple[int, ...], dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded data over the dtype's whole range (8-bit data includes its minimum, the pad value)."""
    rng = np.random.default_rng(seed)
    if dtype == "float32":
        return {"x": rng.standard_normal(shape).astype(np.float32)}
    info = np.iinfo(dtype)
    return {"x": rng.integers(info.min, int(info.max) + 1, size=shape).astype(dtype)}


def check_exact(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path, **options) -> None:
    onnx.save(model, str(tmp_path / "m.onnx"))
    got = polyml_compile(tmp_path / "m.onnx", tmp_path / "build", **options).run(feeds)["y"]
    ref = onnxruntime_run(model, feeds)["y"]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert np.array_equal(got, ref), f"{int((got != ref).sum())} of {ref.size} differ"


@pytest.mark.parametrize("dtype", DTYPES_8)
@pytest.mark.parametrize("xs,attrs,row", MAX_EXACT, ids=[_id(xs, a) for xs, a, _ in MAX_EXACT])
def test_maxpool_exact(xs, attrs, row, dtype, tmp_path) -> None:
    feeds = typed_feed(xs, dtype)
    model = node_model("MaxPool", feeds, opset=_opset(attrs), **attrs)
    node = from_onnx(model).nodes[0]
    assert separable_max(pool_window(node, TensorType(xs, dtype))) == row
    check_exact(model, feeds, tmp_path)


@pytest.mark.parametrize("dtype", DTYPES_8)
@pytest.mark.parametrize("idx", [0, 2, 16], ids=lambda i: _id(*MAX_EXACT[i][:2]))
def test_maxpool_exact_one_thread(idx, dtype, tmp_path) -> None:
    """The same nests without the parallel regions."""
    xs, attrs, _ = MAX_EXACT[idx]
    feeds = typed_feed(xs, dtype, seed=1)
    check_exact(node_model("MaxPool", feeds, **attrs), feeds, tmp_path, threads=1)


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize("idx", [1, 8, 12, 13, 14, 16], ids=lambda i: _id(*MAX_EXACT[i][:2]))
def test_maxpool_exact_cuda_emulated(idx, dtype, tmp_path) -> None:
    """Row-form cases on the CUDA build (the emulator), which reads the unpadded input instead."""
    xs, attrs, row = MAX_EXACT[idx]
    assert row
    feeds = typed_feed(xs, dtype, seed=2)
    check_exact(node_model("MaxPool", feeds, opset=_opset(attrs), **attrs), feeds, tmp_path, target="cuda-emulated")


def test_maxpool_rows_in_registers(tmp_path) -> None:
    """On AVX-512 a float32 3x3/2 max pool splits the rows' column maxima into even and odd
    columns by shuffles and stores the last block masked: no gathers (the row loops' stride-2
    pass read its stack row through them) and no stack row."""
    from polyml.kernels._window import _isa

    feeds = typed_feed((1, 8, 27, 27), "float32")
    model = node_model("MaxPool", feeds, kernel_shape=[3, 3], strides=[2, 2])
    onnx.save(model, str(tmp_path / "m.onnx"))
    polyml_compile(tmp_path / "m.onnx", tmp_path / "build", emit=["ll"], threads=1)
    opt = "".join(p.read_text() for p in (tmp_path / "build").glob("ops.off*.opt.ll"))
    if _isa() != "avx512":
        pytest.skip("the register form is AVX-512's")
    assert "llvm.masked.gather" not in opt and "pool.row" not in opt
    assert "shufflevector <16 x float>" in opt and "llvm.masked.store" in opt


@pytest.mark.parametrize("threads", [1, 0])
def test_maxpool_row_form_prologue(threads, tmp_path) -> None:
    """Relu(x*a + b) evaluated by the row form where it reads (a fused pool prologue), in
    parallel with the default threads."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    xs = (1, 16, 56, 56)
    inits = [numpy_helper.from_array(rng.random((1, 16, 1, 1)).astype(np.float32) + 0.5, "a"),
             numpy_helper.from_array(rng.standard_normal((1, 16, 1, 1)).astype(np.float32), "b")]
    nodes = [helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Add", ["m", "b"], ["ad"]),
             helper.make_node("Relu", ["ad"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(xs))],
                              [helper.make_empty_tensor_value_info("y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    feeds = x_feed(xs)
    compiled = polyml_compile(tmp_path / "m.onnx", tmp_path / "build", threads=threads, cache=False)
    groups = compiled.manifest["fusion"]["groups"]
    assert any(g["kind"] == "pool-prologue" and g["ops"] == ["m", "ad", "r", "y"] for g in groups), groups
    assert rel_error(compiled.run(feeds)["y"], onnxruntime_run(model, feeds)["y"]) <= TOL


@pytest.mark.parametrize("op,opset,attrs", [
    ("MaxPool", 8, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("MaxPool", 10, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ("MaxPool", 12, {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    ("AveragePool", 7, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("AveragePool", 10, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ("AveragePool", 11, {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"}),
], ids=lambda v: str(v))
def test_pool_opsets(op, opset, attrs) -> None:
    check(node_model(op, {"x": (1, 3, 9, 10)}, opset=opset, **attrs), x_feed((1, 3, 9, 10)))


def test_maxpool_indices_unsupported() -> None:
    model = node_model("MaxPool", {"x": (1, 2, 4, 4)}, outputs=("y", "idx"), kernel_shape=[2, 2])
    with pytest.raises(UnsupportedError, match="Indices"):
        from_onnx(model)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("xs", [(2, 3, 5, 6), (1, 4, 7), (1, 2, 3, 4, 5), (1, 5, 1, 1), (1, 16, 7, 7), (2, 37, 29, 31)],
                         ids=str)
def test_global_pool(op, xs) -> None:
    """The last shape (66K elements) runs the nest in parallel over (n, c)."""
    check(node_model(op, {"x": xs}), x_feed(xs))


def test_global_pool_no_polly() -> None:
    check(node_model("GlobalAveragePool", {"x": (2, 3, 5, 6)}), x_feed((2, 3, 5, 6)), polly=False)


# -- LRN ---------------------------------------------------------------------------------------

LRN_CASES = [
    ((1, 5, 4, 4), {"size": 3}),
    ((2, 7, 3, 5), {"size": 5, "alpha": 1e-3, "beta": 0.6, "bias": 2.0}),
    ((1, 3, 2, 2), {"size": 1}),
    ((1, 3, 2, 3), {"size": 7, "alpha": 0.5}),
    ((1, 16, 6, 6), {"size": 5, "alpha": 1e-4, "beta": 0.75, "bias": 2.0}),
]


@pytest.mark.parametrize("xs,attrs", LRN_CASES, ids=[_id(*c) for c in LRN_CASES])
def test_lrn(xs, attrs) -> None:
    check(node_model("LRN", {"x": xs}, **attrs), x_feed(xs))


def test_lrn_no_polly() -> None:
    xs, attrs = LRN_CASES[1]
    check(node_model("LRN", {"x": xs}, **attrs), x_feed(xs), polly=False)


def numpy_lrn(x: np.ndarray, size: int, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0) -> np.ndarray:
    """The ONNX definition, channel window [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    c = x.shape[1]
    sq = np.zeros_like(x, dtype=np.float64)
    for i in range(c):
        lo, hi = max(0, i - (size - 1) // 2), min(c - 1, i + math.ceil((size - 1) / 2))
        sq[:, i] = (x[:, lo : hi + 1].astype(np.float64) ** 2).sum(axis=1)
    return x / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("xs,attrs", [
    ((1, 6, 4, 4), {"size": 4, "alpha": 0.1}),
    ((2, 5, 7), {"size": 3, "alpha": 0.2, "beta": 0.5}),
    ((1, 4, 2, 3, 2), {"size": 2, "alpha": 0.3, "bias": 1.5}),
], ids=lambda v: str(v))
def test_lrn_numpy(xs, attrs, tmp_path) -> None:
    """Cases onnxruntime's LRN refuses (even size, inputs that are not 4-D)."""
    onnx.save(node_model("LRN", {"x": xs}, **attrs), str(tmp_path / "m.onnx"))
    feeds = x_feed(xs)
    got = polyml_compile(tmp_path / "m.onnx", tmp_path / "build").run(feeds)["y"]
    assert rel_error(got, numpy_lrn(feeds["x"], **attrs)) <= TOL
