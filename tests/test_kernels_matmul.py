"""Gemm and MatMul against onnxruntime on seeded random data, and Polly's GEMM pattern match.

Shapes cover numpy matmul's 1-D operands and broadcast batch dimensions (folded into one 2-D
GEMM when B is a single matrix, a per-batch GEMM function otherwise), and Gemm's transposes,
alpha/beta and every broadcastable C shape.  Errors are max|Δ| / max|ref| ≤ 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from polyml.compiler import compile as polyml_compile
from polyml.errors import ShapeError
from polyml.frontends.onnx import from_onnx
from polyml.testing import compile_and_compare
from polyml.testing import single_node_model as node_model

TOL = 1e-4




def feeds_for(inputs: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in inputs.items()}


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **options) -> None:
    errs = compile_and_compare(model, feeds, **options)
    assert errs and max(errs.values()) <= TOL, errs


MATMUL_SHAPES = [
    ((5, 7), (7, 3)),
    ((1, 9), (9, 1)),
    ((7,), (7, 3)),  # 1-D A: (1, K) then the M dim is dropped
    ((5, 7), (7,)),  # 1-D B: (K, 1) then the N dim is dropped
    ((7,), (7,)),  # dot product: a scalar
    ((2, 3, 5, 7), (7, 4)),  # A's batch stacks into M: one 2-D GEMM
    ((2, 5, 7), (1, 7, 4)),  # B with size-1 batch dims is one matrix too
    ((2, 5, 7), (7,)),
    ((2, 3, 5, 7), (3, 7, 4)),  # batched B: a GEMM function called per batch index
    ((5, 7), (2, 7, 4)),  # A broadcast over B's batch
    ((7,), (2, 7, 4)),
    ((2, 1, 5, 7), (1, 3, 7, 4)),  # both broadcast
    ((4, 6, 8), (4, 8, 6)),
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    inputs = {"a": sa, "b": sb}
    check(node_model("MatMul", inputs), feeds_for(inputs))


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 3)), ((7,), (7, 3)), ((2, 3, 5, 7), (3, 7, 4)), ((2, 5, 7), (7, 4))])
def test_matmul_without_polly(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    inputs = {"a": sa, "b": sb}
    check(node_model("MatMul", inputs), feeds_for(inputs), polly=False)


def test_matmul_constant_weights() -> None:
    """B as an initializer (a weight), A batched: the common linear layer."""
    w = np.random.default_rng(3).standard_normal((16, 12)).astype(np.float32)
    check(node_model("MatMul", {"x": (2, 5, 16)}, initializers={"w": w}), feeds_for({"x": (2, 5, 16)}))


# Gemm: (A shape, B shape, C shape or None, attributes); M=5, N=3, K=4
GEMM_CASES = [
    ((5, 4), (4, 3), None, {}),
    ((5, 4), (4, 3), (3,), {}),
    ((5, 4), (4, 3), (1, 3), {}),
    ((5, 4), (4, 3), (5, 1), {}),
    ((5, 4), (4, 3), (5, 3), {}),
    ((5, 4), (4, 3), (), {}),
    ((5, 4), (4, 3), (1,), {}),
    ((5, 4), (4, 3), (1, 1), {}),
    ((4, 5), (4, 3), (3,), {"transA": 1}),
    ((5, 4), (3, 4), (5, 1), {"transB": 1}),
    ((4, 5), (3, 4), (5, 3), {"transA": 1, "transB": 1}),
    ((5, 4), (4, 3), (3,), {"alpha": 0.5}),
    ((5, 4), (4, 3), (5, 3), {"beta": 2.5}),
    ((5, 4), (4, 3), None, {"alpha": -1.5}),
    ((4, 5), (3, 4), (1, 3), {"transA": 1, "transB": 1, "alpha": 0.25, "beta": 0.35}),
    ((5, 4), (4, 3), (5, 3), {"beta": 0.0}),
]


def _gemm_id(case: tuple) -> str:
    sa, sb, sc, attrs = case
    return f"{sa}x{sb}" + (f"+C{sc}" if sc is not None else "") + "".join(f"-{k}{v}" for k, v in attrs.items())


@pytest.mark.parametrize("case", GEMM_CASES, ids=[_gemm_id(c) for c in GEMM_CASES])
def test_gemm(case: tuple) -> None:
    sa, sb, sc, attrs = case
    inputs = {"a": sa, "b": sb, **({"c": sc} if sc is not None else {})}
    check(node_model("Gemm", inputs, **attrs), feeds_for(inputs))


@pytest.mark.parametrize("opset", [7, 11, 13])
def test_gemm_opsets(opset: int) -> None:
    inputs = {"a": (4, 6), "b": (5, 6), "c": (5,)}
    check(node_model("Gemm", inputs, opset=opset, transB=1, alpha=0.5), feeds_for(inputs))


@pytest.mark.parametrize("case", [GEMM_CASES[2], GEMM_CASES[10], GEMM_CASES[14]], ids=_gemm_id)
def test_gemm_without_polly(case: tuple) -> None:
    sa, sb, sc, attrs = case
    inputs = {"a": sa, "b": sb, "c": sc}
    check(node_model("Gemm", inputs, **attrs), feeds_for(inputs), polly=False)


def test_gemm_fully_connected() -> None:
    """A linear layer: constant weight (N, K) read transposed and a constant bias."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((10, 24)).astype(np.float32)
    bias = rng.standard_normal(10).astype(np.float32)
    model = node_model("Gemm", {"x": (3, 24)}, initializers={"w": w, "bias": bias}, transB=1)
    check(model, feeds_for({"x": (3, 24)}))


