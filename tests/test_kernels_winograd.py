"""Winograd F(2x2,3x3) and F(4x4,3x3) (kernels/winograd.py) against onnxruntime on seeded data:
odd and tiny maps (tiles crossing the border, fewer tiles than a register tile), asymmetric,
SAME and no padding, channels not a multiple of the vector width or the register tile, batch 2,
no bias, fused activation and residual add; per-layer-shape error bounds of both tile sizes at
real CNN shapes; the transform matrices against the direct 3x3 correlation; which convolutions
take the path."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from polyml.graph import Node, TensorType
from polyml.options import CodegenConfig
from polyml.testing import compile_and_compare

#: max|Δ|/max|ref| against onnxruntime per tile size (F(4x4)'s transforms round more)
TOL = {"2": 1e-5, "4": 1e-4}


def _model(xs, k, attrs, bias=True, chain="", seed=0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    c = xs[1]
    w = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    inits = [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())]
    ins = ["x", "w"]
    if bias:
        inits.append(helper.make_tensor("b", TensorProto.FLOAT, [k], rng.standard_normal(k).astype(np.float32)))
        ins.append("b")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))]
    nodes = [helper.make_node("Conv", ins, ["c" if chain else "y"], kernel_shape=[3, 3], **attrs)]
    if chain == "relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif chain == "residual":
        nodes += [helper.make_node("Add", ["c", "z"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
        model = helper.make_model(helper.make_graph(nodes, "w", inputs, [helper.make_empty_tensor_value_info("y")], inits),
                                  opset_imports=[helper.make_opsetid("", 17)])
        cshape = next(v for v in onnx.shape_inference.infer_shapes(model).graph.value_info if v.name == "c")
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [d.dim_value for d in cshape.type.tensor_type.shape.dim]))
    graph = helper.make_graph(nodes, "w", inputs, [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, tile, tmp_path, monkeypatch, threads=2) -> float:
    monkeypatch.setenv("POLYML_WINOGRAD", tile)
    errs = compile_and_compare(model, output_dir=tmp_path / "b", cache=False, threads=threads)
    details = [f.get("detail", "") for f in json.loads((tmp_path / "b" / "manifest.json").read_text())["functions"]]
    assert any(d.endswith("winograd") for d in details), details
    return max(errs.values())


EDGES = [
    ((1, 19, 13, 11), 37, {"pads": [1, 1, 1, 1]}, True, "relu"),
    ((1, 16, 9, 10), 24, {"pads": [0, 1, 2, 0]}, False, ""),
    ((2, 20, 7, 6), 32, {"auto_pad": "SAME_UPPER"}, True, "relu"),
    ((1, 24, 10, 9), 13, {}, True, ""),
    ((1, 33, 5, 5), 40, {"pads": [1, 1, 1, 1]}, True, "residual"),
    ((1, 40, 3, 3), 48, {"pads": [1, 1, 1, 1]}, True, "relu"),
    # rows of more tiles than a vector has lanes (the vector output transform's groups): 35
    # tiles of F(2x2) as 16 + 16 + 3, exact, ReLU in registers (F(4x4): 18 = 16 + 2, into Ypad);
    # 16 tiles of F(4x4), whole vectors, exact with a bias (F(2x2): 32 = 16 + 16)
    ((1, 8, 6, 70), 16, {"pads": [1, 1, 1, 1]}, True, "relu"),
    ((1, 8, 8, 64), 12, {"pads": [1, 1, 1, 1]}, True, ""),
]


@pytest.mark.parametrize("tile", ["2", "4"])
@pytest.mark.parametrize("xs,k,attrs,bias,chain", EDGES)
def test_winograd_edge_shapes(xs, k, attrs, bias, chain, tile, tmp_path, monkeypatch) -> None:
    err = _run(_model(xs, k, attrs, bias, chain), tile, tmp_path, monkeypatch)
    assert err <= TOL[tile], err


@pytest.mark.parametrize("tile,shape", [("4", (1, 256, 56, 56)), ("4", (1, 512, 28, 28)), ("2", (1, 512, 14, 14)),
                                        ("4", (1, 512, 14, 14)), ("2", (1, 512, 7, 7)), ("4", (1, 64, 112, 112))])
def test_winograd_layer_error_bound(tile, shape, tmp_path, monkeypatch) -> None:
    """The tile sizes :func:`choose_tile` picks stay within max|Δ|/max|ref| ≤ 1e-4 at the CNN
    layer shapes they are chosen for (the widest reductions: the error grows with C)."""
    err = _run(_model(shape, shape[1], {"pads": [1, 1, 1, 1]}, True, "relu"), tile, tmp_path, monkeypatch, threads=2)
    assert err <= 1e-4, err


def test_winograd_one_thread(tmp_path, monkeypatch) -> None:
    err = _run(_model((1, 32, 30, 30), 48, {"pads": [1, 1, 1, 1]}, True, "relu"), "4", tmp_path, monkeypatch, threads=1)
    assert err <= 1e-4, err


@pytest.mark.parametrize("tile", ["2", "4"])
def test_winograd_scops_export(tile, tmp_path, monkeypatch) -> None:
    """``--emit jscop`` of a Winograd convolution whose rows of tiles end in a masked group: the
    vector transforms carry ``polly.skip.fn`` (Polly 19 segfaulted exporting the input transform's
    SCoP, SqueezeNet's 3x3 16->64 @55), so the export finishes with the other functions' SCoPs."""
    from polyml.compiler import compile as polyml_compile

    monkeypatch.setenv("POLYML_WINOGRAD", tile)
    path = tmp_path / "m.onnx"
    onnx.save(_model((1, 16, 55, 55), 64, {"pads": [1, 1, 1, 1]}, True, "relu"), str(path))
    polyml_compile(path, tmp_path / "build", emit=["jscop", "ll"], threads=2, cache=False)
    assert list((tmp_path / "build" / "jscop").glob("*.jscop"))


@pytest.mark.parametrize("m", [2, 4])
def test_transforms_compute_the_correlation(m) -> None:
    from polyml.kernels.winograd import MATRICES

    bt, g, at = (np.array(v, np.float64) for v in MATRICES[m])
    rng = np.random.default_rng(m)
    d, w = rng.standard_normal((m + 2, m + 2)), rng.standard_normal((3, 3))
    ref = np.array([[np.sum(d[i:i + 3, j:j + 3] * w) for j in range(m)] for i in range(m)])
    np.testing.assert_allclose(at @ ((g @ w @ g.T) * (bt @ d @ bt.T)) @ at.T, ref, atol=1e-12)


@pytest.mark.parametrize("isa", ["avx512", "avx"])
def test_winograd_choice(isa, monkeypatch) -> None:
    """3x3/1 one-group convolutions with constant weights take the path by shape and ISA
    (AVX-512: F(4x4) on big maps, F(2x2) from 12x12 with 48+ channels, on 7x7 only in
    one-thread builds; AVX2: F(4x4) from 13x13, F(2x2) on 7x7 and from 16 channels); strided,
    dilated, grouped, computed-weight and conv=gemm/direct builds keep the GEMM or nests."""
    from polyml.kernels import _window
    from polyml.kernels.conv import _plan

    monkeypatch.setattr(_window, "_isa", lambda: isa)

    def mode(c, h, k, conv="auto", constant=True, threaded=True, winograd="", **attrs):
        node = Node("c", "Conv", ["x", "w"], ["y"], {"pads": [1, 1, 1, 1], **attrs})
        # conv_inplace: the GEMM's fallback mode alike on every ISA
        config = CodegenConfig(packed=True, conv=conv, threaded=threaded, winograd=winograd, conv_inplace="1")
        plan = _plan(config, node, TensorType((1, c, h, h)), TensorType((k, c // attrs.get("group", 1), 3, 3)), constant)
        if plan.mode != "winograd":
            return plan.mode
        from polyml.kernels.winograd import winograd_plan

        return f"F{winograd_plan(config, node, TensorType((1, c, h, h)), TensorType((k, c, 3, 3)), plan.win).m}"

    assert mode(64, 56, 64) == "F4"
    if isa == "avx512":
        assert mode(256, 14, 256) == "F2"
        assert mode(64, 13, 256) == "F2"
        assert mode(256, 12, 384) == "F2"
        assert mode(32, 13, 128) in ("rows", "gemm_inplace")  # under 48 channels
        assert mode(512, 7, 512) in ("rows", "gemm_inplace")  # rows on AVX-512 hosts
        assert mode(512, 7, 512, threaded=False) == "F2"  # but F(2x2) in a one-thread build
        assert mode(192, 6, 384, threaded=False) in ("rows", "gemm_inplace")
        assert mode(16, 55, 64) == "F4"
        assert mode(16, 13, 64, threaded=False) in ("rows", "gemm_inplace")
    else:
        assert mode(256, 14, 256) == "F4"
        assert mode(64, 13, 256) == "F4"
        assert mode(512, 7, 512) == "F2"
        assert mode(16, 55, 64) == "F2"
        assert mode(8, 55, 64) == "flat"  # 8 input channels: the direct nests
    assert not mode(512, 5, 512).startswith("F")  # under 7x7 on every ISA
    assert mode(64, 56, 64, constant=False) == "gemm_inplace"
    assert mode(64, 56, 64, conv="gemm") == "gemm_inplace"
    assert mode(64, 56, 64, conv="direct") != "winograd"
    assert mode(64, 56, 64, strides=[2, 2]) == "gemm_inplace"
    assert mode(64, 56, 64, dilations=[2, 2], pads=[2, 2, 2, 2]) == "gemm_inplace"
    assert mode(64, 56, 64, group=2) != "winograd"
    from polyml.errors import PolymlError

    with pytest.raises(PolymlError, match="POLYML_WINOGRAD"):
        mode(64, 56, 64, winograd="x")
