"""Einsum against onnxruntime on seeded random data.

The equations of Keras's MultiHeadAttention/EinsumDense and of torch attention code, implicit
outputs, "..." (with broadcasting), one-operand transposes, diagonals and reductions, and
two-operand forms that are not matrix products; sizes both below and above the packed GEMM's
threshold, with 1-sized dims and dims that are not multiples of its 12 × 32 register tile.
Errors are max|Δ| / max|ref| ≤ 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from polyml.compiler import compile as polyml_compile
from polyml.errors import GraphError, ShapeError, UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.testing import compile_and_compare
from polyml.testing import single_node_model as node_model

TOL = 1e-4


def feeds_for(shapes: list[tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"x{i}": np.asarray(rng.standard_normal(s), dtype=np.float32) for i, s in enumerate(shapes)}


def einsum_model(equation: str, shapes: list[tuple[int, ...]]) -> onnx.ModelProto:
    return node_model("Einsum", {f"x{i}": s for i, s in enumerate(shapes)}, equation=equation)


def check(equation: str, shapes: list[tuple[int, ...]], **options) -> None:
    errs = compile_and_compare(einsum_model(equation, shapes), feeds_for(shapes), **options)
    assert errs and max(errs.values()) <= TOL, errs


# (equation, operand shapes): B batch, T/S sequence, N heads, H head size, D model width
KERAS = [
    ("abc,cde->abde", [(1, 50, 40), (40, 3, 13)]),  # query/key/value projection
    ("abcd,aecd->acbe", [(1, 50, 3, 13), (1, 37, 3, 13)]),  # attention scores
    ("acbe,aecd->abcd", [(1, 3, 50, 37), (1, 37, 3, 13)]),  # attention-weighted values
    ("abcd,cde->abe", [(1, 50, 3, 13), (3, 13, 40)]),  # output projection
    ("aecd,abcd->acbe", [(1, 37, 3, 13), (1, 50, 3, 13)]),  # scores, key first
    ("abc,cd->abd", [(2, 25, 40), (40, 33)]),  # EinsumDense
]
TORCH = [
    ("bhid,bhjd->bhij", [(1, 4, 50, 16), (1, 4, 37, 16)]),
    ("bhij,bhjd->bhid", [(1, 4, 50, 37), (1, 4, 37, 16)]),
    ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)]),  # the node suite's batch_matmul
    ("bnd,bmd->bnm", [(3, 40, 24), (3, 35, 24)]),
    ("i,j->ij", [(100,), (64,)]),  # rotary embeddings' outer product
    ("ij,jk->ki", [(40, 30), (30, 50)]),  # the product transposed: Cᵀ = Bᵀ·Aᵀ, no copy
]


@pytest.mark.parametrize("equation,shapes", KERAS, ids=[e for e, _ in KERAS])
def test_keras_equations(equation: str, shapes: list[tuple[int, ...]]) -> None:
    check(equation, shapes, threads=2)


@pytest.mark.parametrize("equation,shapes", TORCH, ids=[e for e, _ in TORCH])
def test_torch_equations(equation: str, shapes: list[tuple[int, ...]]) -> None:
    check(equation, shapes, threads=2)


EDGES = [
    ("abcd,aecd->acbe", [(1, 1, 1, 13), (1, 1, 1, 13)]),  # one query, one key, one head
    ("abcd,aecd->acbe", [(2, 13, 1, 33), (2, 14, 1, 33)]),
    ("abcd,aecd->acbe", [(1, 12, 5, 1), (1, 32, 5, 1)]),  # head size 1: K = 1
    ("acbe,aecd->abcd", [(1, 5, 25, 33), (1, 33, 5, 1)]),  # N = 1: per-head matrix-vector
    ("abc,cde->abde", [(1, 1, 64), (64, 1, 64)]),  # one row
    ("abc,cde->abde", [(3, 13, 1), (1, 5, 7)]),  # contraction over one element
    ("bhid,bhjd->bhij", [(1, 3, 25, 33), (1, 3, 97, 33)]),  # edges in every tile dimension
    ("bhid,bhjd->bhij", [(1, 1, 1, 8), (1, 1, 5, 8)]),
]


@pytest.mark.parametrize("equation,shapes", EDGES, ids=[f"{e}-{'x'.join(map(str, s[0]))}" for e, s in EDGES])
@pytest.mark.parametrize("threads", [1, 2])
def test_edge_sizes(equation: str, shapes: list[tuple[int, ...]], threads: int) -> None:
    check(equation, shapes, threads=threads)


IMPLICIT = [
    ("ij,jk", [(20, 30), (30, 40)]),
    ("bij,bjk", [(3, 20, 30), (3, 30, 40)]),
    ("ji", [(3, 4)]),  # implicit output sorted: a transpose
    ("ii", [(5, 5)]),  # trace
    ("i,i", [(5,), (5,)]),  # inner product (the node suite's inner_prod)
    ("ij,kj", [(20, 16), (24, 16)]),
    ("...ij,...jk", [(2, 3, 20, 30), (2, 3, 30, 40)]),
    ("...,...", [(3, 4), (3, 4)]),
    ("...j,j...", [(2, 3), (3, 2)]),
]
ELLIPSIS = [
    ("...ij,...jk->...ik", [(2, 3, 40, 30), (2, 3, 30, 50)]),
    ("...ij,...jk->...ik", [(2, 1, 40, 30), (2, 3, 30, 50)]),  # broadcast batch: A reused
    ("...ij,...jk->...ik", [(1, 3, 40, 30), (2, 1, 30, 50)]),  # both broadcast
    ("...ij,jk->...ik", [(2, 3, 40, 30), (30, 50)]),  # batch stacked into the rows
    ("b...d,b...d->b...", [(2, 3, 5, 8), (2, 3, 5, 8)]),
    ("...ii->...i", [(3, 5, 5)]),  # the node suite's batch_diagonal
    ("i...->...", [(2, 3)]),
    ("...->...", [(2, 3)]),
    ("ij,jk->ik", [(20, 1), (7, 40)]),  # a labelled dim of size 1 broadcasts too
]


@pytest.mark.parametrize("equation,shapes", IMPLICIT + ELLIPSIS, ids=[e for e, _ in IMPLICIT + ELLIPSIS])
def test_implicit_and_ellipsis(equation: str, shapes: list[tuple[int, ...]]) -> None:
    check(equation, shapes, threads=2)


ONE_OPERAND = [
    ("ij->ji", [(3, 4)]),  # the node suite's transpose
    ("abcd->acbd", [(2, 5, 3, 7)]),
    ("ij->i", [(3, 4)]),  # the node suite's sum
    ("ij->j", [(30, 40)]),
    ("ijk->", [(3, 4, 5)]),
    ("ijk->ki", [(3, 4, 5)]),
    ("ii->i", [(6, 6)]),
    ("ii->", [(6, 6)]),
    ("iij->ji", [(4, 4, 3)]),
    ("->", [()]),  # the node suite's scalar
    ("i->", [(7,)]),
    ("ij->ij", [(1, 5)]),
]


@pytest.mark.parametrize("equation,shapes", ONE_OPERAND, ids=[e for e, _ in ONE_OPERAND])
def test_one_operand(equation: str, shapes: list[tuple[int, ...]]) -> None:
    check(equation, shapes)


NOT_PRODUCTS = [
    ("ij,ij->ij", [(20, 30), (20, 30)]),  # elementwise product
    ("ij,ij->i", [(20, 30), (20, 30)]),  # row-wise dot products
    ("ij,kl->ijkl", [(2, 3), (4, 5)]),
    ("ij,jk->", [(20, 30), (30, 40)]),  # i and k summed from one operand each
    ("ij,j->i", [(64, 30), (30,)]),  # matrix-vector
    ("iij,jk->ik", [(40, 40, 30), (30, 50)]),  # a diagonal operand: a product of strided reads
    ("ikj,jk->ik", [(40, 50, 30), (30, 50)]),
]


@pytest.mark.parametrize("equation,shapes", NOT_PRODUCTS, ids=[e for e, _ in NOT_PRODUCTS])
def test_other_two_operand_forms(equation: str, shapes: list[tuple[int, ...]]) -> None:
    check(equation, shapes)


@pytest.mark.parametrize("equation,shapes", [KERAS[1], TORCH[0], ("...ij,...jk->...ik", [(2, 1, 40, 30), (2, 3, 30, 50)])],
                         ids=["keras-scores", "torch-scores", "broadcast"])
@pytest.mark.parametrize("options", [{"polly": False}, {"gemm": "polly"}, {"threads": 1}], ids=["no-polly", "gemm-polly", "1-thread"])
def test_build_options(equation: str, shapes: list[tuple[int, ...]], options: dict) -> None:
    """Without Polly, without the packed GEMM (the nest over all labels), on one thread."""
    check(equation, shapes, **options)


def _details(model: onnx.ModelProto, tmp_path: Path, **options) -> list[str]:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    polyml_compile(path, tmp_path / "build", cache=False, **options)
    manifest = json.loads((tmp_path / "build" / "manifest.json").read_text())
    return [f["detail"] for f in manifest["functions"] if f["op_type"] == "Einsum"]


@pytest.mark.parametrize("equation,shapes,expect", [
    ("abc,cde->abde", [(1, 128, 64), (64, 4, 16)], "1 x 128x64 @ 64x64 packed (no copies)"),
    ("abcd,aecd->acbe", [(1, 128, 4, 16), (1, 128, 4, 16)], "4 x 128x16 @ 16x128 packed (no copies)"),
    ("acbe,aecd->abcd", [(1, 4, 128, 128), (1, 128, 4, 16)], "4 x 128x128 @ 128x16 packed (no copies)"),
    ("abcd,cde->abe", [(1, 128, 4, 16), (4, 16, 64)], "1 x 128x64 @ 64x64 packed (no copies)"),
    ("aecd,abcd->acbe", [(1, 128, 4, 16), (1, 128, 4, 16)], "4 x 128x16 @ 16x128 packed (no copies)"),
    ("bhid,bhjd->bhij", [(1, 4, 128, 16), (1, 4, 128, 16)], "4 x 128x16 @ 16x128 packed (no copies)"),
    ("ij,jk->ki", [(40, 30), (30, 50)], "1 x 50x30 @ 30x40 packed (no copies)"),
    ("bij,bjk->kib", [(3, 40, 30), (3, 30, 50)], "3 x 40x30 @ 30x50 packed (copies C)"),
    ("ij,jk->", [(20, 30), (30, 40)], "nests"),
])
def test_packed_plan(equation: str, shapes: list[tuple[int, ...]], expect: str, tmp_path: Path) -> None:
    """The attention equations read their operands in place (strided packing, the scores' K
    transposed), as the manifest's function detail reports; a permuted output is copied."""
    model = einsum_model(equation, shapes)
    assert _details(model, tmp_path) == [f"{equation} {expect}"]
    errs = compile_and_compare(model, feeds_for(shapes))
    assert max(errs.values()) <= TOL, errs


