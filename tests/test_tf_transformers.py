"""The TensorFlow frontend on transformers and modern CNNs, without TensorFlow:
Einsum, Erf/Erfc and the GELU subgraphs, run-time Cast, against numpy on GraphDefs built with the
protobuf classes; and frozen Keras fixtures (a transformer block with ``MultiHeadAttention``,
a reduced ConvNeXt and a reduced EfficientNetV2, made by ``scripts/freeze_keras.py``) through
``polyml build --polly --fuse`` / ``polyml run`` against TensorFlow's stored outputs.  The
full-size models (ConvNeXtTiny, EfficientNetV2B0, the 64×128 transformer block) are slow tests
that need TensorFlow and skip without it.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tensorboard.compat.proto import graph_pb2

import polyml
from polyml import cli
from polyml.frontends.tensorflow import from_graphdef, inline_functions
from polyml.testing import rel_error
from tests.test_tf_frontend import G, softmax

FIXTURES = Path(__file__).parent / "fixtures" / "tf"
ROOT = Path(__file__).parent.parent
RNG = np.random.default_rng(12)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1 + _erf(x / math.sqrt(2)))).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))).astype(np.float32)


def run_graph(g: G, feeds: dict[str, np.ndarray], exp: dict[str, np.ndarray], tmp_path: Path, tol: float = 1e-5):
    m = polyml.compile(g.save(tmp_path / "g.pb"), tmp_path / "art", outputs=list(exp), threads=1, polly=False)
    got = m.run(feeds)
    for k, ref in exp.items():
        assert got[k].shape == ref.shape, (k, got[k].shape, ref.shape)
        assert got[k].dtype == ref.dtype, (k, got[k].dtype, ref.dtype)
        err = rel_error(got[k], ref)
        assert err <= tol, f"{k}: max|Δ|/max|ref| = {err:.2e}"
    return got


# -- Einsum -------------------------------------------------------------------------------------

def einsum_graph() -> tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Keras MultiHeadAttention's two equations (scale, softmax between), a dense EinsumDense
    equation, ``...``, a constant first operand with a free label of the
    second before its own, a label summed in one operand only, and one-operand equations."""
    g = G()
    q = RNG.standard_normal((1, 5, 2, 3)).astype(np.float32)
    k = RNG.standard_normal((1, 6, 2, 3)).astype(np.float32)
    v = RNG.standard_normal((1, 6, 2, 3)).astype(np.float32)
    for name, arr in (("q", q), ("k", k), ("v", v)):
        g.placeholder(name, list(arr.shape))
    exp = {}
    g.node("scores", "Einsum", ["q", "k"], T=1, N=2, equation="BTNH,BSNH->BNTS")
    g.const("scale", np.float32(0.5))
    g.node("scaled", "Mul", ["scores", "scale"], T=1)
    g.node("probs", "Softmax", ["scaled"], T=1)
    g.node("ctx", "Einsum", ["probs", "v"], T=1, N=2, equation="BNTS,BSNH->BTNH")
    g.ints("ctx_shape", [1, 5, 6])
    g.node("merged", "Reshape", ["ctx", "ctx_shape"], T=1, Tshape=3)
    s = np.einsum("btnh,bsnh->bnts", q, k)
    p = softmax(s * 0.5)
    exp["scores"] = s
    exp["ctx"] = np.einsum("bnts,bsnh->btnh", p, v)
    exp["merged"] = exp["ctx"].reshape(1, 5, 6)
    wn, w = g.f32("w", (6, 2, 4))
    g.node("dense", "Einsum", ["merged", wn], T=1, N=2, equation="abc,cde->abde")
    exp["dense"] = np.einsum("abc,cde->abde", exp["merged"], w)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    y = RNG.standard_normal((2, 4, 5)).astype(np.float32)
    g.placeholder("x", [2, 3, 4])
    g.placeholder("y", [2, 4, 5])
    g.node("ell", "Einsum", ["x", "y"], T=1, N=2, equation="...ij,...jk->...ik")
    exp["ell"] = x @ y
    an, a = g.f32("a", (3, 4))
    g.node("const_first", "Einsum", [an, "y"], T=1, N=2, equation="ij,bjk->bik")
    exp["const_first"] = np.einsum("ij,bjk->bik", a, y)
    g.node("summed", "Einsum", ["x", "y"], T=1, N=2, equation="bij,bkl->bil")  # j, k summed apart
    exp["summed"] = np.einsum("bij,bkl->bil", x, y)
    g.node("perm_sum", "Einsum", ["x"], T=1, N=1, equation="bij->jb")
    exp["perm_sum"] = np.einsum("bij->jb", x)
    g.node("perm", "Einsum", ["y"], T=1, N=1, equation="bjk->kbj")
    exp["perm"] = np.transpose(y, (2, 0, 1))
    g.node("perm_relu", "Relu", ["perm"], T=1)
    exp["perm_relu"] = np.maximum(exp["perm"], 0)
    feeds = {"q": q, "k": k, "v": v, "x": x, "y": y}
    return g, feeds, {key: val.astype(np.float32) for key, val in exp.items()}


