"""polyml.schedule: plain nests, schedule-tree transforms, isl AST code generation, intrinsics.

The GEMM family end to end: its BLIS schedule tree and the loops isl generates from it are
pinned with FileCheck; MatMuls built through it match onnxruntime at edge shapes (partial
register tiles, K = 1, one thread share or two); the manifest says which path each function
took; the legality check rejects a reordering that breaks the reduction's order; a tensorize
mark naming no intrinsic is a clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

import islpy as isl
import numpy as np
import onnx
import pytest

from polyml.codegen import gemm as packed
from polyml.compiler import compile as polyml_compile
from polyml.schedule import codegen, layout, legality
from polyml.schedule import gemm as scheduled_gemm
from polyml.schedule import tree as T
from polyml.schedule.nest import Array, Program
from polyml.testing import compile_and_compare, single_node_model
from tests.conftest import filecheck, shared_library

#: a fixed blocking, so the goldens do not depend on the host's caches
BLK = packed.Blocking(12, 32, 16, mc=96, kc=256, nc=512)
SIZES = {"M": 200, "N": 300, "K": 70}


def _program() -> Program:
    return scheduled_gemm.schedule(scheduled_gemm.plan(200, 300, 70, BLK, 2))


def _band_node(tree: isl.Schedule, statement: str) -> isl.ScheduleNode:
    """The band that schedules ``statement`` in a nest's initial tree (below its sequence filter)."""
    node = tree.get_root().child(0)
    while node.get_type() != isl.schedule_node_type.band:
        if node.get_type() == isl.schedule_node_type.sequence:
            node = next(node.child(c).child(0) for c in range(node.n_children())
                        if statement in _tuple_names(node.child(c).filter_get_filter()))
        else:
            node = node.child(0)
    return node


def _tuple_names(sets: isl.UnionSet) -> list[str]:
    names: list[str] = []
    sets.foreach_set(lambda s: names.append(s.get_tuple_name()))
    return names


def test_gemm_schedule_tree_golden(golden: Path) -> None:
    filecheck(T.text(_program().tree), golden / "gemm.schedule_tree.check")


def test_gemm_loops_golden(golden: Path) -> None:
    filecheck(codegen.c_text(_program(), SIZES), golden / "gemm.schedule_loops.check")


def test_gemm_parametric_loops() -> None:
    """Without fixed sizes the loops are bounded by the parameters (tiles and remainders from
    isl's AST generator): one build's schedule serves every M, N, K."""
    text = codegen.c_text(_program())
    assert "N" in text and "M" in text and "K" in text
    assert "// tensorize fma.f32.12x32 S init=Z" in text


#: at least polyml.kernels.matmul.PACKED_MIN_MACS multiply-adds (smaller products stay plain nests)
CASES = [(12, 3000, 1), (13, 33, 80), (12, 32, 96), (50, 32, 70), (200, 300, 70), (64, 1000, 3), (257, 129, 513)]


@pytest.mark.parametrize("m,n,k", CASES, ids=[f"{m}x{n}x{k}" for m, n, k in CASES])
@pytest.mark.parametrize("threads", [1, 2])
def test_scheduled_matmul_matches_onnxruntime(m: int, n: int, k: int, threads: int, tmp_path: Path) -> None:
    model = single_node_model("MatMul", {"a": (m, k), "b": (k, n)})
    rng = np.random.default_rng(m + n + k)
    feeds = {"a": rng.standard_normal((m, k), dtype=np.float32), "b": rng.standard_normal((k, n), dtype=np.float32)}
    errs = compile_and_compare(model, feeds, output_dir=tmp_path / "b", threads=threads, gemm="schedule")
    assert errs and max(errs.values()) <= 1e-5, errs
    fn = json.loads((tmp_path / "b" / "manifest.json").read_text())["functions"][0]
    assert fn["path"] == "schedule", fn
    assert "tensorize fma.f32." in fn["schedules"][0]


