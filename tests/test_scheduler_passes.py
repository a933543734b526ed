"""The scheduler passes: isl's scheduler and the band tree it hands on, tiling
on that tree with the cache model, wavefront, parallel, vectorize, skew, fuse/distribute, the
default policy and ``--tune``.  Schedules are checked with isl (legality against the exact
dependences, band flags); the end-to-end tests build small C kernels of the affine suite and
compare their arrays with clang -O3's bit for bit."""

from __future__ import annotations

import json
import re
import subprocess

import islpy as isl
import pytest

from polyml import affine_suite as A
from polyml import passes
from polyml.cli import main
from polyml.driver.toolchain import tool
from polyml.passes import PassError, parse_pipeline
from polyml.passes import pipeline as P
from polyml.passes.tile import footprint, model_sizes
from polyml.scop import legality, printer
from polyml.scop import schedule as sched
from tests.test_scop_legality import GEMM, STENCIL, scop, stmt

#: jacobi-1d as two statements in a time loop: B[i] = (A[i-1] + A[i] + A[i+1]) / 3, A[i] = B[i]
JACOBI1D = scop(
    stmt("S", "{ S[t, i] : 0 <= t <= 5 and 1 <= i <= 14 }", "{ S[t, i] -> [t, 0, i] }",
         ("read", "{ S[t, i] -> A[i - 1] }"), ("read", "{ S[t, i] -> A[i] }"), ("read", "{ S[t, i] -> A[i + 1] }"),
         ("write", "{ S[t, i] -> B[i] }")),
    stmt("T", "{ T[t, i] : 0 <= t <= 5 and 1 <= i <= 14 }", "{ T[t, i] -> [t, 1, i] }",
         ("read", "{ T[t, i] -> B[i] }"), ("write", "{ T[t, i] -> A[i] }")),
)
#: two independent nests over the same range (fusable without shifts): x[i] = a[i]; y[i] = x[i] + 1
PRODUCER_CONSUMER = scop(
    stmt("P", "{ P[i] : 0 <= i <= 15 }", "{ P[i] -> [0, i] }", ("read", "{ P[i] -> a[i] }"), ("write", "{ P[i] -> x[i] }")),
    stmt("C", "{ C[i] : 0 <= i <= 15 }", "{ C[i] -> [1, i] }", ("read", "{ C[i] -> x[i] }"), ("write", "{ C[i] -> y[i] }")),
)


def run(text: str, j: dict) -> dict:
    out = passes.run(parse_pipeline(text), j)
    legality.check(j, out, text)
    return out


def bands(j: dict) -> list[dict]:
    return sched.describe(sched.tree(j))


# -- schedule -----------------------------------------------------------------------------------

def test_schedule_gemm_band_is_permutable_with_parallel_i_j() -> None:
    out = run("schedule", GEMM)
    b = bands(out)
    product = next(x for x in b if "P" in x["statements"] and len(x["members"]) == 3)
    assert product["permutable"]
    # i and j carry no dependence (coincident), k carries the reduction
    assert product["coincident"][:2] == [True, True] and product["coincident"][2] is False
    assert sched.META in out and "tree" in out[sched.META]


def test_schedule_fusion_options() -> None:
    """min: one nest per statement (a sequence at the root); max: one band over both."""
    low, high = run("schedule{fusion=min}", PRODUCER_CONSUMER), run("schedule{fusion=max}", PRODUCER_CONSUMER)
    tree_low = sched.tree(low)
    assert tree_low.get_root().child(0).get_type() == isl.schedule_node_type.sequence
    assert [x["statements"] for x in bands(high)][0] == ["C", "P"]
    with pytest.raises(PassError, match="fusion='some'"):
        parse_pipeline("schedule{fusion=some}")