def test_einsum_matches_numpy(tmp_path: Path) -> None:
    g, feeds, exp = einsum_graph()
    run_graph(g, feeds, exp, tmp_path)


def test_einsum_lowers_to_matmul() -> None:
    g, _, _ = einsum_graph()
    graph = from_graphdef(g.gd, outputs=["merged"])
    ops = [n.op_type for n in graph.nodes]
    # Q and K brought to (B, N, T, H) / (B, N, H, S), V to (B, N, S, H); the context back to (B, T, N, H)
    assert ops.count("MatMul") == 2 and ops.count("Transpose") == 4 and "Softmax" in ops, ops


def test_einsum_parse() -> None:
    from polyml.frontends.tensorflow.convert.einsum import parse

    assert parse("bij,bjk", [3, 3]) == (["bij", "bjk"], "ik")  # numpy's implicit output (TF's op needs "->")
    assert parse("...ij,jk->...ik", [4, 2]) == (["abij", "jk"], "abik")
    assert parse("i...,...->...i", [2, 1]) == (["ia", "a"], "ai")


def test_einsum_errors() -> None:
    from polyml.errors import UnsupportedError

    g = G()
    g.placeholder("x", [3, 3])
    g.node("trace", "Einsum", ["x"], T=1, N=1, equation="ii->i")
    with pytest.raises(UnsupportedError, match="repeated within one operand"):
        from_graphdef(g.gd)


# -- Erf, Erfc, GELU ----------------------------------------------------------------------------