#: Gemm's forms on the schedule: transposed operands, alpha, beta and broadcast biases (the
#: finishing statement fused into each register tile), constant B' (packed at compile time,
#: transposed there for transB)
GEMM_CASES = [
    ({"a": (40, 100), "b": (70, 40), "c": (70,)}, {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, False),
    ({"a": (96, 80), "b": (80, 112), "c": (96, 1)}, {}, False),
    ({"a": (96, 80), "b": (112, 80), "c": (96, 112)}, {"transB": 1}, False),
    ({"a": (30, 80), "b": (80, 112)}, {"alpha": -1.0}, False),
    ({"a": (130, 300), "b": (300, 77), "c": (77,)}, {}, True),
    ({"a": (50, 64), "b": (200, 64), "c": (1,)}, {"transB": 1, "beta": 0.5}, True),
    ({"a": (64, 50), "b": (64, 96)}, {"transA": 1}, True),
]


@pytest.mark.parametrize("inputs,attrs,constant", GEMM_CASES, ids=[str(i) for i in range(len(GEMM_CASES))])
@pytest.mark.parametrize("threads", [1, 2])
def test_scheduled_gemm_matches_onnxruntime(inputs: dict, attrs: dict, constant: bool, threads: int,
                                            tmp_path: Path) -> None:
    rng = np.random.default_rng(len(str(inputs)))
    data = {k: rng.standard_normal(v, dtype=np.float32) for k, v in inputs.items()}
    if constant:
        model = single_node_model("Gemm", {k: v for k, v in inputs.items() if k != "b"},
                                  initializers={"b": data["b"]}, **attrs)
        model.graph.node[0].input[:] = ["a", "b", *(["c"] if "c" in inputs else [])]
        feeds = {k: v for k, v in data.items() if k != "b"}
    else:
        model, feeds = single_node_model("Gemm", inputs, **attrs), data
    errs = compile_and_compare(model, feeds, output_dir=tmp_path / "b", threads=threads)
    assert errs and max(errs.values()) <= 1e-5, errs
    fn = json.loads((tmp_path / "b" / "manifest.json").read_text())["functions"][0]
    assert fn["path"] == "schedule", fn
    if "c" in inputs or attrs.get("alpha", 1.0) != 1.0:  # E fused into the tile loops
        assert "E[i, j]" in fn["schedules"][0]


@pytest.mark.parametrize("m", [12, 128])
def test_scheduled_matmul_constant_weights(m: int, tmp_path: Path) -> None:
    """A constant B in the schedule's layout (made by evaluating the layout): no B slot, no B
    copy statement in the tree; fewer rows than a tile stay on the packed GEMM's short kernels."""
    rng = np.random.default_rng(m)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    model = single_node_model("MatMul", {"a": (m, 300)}, initializers={"b": w})
    errs = compile_and_compare(model, {"a": rng.standard_normal((m, 300)).astype(np.float32)},
                               output_dir=tmp_path / "b", threads=2)
    assert errs and max(errs.values()) <= 1e-5, errs
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    fn = manifest["functions"][0]
    assert fn["path"] == "schedule" and "Pack_Bp" not in fn["schedules"][0] and "Pack_Ap" in fn["schedules"][0]
    assert "b" not in [s["name"] for s in manifest["slots"] if s["kind"] == "weight"]
    few = single_node_model("MatMul", {"a": (4, 300)}, initializers={"b": w})
    compile_and_compare(few, {"a": rng.standard_normal((4, 300)).astype(np.float32)}, output_dir=tmp_path / "few")
    assert json.loads((tmp_path / "few" / "manifest.json").read_text())["functions"][0]["path"] == "hand"


@pytest.mark.parametrize("case", ["matmul-weights", "matmul", "gemm-transposed-bias"])
def test_no_schedule_builds_the_plain_nests(case: str, tmp_path: Path) -> None:
    """``--no-schedule``: the same products as their plain nests under the initial schedule
    (path ``plain``, B read as stored, no packing buffers), still as onnxruntime computes."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    if case == "matmul-weights":
        model, feeds = single_node_model("MatMul", {"a": (128, 300)}, initializers={"b": w}), {"a": (128, 300)}
    elif case == "matmul":
        model, feeds = single_node_model("MatMul", {"a": (128, 300), "b": (300, 200)}), {"a": (128, 300), "b": (300, 200)}
    else:
        model = single_node_model("Gemm", {"a": (300, 128)}, initializers={"b": w.T.copy(), "c": w[0]}, transA=1,
                                  transB=1, alpha=0.5)
        feeds = {"a": (300, 128)}
    feeds = {k: rng.standard_normal(v).astype(np.float32) for k, v in feeds.items()}
    errs = compile_and_compare(model, feeds, output_dir=tmp_path / "b", schedule=False)
    assert errs and max(errs.values()) <= 1e-5, errs
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    fn = manifest["functions"][0]
    assert fn["path"] == "plain" and "--no-schedule" in fn["reason"] and "schedules" not in fn
    assert manifest["options"]["schedule"] is False
    assert not [s for s in manifest["slots"] if s["kind"] == "weight" and "#const" in s["name"]]


def test_layout_offsets_match_isl() -> None:
    """The numpy evaluation of a blocked layout agrees with isl on every element."""
    text = "{ B[k, j] -> Bc[384*floor(k/4) + 128*floor(j/32) + 32*(k mod 4) + j mod 32] }"
    got = layout.offsets(text, (10, 70), {})
    rel = isl.Map(text)
    for k in range(10):
        for j in range(70):
            point = rel.intersect_domain(isl.Set(f"{{ B[{k}, {j}] }}")).range().sample_point()
            assert point.get_coordinate_val(isl.dim_type.set, 0).to_python() == got[k, j]
    assert len(set(got.ravel())) == got.size  # one position per element


def test_manifest_paths(tmp_path: Path) -> None:
    """``--gemm packed`` keeps the hand-written GEMM (path ``hand``); an op left to opt is ``plain``."""
    path = tmp_path / "m.onnx"
    onnx.save(single_node_model("MatMul", {"a": (64, 96), "b": (96, 128)}), str(path))
    polyml_compile(path, tmp_path / "hand", cache=False, gemm="packed")
    fn = json.loads((tmp_path / "hand" / "manifest.json").read_text())["functions"][0]
    assert (fn["path"], fn["policy"]) == ("hand", "off") and "schedules" not in fn
    onnx.save(single_node_model("Transpose", {"x": (33, 65)}, perm=[1, 0]), str(path))
    polyml_compile(path, tmp_path / "plain", cache=False)
    fn = json.loads((tmp_path / "plain" / "manifest.json").read_text())["functions"][0]
    assert fn["path"] in ("plain", "hand") and fn["reason"]


def test_legality_rejects_a_reversed_reduction() -> None:
    """Running S's k loop backwards reorders the accumulation into C[i, j]: illegal; the
    blocked band of the GEMM schedule keeps every (i, j)'s k order: legal."""
    program = T.fold_init(Program.of(scheduled_gemm.nest()), "Z")
    deps = legality.dependences(program.nest)
    node = _band_node(program.tree, "S")
    i, j, k = T.members(node)
    reversed_k = T.with_members(node, [i, j, k.neg()])
    assert not legality.is_legal(reversed_k.get_schedule(), deps)
    blocked = T.with_members(node, [T.origin(j, 64), T.origin(k, 16), i, T.offset(j, 64), T.offset(k, 16)])
    assert legality.is_legal(blocked.get_schedule(), deps)
    assert legality.is_legal(T.permute(node, [1, 0, 2]).get_schedule(), deps)


def test_unknown_intrinsic_is_a_clear_error() -> None:
    import llvmlite.ir as ir

    program = T.fold_init(Program.of(scheduled_gemm.nest()), "Z")
    node = _band_node(program.tree, "S")
    bad = Program(program.nest, T.mark(node, "tensorize nope.4x4 S init=Z").get_schedule())
    module = ir.Module("t")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "f")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    f32p = ir.FloatType().as_pointer()
    arrays = {name: ir.Constant(f32p, None) for name in ("A", "B", "C")}
    with pytest.raises(codegen.ScheduleCodegenError, match="no intrinsic 'nope.4x4'.*known: fma.f32.12x32"):
        codegen.Emitter(module, fn, b, bad, arrays, SIZES, {"fma.f32.12x32": object()}).emit(SIZES)