def test_schedule_skews_a_stencil_into_a_permutable_band() -> None:
    out = run("schedule", JACOBI1D)
    outer = bands(out)[0]
    assert outer["permutable"] and len(outer["members"]) == 2
    assert not any(outer["coincident"])  # a stencil: no parallel loop before tiling/wavefront


def test_stale_tree_is_rebuilt_from_flat_schedules() -> None:
    """A flat-schedule pass after ``schedule`` leaves a tree that no longer matches: ignored."""
    out = run("schedule,interchange", GEMM)
    tree = sched.tree(out)
    assert sched.flat_union(tree).is_equal(sched.flat_union(sched.to_tree(out)))


# -- tile and the cache model -----------------------------------------------------------------

def test_tile_on_the_scheduled_tree_and_the_cache_model() -> None:
    out = run("schedule,tile{sizes=4,4,4}", GEMM)
    assert bands(out)[0]["permutable"] and len(bands(out)) >= 2
    s = {x["name"]: isl.Map(x["schedule"]) for x in out["statements"]}
    assert s["P"].is_equal(isl.Map("{ P[i, k, j] -> [floor(i/4), floor(j/4), floor(k/4), i, j, k, 1] }"))
    # the model: a bigger budget never gives smaller tiles, and the chosen tile fits its budget
    gemm64 = json.loads(json.dumps(GEMM).replace("<= 7", "<= 63"))
    node = sched.bands(sched.tree(run("schedule", gemm64)))[0]
    small, big = model_sizes(node, gemm64, 6 << 10), model_sizes(node, gemm64, 1 << 20)
    assert small == [16, 16, 16] and big == [64, 64, 64]  # 3 arrays x 16 x 16 doubles = 6 KiB
    assert footprint(node, gemm64, small) <= 6 << 10 < footprint(node, gemm64, [32, 32, 32])


def test_time_tiling_and_wavefront_of_a_stencil() -> None:
    out = run("schedule,tile{sizes=2,4},wavefront", JACOBI1D)
    tile_band = bands(out)[0]
    assert tile_band["coincident"] == [False, True]  # tiles along a wavefront run concurrently
    assert "floor" in out["statements"][0]["schedule"]


# -- parallel, vectorize ------------------------------------------------------------------------

def test_parallel_moves_a_parallel_member_out_and_asks_for_threads() -> None:
    j = scop(stmt("S", "{ S[k, i] : 0 <= k <= 7 and 0 <= i <= 7 }", "{ S[k, i] -> [k, i] }",
                  ("read", "{ S[k, i] -> x[i] }"), ("read", "{ S[k, i] -> a[k, i] }"), ("write", "{ S[k, i] -> x[i] }")))
    out = run("parallel{threads=2}", j)
    assert isl.Map(out["statements"][0]["schedule"]).is_equal(isl.Map("{ S[k, i] -> [i, k] }"))
    assert out[sched.META]["parallel"] == {"threads": 2}
    assert "-polly-parallel" in P_flags(out)


def P_flags(j: dict) -> list[str]:
    from polyml.scop.exchange import parallel_flags

    return parallel_flags([j])


def test_vectorize_puts_the_stride_one_parallel_loop_innermost() -> None:
    out = run("schedule,tile{sizes=4,4,4},vectorize{width=4}", GEMM)
    ast = printer.ast_c(out)
    # gemm's point band [i, j, k] -> [i, k, ⌊j/4⌋, j]: the innermost loop walks C[i][j] and B[k][j]
    inner = isl.Map(out["statements"][1]["schedule"])
    # the init statement I gets its own j loop (separated at k = 0, before P's)
    assert inner.is_equal(isl.Map("{ P[i, k, j] -> [floor(i/4), floor(j/4), floor(k/4), i, k, 1, floor(j/4), j] }")), inner
    assert "if" not in ast.split("for")[-1]