def gelu_graph(keep_inner: bool = False) -> tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The three GELU subgraphs (tf.nn.gelu's erfc form and approximate form, the erf form with a
    division), a near miss (0.4 for 0.5), and Erf / Erfc alone."""
    g = G()
    x = (RNG.standard_normal((1, 4, 6)) * 2).astype(np.float32)
    g.placeholder("x", [1, 4, 6])
    g.const("half", np.float32(0.5))
    g.const("c", np.float32(1 / math.sqrt(2)))
    g.node("hx", "Mul", ["half", "x"], T=1)
    g.node("nx", "Neg", ["x"], T=1)
    g.node("nxc", "Mul", ["nx", "c"], T=1)
    g.node("erfc", "Erfc", ["nxc"], T=1)
    g.node("gelu", "Mul", ["hx", "erfc"], T=1)  # tf.nn.gelu(x)
    exp = {"gelu": gelu(x)}
    g.const("three", np.float32(3.0))
    g.const("k1", np.float32(0.044715))
    g.const("k2", np.float32(math.sqrt(2 / math.pi)))
    g.const("one", np.float32(1.0))
    g.node("x3", "Pow", ["x", "three"], T=1)
    g.node("kx3", "Mul", ["k1", "x3"], T=1)
    g.node("inner", "AddV2", ["x", "kx3"], T=1)
    g.node("scaled", "Mul", ["k2", "inner"], T=1)
    g.node("tanh", "Tanh", ["scaled"], T=1)
    g.node("onep", "AddV2", ["one", "tanh"], T=1)
    g.node("gelu_tanh", "Mul", ["hx", "onep"], T=1)  # tf.nn.gelu(x, approximate=True)
    exp["gelu_tanh"] = gelu_tanh(x)
    g.node("id", "Identity", ["x"], T=1)  # the same x through an Identity
    g.const("sqrt2", np.float32(math.sqrt(2)))
    g.node("xs", "RealDiv", ["id", "sqrt2"], T=1)
    g.node("erf", "Erf", ["xs"], T=1)
    g.node("onepe", "AddV2", ["erf", "one"], T=1)
    g.node("xh", "Mul", ["x", "half"], T=1)
    g.node("gelu_erf", "Mul", ["onepe", "xh"], T=1)
    exp["gelu_erf"] = gelu(x)
    g.const("p4", np.float32(0.4))
    g.node("p4x", "Mul", ["p4", "x"], T=1)
    g.node("not_gelu", "Mul", ["p4x", "erfc"], T=1)
    exp["not_gelu"] = (0.4 * x * (1 - _erf(-x / math.sqrt(2)))).astype(np.float32)
    g.node("erf_alone", "Erf", ["x"], T=1)
    exp["erf_alone"] = _erf(x).astype(np.float32)
    exp["erfc"] = (1 - _erf(-x / math.sqrt(2)).astype(np.float32)).astype(np.float32)
    return g, {"x": x}, exp


def test_gelu_patterns_match_numpy(tmp_path: Path) -> None:
    g, feeds, exp = gelu_graph()
    run_graph(g, feeds, exp, tmp_path, tol=1e-5)


def test_gelu_patterns_become_one_op() -> None:
    g, _, _ = gelu_graph()
    graph = from_graphdef(g.gd, outputs=["gelu", "gelu_tanh", "gelu_erf"])
    ops = sorted(n.op_type for n in graph.nodes)
    assert ops == ["Gelu", "Gelu", "Gelu"], ops
    assert sorted(n.attrs["approximate"] for n in graph.nodes) == ["none", "none", "tanh"]
    # the near miss and a reader of an inner node keep their own ops
    graph = from_graphdef(g.gd, outputs=["not_gelu", "gelu"])
    ops = [n.op_type for n in graph.nodes]
    assert "Erf" in ops and ops.count("Gelu") == 1, ops


# -- layer normalization, swish -------------------------------------------------------------------

def layer_norm_graph() -> tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Keras 3's LayerNormalization (center and scale; scale only), the same after a Conv
    (channels-first held), and swish with and without its beta = 1 multiply."""
    from tests.test_tf_frontend import conv_ref

    g = G()
    x = RNG.standard_normal((1, 5, 8)).astype(np.float32) * 3 + 1
    g.placeholder("x", [1, 5, 8])
    gn, gamma = g.f32("gamma", (8,), 0.5, 1.5)
    bn, beta = g.f32("beta", (8,))
    g.ints("last", [-1])
    g.const("eps", np.float32(1e-3))
    exp = {}

    def layer_norm(name: str, src: str, ref: np.ndarray, scale: bool, center: bool) -> None:
        g.node(f"{name}/mean", "Mean", [src, "last"], T=1, Tidx=3, keep_dims=True)
        g.node(f"{name}/sg", "StopGradient", [f"{name}/mean"], T=1)
        g.node(f"{name}/sqd", "SquaredDifference", [src, f"{name}/sg"], T=1)
        g.node(f"{name}/var", "Mean", [f"{name}/sqd", "last"], T=1, Tidx=3, keep_dims=True)
        g.node(f"{name}/add", "AddV2", [f"{name}/var", "eps"], T=1)
        g.node(f"{name}/rsqrt", "Rsqrt", [f"{name}/add"], T=1)
        inv = f"{name}/rsqrt"
        if scale:
            g.node(f"{name}/inv", "Mul", [inv, gn], T=1)
            inv = f"{name}/inv"
        g.node(f"{name}/xi", "Mul", [src, inv], T=1)
        g.node(f"{name}/neg", "Neg", [f"{name}/mean"], T=1)
        g.node(f"{name}/res", "Mul", [f"{name}/neg", inv], T=1)
        res = f"{name}/res"
        if center:
            g.node(f"{name}/resb", "AddV2", [res, bn], T=1)
            res = f"{name}/resb"
        g.node(name, "AddV2", [f"{name}/xi", res], T=1)
        mu = ref.mean(-1, keepdims=True)
        y = (ref - mu) / np.sqrt(((ref - mu) ** 2).mean(-1, keepdims=True) + np.float32(1e-3))
        exp[name] = (y * (gamma if scale else 1) + (beta if center else 0)).astype(np.float32)

    layer_norm("ln", "x", x, True, True)
    layer_norm("ln_scale", "x", x, True, False)
    img = RNG.standard_normal((1, 4, 5, 3)).astype(np.float32)
    g.placeholder("img", [1, 4, 5, 3])
    wn, w = g.f32("w", (1, 1, 3, 8))
    g.node("conv", "Conv2D", ["img", wn], T=1, strides=[1, 1, 1, 1], padding="VALID")
    layer_norm("ln_conv", "conv", conv_ref(img, w), True, True)
    g.const("beta1", np.float32(1.0))
    g.node("bx", "Mul", ["beta1", "x"], T=1)
    g.node("sig", "Sigmoid", ["bx"], T=1)
    g.node("swish", "Mul", ["x", "sig"], T=1)
    g.node("sig2", "Sigmoid", ["x"], T=1)
    g.node("swish2", "Mul", ["sig2", "x"], T=1)
    exp["swish"] = exp["swish2"] = (x / (1 + np.exp(-x))).astype(np.float32)
    return g, {"x": x, "img": img}, exp


