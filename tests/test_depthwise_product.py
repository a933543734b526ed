"""A 1x1 expansion fused into the depthwise Conv that reads it (passes/depthwise_product.py,
kernels/depthwise_product.py) against onnxruntime on seeded data: MobileNetV2's block shapes
(stride 1 and 2 at widths 112, 56 and 28), odd widths with a masked last vector, asymmetric
pads, dilation, column stride 1 with row stride 2, no biases, no chains, 1 and 2 threads; and
which pairs the pass fuses and which it leaves."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from polyml.frontends.onnx import from_onnx
from polyml.kernels import _window as conv_kernels
from polyml.kernels import depthwise_product
from polyml.options import CodegenConfig
from polyml.passes.fuse import FuseOperators
from polyml.testing import compile_and_compare

TOL = 1e-5


def _relu6(inits: list, nodes: list, src: str, dst: str) -> None:
    if not any(t.name == "lo" for t in inits):
        inits += [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])]
    nodes.append(helper.make_node("Clip", [src, "lo", "hi"], [dst]))


def _block(xs, c, ks=(3, 3), dw_attrs=None, *, e_bias=True, d_bias=True, e_chain="relu6", d_chain="relu6",
           seed=0, extra_reader=False) -> onnx.ModelProto:
    """x -> Conv 1x1 (K -> c) -> e_chain -> depthwise Conv -> d_chain -> y."""
    rng = np.random.default_rng(seed)
    k = xs[1]
    inits = [helper.make_tensor("we", TensorProto.FLOAT, (c, k, 1, 1), rng.standard_normal(c * k).astype(np.float32) * 0.5),
             helper.make_tensor("wd", TensorProto.FLOAT, (c, 1, *ks), rng.standard_normal(c * int(np.prod(ks))).astype(np.float32))]
    e_ins, d_ins = ["x", "we"], ["t", "wd"]
    if e_bias:
        inits.append(helper.make_tensor("be", TensorProto.FLOAT, (c,), rng.standard_normal(c).astype(np.float32)))
        e_ins.append("be")
    if d_bias:
        inits.append(helper.make_tensor("bd", TensorProto.FLOAT, (c,), rng.standard_normal(c).astype(np.float32)))
        d_ins.append("bd")
    nodes = [helper.make_node("Conv", e_ins, ["e" if e_chain else "t"], kernel_shape=[1, 1])]
    if e_chain == "relu6":
        _relu6(inits, nodes, "e", "t")
    elif e_chain == "relu":
        nodes.append(helper.make_node("Relu", ["e"], ["t"]))
    elif e_chain == "silu":
        nodes += [helper.make_node("Sigmoid", ["e"], ["s"]), helper.make_node("Mul", ["e", "s"], ["t"])]
    nodes.append(helper.make_node("Conv", d_ins, ["d" if d_chain else "y"], kernel_shape=list(ks), group=c,
                                  **(dw_attrs or {"pads": [1, 1, 1, 1]})))
    if d_chain == "relu6":
        _relu6(inits, nodes, "d", "y")
    outputs = [helper.make_empty_tensor_value_info("y")]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["t"], ["t2"]))
        outputs.append(helper.make_empty_tensor_value_info("t2"))
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
                              outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _avx512() -> bool:
    return conv_kernels.VECTOR_LANES[conv_kernels._isa()] == 16


needs_avx512 = pytest.mark.skipif(not _avx512(), reason="the fused form is made on AVX-512 hosts only")

CASES = [
    # (N, K, H, W), C, kernel, depthwise attrs
    ((1, 16, 112, 112), 96, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # MobileNetV2's
    ((1, 24, 56, 56), 144, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 24, 56, 56), 144, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 32, 28, 28), 192, (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 5, 19, 37), 7, (3, 3), {"pads": [1, 1, 1, 1]}),  # a masked last vector, a prime C
    ((1, 3, 23, 41), 10, (3, 3), {"pads": [0, 1, 2, 0], "strides": [2, 2]}),  # asymmetric pads
    ((1, 4, 30, 50), 6, (5, 5), {"pads": [4, 4, 4, 4], "dilations": [2, 2]}),
    ((1, 8, 21, 33), 12, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}),
    ((1, 64, 17, 18), 8, (3, 3), {}),  # K = MAX_K, no pads
    ((1, 2, 40, 96), 4, (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # several vectors per phase row
    ((1, 4, 3, 82), 96, (3, 3), {}),  # one output row: the threads split the channels (4 per block)
]


@pytest.fixture
def small_fused(monkeypatch):
    """Small expanded tensors fused too (the cases stay quick); builds bypass the compile cache,
    which does not know the patched threshold."""
    monkeypatch.setattr(depthwise_product, "MIN_EXPANDED_BYTES", 0)


@needs_avx512
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xs,c,ks,attrs", CASES)
def test_matches_onnxruntime(xs, c, ks, attrs, threads, small_fused):
    model = _block(xs, c, ks, attrs)
    assert _fused(model)
    got = compile_and_compare(model, threads=threads, cache=False)
    assert got["y"] < TOL


@needs_avx512
@pytest.mark.parametrize("e_bias,d_bias,e_chain,d_chain", [
    (False, False, "", ""), (True, False, "relu", ""), (False, True, "", "relu6")])
def test_biases_and_chains(e_bias, d_bias, e_chain, d_chain, small_fused):
    model = _block((1, 6, 20, 34), 12, dw_attrs={"pads": [1, 1, 1, 1], "strides": [2, 2]}, e_bias=e_bias,
                   d_bias=d_bias, e_chain=e_chain, d_chain=d_chain)
    assert _fused(model)
    assert compile_and_compare(model, threads=2, cache=False)["y"] < TOL


def _fused(model: onnx.ModelProto, packed_gemm: bool = True, conv: str = "auto", dw_product: bool = True) -> bool:
    """Whether FuseOperators, run as a host build runs it, fuses the pair."""
    graph, report = FuseOperators(config=CodegenConfig(packed=packed_gemm, conv=conv, threaded=True, dw_product=dw_product)).apply(from_onnx(model))
    kinds = [grp["kind"] for grp in report.groups]
    ops = [n.op_type for n in graph.nodes]
    assert (depthwise_product.DEPTHWISE_PRODUCT_OP in ops) == ("depthwise-product" in kinds)
    return "depthwise-product" in kinds


@needs_avx512
def test_which_pairs_fuse(monkeypatch):
    assert _fused(_block((1, 16, 56, 56), 96))
    assert not _fused(_block((1, 32, 28, 28), 192))  # 0.6 MB: stays in L2 unfused
    monkeypatch.setattr(depthwise_product, "MIN_EXPANDED_BYTES", 0)
    assert _fused(_block((1, 32, 28, 28), 192))
    assert not _fused(_block((1, 16, 56, 56), 96, extra_reader=True))  # the expanded tensor read twice
    assert not _fused(_block((1, 16, 56, 56), 96, e_chain="silu"))  # not a register chain
    assert not _fused(_block((1, 16, 7, 15), 96))  # planes narrower than a vector
    assert not _fused(_block((1, 65, 56, 56), 96))  # K > MAX_K
    assert not _fused(_block((2, 16, 56, 56), 96))  # batch 2
    assert not _fused(_block((1, 16, 56, 56), 96), dw_product=False)  # POLYML_DW_PRODUCT=0


def test_gpu_builds_keep_the_pair():
    graph, _ = FuseOperators(depthwise_products=False).apply(from_onnx(_block((1, 16, 56, 56), 96)))
    assert [n.op_type for n in graph.nodes] == ["Conv", "Conv"]


@needs_avx512
def test_no_fusion_without_the_packed_gemm():
    assert not _fused(_block((1, 16, 56, 56), 96), packed_gemm=False)  # --gemm polly, the SCoP tools
    assert not _fused(_block((1, 16, 56, 56), 96), conv="direct")


def test_flops_count_both_convolutions():
    from polyml.flops import graph_flops

    model = _block((1, 16, 56, 56), 96, dw_attrs={"pads": [1, 1, 1, 1], "strides": [2, 2]})
    unfused = graph_flops(from_onnx(model))
    fused, _ = FuseOperators(config=CodegenConfig(packed=True, conv="auto", threaded=True)).apply(from_onnx(model))
    assert unfused == 2.0 * (96 * 16 * 56 * 56 + 96 * 28 * 28 * 9)
    if _avx512():
        assert graph_flops(fused) == unfused


@needs_avx512
def test_report_merges_both_epilogue_nests():
    _, report = FuseOperators(config=CodegenConfig(packed=True, conv="auto", threaded=True)).apply(from_onnx(_block((1, 16, 56, 56), 96)))
    assert [(grp["kind"], len(grp["ops"])) for grp in report.groups] == [("depthwise-product", 4)]
