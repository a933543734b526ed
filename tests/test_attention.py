"""Attention fusion: each head's MatMul → (scale, mask) → Softmax → MatMul runs as one
``polyml.Attention`` nest, checked against onnxruntime and the unfused build; the isl legality
check and the refusals are reported in the fusion report."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyml
from polyml.testing import onnxruntime_run, rel_error

RNG = np.random.default_rng(3)


def attention_model(b: int, h: int, s: int, d: int, sk: int | None = None, dv: int | None = None, mask: str = "add",
                    k_layout: str = "transpose", extra_reader: bool = False) -> tuple[onnx.ModelProto, dict]:
    """One attention block as exporters write it: Q·Kᵀ (a Transpose of K, or K given as Kᵀ),
    scale, a mask (additive float, or a bool ``Where``), Softmax, ·V."""
    sk, dv = sk or s, dv or d
    feeds = {"q": RNG.standard_normal((b, h, s, d)).astype(np.float32),
             "k": RNG.standard_normal((b, h, sk, d) if k_layout == "transpose" else (b, h, d, sk)).astype(np.float32),
             "v": RNG.standard_normal((b, h, sk, dv)).astype(np.float32)}
    nodes = []
    kt = "k"
    if k_layout == "transpose":
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="k_transpose"))
        kt = "kt"
    nodes += [helper.make_node("MatMul", ["q", kt], ["scores"], name="qk"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale")]
    inits = {"scale": np.array(1 / np.sqrt(d), np.float32)}
    last = "scaled"
    if mask == "add":
        m = np.zeros((b, 1, 1, sk), np.float32)
        m[..., sk - 2:] = -1e4
        feeds["mask"] = m
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask"))
        last = "masked"
    elif mask == "nan-guard":  # torch's SDPA export: a fully masked row gives NaN, then 0
        m = np.zeros((b, 1, s, sk), np.float32)
        m[:, :, 0, :] = -np.inf
        feeds["mask"] = m
        inits["zero"] = np.array(0.0, np.float32)
        nodes.append(helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask"))
        nodes += [helper.make_node("Softmax", ["masked"], ["p0"], axis=-1, name="softmax"),
                  helper.make_node("IsNaN", ["p0"], ["isnan"], name="isnan"),
                  helper.make_node("Where", ["isnan", "zero", "p0"], ["p"], name="guard"),
                  helper.make_node("MatMul", ["p", "v"], ["o"], name="pv")]
        vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in feeds.items()]
        graph = helper.make_graph(nodes, "attention", vis, [helper.make_empty_tensor_value_info("o")],
                                  initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds
    elif mask == "causal":
        inits["causal"] = np.tril(np.ones((s, sk), bool))
        inits["neg"] = np.array(-3.4e38, np.float32)
        nodes.append(helper.make_node("Where", ["causal", "scaled", "neg"], ["masked"], name="causal"))
        last = "masked"
    nodes += [helper.make_node("Softmax", [last], ["p"], axis=-1, name="softmax"),
              helper.make_node("MatMul", ["p", "v"], ["o"], name="pv")]
    outputs = ["o"]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["scaled"], ["r"], name="extra"))
        outputs.append("r")
    vis = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in feeds.items()]
    graph = helper.make_graph(nodes, "attention", vis, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              initializer=[numpy_helper.from_array(v, n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


def build(model: onnx.ModelProto, tmp_path, **options) -> polyml.runtime.model.CompiledModel:
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return polyml.compile(path, tmp_path / f"out{len(list(tmp_path.iterdir()))}", cache=False, **options)


CASES = {
    "bert": dict(b=1, h=2, s=16, d=8),
    "edges": dict(b=2, h=3, s=13, d=7, sk=29, dv=5),  # sizes off the micro-kernel's 12/32 tiles
    "kt-given": dict(b=1, h=2, s=16, d=8, k_layout="given", mask="none"),
    "causal": dict(b=1, h=4, s=33, d=16, mask="causal"),
    "nan-guard": dict(b=1, h=2, s=16, d=8, mask="nan-guard"),
}


@pytest.mark.parametrize("gemm", ["packed", "polly"])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_attention_matches_onnxruntime(case: str, gemm: str, tmp_path) -> None:
    model, feeds = attention_model(**CASES[case])
    ref = onnxruntime_run(model, feeds)
    fused = build(model, tmp_path, gemm=gemm)
    groups = [g for g in fused.manifest["fusion"]["groups"] if g["kind"] == "attention"]
    assert len(groups) == 1, fused.manifest["fusion"]
    assert "softmax" in groups[0]["ops"] and "qk" in groups[0]["ops"]
    assert [f["op_type"] for f in fused.manifest["functions"]] == ["polyml.Attention"]
    got = fused.run(feeds)
    assert rel_error(got["o"], ref["o"]) < 1e-5
    unfused = build(model, tmp_path, fuse=False).run(feeds)
    assert rel_error(unfused["o"], ref["o"]) < 1e-5


def test_scores_read_elsewhere_are_not_fused(tmp_path) -> None:
    model, feeds = attention_model(1, 2, 8, 4, extra_reader=True)
    m = build(model, tmp_path)
    rep = m.manifest["fusion"]
    assert not [g for g in rep["groups"] if g["kind"] == "attention"]
    assert any("attention not fused" in b["reason"] and "read by other nodes" in b["reason"] for b in rep["blocked"]), rep
    ref = onnxruntime_run(model, feeds)
    got = m.run(feeds)
    assert all(rel_error(got[k], ref[k]) < 1e-5 for k in ref)


def test_isl_legality_of_per_head_fusion() -> None:
    from polyml.passes.attention import legality_violations

    assert legality_violations(12, 128, 128, 64, 64) == []


def test_attention_fusion_can_be_turned_off(tmp_path) -> None:
    """``--no-fuse-attention`` (Options.attention): the chain stays separate nests, same numbers."""
    model, feeds = attention_model(**CASES["bert"])
    m = build(model, tmp_path, attention=False)
    assert m.manifest["options"]["attention"] is False
    assert not [g for g in m.manifest["fusion"]["groups"] if g["kind"] == "attention"]
    assert "polyml.Attention" not in [f["op_type"] for f in m.manifest["functions"]]
    assert rel_error(m.run(feeds)["o"], onnxruntime_run(model, feeds)["o"]) < 1e-5


def test_cuda_build_keeps_attention_unfused(tmp_path) -> None:
    """The grid mapping takes constant-bound nests only: ``--target cuda`` fuses the chain's
    elementwise ops but leaves the products and the softmax as kernels of their own."""
    import shutil

    from polyml.frontends.onnx import from_onnx
    from polyml.gpu.build import build_cuda_artifact

    model, _ = attention_model(**CASES["bert"])
    m = build_cuda_artifact(from_onnx(model), tmp_path / "cuda", check_ptxas=shutil.which("ptxas") is not None)
    assert m["kernels"] and not [g for g in (m.get("fusion") or {}).get("groups", []) if g["kind"] == "attention"]