def test_layer_norm_and_swish_match_numpy(tmp_path: Path) -> None:
    g, feeds, exp = layer_norm_graph()
    run_graph(g, feeds, exp, tmp_path, tol=1e-5)


def test_layer_norm_and_swish_patterns(monkeypatch) -> None:
    """Where the kernel registry has LayerNormalization and Swish (stand-ins here), the Keras
    subgraphs become one node each; a channels-first-held input keeps the decomposition."""
    from polyml.kernels import Kernel, registry

    class StandIn(Kernel):
        def infer(self, node, ins):
            return [ins[0].type]

    for op in ("LayerNormalization", "Swish"):
        monkeypatch.setitem(registry(), op, StandIn())
    g, _, _ = layer_norm_graph()
    graph = from_graphdef(g.gd, outputs=["ln", "ln_scale", "swish", "swish2"])
    ops = sorted(n.op_type for n in graph.nodes)
    assert ops == ["LayerNormalization", "LayerNormalization", "Swish", "Swish"], ops
    ln = [n for n in graph.nodes if n.op_type == "LayerNormalization"]
    assert all(n.attrs == {"axis": -1, "epsilon": pytest.approx(1e-3)} for n in ln)
    np.testing.assert_array_equal(graph.constants[ln[1].inputs[2]], np.zeros(8, np.float32))  # no center
    assert [n.attrs["alpha"] for n in graph.nodes if n.op_type == "Swish"] == [1.0, 1.0]
    ops = [n.op_type for n in from_graphdef(g.gd, outputs=["ln_conv"]).nodes]
    assert "LayerNormalization" not in ops and "ReduceMean" in ops, ops


def batch_statistics_graph() -> tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """FusedBatchNormV3 with is_training: tf-keras' LayerNormalization (one sample, NCHW, scale
    1, offset 0) and a batch of two NHWC images with a per-channel scale and offset."""
    g = G()
    x = RNG.standard_normal((1, 5, 8, 1)).astype(np.float32) * 2 + 1
    img = RNG.standard_normal((2, 3, 4, 6)).astype(np.float32)
    g.placeholder("x", [1, 5, 8, 1])
    g.placeholder("img", [2, 3, 4, 6])
    g.const("ones", np.ones(5, np.float32))
    g.const("zeros", np.zeros(5, np.float32))
    g.const("empty", np.zeros(0, np.float32))
    g.node("ln", "FusedBatchNormV3", ["x", "ones", "zeros", "empty", "empty"], T=1, U=1, epsilon=1e-3,
           is_training=True, data_format="NCHW")
    mu = x.mean(axis=(0, 2, 3), keepdims=True)
    exp = {"ln": (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True) + np.float32(1e-3))}
    sn, sc = g.f32("scale", (6,), 0.5, 1.5)
    on, off = g.f32("offset", (6,))
    g.node("bn", "FusedBatchNormV3", ["img", sn, on, "empty", "empty"], T=1, U=1, epsilon=1e-3, is_training=True)
    mu = img.mean(axis=(0, 1, 2))
    exp["bn"] = (img - mu) / np.sqrt(((img - mu) ** 2).mean(axis=(0, 1, 2)) + np.float32(1e-3)) * sc + off
    return g, {"x": x, "img": img}, {k: v.astype(np.float32) for k, v in exp.items()}


@pytest.mark.parametrize("kernel", [True, False], ids=["layernorm_kernel", "decomposed"])
def test_batch_statistics(kernel: bool, tmp_path: Path, monkeypatch) -> None:
    from polyml.kernels import registry

    if not kernel:
        monkeypatch.delitem(registry(), "LayerNormalization", raising=False)
    elif "LayerNormalization" not in registry():
        pytest.skip("no LayerNormalization kernel")
    g, feeds, exp = batch_statistics_graph()
    graph = from_graphdef(g.gd, outputs=list(exp))
    ops = [n.op_type for n in graph.nodes]
    assert ops.count("LayerNormalization") == (1 if kernel else 0), ops  # one sample only
    if kernel:
        run_graph(g, feeds, exp, tmp_path, tol=1e-5)
    else:
        from polyml.compiler import compile_graph

        got = compile_graph(graph, tmp_path / "art", threads=1, polly=False).run(feeds)
        for k, ref in exp.items():
            assert rel_error(got[k], ref) <= 1e-5, k


# -- Dense on a feature map ---------------------------------------------------------------------

