"""The SCoP research workflow end to end: `polyml scops` dumps (JSON contract, golden text),
the JSCoP round trip through `polyml build` (hand-edited interchange imported and run; an
illegal edit refused), `polyml opt` on a clang-written GEMM, and Polly's rejection reasons."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import islpy as isl
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyml
from polyml.cli import main
from polyml.driver.toolchain import tool
from polyml.scop import legality
from polyml.scop.detect import detect, parse_remarks
from tests.conftest import filecheck
from tests.test_codegen import add_relu_model

KEYS = {"scops", "rejected"}
SCOP_KEYS = {"function", "region", "statements", "dependences", "ast"}
STMT_KEYS = {"name", "op", "ops", "domain", "schedule", "accesses"}
ACCESS_KEYS = {"kind", "relation", "array"}

GEMM_C = """
#define NI 60
#define NJ 70
#define NK 80
void kernel_gemm(float alpha, float beta, float C[NI][NJ], float A[NI][NK], float B[NK][NJ]) {
  for (int i = 0; i < NI; i++) {
    for (int j = 0; j < NJ; j++)
      C[i][j] *= beta;
    for (int k = 0; k < NK; k++)
      for (int j = 0; j < NJ; j++)
        C[i][j] += alpha * A[i][k] * B[k][j];
  }
}
"""
DRIVER_C = """
#include <stdio.h>
#define NI 60
#define NJ 70
#define NK 80
void kernel_gemm(float alpha, float beta, float C[NI][NJ], float A[NI][NK], float B[NK][NJ]);
static float A[NI][NK], B[NK][NJ], C[NI][NJ];
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb");
  if (fread(A, sizeof A, 1, f) != 1 || fread(B, sizeof B, 1, f) != 1 || fread(C, sizeof C, 1, f) != 1) return 1;
  fclose(f);
  kernel_gemm(1.5f, 1.2f, C, A, B);
  f = fopen(argv[2], "wb");
  fwrite(C, sizeof C, 1, f);
  fclose(f);
  return 0;
}
"""


def gemm_model(path: Path) -> tuple[dict, np.ndarray]:
    """Gemm(a[16,24], b[24,40], c[40], alpha=0.5): init, product and epilogue nests in one SCoP."""
    rng = np.random.default_rng(0)
    b = rng.standard_normal((24, 40)).astype(np.float32)
    c = rng.standard_normal((40,)).astype(np.float32)
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [16, 24])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="fc", alpha=0.5)
    g = helper.make_graph([node], "g", [a], [y], initializer=[numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    x = rng.standard_normal((16, 24)).astype(np.float32)
    return {"a": x}, 0.5 * (x.astype(np.float64) @ b) + c


def scops_json(capsys, *args: str) -> dict:
    assert main(["scops", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_scops_json_contract(tmp_path, capsys) -> None:
    model = tmp_path / "add_relu.onnx"
    onnx.save(add_relu_model(), str(model))
    report = scops_json(capsys, str(model), "--no-fuse")
    assert set(report) == KEYS and report["rejected"] == []
    assert [s["function"] for s in report["scops"]] == ["op0_add0", "op1_relu0"]
    for s in report["scops"]:
        assert set(s) == SCOP_KEYS and set(s["dependences"]) == {"raw", "war", "waw"}
        # coalesced elementwise nests: Add (2, 12), Relu (24)
        assert s["ast"].startswith(("for (int c0 = 0; c0 <= 1; c0 += 1)", "for (int c0 = 0; c0 <= 23; c0 += 1)"))
        for st in s["statements"]:
            assert set(st) == STMT_KEYS and st["op"] in ("add0", "relu0")
            isl.Set(st["domain"])
            isl.Map(st["schedule"])
            for a in st["accesses"]:
                assert set(a) == ACCESS_KEYS and a["kind"] in ("read", "write", "may_write")
                assert isl.Map(a["relation"]).get_tuple_name(isl.dim_type.out) == a["array"]
        for rel in s["dependences"].values():
            isl.UnionMap(rel)


def test_scops_text_golden(tmp_path, capsys, golden) -> None:
    model = tmp_path / "add_relu.onnx"
    onnx.save(add_relu_model(), str(model))
    assert main(["scops", str(model), "--no-fuse"]) == 0
    filecheck(capsys.readouterr().out, golden / "add_relu.scops.check")


def test_scops_after_tile_golden(tmp_path, capsys, golden) -> None:
    gemm_model(tmp_path / "gemm.onnx")
    assert main(["scops", str(tmp_path / "gemm.onnx"), "--after", "tile{sizes=4,8}"]) == 0
    filecheck(capsys.readouterr().out, golden / "gemm.scops_tiled.check")


def _edit(src: Path, dst_dir: Path, schedules: dict[str, str]) -> Path:
    dst_dir.mkdir(exist_ok=True)
    j = json.loads(src.read_text())
    for s in j["statements"]:
        if s["name"] in schedules:
            s["schedule"] = schedules[s["name"]]
    (dst_dir / src.name).write_text(json.dumps(j, indent=3))
    return dst_dir / src.name


def test_jscop_round_trip_interchange_and_illegal_edit(tmp_path, golden, capsys) -> None:
    """Export, interchange k and j of the product by hand, import: same result, and the emitted
    IR has the new loop order.  Moving the init nest after the product is refused."""
    model = tmp_path / "gemm.onnx"
    feeds, expected = gemm_model(model)
    assert main(["build", str(model), "-o", str(tmp_path / "a"), "--emit", "jscop", "--no-cache"]) == 0
    (exported,) = (tmp_path / "a" / "jscop").glob("*.jscop")
    assert exported.name.startswith("op0_fc___%fc.")
    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert f"jscop/{exported.name}" in man["files"]

    product = "{ Stmt_fc_L2_j_body[i0, i1, i2] -> [1, i0, i2, i1] }"
    _edit(exported, tmp_path / "edits", {"Stmt_fc_L2_j_body": product})
    assert main(["build", str(model), "-o", str(tmp_path / "b"), "--import-jscop", str(tmp_path / "edits"),
                 "--emit", "ll", "--no-cache"]) == 0
    got = polyml.load(tmp_path / "b").run(feeds)["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    staged = json.loads((tmp_path / "b" / "jscop-imported" / exported.name).read_text())
    assert any(s["schedule"] == product for s in staged["statements"])
    (scop_ll,) = (tmp_path / "b").glob("ops.*.scop.ll")
    filecheck(scop_ll.read_text(), golden / "gemm_interchanged.scop.ll.check")

    _edit(exported, tmp_path / "bad", {"Stmt_fc_L1_j_body": "{ Stmt_fc_L1_j_body[i0, i1] -> [3, i0, i1, 0] }"})
    with pytest.raises(legality.IllegalScheduleError) as e:
        polyml.compile(model, tmp_path / "c", import_jscop=str(tmp_path / "bad"), cache=False)
    msg = str(e.value)
    assert f"{exported.name}: illegal schedule" in msg
    assert "read-after-write (flow) dependence Stmt_fc_L1_j_body -> Stmt_fc_L2_j_body on array MemRef_out0" in msg
    assert main(["build", str(model), "-o", str(tmp_path / "c"), "--import-jscop", str(tmp_path / "bad")]) == 2
    assert "dependence Stmt_fc_L1_j_body -> Stmt_fc_L2_j_body" in capsys.readouterr().err


def test_import_errors_name_the_file(tmp_path, capsys) -> None:
    model = tmp_path / "gemm.onnx"
    gemm_model(model)
    edits = tmp_path / "edits"
    edits.mkdir()
    (edits / "op9_nope___%a---%b.jscop").write_text(json.dumps({"name": "%a---%b", "context": "{ : }", "statements": []}))
    assert main(["build", str(model), "-o", str(tmp_path / "o"), "--import-jscop", str(edits), "--no-cache"]) == 2
    assert "no function 'op9_nope' in this build (functions: op0_fc)" in capsys.readouterr().err
    art = tmp_path / "art"
    art.mkdir()
    assert main(["build", str(model), "-o", str(art), "--import-jscop", str(art / "jscop"), "--no-cache"]) == 2
    assert "lies inside the artifact folder" in capsys.readouterr().err


@pytest.fixture(scope="module")
def clang_gemm(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("gemm")
    (d / "gemm.c").write_text(GEMM_C)
    (d / "driver.c").write_text(DRIVER_C)
    subprocess.run([tool("clang"), "-S", "-emit-llvm", "-O1", "-Xclang", "-disable-llvm-passes", str(d / "gemm.c"),
                    "-o", str(d / "gemm.ll")], check=True)
    return d


def _run_gemm(d: Path, ll: Path, name: str, inputs: Path) -> tuple[np.ndarray, str]:
    exe = d / name
    subprocess.run([tool("clang"), "-O2", str(ll), str(d / "driver.c"), "-o", str(exe)], check=True)
    proc = subprocess.run([str(exe), str(inputs), str(d / f"{name}.bin")], capture_output=True, text=True, check=True)
    return np.fromfile(d / f"{name}.bin", np.float32).reshape(60, 70), proc.stdout


def test_opt_tiles_clang_gemm(clang_gemm, capsys) -> None:
    """`polyml opt --passes tile{sizes=32}` on clang's GEMM: valid IR, Polly's code runs, same
    result.  (Plain ``tile`` sizes tiles by the host's L2: one tile covers this 60x70x80 GEMM.)"""
    d = clang_gemm
    rng = np.random.default_rng(2)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((60, 80), (80, 70), (60, 70)))
    np.concatenate([a.ravel(), b.ravel(), c.ravel()]).tofile(d / "in.bin")
    out = d / "gemm.tiled.ll"
    assert main(["opt", str(d / "gemm.ll"), "--passes", "tile{sizes=32}", "-o", str(out), "--jscop-dir", str(d / "jscop"),
                 "--opt-arg=-polly-codegen-emit-rtc-print"]) == 0
    assert "kernel_gemm" in capsys.readouterr().err
    subprocess.run([tool("opt"), "-passes=verify", "-disable-output", str(out)], check=True)
    (new,) = (d / "jscop").glob("*.jscop.new")
    assert "floor((i0)/32)" in new.read_text()
    ref, _ = _run_gemm(d, d / "gemm.ll", "plain", d / "in.bin")
    got, stdout = _run_gemm(d, out, "tiled", d / "in.bin")
    assert "RTC: -1 Overflow: -1" in stdout  # Polly's (tiled) code ran, not the original fallback
    np.testing.assert_array_equal(got, ref)  # tiling keeps each C[i][j]'s summation order
    expect = 1.2 * c.astype(np.float64) + 1.5 * a.astype(np.float64) @ b
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4)