@pytest.mark.parametrize("m", [1, 3, 130])
def test_gemm_transposed_weight_rows(m: int) -> None:
    """transB reads B in place for few rows (dot products) and transposes it for many."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((9, 20)).astype(np.float32)
    bias = rng.standard_normal(9).astype(np.float32)
    model = node_model("Gemm", {"x": (m, 20)}, initializers={"w": w, "bias": bias}, transB=1, alpha=1.5)
    check(model, feeds_for({"x": (m, 20)}))


@pytest.mark.parametrize("k,n,trans_b,alpha,c_shape", [(1280, 1000, 1, 1.0, (1000,)), (1000, 72, 0, 0.5, (1, 72)),
                                                        (256, 256, 1, 1.0, None), (520, 130, 0, 2.0, ())])
def test_gemm_one_row(k: int, n: int, trans_b: int, alpha: float, c_shape: tuple | None, tmp_path: Path) -> None:
    """A batch-1 fully connected layer on the one-row kernel (64-column blocks over the
    threads, a partial last block and vector), B constant either way round, alpha and C."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    inits = {"w": w}
    if c_shape is not None:
        inits["c"] = rng.standard_normal(c_shape).astype(np.float32)
    model = node_model("Gemm", {"x": (1, k)}, initializers=inits, transB=trans_b, alpha=alpha)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    built = polyml_compile(path, tmp_path / "b", cache=False)
    assert [f["detail"].split()[-1] for f in built.manifest["functions"] if f["op_type"] == "Gemm"] == ["gemv"]
    check(model, feeds_for({"x": (1, k)}))


def _optimized_ir(model: onnx.ModelProto, tmp_path: Path) -> tuple[str, object]:
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    compiled = polyml_compile(path, tmp_path / "build", emit=["ll"], gemm="polly")
    return "".join(p.read_text() for p in sorted((tmp_path / "build").glob("ops.polly*.opt.ll"))), compiled


@pytest.mark.parametrize(
    "op,inputs,attrs",
    [
        ("MatMul", {"a": (96, 80), "b": (80, 112)}, {}),
        ("MatMul", {"a": (2, 96, 80), "b": (2, 80, 112)}, {}),
        ("Gemm", {"a": (80, 136), "b": (112, 80), "c": (112,)}, {"transA": 1, "transB": 1, "alpha": 0.5}),
        ("Gemm", {"a": (96, 80), "b": (80, 112), "c": (96, 1)}, {}),
    ],
    ids=["matmul", "batched", "gemm-transposed", "gemm-bias"],
)
def test_polly_gemm_pattern_applies(op: str, inputs: dict, attrs: dict, tmp_path: Path) -> None:
    """With ``gemm="polly"`` the nests are in the form Polly's matmul optimizer rewrites: its
    packed arrays appear."""
    model = node_model(op, inputs, **attrs)
    ir, compiled = _optimized_ir(model, tmp_path)
    assert "Packed_A" in ir and "Packed_B" in ir
    feeds = feeds_for(inputs)
    got = compiled.run(feeds)["y"]
    a, b = feeds["a"].astype(np.float64), feeds["b"].astype(np.float64)
    if op == "Gemm" and attrs:
        want = 0.5 * a.T @ b.T + feeds["c"]
    elif op == "Gemm":
        want = a @ b + feeds["c"]
    else:
        want = np.matmul(a, b)
    assert np.abs(got - want).max() / np.abs(want).max() <= TOL