def dense_graph() -> tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Keras 3 Dense (Tensordot: Reshape → MatMul → Reshape, here with transpose_b) and
    EinsumDense (BatchMatMulV2) on a convolution's output, and Tensordot on the input itself."""
    from tests.test_tf_frontend import conv_ref, same_pads

    g = G()
    x = RNG.standard_normal((1, 5, 6, 4)).astype(np.float32)
    g.placeholder("x", [1, 5, 6, 4])
    wn, w = g.f32("w", (3, 3, 4, 4))
    g.node("conv", "Conv2D", ["x", wn], T=1, strides=[1, 1, 1, 1], padding="SAME")
    c = conv_ref(x, w, pads=(same_pads(5, 3, 1), same_pads(6, 3, 1)))
    exp = {}
    g.ints("ident", [0, 1, 2, 3])
    g.ints("flat", [-1, 4])
    g.ints("back", [1, 5, 6, 7])
    dn, d = g.f32("dense_t", (7, 4))
    bn, b = g.f32("bias", (7,))
    for src, ref in (("conv", c), ("x", x)):
        g.node(f"{src}/tr", "Transpose", [src, "ident"], T=1, Tperm=3)
        g.node(f"{src}/rows", "Reshape", [f"{src}/tr", "flat"], T=1, Tshape=3)
        g.node(f"{src}/mm", "MatMul", [f"{src}/rows", dn], T=1, transpose_b=True)
        g.node(f"{src}/dense", "Reshape", [f"{src}/mm", "back"], T=1, Tshape=3)
        g.node(f"{src}/bias", "BiasAdd", [f"{src}/dense", bn], T=1)
        exp[f"{src}/bias"] = ref @ d.T + b
    en, e = g.f32("einsum_w", (4, 3))
    g.node("bmm", "BatchMatMulV2", ["conv", en], T=1)
    g.node("gelu_in", "Relu", ["bmm"], T=1)
    exp["gelu_in"] = np.maximum(c @ e, 0)
    return g, {"x": x}, exp


def test_dense_on_feature_map(tmp_path: Path) -> None:
    g, feeds, exp = dense_graph()
    run_graph(g, feeds, exp, tmp_path)
    graph = from_graphdef(g.gd, outputs=["conv/bias", "gelu_in"])
    ops = [n.op_type for n in graph.nodes]
    # the products are 1×1 Convs on the NCHW-held output, their biases folded in; no Transposes
    # but the input's, and the outputs' back to TF order
    assert sorted(ops) == ["Conv", "Conv", "Conv", "Relu", "Transpose", "Transpose", "Transpose"], ops
    ops = [n.op_type for n in from_graphdef(g.gd, outputs=["x/bias"]).nodes]
    assert sorted(ops) == ["Add", "MatMul", "Reshape", "Reshape"], ops  # TF order already: the product as it is


def test_batch1_classifier_is_a_transposed_gemm() -> None:
    """A one-row product by a constant matrix is a Gemm reading the matrix transposed (dot
    products along its rows), its bias folded in; numerics are in test_tf_frontend's cases."""
    from tests.test_tf_frontend import case_matmul_shapes

    g, _, _ = case_matmul_shapes()
    graph = from_graphdef(g.gd, outputs=["probs"])
    (gemm,) = [n for n in graph.nodes if n.op_type == "Gemm"]
    assert gemm.attrs == {"transB": 1} and len(gemm.inputs) == 3
    assert graph.constants[gemm.inputs[1]].shape == (7, 4)  # the (4, 7) Dense kernel, transposed


# -- Cast, Mul by one ---------------------------------------------------------------------------

def test_runtime_cast_and_unit_factor(tmp_path: Path) -> None:
    g = G()
    x = (RNG.standard_normal((2, 5)) * 4).astype(np.float32)
    g.placeholder("x", [2, 5])
    g.node("to_int", "Cast", ["x"], SrcT=1, DstT=3)  # truncation toward zero
    g.node("back", "Cast", ["to_int"], SrcT=3, DstT=1)
    g.node("frac", "Sub", ["x", "back"], T=1)
    g.const("ones", np.ones(5, np.float32))
    g.node("unit", "Mul", ["ones", "frac"], T=1)
    g.node("same", "Cast", ["unit"], SrcT=1, DstT=1)
    exp = {"to_int": x.astype(np.int32), "same": x - x.astype(np.int32).astype(np.float32)}
    run_graph(g, {"x": x}, exp, tmp_path, tol=0)
    ops = [n.op_type for n in from_graphdef(g.gd, outputs=["same"]).nodes]
    assert sorted(ops) == ["Cast", "Cast", "Identity", "Sub"], ops  # x * 1 is x; "same" names an Identity