def test_pack_refuses_a_written_array() -> None:
    program = Program.of(scheduled_gemm.nest())
    node = _band_node(program.tree, "S")
    with pytest.raises(ValueError, match="C is written"):
        T.pack(program, node, "S", "C", Array("Cp", (10,)), "{ Pack_Cp[a, b, c, d, e] -> Cp[0] }")


def test_scops_shows_the_schedules(tmp_path, capsys) -> None:
    """``polyml scops --schedules``: each scheduled function's tree and the loops isl makes of it."""
    from polyml.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(single_node_model("MatMul", {"a": (200, 70), "b": (70, 300)}), str(path))
    assert main(["scops", str(path), "--schedules", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["schedules"]
    assert entry["op_type"] == "MatMul" and 'mark: "tensorize fma.f32.' in entry["tree"]
    assert "Pack_Bp(" in entry["loops"] and "// tensorize fma.f32." in entry["loops"]
    assert main(["scops", str(path), "--schedules"]) == 0
    text = capsys.readouterr().out
    assert "op0_matmul0" in text and "// tensorize fma.f32." in text


def test_one_parametric_function_serves_every_size(tmp_path) -> None:
    """The GEMM schedule with M, N and K left as run-time arguments: one function (tiles and
    remainders from isl's AST generator, the packing buffers per thread, whatever the sizes)
    computes products of every size, partial tiles and more thread shares than threads too."""
    import ctypes

    import llvmlite.ir as ir

    from polyml.schedule.intrinsics import FmaTile

    blk = packed.blocking_for_host("")
    plan = scheduled_gemm.plan(96, 96, 64, blk, 2)  # the sizes only choose the blocks
    program = scheduled_gemm.schedule(plan)
    module = ir.Module("parametric")
    f32p, i64 = ir.FloatType().as_pointer(), ir.IntType(64)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [f32p] * 4 + [i64] * 3), "gemm")
    a, b, c, work, m, n, k = fn.args
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    fma = FmaTile(blk, ("nounwind",))
    codegen.Emitter(module, fn, builder, program, {"A": a, "B": b, "C": c, "Ap": work, "Bp": work},
                    {"M": m, "N": n, "K": k}, {fma.name: fma}, ("nounwind",)).emit()
    builder.ret_void()
    lib = shared_library(str(module), tmp_path, "g", opt="-O3")
    fp = ctypes.POINTER(ctypes.c_float)
    lib.gemm.argtypes = [fp] * 4 + [ctypes.c_int64] * 3
    scratch = np.zeros(plan.scratch_floats, np.float32)
    rng = np.random.default_rng(5)
    for mm, nn, kk in [(96, 96, 64), (1, 1, 1), (13, 33, 7), (300, 257, 129), (1000, 40, 600)]:
        x = rng.standard_normal((mm, kk), dtype=np.float32)
        y = rng.standard_normal((kk, nn), dtype=np.float32)
        out = np.full((mm, nn), np.nan, np.float32)
        lib.gemm(*(arr.ctypes.data_as(fp) for arr in (x, y, out, scratch)), mm, nn, kk)
        ref = x.astype(np.float64) @ y.astype(np.float64)
        assert np.abs(out - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), (mm, nn, kk)
