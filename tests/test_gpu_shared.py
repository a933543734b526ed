"""GPU shared-memory promotion, the GEMM helper as a 2-D grid, and ``scops --target cuda``.

No GPU needed: the promoted copies are checked with isl (the box a block copies contains every
element it reads) and the PTX with ``ptxas``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from polyml import cli, testing
from polyml.compiler import read_graph
from polyml.gpu import mapping, shared
from polyml.gpu.build import build_cuda_artifact
from polyml.gpu.builder import AccessRecord, LoopRecord, NestRecord
from polyml.gpu.lower import lower_graph_cuda

needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not installed")
BUDGET = shared.SHARED_BYTES


def _graph(tmp_path: Path, model: onnx.ModelProto):
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return read_graph(path), path


def _gemm() -> onnx.ModelProto:
    b = np.random.default_rng(0).normal(size=(50, 70)).astype(np.float32)
    return testing.single_node_model("Gemm", {"a": (37, 50)}, initializers={"b": b})


def _conv() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(32, 16, 3, 3)).astype(np.float32)
    return testing.single_node_model("Conv", {"x": (1, 16, 20, 20)}, initializers={"w": w}, pads=[1, 1, 1, 1])


def _product_nest(m: int, n: int, k: int) -> NestRecord:
    """``for i, k, j: C[i][j] += A[i][k] * B[k][j]`` (arrays 0, 1, 2) as the recorder sees it."""
    rec = NestRecord(0)
    keys = [(0,), (0, 0), (0, 0, 0)]
    for d, (key, hi, name) in enumerate(zip(keys, (m, k, n), "ikj")):
        rec.loops[key] = LoopRecord(key, 0, hi, d, name, children=[keys[d + 1]] if d < 2 else [])
    rec.roots.append(keys[0])
    rec.loops[keys[2]].direct_access = True
    i, r, j = keys
    accs = [("read", 0, {i: k, r: 1}), ("read", 1, {r: n, j: 1}), ("read", 2, {i: n, j: 1}), ("write", 2, {i: n, j: 1})]
    for pos, (kind, root, off) in enumerate(accs):
        rec.accesses.append(AccessRecord(kind, root, keys, [0, 0, 0, pos], off))
    return rec


# -- isl: which tiles are promoted, and that the copies cover the reads --------------------------

def test_gemm_tiles_of_both_operands_are_promoted_and_cover_the_reads():
    m, n, k = 37, 70, 50
    rec = _product_nest(m, n, k)
    sizes, shapes = [m * k, k * n, m * n], [(m, k), (k, n), (m, n)]
    mp = shared.map_nest_shared(rec, sizes, shapes, ["float32"] * 3, BUDGET, ["A", "B", "C"])
    plan = mp.shared
    assert plan is not None and mp.block == (16, 16, 1)
    assert plan.name == "k" and plan.tile == 32
    assert {a.name: a.widths for a in plan.arrays} == {"A": [16, 32], "B": [32, 16]}  # C is written: not promoted
    mapping.check_bijective(mp)
    shared.check_cover(plan, mp)
    for arr in plan.arrays:
        # footprint (elements the block reads in one k tile) ⊆ the copied box, for every block and tile
        assert shared.footprint(plan, mp, arr).is_subset(shared.copied(plan, mp, arr))
        assert shared.subscripts_in_box(plan, mp, arr)
        assert shared.every_element_shared(plan, mp, arr)


def test_cover_check_rejects_a_box_too_small():
    rec = _product_nest(37, 70, 50)
    mp = shared.map_nest_shared(rec, [37 * 50, 50 * 70, 37 * 70], [(37, 50), (50, 70), (37, 70)], ["float32"] * 3)
    arr = mp.shared.arrays[0]
    arr.widths[1] -= 1  # one k column short
    assert not shared.footprint(mp.shared, mp, arr).is_subset(shared.copied(mp.shared, mp, arr))
    with pytest.raises(AssertionError):
        shared.check_cover(mp.shared, mp)


def test_no_promotion_without_reuse_or_space():
    rec = _product_nest(37, 70, 50)
    args = ([37 * 50, 50 * 70, 37 * 70], [(37, 50), (50, 70), (37, 70)], ["float32"] * 3)
    # 32 bytes hold no 16-row tile of either operand, even one k wide
    mp = shared.map_nest_shared(rec, *args, budget=32)
    assert mp.shared is None and "do not fit" in mp.shared_note
    # with a one-row block, every element of B is read by a single thread: only A is reused
    rec = _product_nest(37, 300, 50)
    m1 = mapping.map_nest(rec, [37 * 50, 50 * 300, 37 * 300])
    assert m1.block == (256, 1, 1)
    plan, _ = shared.plan_shared(rec, m1, [(37, 50), (50, 300), (37, 300)], ["float32"] * 3)
    assert plan is not None and [a.root for a in plan.arrays] == [0]


def test_delinearize_splits_by_stride():
    i, k = (0,), (0, 0)
    assert shared.delinearize({i: 50, k: 1}, [50, 1]) == [{i: 1}, {k: 1}]
    assert shared.delinearize({i: 2 * 20, k: 20}, [400, 20, 1]) == [{}, {i: 2, k: 1}, {}]


# -- whole ops --------------------------------------------------------------------------------------

@needs_ptxas
def test_gemm_shared_ptx_assembles(tmp_path):
    g, _ = _graph(tmp_path, _gemm())
    m = build_cuda_artifact(g, tmp_path / "a", check_ptxas=True, shared_memory=True)
    assert m["ptxas_checked"] and m["options"]["shared_memory"] and m["shared_memory_kernels"] == 1
    k = next(k for k in m["kernels"] if "shared" in k["mapping"])
    assert k["block"] == [16, 16, 1] and [a["name"] for a in k["mapping"]["shared"]["arrays"]] == ["a", "b"]
    ptx = (tmp_path / "a" / k["ptx"]).read_text()
    assert ".shared" in ptx and "bar.sync" in ptx and "ld.shared" in ptx and "st.shared" in ptx


def test_shared_memory_is_off_by_default(tmp_path):
    g, _ = _graph(tmp_path, _gemm())
    m = build_cuda_artifact(g, tmp_path / "a", check_ptxas=False)
    assert not m["options"]["shared_memory"] and m["shared_memory_kernels"] == 0
    assert all(".shared" not in (tmp_path / "a" / f).read_text() for f in m["files"])


@needs_ptxas
def test_conv_accumulation_promotes_input_and_weight_tiles(tmp_path):
    g, _ = _graph(tmp_path, _conv())
    low = lower_graph_cuda(g, shared_bytes=BUDGET)  # verify=True: check_bijective and check_cover
    promoted = [launch for launch in low.launches if launch.mapping.shared is not None]
    assert promoted and all(launch.op_type == "Conv" for launch in promoted)
    assert any(len(launch.mapping.shared.arrays) == 2 for launch in promoted)
    for launch in promoted:
        assert launch.mapping.shared.name == "c" and launch.mapping.shared.nbytes <= BUDGET
    m = build_cuda_artifact(g, tmp_path / "a", check_ptxas=True, shared_memory=True)
    assert m["shared_memory_kernels"] == len(promoted)


def test_batched_matmul_runs_on_a_2d_grid(tmp_path):
    # B has a batch dimension: kernels/matmul.py calls its outlined GEMM helper per batch index;
    # the GPU builder inlines it, so batch, i and j map onto the grid and k stays in the thread
    g, _ = _graph(tmp_path, testing.single_node_model("MatMul", {"a": (3, 20, 30), "b": (3, 30, 40)}))
    low = lower_graph_cuda(g)
    (launch,) = low.launches
    mp = launch.mapping
    assert not mp.why_serial and mp.inner == ["gk"]
    assert [d["to"].split("*")[0] for d in mp.describe()["band"]] == ["blockIdx.z", "blockIdx.y", "blockIdx.x"]
    assert mp.grid[0] * mp.block[0] >= 40 and mp.grid[1] * mp.block[1] >= 20 and mp.grid[2] * mp.block[2] >= 3
    assert "gemm2d" not in str(low.modules[launch.module]).split("define")[-1]  # the helper is not called
    low = lower_graph_cuda(g, shared_bytes=BUDGET)
    assert low.launches[0].mapping.shared is not None and low.launches[0].mapping.shared.name == "gk"


def test_softmax_rows_map_to_threads(tmp_path):
    g, _ = _graph(tmp_path, testing.single_node_model("Softmax", {"x": (64, 1000)}, axis=1))
    low = lower_graph_cuda(g)
    for launch in low.launches:
        band = launch.mapping.describe()["band"]
        rows = [d for d in band if d["range"] == [0, 64]]
        assert rows and all(d["to"].startswith("blockIdx") for d in rows)


# -- CLI ----------------------------------------------------------------------------------------------

def test_scops_target_cuda_prints_the_mapping(tmp_path, capsys):
    _, path = _graph(tmp_path, _gemm())
    assert cli.main(["scops", str(path), "--target", "cuda", "--shared-memory"]) == 0
    text = capsys.readouterr().out
    assert "op0_gemm0_k1" in text and "blockIdx.x*16+threadIdx.x" in text and "grid (5, 3, 1) block (16, 16, 1)" in text
    assert "sequential in the thread: k" in text and "shared memory: a 16x32, b 32x16" in text
    assert cli.main(["scops", str(path), "--target", "cuda", "--json"]) == 0
    kernels = json.loads(capsys.readouterr().out)["kernels"]
    assert [k["name"] for k in kernels] == ["op0_gemm0_k0", "op0_gemm0_k1"] and "shared" not in kernels[1]["mapping"]
    assert cli.main(["gpu-map", str(path), "--json", "--shared-memory"]) == 0
    assert "shared" in json.loads(capsys.readouterr().out)["kernels"][1]["mapping"]


@needs_ptxas
def test_build_flag_records_shared_memory(tmp_path, capsys):
    _, path = _graph(tmp_path, _gemm())
    assert cli.main(["build", str(path), "--target", "cuda", "--shared-memory", "-o", str(tmp_path / "a")]) == 0
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert m["options"]["shared_memory"] and m["options"]["shared_bytes"] == BUDGET and m["ptxas_checked"]