def test_vectorize_separates_shifted_statements() -> None:
    """After time tiling the two statements of jacobi-1d are shifted against each other in the
    innermost loop; vectorize gives each its own guard-free innermost loop where legal."""
    out = run("schedule,tile{sizes=2,8},vectorize{width=1}", JACOBI1D)
    assert "if (" not in printer.ast_c(out).split("for")[-1]


# -- skew, fuse, distribute -----------------------------------------------------------------------

def test_skew_finds_the_least_factor() -> None:
    out = run("skew", STENCIL)  # distance (1, -1): i + j
    assert isl.Map(out["statements"][0]["schedule"]).is_equal(isl.Map("{ S[i, j] -> [i, i + j] }"))
    tiled = run("skew,tile{sizes=4,4}", STENCIL)
    assert len(bands(tiled)[0]["members"]) == 2  # both dimensions tiled once skewed


def test_fuse_legal_and_illegal() -> None:
    fused = run("fuse", PRODUCER_CONSUMER)
    assert "for" in printer.ast_c(fused) and printer.ast_c(fused).count("for (") == 1
    with pytest.raises(PassError, match=r"(?s)fuse: illegal.*read-after-write \(flow\) dependence I -> P on array C"):
        passes.run(parse_pipeline("fuse"), GEMM)


def test_distribute_legal_and_illegal() -> None:
    j = scop(stmt("S", "{ S[i] : 0 <= i <= 7 }", "{ S[i] -> [i, 0] }", ("read", "{ S[i] -> y[i - 1] }"),
                  ("write", "{ S[i] -> x[i] }")),
             stmt("T", "{ T[i] : 0 <= i <= 7 }", "{ T[i] -> [i, 1] }", ("read", "{ T[i] -> x[i] }"),
                  ("write", "{ T[i] -> y[i] }")))
    with pytest.raises(PassError, match="distribute: illegal"):
        passes.run(parse_pipeline("distribute"), j)  # T(i-1) feeds S(i): a recurrence through both
    out = run("distribute", PRODUCER_CONSUMER)
    assert printer.ast_c(out).count("for (") == 2


# -- the default policy ---------------------------------------------------------------------------

def test_default_policy_and_threads() -> None:
    assert P.choose(GEMM).pipeline == "polly"
    fw = scop(stmt("S", "{ S[k, i, j] : 0 <= k, i, j <= 7 }", "{ S[k, i, j] -> [k, i, j] }",
                   ("read", "{ S[k, i, j] -> d[i, j] }"), ("read", "{ S[k, i, j] -> d[i, k] }"),
                   ("read", "{ S[k, i, j] -> d[k, j] }"), ("write", "{ S[k, i, j] -> d[i, j] }")))
    assert P.choose(fw).pipeline == P.DEFAULT  # floyd-warshall: one array, no product for Polly
    triangular = json.loads(json.dumps(GEMM).replace("0 <= j <= 7 }", "0 <= j <= i }"))
    assert P.choose(triangular).pipeline == P.DEFAULT
    assert P.choose(JACOBI1D).pipeline == P.DEFAULT
    assert P.with_threads(P.DEFAULT, 1) == "schedule,tile,wavefront,vectorize{width=1}"
    assert "parallel{threads=2}" in P.with_threads(P.DEFAULT, 2)
    for text in P.tune_variants(20):
        parse_pipeline(text)


# -- end to end on the affine suite (small sizes) -------------------------------------------------

@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return tmp_path_factory.mktemp("sched")


def _check(kernel: str, work, passes_text: str | None, opt_args=()) -> A.Build:
    ref = A.build(kernel, "O3", "small", work / kernel)
    got = A.build(kernel, "polyml", "small", work / kernel, passes=passes_text, opt_args=opt_args)
    A.run(ref, 1, work / kernel / "ref.bin")
    for threads in (1, 2):
        A.run(got, threads, work / kernel / "got.bin")
        c = A.compare(work / kernel / "ref.bin", work / kernel / "got.bin")
        assert c.exact, f"{kernel} ({threads} threads): {c}"
    return got