def test_opt_refuses_illegal_pipeline(clang_gemm, capsys) -> None:
    assert main(["opt", str(clang_gemm / "gemm.ll"), "--passes", "interchange", "-o", str(clang_gemm / "x.ll")]) == 2
    assert "illegal schedule" in capsys.readouterr().err


REJECTED_C = """
void ext(float *);
void calls(float *restrict a) { for (int i = 0; i < 100; i++) { a[i] = 0; ext(a); } }
void fine(float *restrict a) { for (int i = 0; i < 100; i++) a[i] += 1; }
"""


def test_rejections_come_with_polly_reasons(tmp_path, capsys) -> None:
    (tmp_path / "r.c").write_text(REJECTED_C)
    ll = tmp_path / "r.ll"
    subprocess.run([tool("clang"), "-S", "-emit-llvm", "-O1", "-Xclang", "-disable-llvm-passes", str(tmp_path / "r.c"),
                    "-o", str(ll)], check=True)
    found = detect(ll)
    assert [s.function for s in found.scops] == ["fine"]
    assert [(r.function, r.reason) for r in found.rejected] == [
        ("calls", "not a SCoP: This function call cannot be handled. Try to inline it.")]
    report = scops_json(capsys, str(ll))
    assert report["rejected"] == [{"op": "calls", "reason": "not a SCoP: This function call cannot be handled. Try to inline it."}]