# -- batched MatMul on the same batched packed GEMM (kernels/matmul.py batched_product) ----------

BATCHED_MATMUL = [
    ((1, 4, 50, 16), (1, 4, 16, 37)),  # attention scores, per-head products below the thread threshold
    ((1, 3, 128, 64), (1, 3, 64, 128)),  # 3 heads on 2 threads: each product cut in two shares
    ((1, 12, 128, 64), (1, 12, 64, 128)),  # BERT-base scores
    ((50, 16), (3, 16, 40)),  # A broadcast over B's batch
    ((2, 1, 30, 16), (1, 3, 16, 40)),  # both broadcast
    ((13, 33), (2, 33, 97)),
    ((2, 301, 300), (2, 300, 40)),  # several row and reduction blocks, A read in place
]


@pytest.mark.parametrize("sa,sb", BATCHED_MATMUL, ids=[f"{a}@{b}" for a, b in BATCHED_MATMUL])
@pytest.mark.parametrize("threads", [1, 2])
def test_batched_matmul_packed(sa: tuple[int, ...], sb: tuple[int, ...], threads: int, tmp_path: Path) -> None:
    model = node_model("MatMul", {"a": sa, "b": sb})
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    compiled = polyml_compile(path, tmp_path / "build", cache=False, threads=threads)
    detail = [f["detail"] for f in compiled.manifest["functions"] if f["op_type"] == "MatMul"]
    assert detail == [f"{sa} @ {sb} packed batched"]
    feeds = {"a": feeds_for([sa])["x0"], "b": feeds_for([sb], seed=1)["x0"]}
    got = compiled.run(feeds)["y"]
    want = np.matmul(feeds["a"].astype(np.float64), feeds["b"].astype(np.float64))
    assert np.abs(got - want).max() / np.abs(want).max() <= TOL