@pytest.mark.parametrize("kernel,pipeline", [("jacobi-2d", P.DEFAULT), ("seidel-2d", P.DEFAULT), ("mvt", P.STREAM)])
def test_default_pipeline_matches_O3(suite, kernel: str, pipeline: str) -> None:
    """Stencils get the whole pipeline; mvt (a streaming matrix-vector nest: each matrix element
    read once) isl's loop order without tiles."""
    got = _check(kernel, suite, None)
    assert f"transformed ({pipeline})" in got.opt_output


def test_default_policy_keeps_a_schedule_that_walks_memory_better(suite) -> None:
    """atax: isl's schedule would read A down its columns in y[j] += A[i][j]·tmp[i]; the policy
    keeps the source order (and only parallel/vectorize), so the result is -O3's code."""
    got = _check("atax", suite, None)
    assert f"unchanged ({P.KEEP})" in got.opt_output


def test_time_tiled_jacobi_runs_parallel_and_vectorized(suite) -> None:
    """jacobi-2d through the default pipeline with tiles small enough for the CI size (6 steps
    on 40²): time-tiled (the time loop inside a tile band), OpenMP calls from Polly, and vector
    instructions after LLVM's -O3."""
    _check("jacobi-2d", suite, P.DEFAULT.replace("tile,", "tile{sizes=2,8,16},"),
           opt_args=["--jscop-dir", str(suite / "jacobi-2d" / "j")])
    new = next((suite / "jacobi-2d" / "j").glob("kernel_jacobi_2d*.jscop.new"))
    tree = sched.tree(json.loads(new.read_text()))
    tile = sched.bands(tree)[0]
    assert tile.band_n_member() == 3 and tile.band_get_permutable()
    assert "floor((i0)" in str(tile.band_get_partial_schedule()) or "floor((i0)" in new.read_text()
    opt_ll = (suite / "jacobi-2d" / "jacobi-2d.opt.ll").read_text()
    assert re.search(r"call .*@GOMP_parallel_loop", opt_ll)
    vec = suite / "jacobi-2d" / "vec.ll"
    subprocess.run([tool("opt"), "-O3", str(suite / "jacobi-2d" / "jacobi-2d.opt.ll"), "-S", "-o", str(vec)], check=True)
    assert re.search(r"fadd <\d+ x double>", vec.read_text())


def test_gemm_left_to_polly_matches_O3(suite) -> None:
    got = _check("gemm", suite, None)
    assert "left to Polly's optimizer" in got.opt_output
    # clang -O1's llvm.loop.unroll.disable on every loop is gone (the -O3 after polyml unrolls)
    assert "llvm.loop.unroll.disable" in (suite / "gemm" / "gemm.ll").read_text()
    assert "llvm.loop.unroll.disable" not in (suite / "gemm" / "gemm.opt.ll").read_text()


def _gemm(suite) -> None:
    """gemm built -O3 and through ``polyml opt`` (by the test above, or now)."""
    if not (suite / "gemm" / "gemm.opt.ll").exists():
        _check("gemm", suite, None)


def test_polly_functions_finds_the_code_polly_generated(suite) -> None:
    """The check behind the hand-off: Polly's blocks (``polly.*``) in gemm's function after
    ``polyml opt``, none in plain -O3's code of the same IR."""
    from polyml.scop import optimize

    _gemm(suite)
    assert "kernel_gemm" in optimize.polly_functions((suite / "gemm" / "gemm.opt.ll").read_text())
    plain = suite / "gemm" / "plain.ll"
    subprocess.run([tool("opt"), "-O3", str(suite / "gemm" / "gemm.ll"), "-S", "-o", str(plain)], check=True)
    assert optimize.polly_functions(plain.read_text()) == set()