def test_dismissed_scop_reason_is_parsed() -> None:
    yaml = """--- !Analysis
Pass:            polly-scops
Name:            ScopEntry
Function:        op3_n3
Args:
  - String:          SCoP begins here.
...
--- !Analysis
Pass:            polly-scops
Name:            AssumpRestrict
Function:        op3_n3
Args:
  - String:          'Delinearization assumption:	{  : false }'
...
--- !Analysis
Pass:            polly-scops
Name:            ScopEnd
Function:        op3_n3
Args:
  - String:          SCoP ends here but was dismissed.
...
"""
    (r,) = parse_remarks(yaml)
    assert r.function == "op3_n3"
    assert r.reason == "SCoP dismissed while building it: Delinearization assumption: { : false }"


@pytest.mark.slow
def test_squeezenet_scops_acceptance(tmp_path, capsys) -> None:
    """Every Conv of squeezenet is the op of some statement; all isl strings parse; nothing rejected."""
    from polyml.testing import light_model_path, randomize_weights

    model = randomize_weights(onnx.load(str(light_model_path("squeezenet"))))
    onnx.save(model, str(tmp_path / "squeezenet.onnx"))
    report = scops_json(capsys, str(tmp_path / "squeezenet.onnx"))
    assert report["rejected"] == []
    convs = {n.name for n in model.graph.node if n.op_type == "Conv"}
    ops = {op for s in report["scops"] for st in s["statements"] for op in st["ops"]}
    assert convs <= ops
    for s in report["scops"]:
        assert s["ast"].strip() and set(s["dependences"]) == {"raw", "war", "waw"}
        for rel in s["dependences"].values():
            isl.UnionMap(rel)
        for st in s["statements"]:
            isl.Set(st["domain"])
            isl.Map(st["schedule"])
            for a in st["accesses"]:
                isl.Map(a["relation"])