# -- indexing and masks at run time ---------------------------------------------------------------

def indexing_graph() -> tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """StridedSlice (strides, negative steps, ellipsis, new and shrunk axes), Slice, GatherV2
    (an embedding lookup of int32 ids, run-time data with constant int64 indices), Split,
    SplitV, Unpack, Pack, Tile, BroadcastTo, and a slice of a channels-first-held Conv output."""
    from tests.test_tf_frontend import conv_ref

    g = G()
    x = RNG.standard_normal((2, 5, 6)).astype(np.float32)
    ids = np.array([3, 0, 9, 3], np.int32)
    g.placeholder("x", [2, 5, 6])
    g.placeholder("ids", [4], 3)
    exp = {}

    def ss(name: str, src: str, b, e, s, ref, **masks) -> None:
        g.ints(f"{name}/b", b)
        g.ints(f"{name}/e", e)
        g.ints(f"{name}/s", s)
        g.node(name, "StridedSlice", [src, f"{name}/b", f"{name}/e", f"{name}/s"], T=1, Index=3, **masks)
        exp[name] = ref

    ss("ss_step", "x", [0, 1, 0], [0, 4, 0], [1, 2, -1], x[:, 1:4:2, ::-1], begin_mask=5, end_mask=5)
    ss("ss_ell", "x", [1, 0, 0, 2], [2, 0, 0, 3], [1, 1, 1, 1], x[1, ..., None, 2],
       ellipsis_mask=2, new_axis_mask=4, shrink_axis_mask=9)
    ss("ss_cls", "x", [0, -1], [0, 0], [1, 1], x[:, -1], begin_mask=1, end_mask=1, shrink_axis_mask=2)
    ss("ss_back", "x", [0, 5], [0, 0], [1, -2], x[..., 5::-2], ellipsis_mask=1, end_mask=2)
    g.ints("sl/b", [0, 1, 2])
    g.ints("sl/s", [-1, 3, 2])
    g.node("slice", "Slice", ["x", "sl/b", "sl/s"], T=1, Index=3)
    exp["slice"] = x[:, 1:4, 2:4]
    tn, table = g.f32("table", (10, 4))
    g.ints("ax0", 0)
    g.node("embed", "GatherV2", [tn, "ids", "ax0"], Tparams=1, Tindices=3, Taxis=3, batch_dims=0)
    exp["embed"] = table[ids]
    g.const("cols", np.array([[5, 0], [5, 2]], np.int64))
    g.ints("ax2", 2)
    g.node("gather_x", "GatherV2", ["x", "cols", "ax2"], Tparams=1, Tindices=9, Taxis=3, batch_dims=0)
    exp["gather_x"] = np.take(x, [[5, 0], [5, 2]], axis=2)
    g.node("split", "Split", ["ax2", "x"], T=1, num_split=3)
    for i in range(3):
        g.node(f"split_{i}", "Identity", [f"split:{i}" if i else "split"], T=1)
        exp[f"split_{i}"] = x[:, :, 2 * i : 2 * i + 2]
    g.ints("sizes", [1, -1])
    g.node("splitv", "SplitV", ["x", "sizes", "ax0"], T=1, Tlen=3, num_split=2)
    g.node("splitv_1", "Neg", ["splitv:1"], T=1)
    exp["splitv_1"] = -x[1:]
    g.node("unpack", "Unpack", ["x"], T=1, num=5, axis=1)
    g.node("pack", "Pack", ["unpack:4", "unpack"], T=1, N=2, axis=2)
    exp["pack"] = np.stack([x[:, 4], x[:, 0]], axis=2)
    g.ints("reps", [1, 2, 1])
    g.node("tile", "Tile", ["x", "reps"], T=1, Tmultiples=3)
    exp["tile"] = np.tile(x, (1, 2, 1))
    g.ints("bshape", [3, 2, 5, 6])
    g.node("bcast", "BroadcastTo", ["x", "bshape"], T=1, Tidx=3)
    exp["bcast"] = np.broadcast_to(x, (3, 2, 5, 6))
    img = RNG.standard_normal((1, 4, 5, 3)).astype(np.float32)
    g.placeholder("img", [1, 4, 5, 3])
    wn, w = g.f32("w", (1, 1, 3, 4))
    g.node("conv", "Conv2D", ["img", wn], T=1, strides=[1, 1, 1, 1], padding="VALID")
    ss("ss_conv", "conv", [0, 1, 0, 1], [0, 3, 0, 3], [1, 1, 1, 1], conv_ref(img, w)[:, 1:3, :, 1:3],
       begin_mask=5, end_mask=5)
    return g, {"x": x, "ids": ids, "img": img}, exp