@pytest.mark.parametrize(
    "op,inputs,attrs",
    [
        ("MatMul", {"a": (5, 7), "b": (6, 3)}, {}),
        ("MatMul", {"a": (2, 5, 7), "b": (3, 7, 3)}, {}),
        ("Gemm", {"a": (5, 4), "b": (4, 3)}, {"transB": 1}),
        ("Gemm", {"a": (5, 4), "b": (4, 3), "c": (2, 3)}, {}),
        ("Gemm", {"a": (5, 4, 1), "b": (4, 3)}, {}),
    ],
    ids=["inner", "batch", "gemm-inner", "gemm-c", "gemm-rank"],
)
def test_shape_errors(op: str, inputs: dict, attrs: dict) -> None:
    with pytest.raises(ShapeError):
        from_onnx(node_model(op, inputs, **attrs))


@pytest.mark.parametrize("sa,sb", [((1024, 1024), (1024, 1024)), ((257, 300), (300, 200)), ((3, 129, 64), (64, 96))],
                         ids=["1024^3", "odd-rows", "batch-stacked"])
def test_matmul_row_blocks_parallel(sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    """Products large enough to split their rows over the cores (kernels/matmul.py
    ``parallel_gemm``; an uneven split gets a tail-block function), 2 threads; 1024³ is issue
    7's GEMM benchmark (its speed is measured by scripts/bench_gemm.py, not asserted here)."""
    inputs = {"a": sa, "b": sb}
    check(node_model("MatMul", inputs), feeds_for(inputs), threads=2)


# -- polyml's packed GEMM (polyml/codegen/gemm.py) ------------------------------------------

PACKED_CASES = [
    # (op, inputs, attrs): edges in every dimension (rows % 12, cols % 32, K % kc), one thread share
    ("MatMul", {"a": (13, 385), "b": (385, 33)}, {}),
    ("MatMul", {"a": (100, 50), "b": (50, 70)}, {}),
    ("MatMul", {"a": (257, 300), "b": (300, 200)}, {}),
    ("MatMul", {"a": (3, 40, 64), "b": (64, 96)}, {}),  # batch rows stacked into one product
    ("MatMul", {"a": (24, 800), "b": (800, 1000)}, {}),  # split by columns over threads
    ("MatMul", {"a": (1000, 64), "b": (64, 40)}, {}),  # split by rows
    ("Gemm", {"a": (40, 100), "b": (70, 40), "c": (70,)}, {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
    ("Gemm", {"a": (96, 80), "b": (80, 112), "c": (96, 1)}, {}),
    ("Gemm", {"a": (96, 80), "b": (112, 80), "c": (96, 112)}, {"transB": 1}),
    ("Gemm", {"a": (30, 80), "b": (80, 112)}, {"alpha": -1.0}),
    ("MatMul", {"a": (50, 32), "b": (32, 70)}, {}),  # K <= ROWS_OUTER_MAX_K: row panels outside column panels
    ("MatMul", {"a": (50, 600), "b": (600, 70)}, {}),  # K > ROWS_OUTER_MAX_K_WIDE: column panels outside
]


@pytest.mark.parametrize("op,inputs,attrs", PACKED_CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[1]['a']))}-{i}" for i, c in enumerate(PACKED_CASES)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_gemm_matches_onnxruntime(op: str, inputs: dict, attrs: dict, threads: int) -> None:
    check(node_model(op, inputs, **attrs), feeds_for(inputs), threads=threads)


#: fewer rows than a register tile: packed only with constant weights (classifier heads, batch-1 MLPs)
FEW_ROWS_CASES = [
    ("MatMul", {"a": (1, 1280), "b": (1280, 1000)}, {}),
    ("MatMul", {"a": (4, 768), "b": (768, 3072)}, {}),
    ("MatMul", {"a": (1, 3, 700), "b": (700, 45)}, {}),
    ("Gemm", {"a": (1, 512), "b": (512, 1000), "c": (1000,)}, {}),  # with transB: dot products (Gemm._b_constant)
    ("Gemm", {"a": (5, 300), "b": (300, 77), "c": (5, 77)}, {"alpha": 0.5}),
]


@pytest.mark.parametrize("op,inputs,attrs", PACKED_CASES + FEW_ROWS_CASES,
                         ids=[f"{c[0]}-{'x'.join(map(str, c[1]['a']))}-{i}" for i, c in enumerate(PACKED_CASES + FEW_ROWS_CASES)])
def test_packed_gemm_constant_weights_prepacked(op: str, inputs: dict, attrs: dict, tmp_path: Path) -> None:
    """A constant B (the weights) is packed at compile time (gemm.prepack_b), read in place by
    the block function, and not stored in its original layout."""
    rng = np.random.default_rng(1)
    weights = {"b": rng.standard_normal(inputs["b"]).astype(np.float32)}
    data = {k: v for k, v in inputs.items() if k != "b"}
    model = node_model(op, {"a": data["a"]}, initializers=weights, **attrs)
    if "c" in data:  # keep the input order a, b, c
        model = node_model(op, {"a": data["a"], "c": data["c"]}, initializers=weights, **attrs)
        model.graph.node[0].input[:] = ["a", "b", "c"]
    feeds = {k: v for k, v in feeds_for(data).items()}
    errs = compile_and_compare(model, feeds, output_dir=tmp_path / "build", threads=2)
    assert errs and max(errs.values()) <= TOL, errs
    import json

    slots = json.loads((tmp_path / "build" / "manifest.json").read_text())["slots"]
    names = [s["name"] for s in slots if s["kind"] == "weight"]
    assert "b" not in names and any("#const" in n for n in names), names


def test_packed_gemm_is_used_and_leaves_polly_out(tmp_path: Path) -> None:
    """A large product is lowered by the packed GEMM: a micro-kernel of FMA vectors in a
    module compiled without Polly, no Polly pattern arrays."""
    model = node_model("MatMul", {"a": (64, 96), "b": (96, 128)})
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    polyml_compile(path, tmp_path / "build", emit=["ll"])
    before = "".join(p.read_text() for p in sorted((tmp_path / "build").glob("ops.off*.ll")) if ".opt." not in p.name)
    assert "polyml.ukernel." in before and "llvm.fma.v" in before
    assert not list((tmp_path / "build").glob("ops.polly*.ll"))


def test_micro_kernel_ir_golden(golden: Path) -> None:
    """The AVX-512 micro-kernel: a k loop of 12 x 2 FMA accumulators (pinned with FileCheck)."""
    import llvmlite.ir as ir

    from polyml.codegen.gemm import host_blocking, micro_kernel
    from tests.conftest import filecheck

    module = ir.Module("t")
    blk = host_blocking("+avx512f,+fma", 48 << 10, 2 << 20)
    assert (blk.mr, blk.nr, blk.width) == (12, 32, 16)
    micro_kernel(module, blk, ["nounwind"])
    filecheck(str(module), golden / "ukernel_avx512.ll.check")


@pytest.mark.parametrize("features,expect", [("+avx512f,+fma", (12, 32, 16)), ("+avx2,+fma", (6, 16, 8)), ("+sse2", (4, 8, 4))])
def test_host_blocking_by_vector_isa(features: str, expect: tuple[int, int, int]) -> None:
    from polyml.codegen.gemm import host_blocking

    blk = host_blocking(features, 48 << 10, 2 << 20)
    assert (blk.mr, blk.nr, blk.width) == expect
    assert blk.nr % blk.width == 0 and blk.mc % blk.mr == 0 and blk.nc % blk.nr == 0
    assert blk.kc * blk.nr * 4 <= 48 << 10  # one B micro-panel fits L1
    assert blk.nc_wide >= blk.nc and blk.nc_wide % blk.nr == 0


@pytest.mark.parametrize("features", ["+avx2,+fma", "+avx512f,+fma"])
def test_edge_panel_kernels(features: str) -> None:
    """The last column panel's micro-kernel is the narrowest power-of-two split of ``nr`` (vectors
    of at least 4 lanes) that holds its ``N mod nr`` columns; the partial row panel's has
    ``M mod mr`` rows and reads the ``mr``-high packed panel; none where the tile divides."""
    import llvmlite.ir as ir

    from polyml.codegen.gemm import GemmSpec, host_blocking, matrix_loader, narrow_kernels, short_kernel

    blk = host_blocking(features, 32 << 10, 1 << 20)
    module = ir.Module("t")
    tails = (0, 1, 4, 5, 8, 9, 16, 17)
    cols = [narrow_kernels(module, blk, ["nounwind"], 0, tail)[0] for tail in tails if tail < blk.nr]
    assert cols == ([0, 4, 4, 8, 8, 0] if blk.nr == 16 else [0, 4, 4, 8, 8, 16, 16, 0])
    _, (quarter,) = narrow_kernels(module, blk, ["nounwind"], 0, 1)
    assert quarter.name == f"polyml.ukernel.{blk.mr}x4.pitch{blk.nr}" and "<4 x float>" in str(quarter)

    def spec(m: int) -> GemmSpec:
        return GemmSpec(m, 64, 32, load_a=matrix_loader(0, 32), load_b=matrix_loader(1, 64), operands=2)

    assert short_kernel(module, spec(blk.mr * 3), blk, ["nounwind"]) is None
    short = short_kernel(module, spec(blk.mr * 3 + 2), blk, ["nounwind"])
    assert short.name == f"polyml.ukernel.2x{blk.nr}.apitch{blk.mr}"
    assert f"mul nsw i64 %\"p\", {blk.mr}" in str(short) or f"mul nsw i64 %p, {blk.mr}" in str(short)


def test_blocks_by_how_a_is_read() -> None:
    """An A packed at run time takes the wide reduction and column blocks (A is packed again
    per column block, C read again per reduction block); a pre-packed or in-place A the
    L1/L2-sized ones.  A pre-packed B needs an A packed at run time (its layout uses that kc).
    A pre-packed A of at most THIN_A_ROWS rows packs B in L1-sized blocks of at least two
    panels (but nothing is packed where B is read in place)."""
    from polyml.codegen.gemm import THIN_A_ROWS, GemmSpec, InPlaceB, block_kc, block_nc, host_blocking, matrix_loader

    blk = host_blocking("+avx512f,+fma", 32 << 10, 1 << 20, 32 << 20)
    assert (blk.kc, blk.kc_wide, blk.nc, blk.nc_wide) == (256, 512, 512, 4096)

    def spec(m: int = 96, k: int = 2048, **how) -> GemmSpec:
        how.setdefault("load_b", matrix_loader(1, 4096))
        return GemmSpec(m, 4096, k, load_a=matrix_loader(0, k), operands=2, **how)

    assert THIN_A_ROWS == 64
    assert block_nc(spec(64, prepacked_a=True), blk) == 2 * blk.nr  # 32 KiB / (4 · 256) = 32 columns: two panels
    assert block_nc(spec(64, 128, prepacked_a=True), blk) == 64
    assert block_nc(spec(16, 32, prepacked_a=True), blk) == 256
    assert block_nc(spec(16, 8, prepacked_a=True), blk) == blk.nc  # no larger than the L2 block
    in_place = InPlaceB(1, tuple(range(32)), 64, 64)
    assert block_nc(spec(16, 32, prepacked_a=True, in_place_b=in_place, load_b=None), blk) == blk.nc
    assert block_nc(spec(64), blk) == 4096  # A packed at run time

    assert (block_kc(spec(), blk), block_nc(spec(), blk)) == (512, 4096)
    assert (block_kc(spec(prepacked_b=True), blk), block_nc(spec(prepacked_b=True), blk)) == (512, 4096)
    for constant in ({"prepacked_a": True}, {"lda": 2048}):
        assert (block_kc(spec(**constant), blk), block_nc(spec(**constant), blk)) == (256, 512)
        with pytest.raises(ValueError, match="pre-packed B"):
            spec(prepacked_b=True, **constant)


def test_reduction_blocks_of_equal_size() -> None:
    """``kc_for``: the fewest reduction blocks under the limit, of equal size in whole steps
    (a convolution's taps), never a short last block."""
    from polyml.codegen.gemm import kc_for

    assert kc_for(512, 384) == 256  # not 384 + 128
    assert kc_for(384, 384) == 384 and kc_for(100, 384) == 100
    assert kc_for(0, 384) == 1 and kc_for(0, 384, 9) == 9  # an empty reduction: one step, never run
    assert kc_for(2048, 768) == 683  # three blocks, the last 682
    assert kc_for(1152, 384, 9) == 288  # 3x3 taps: 4 x 288, not 3 x 378 + 18
    assert kc_for(27, 384, 27) == 27 and kc_for(49 * 3, 100, 49) == 98  # 98 + 49: two blocks either way
    for k, kc, step in ((1000, 256, 1), (2304, 384, 9), (4608, 384, 9), (517, 64, 1)):
        size = kc_for(k, kc, step)
        blocks = -(-k // size)
        assert size <= kc and size % step == 0 and blocks == -(-k // (kc // step * step)), (k, kc, step)
        assert k - (blocks - 1) * size > size - step * blocks  # the last block is not short


def test_row_panels_outside_by_tile_width() -> None:
    """``ir`` runs outside ``jr`` for reductions up to 32 steps with AVX2's 16-column tiles and up
    to 512 with AVX-512's 32-column ones (measured: ResNet-50 0.95x)."""
    from polyml.codegen.gemm import GemmSpec, host_blocking, matrix_loader, rows_outer

    def spec(k: int) -> GemmSpec:
        return GemmSpec(64, 256, k, load_a=matrix_loader(0, k), load_b=matrix_loader(1, 256), operands=2)

    wide, narrow = host_blocking("+avx512f,+fma"), host_blocking("+avx2,+fma")
    assert [rows_outer(spec(k), wide) for k in (32, 64, 512, 513)] == [True, True, True, False]
    assert [rows_outer(spec(k), narrow) for k in (32, 33, 512)] == [True, False, False]


@pytest.mark.parametrize("blocking", ["mr=6,nr=16,width=8", "mr=4,nr=8,width=4,fma=0", "mr=6,nr=16,width=8,kc=16",
                                      "mc=24,kc=16,nc=64,nc_wide=96"],
                         ids=["avx2-like", "sse-like", "several-k-blocks", "several-blocks-everywhere"])
def test_packed_gemm_other_vector_widths(blocking: str, monkeypatch) -> None:
    """The AVX2 (6x16 of 8-lane vectors) and SSE (4x8, no FMA) micro-kernels, forced through
    POLYML_GEMM_BLOCKING on this host, give the same products (GEMM and a conv as GEMM); with
    ``kc=16`` every product takes several reduction blocks (edge tiles added into C); with small
    ``mc``/``nc``/``nc_wide`` several row and column blocks too (A packed again per column block)."""
    monkeypatch.setenv("POLYML_GEMM_BLOCKING", blocking)
    for op, inputs, attrs in (PACKED_CASES[0], PACKED_CASES[2], PACKED_CASES[6]):
        check(node_model(op, inputs, **attrs), feeds_for(inputs), threads=2, cache=False)
    rng = np.random.default_rng(2)
    w = rng.standard_normal((40, 16, 3, 3)).astype(np.float32)
    conv = node_model("Conv", {"x": (1, 16, 15, 17)}, initializers={"w": w}, pads=[1, 1, 1, 1], strides=[2, 1])
    check(conv, feeds_for({"x": (1, 16, 15, 17)}), conv="gemm", cache=False)


@pytest.mark.parametrize("blocking", ["mr=12,nr=32,width=8", "mr=5,nr=16,width=8,mc=35"],
                         ids=["avx512-tile", "odd-mr"])
def test_edge_panel_kernels_other_tiles(blocking: str, monkeypatch) -> None:
    """The edge-panel kernels on other register tiles, forced through POLYML_GEMM_BLOCKING:
    AVX-512's 12x32 (narrow kernels of 16, 8 and 4 columns; partial row panels of M mod 12
    rows) and a 5-row tile; an in-place stem on rows aligned to the tile (32 columns), a 7x7
    1x1 (49 columns: one in the last panel) and a 14x14 one (196: four), as onnxruntime."""
    monkeypatch.setenv("POLYML_GEMM_BLOCKING", blocking)
    monkeypatch.setenv("POLYML_CONV_INPLACE", "1")
    rng = np.random.default_rng(4)
    for xs, ws, attrs in (((1, 3, 66, 64), (20, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                          ((1, 32, 7, 7), (22, 32, 1, 1), {}), ((1, 24, 14, 14), (44, 24, 1, 1), {})):
        w = rng.standard_normal(ws).astype(np.float32)
        conv = node_model("Conv", {"x": xs}, initializers={"w": w}, **attrs)
        for threads in (1, 2):
            check(conv, feeds_for({"x": xs}), conv="gemm", cache=False, threads=threads)


def test_edge_columns_split() -> None:
    """The last column panel's tail: a narrow kernel where it holds the tail whole and costs no
    more, else the column kernel on the columns past a narrower one (a 7x7 map's 17 columns in
    32-column panels: 16 + 1; a 14x14 map's 4: four columns); none past 12 columns or where a
    column of the tile needs more than two vectors; ``gemm.COLUMN_KERNEL_MAX = 0`` turns it off."""
    from polyml.codegen.gemm import edge_columns, host_blocking

    wide, narrow = host_blocking("+avx512f,+fma"), host_blocking("+avx2,+fma")
    assert [edge_columns(wide, t) for t in (0, 1, 4, 9, 11, 12, 16, 17, 25, 26, 31)] == [
        (0, 0), (0, 1), (0, 4), (0, 9), (0, 11), (16, 0), (16, 0), (16, 1), (16, 9), (32, 0), (32, 0)]
    assert [edge_columns(narrow, t) for t in (1, 5, 6, 9, 12)] == [(0, 1), (0, 5), (8, 0), (8, 1), (16, 0)]
    from dataclasses import replace

    assert edge_columns(replace(wide, width=4, nr=32), 17) == (32, 0)  # 12 rows: three vectors a column


#: 1x1 convolutions as products whose last column panel takes the column kernel: (map, K, M)
COLUMN_CASES = [((7, 7), 33, 22), ((13, 13), 40, 30), ((5, 5), 300, 26), ((3, 19), 24, 13), ((1, 11), 17, 40), ((6, 6), 301, 20),
                ((14, 14), 25, 44)]


@pytest.mark.parametrize("blocking", [None, "mr=12,nr=32,width=8", "mr=5,nr=16,width=8,mc=35", "mr=4,nr=8,width=4,fma=0"],
                         ids=["host", "avx512-tile-8-lanes", "odd-mr", "sse-like"])
def test_edge_column_kernels(blocking: str | None, monkeypatch) -> None:
    """Convolutions as products whose last panel's tail runs on a narrow kernel plus the column
    kernel: tails of 1-11 columns alone or after 16 (49, 169, 25, 57, 11, 36 and 196 positions),
    row counts not a multiple of the tile (a masked last vector), several reduction blocks and odd ones (K =
    300, 301, 33, 25: the partial sums' remainder), no FMA (SSE-like), 1 and 2 threads; against onnxruntime."""
    if blocking:
        monkeypatch.setenv("POLYML_GEMM_BLOCKING", blocking)
    rng = np.random.default_rng(5)
    for (h, w), k, m in COLUMN_CASES:
        weights = rng.standard_normal((m, k, 1, 1)).astype(np.float32)
        bias = rng.standard_normal(m).astype(np.float32)
        conv = node_model("Conv", {"x": (1, k, h, w)}, initializers={"w": weights, "b": bias})
        for threads in (1, 2):
            check(conv, feeds_for({"x": (1, k, h, w)}), conv="gemm", cache=False, threads=threads)


@pytest.mark.parametrize("blocking", [None, "mr=6,nr=16,width=8"], ids=["host", "avx2-like"])
def test_in_place_tail_tiles(blocking: str | None, monkeypatch) -> None:
    """In-place stems with output rows of two register tiles or more get planes aligned to the
    tile and each row's partial last tile stored into C by a kernel of ``nr/2`` or ``nr``
    columns that stores only the row's (masked where fewer): rows of 111, 112, 88 and 56
    columns (tails of 15, 16, 24 and 24 on 32-column tiles, 15, 0, 8, 8 on 16-column ones),
    partial row panels (20 and 13 channels), 1 and 2 threads, against onnxruntime."""
    from polyml.codegen.gemm import IN_PLACE_TAIL_MIN_TILES, blocking_for_host
    from polyml.graph import Node, TensorType
    from polyml.kernels.conv import conv_window, row_align

    if blocking:
        monkeypatch.setenv("POLYML_GEMM_BLOCKING", blocking)
    monkeypatch.setenv("POLYML_CONV_INPLACE", "1")
    nr = blocking_for_host(blocking or "").nr
    rng = np.random.default_rng(6)
    for xs, ws, attrs in (((1, 3, 12, 224), (20, 3, 3, 3), {"strides": [2, 2]}),
                          ((1, 3, 12, 224), (13, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
                          ((1, 3, 20, 176), (20, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}),
                          ((1, 3, 20, 112), (13, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]})):
        node = Node("c", "Conv", ["x", "w"], ["y"], {"kernel_shape": list(ws[2:]), **attrs})
        out = conv_window(node, TensorType(xs), TensorType(ws)).out[1]
        aligned = out % nr == 0 or out >= IN_PLACE_TAIL_MIN_TILES * nr
        assert row_align(conv_window(node, TensorType(xs), TensorType(ws)), nr) == (nr if aligned else 1)
        w = rng.standard_normal(ws).astype(np.float32)
        conv = node_model("Conv", {"x": xs}, initializers={"w": w}, **attrs)
        for threads in (1, 2):
            check(conv, feeds_for({"x": xs}), conv="gemm", cache=False, threads=threads)


#: (input, weights, attributes, chain after the conv): products whose epilogue runs in the
#: micro-kernels' registers or does not
REGISTER_EPILOGUE_CASES = [
    ((1, 40, 9, 37), (30, 40, 1, 1), {}, "Relu", True),  # bias + ReLU, edge tiles on the pass
    ((1, 600, 5, 13), (26, 600, 1, 1), {}, "Relu", True),  # several reduction blocks: after the last
    ((1, 24, 7, 40), (16, 24, 1, 1), {}, "", True),  # bias only
    ((1, 3, 20, 224), (20, 3, 3, 3), {"strides": [2, 2]}, "Relu", True),  # in-place stem and its row tails
    ((1, 40, 9, 37), (30, 40, 1, 1), {}, "Clip", True),  # ReLU6 with constant bounds (inputs)
    ((1, 40, 9, 37), (30, 40, 1, 1), {}, "Clip-max", True),  # an upper bound only
    ((1, 40, 9, 37), (30, 40, 1, 1), {}, "Sigmoid", False),  # other chains: the epilogue pass
]


@pytest.mark.parametrize("xs,ws,attrs,act,in_registers", REGISTER_EPILOGUE_CASES)
def test_register_epilogue(xs, ws, attrs, act, in_registers, tmp_path) -> None:
    """A conv as a product with a bias and ReLU or Clip (or a bias alone) applies them to the whole
    tiles' accumulators before the store (RegisterEpilogue: an ``.epi`` micro-kernel), after
    the last reduction block only; other chains keep the epilogue pass; results against
    onnxruntime at 1 and 2 threads."""
    from onnx import TensorProto, helper

    from polyml.codegen.gemm import blocking_for_host

    rng = np.random.default_rng(7)
    w = rng.standard_normal(ws).astype(np.float32)
    bias = rng.standard_normal(ws[0]).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()), helper.make_tensor("b", TensorProto.FLOAT, bias.shape, bias)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c" if act else "y"], kernel_shape=list(ws[2:]), **attrs)]
    if act.startswith("Clip"):
        inits += [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])]
        nodes.append(helper.make_node("Clip", ["c", "" if act == "Clip-max" else "lo", "hi"], ["y"]))
    elif act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
                              [helper.make_empty_tensor_value_info("y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for threads in (1, 2):
        check(model, feeds_for({"x": xs}), conv="gemm", cache=False, threads=threads)
    if blocking_for_host().nr == 32:  # the IR names on this host's blocking
        path = tmp_path / "m.onnx"
        onnx.save(model, str(path))
        polyml_compile(path, tmp_path / "build", emit=["ll"], conv="gemm", cache=False)
        ir_text = "".join(p.read_text() for p in (tmp_path / "build").glob("ops.*.ll") if ".opt." not in p.name)
        assert ('.epi1' in ir_text) == in_registers


def test_edge_kernels_scops_export(tmp_path) -> None:
    """``--emit jscop`` of products that take the column kernel (a 7x7 map) and a masked row
    tail (a 111-wide stem): those kernels carry ``polly.skip.fn`` (Polly 19 segfaulted exporting
    the column kernel's SCoP), so the export finishes and dumps the other functions' SCoPs."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(8)
    inits = [helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel())
             for name, shape in (("w1", (40, 3, 3, 3)), ("w2", (64, 40, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], strides=[2, 2]),
             helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[3, 15], strides=[1, 15]),  # 7x7
             helper.make_node("Conv", ["p", "w2"], ["y"], kernel_shape=[1, 1])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 224])],
                              [helper.make_empty_tensor_value_info("y")], initializer=inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    polyml_compile(path, tmp_path / "build", emit=["jscop", "ll"], threads=2, conv="gemm", cache=False)
    assert list((tmp_path / "build" / "jscop").glob("*.jscop"))


def test_gemm_blocking_override_errors() -> None:
    from polyml.codegen.gemm import blocking_for_host
    from polyml.errors import PolymlError

    for bad in ("mr=x", "nr=20", "width=5,nr=20", "kc=0", "nc_wide=-1", "depth=3"):
        with pytest.raises(PolymlError, match="POLYML_GEMM_BLOCKING"):
            blocking_for_host(bad)