def test_uppercase_labels(tmp_path: Path) -> None:
    """TensorFlow's equations use capitals (``BTNH,BSNH->BNTS``); numpy is the reference
    (this onnxruntime build rejects capitals although ONNX allows them)."""
    equation, shapes = "BTNH,BSNH->BNTS", [(1, 50, 3, 13), (1, 37, 3, 13)]
    path = tmp_path / "model.onnx"
    onnx.save(einsum_model(equation, shapes), str(path))
    feeds = feeds_for(shapes)
    got = polyml_compile(path, tmp_path / "build", cache=False).run(feeds)["y"]
    want = np.einsum(equation, *(feeds[f"x{i}"].astype(np.float64) for i in range(2)))
    assert np.abs(got - want).max() / np.abs(want).max() <= TOL


def test_three_operands_refused() -> None:
    with pytest.raises(UnsupportedError, match="Einsum with 3 operands"):
        from_onnx(einsum_model("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]))


def test_integer_operands_refused() -> None:
    a = np.ones((2, 3), np.int32)
    with pytest.raises(UnsupportedError, match="int32"):
        from_onnx(node_model("Einsum", {"a": a, "b": a}, equation="ij,ij->ij"))


@pytest.mark.parametrize("equation,shapes,error", [
    ("ij,jk->ik", [(2, 3), (4, 5)], ShapeError),  # j is 3 and 4
    ("ij->ik", [(2, 3)], GraphError),  # k in no input
    ("ij->ii", [(2, 3)], GraphError),
    ("ijk->i", [(2, 3)], ShapeError),  # rank
    ("i1->i", [(2, 3)], GraphError),
    ("ij,jk", [(2, 3)], GraphError),  # terms vs inputs
    ("...ij->ij", [(4, 2, 3)], GraphError),  # "..." dropped from the output
])
def test_equation_errors(equation: str, shapes: list[tuple[int, ...]], error: type) -> None:
    inputs = {f"x{i}": s for i, s in enumerate(shapes)}
    with pytest.raises(error, match="Einsum node"):
        from_onnx(node_model("Einsum", inputs, equation=equation))


@pytest.mark.parametrize("equation,shapes", [KERAS[1], ("ii->i", [(6, 6)]), ("ij,jk->", [(20, 30), (30, 40)]), ("->", [()])],
                         ids=["keras-scores", "diagonal", "full-contraction", "scalar"])
def test_cuda_lowering_maps_the_nests(equation: str, shapes: list[tuple[int, ...]], tmp_path: Path) -> None:
    """The GPU lowering (no packed GEMM) records the nests over all labels and maps them
    bijectively; the summed labels of the scores stay loops inside a thread."""
    from polyml.compiler import read_graph
    from polyml.gpu import mapping
    from polyml.gpu.lower import lower_graph_cuda

    path = tmp_path / "model.onnx"
    onnx.save(einsum_model(equation, shapes), str(path))
    low = lower_graph_cuda(read_graph(path))
    assert low.launches
    for launch in low.launches:
        mapping.check_bijective(launch.mapping)
    if equation == KERAS[1][0]:
        band = low.launches[-1].mapping.describe()["band"]
        assert [d["parallel"] for d in band] == [True, True, False, True]