def test_runtime_indexing_matches_numpy(tmp_path: Path) -> None:
    g, feeds, exp = indexing_graph()
    run_graph(g, feeds, exp, tmp_path, tol=1e-6)  # copies are exact; the Conv rounds


def logical_graph() -> tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """An int32 attention mask compared and selected with, comparisons of floats, logical ops,
    IsNan, TF1's Select with a row vector, bool → float Cast."""
    g = G()
    a = RNG.standard_normal((4, 5)).astype(np.float32)
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    a[1, 2] = np.nan
    mask = np.array([[1, 1, 0, 1, 0]], np.int32)
    g.placeholder("a", [4, 5])
    g.placeholder("b", [4, 5])
    g.placeholder("mask", [1, 5], 3)
    g.ints("one", 1)
    g.ints("zero", 0)
    g.node("keep", "Equal", ["mask", "one"], T=3)
    g.node("pad", "NotEqual", ["mask", "one"], T=3)
    g.const("neg", np.float32(-1e9))
    g.node("masked", "SelectV2", ["keep", "b", "neg"], T=1)
    exp = {"keep": mask == 1, "pad": mask != 1, "masked": np.where(mask == 1, b, np.float32(-1e9))}
    for op, fn in (("Less", np.less), ("LessEqual", np.less_equal), ("Greater", np.greater),
                   ("GreaterEqual", np.greater_equal)):
        g.node(op.lower(), op, ["a", "b"], T=1)
        exp[op.lower()] = fn(a, b)
    g.node("both", "LogicalAnd", ["less", "keep"])
    g.node("either", "LogicalOr", ["greater", "pad"])
    g.node("neither", "LogicalNot", ["either"])
    g.node("nan", "IsNan", ["a"], T=1)
    exp["both"] = exp["less"] & (mask == 1)
    exp["neither"] = ~(exp["greater"] | (mask != 1))
    exp["nan"] = np.isnan(a)
    g.node("sel", "Select", ["less", "a", "b"], T=1)
    exp["sel"] = np.where(exp["less"], a, b)
    g.ints("c/b", [0, 0])
    g.ints("c/e", [0, 1])
    g.ints("c/s", [1, 1])
    g.node("col", "StridedSlice", ["b", "c/b", "c/e", "c/s"], T=1, Index=3, begin_mask=1, end_mask=1, shrink_axis_mask=2)
    g.const("zf", np.float32(0))
    g.node("rows", "Greater", ["col", "zf"], T=1)
    g.node("nb", "Neg", ["b"], T=1)
    g.node("sel_rows", "Select", ["rows", "b", "nb"], T=1)  # |b| where b[:, 0] > 0 (a holds a NaN)
    exp["sel_rows"] = np.where((b[:, 0] > 0)[:, None], b, -b)
    g.node("as_float", "Cast", ["both"], SrcT=10, DstT=1)
    exp["as_float"] = exp["both"].astype(np.float32)
    return g, {"a": a, "b": b, "mask": mask}, exp


def test_masks_and_selection_match_numpy(tmp_path: Path) -> None:
    g, feeds, exp = logical_graph()
    run_graph(g, feeds, exp, tmp_path, tol=0)


# -- frozen Keras fixtures ----------------------------------------------------------------------

#: fixture stem → (TF op types its GraphDef must contain, IR op counts its graph must have)
KERAS_FIXTURES = {
    "transformer_8x16": (
        {"Einsum", "BatchMatMulV2", "Erfc", "SquaredDifference", "Rsqrt", "StopGradient", "Softmax", "Shape",
         "GatherV2", "Prod", "Pack", "ConcatV2", "Transpose", "MatMul"},
        {"Gelu": 1, "Softmax": 1, "Erf": 0},
    ),
    "convnext_mini_64": (
        {"StatefulPartitionedCall", "Conv2D", "Erfc", "Squeeze", "SquaredDifference", "Rsqrt", "Maximum", "RealDiv",
         "Sqrt", "Mean", "MatMul"},
        {"Gelu": 4, "Erf": 0, "Conv": 16, "MatMul": 0, "Transpose": 1},  # Dense layers as 1×1 Convs
    ),
    "transformer_8x16_tf1": (  # tf-keras: EinsumDense as Einsum, LayerNormalization as a training-mode batch norm
        {"Einsum", "FusedBatchNormV3", "Fill", "Erfc", "Softmax", "StridedSlice", "Pack", "Prod"},
        {"Gelu": 1, "Softmax": 1, "Erf": 0},
    ),
    "efficientnetv2_mini_64": (
        {"DepthwiseConv2dNative", "Conv2D", "Sigmoid", "IdentityN", "StridedSlice", "Pack", "Cast", "Squeeze", "Rsqrt",
         "Mean"},
        {"Sigmoid": 2, "Swish": 10, "Transpose": 1},  # x·sigmoid(x) as one Swish, the SE gates stay Sigmoid
    ),
}