def test_polly_skipped_functions_are_not_rejections() -> None:
    """``polly_skipped``: the functions whose attribute group holds ``"polly.skip.fn"``."""
    from polyml.scop.detect import polly_skipped

    ir_text = '''define void @"op1_n2.par0"(float* %x) #0 {
entry:
  ret void
}
define void @op2(float* %x) #1 {
entry:
  ret void
}
attributes #0 = { nounwind "polly.skip.fn" "target-cpu"="x" }
attributes #1 = { nounwind "target-cpu"="x" }
'''
    assert polly_skipped(ir_text) == {"op1_n2.par0"}


def test_export_failure_keeps_its_input(tmp_path) -> None:
    """A failing JSCoP export (here: IR opt cannot parse) keeps the input and the command
    under ``failed/`` and shows opt's own message, as the build's other tool failures do."""
    from polyml.errors import ToolchainError
    from polyml.scop import exchange

    src = tmp_path / "work" / "ops.off.0.ll"
    src.parent.mkdir()
    src.write_text("define void @f( {\n")
    with pytest.raises(ToolchainError, match="JSCoP export") as info:
        exchange.export([src], tmp_path / "out" / "jscop", keep_failed=tmp_path / "out")
    assert "failed" in str(info.value)
    kept = tmp_path / "out" / "failed"
    assert (kept / "ops.off.0.ll").read_text() == src.read_text()
    assert (kept / "ops.off.0.command.sh").exists() and (kept / "ops.off.0.stderr.txt").exists()


def test_own_jscops_imported_unchanged_give_the_same_library(tmp_path) -> None:
    """A CNN's build with --emit jscop, rebuilt with --import-jscop of those files unchanged:
    the same functions exist (the lowering does not change with the import) and nothing is
    imported, so model.so is byte-identical."""
    from polyml.testing import light_model_path

    model = light_model_path("squeezenet")
    assert main(["build", str(model), "-o", str(tmp_path / "a"), "--emit", "jscop", "--no-cache"]) == 0
    files = sorted((tmp_path / "a" / "jscop").glob("*.jscop"))
    assert files
    assert main(["build", str(model), "-o", str(tmp_path / "b"), "--import-jscop", str(tmp_path / "a" / "jscop"),
                 "--no-cache"]) == 0
    assert (tmp_path / "a" / "model.so").read_bytes() == (tmp_path / "b" / "model.so").read_bytes()
    assert not list((tmp_path / "b" / "jscop-imported").glob("*.jscop"))