def test_a_product_polly_leaves_unchanged_gets_polymls_pipeline(suite, monkeypatch, capsys) -> None:
    """Where Polly's optimizer takes nothing (here: it is made to do nothing), the default policy
    runs polyml's pipeline on that function instead of leaving it at -O3; an explicit
    ``--passes polly`` keeps Polly and says it left the function unchanged."""
    from polyml.scop import optimize

    _gemm(suite)
    monkeypatch.setattr(optimize, "polly_optimize", lambda *a, **k: None)
    ll = suite / "gemm" / "gemm.ll"
    out = suite / "gemm" / "dismissed.ll"
    assert main(["opt", str(ll), "-o", str(out), "--threads", "1"]) == 0
    said = "".join(capsys.readouterr())
    assert re.search(r"kernel_gemm .*transformed \(schedule,tile.*\): Polly's optimizer left it unchanged", said)
    assert "Packed_" not in out.read_text()  # polyml's schedule, not Polly's GEMM pattern
    exe = suite / "gemm" / "dismissed"
    subprocess.run([tool("clang"), "-O3", *A.COMMON, str(out), "-o", str(exe), *A.LIBS], check=True)
    a, b = suite / "gemm" / "dismissed.bin", suite / "gemm" / "O3.bin"
    A.run(A.Build("gemm", "polyml", "small", exe, ()), dump=a)
    A.run(A.Build("gemm", "O3", "small", suite / "gemm" / "gemm.O3", ()), dump=b)
    assert A.compare(b, a).exact
    assert main(["opt", str(ll), "-o", str(out), "--passes", "polly"]) == 0
    said = "".join(capsys.readouterr())
    assert "left to Polly's optimizer, which left it unchanged (-O3's code)" in said


def test_tune_keeps_the_fastest(suite, capsys) -> None:
    kernel = "atax"
    work = suite / "tune"
    ll = work / f"{kernel}.ll"
    work.mkdir()
    subprocess.run([tool("clang"), *A.IR_FLAGS, *A.COMMON, "-DSMALL", str(A.source(kernel)), "-o", str(ll)], check=True)
    out = work / "out.ll"
    assert main(["opt", str(ll), "-o", str(out), "--tune", "3", "--threads", "1"]) == 0
    record = json.loads((work / "out.ll.tune.json").read_text())
    tried = [t for t in record["trials"] if t["seconds"] is not None]
    assert len(record["trials"]) == 4 and record["trials"][0]["pipeline"] == "none"
    assert record["chosen"]["seconds"] == min(t["seconds"] for t in tried)
    assert out.read_text().startswith("; ModuleID")
    assert "kept" in capsys.readouterr().err


def test_build_passes_applies_a_pipeline_and_records_it(tmp_path) -> None:
    """``polyml build MODEL --passes P``: the pipeline runs on the op functions' SCoPs (the Gemm's
    plain nests with ``--gemm polly``), legality-checked, imported, recorded in the manifest."""
    import numpy as np

    import polyml
    from tests.test_scop_workflow import gemm_model

    model = tmp_path / "gemm.onnx"
    feeds, expected = gemm_model(model)
    pipeline = "schedule,tile{sizes=8,8,8},parallel,vectorize{width=1}"
    assert main(["build", str(model), "-o", str(tmp_path / "a"), "--gemm", "polly", "--passes", pipeline,
                 "--no-cache"]) == 0
    man = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert man["options"]["passes"] == pipeline
    assert [p["name"] for p in man["passes"]] == ["schedule", "tile", "parallel", "vectorize"]
    assert man["passes"][1]["options"]["sizes"] == [8, 8, 8]
    (staged,) = (tmp_path / "a" / "jscop-imported").glob("*.jscop")
    assert "floor((i0)/8)" in staged.read_text() and sched.META not in json.loads(staged.read_text())
    got = polyml.load(tmp_path / "a").run(feeds)["y"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(PassError, match="unknown pass 'nosuch'"):
        polyml.compile(model, tmp_path / "b", gemm="polly", passes="nosuch", cache=False)