@pytest.mark.parametrize("stem", KERAS_FIXTURES)
def test_keras_fixture_op_types(stem: str) -> None:
    gd = graph_pb2.GraphDef()
    gd.ParseFromString((FIXTURES / f"{stem}.pb").read_bytes())
    ops = {n.op for n in gd.node} | {n.op for n in inline_functions(gd).node}  # calls, and the ops in their bodies
    tf_ops, ir_counts = KERAS_FIXTURES[stem]
    assert tf_ops <= ops, sorted(tf_ops - ops)
    ir_ops = [n.op_type for n in from_graphdef(gd).nodes]
    for op, count in ir_counts.items():
        assert ir_ops.count(op) == count, (op, ir_ops)


@pytest.mark.parametrize("stem", KERAS_FIXTURES)
def test_keras_fixture_cli(stem: str, tmp_path: Path) -> None:
    """`polyml build X.pb --polly --fuse` then `polyml run` match TensorFlow's stored outputs."""
    art = tmp_path / "art"
    assert cli.main(["build", str(FIXTURES / f"{stem}.pb"), "--polly", "--fuse", "-o", str(art), "--threads", "2"]) == 0
    out = tmp_path / "out.npz"
    assert cli.main(["run", str(art), "--inputs", str(FIXTURES / f"{stem}.in.npz"), "--outputs", str(out)]) == 0
    with np.load(FIXTURES / f"{stem}.out.npz") as ref, np.load(out) as got:
        assert set(got.files) == set(ref.files)
        for k in ref.files:
            assert got[k].shape == ref[k].shape and np.std(ref[k]) > 0
            err = rel_error(got[k], ref[k])
            assert err <= 1e-4, f"{stem} {k}: max|Δ|/max|ref| = {err:.2e}"


# -- with TensorFlow (slow, skipped without it) ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["einsum", "gelu", "layer_norm", "dense", "indexing", "logical", "batch_statistics"])
def test_numpy_references_match_tensorflow(name: str) -> None:
    from tests.test_tf_frontend import _tf_run

    graphs = {"einsum": einsum_graph, "gelu": gelu_graph, "layer_norm": layer_norm_graph, "dense": dense_graph,
              "indexing": indexing_graph, "logical": logical_graph, "batch_statistics": batch_statistics_graph}
    g, feeds, exp = graphs[name]()
    got = _tf_run(g.gd, feeds, list(exp))
    for k, ref in exp.items():
        assert got[k].shape == ref.shape and got[k].dtype == ref.dtype, k
        assert rel_error(got[k], ref) <= 1e-5, k


@pytest.mark.slow
@pytest.mark.parametrize("model, args", [
    ("transformer", []),
    ("transformer", ["--tf1"]),
    ("convnext_tiny", ["--size", "224"]),
    ("efficientnetv2_b0", ["--size", "224"]),
])
def test_keras_models_match_tensorflow(model: str, args: list[str], tmp_path: Path) -> None:
    """Acceptance: the Keras transformer block (seq 64, dim 128, 4 heads, GELU 512),
    ConvNeXtTiny and EfficientNetV2B0 frozen with random weights, built with --polly --fuse,
    match TensorFlow (max|Δ|/max|ref| ≤ 1e-3)."""
    pytest.importorskip("tensorflow")
    script = ROOT / "scripts" / "freeze_keras.py"
    subprocess.run([sys.executable, str(script), model, *args, "-o", str(tmp_path), "--name", "m"], check=True,
                   capture_output=True)
    assert cli.main(["build", str(tmp_path / "m.pb"), "--polly", "--fuse", "-o", str(tmp_path / "art")]) == 0
    out = tmp_path / "out.npz"
    assert cli.main(["run", str(tmp_path / "art"), "--inputs", str(tmp_path / "m.in.npz"), "--outputs", str(out)]) == 0
    with np.load(tmp_path / "m.out.npz") as ref, np.load(out) as got:
        for k in ref.files:
            assert rel_error(got[k], ref[k]) <= 1e-3, k
