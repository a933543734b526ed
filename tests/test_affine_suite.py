"""The affine kernel suite at its small sizes through ``polyml opt``'s default pipeline.

Every kernel of ``benchmarks/affine/`` is built as clang -O3 (the reference) and through polyml
(clang's IR, ``polyml opt``, clang -O3); the polyml build's dumped arrays must equal the
reference's (normwise 1e-9, :mod:`polyml.affine_suite`), and every schedule polyml imported is
re-checked here, independently of ``polyml opt``, against the dependences of the SCoP Polly
exported (``--jscop-dir`` keeps both).  ``polyml opt`` itself refuses an illegal schedule
(``test_an_illegal_pipeline_is_refused``), so a pass that produced one fails the build.
Builds run two at a time (about a minute on two cores).
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from polyml import affine_suite as A
from polyml.cli import main
from polyml.driver.toolchain import tool
from polyml.scop import jscop as J
from polyml.scop import legality

#: polyml opt's default pipeline (None); POLYML_AFFINE_PASSES tries another one
PASSES = os.environ.get("POLYML_AFFINE_PASSES") or None
#: seconds polyml opt may take on one small kernel (2-5 s on the loaded 2-core host): a
#: scheduler that blows up fails here instead of stalling CI
OPT_TIMEOUT = 90


def _one(kernel: str, work: Path) -> dict:
    d = work / kernel
    try:
        ref = A.build(kernel, "O3", "small", d)
        got = A.build(kernel, "polyml", "small", d, passes=PASSES, opt_args=["--jscop-dir", str(d / "jscop")],
                      opt_timeout=OPT_TIMEOUT)
        A.run(ref, dump=d / "ref.bin")
        A.run(got, threads=2, dump=d / "polyml.bin")
    except Exception as e:  # reported by the kernel's test
        return {"error": f"{type(e).__name__}: {e}"}
    return {"comparison": A.compare(d / "ref.bin", d / "polyml.bin"), "report": got.opt_output, "jscop": d / "jscop",
            "same_code": A.kernel_code(got.exe, kernel) == A.kernel_code(ref.exe, kernel)}


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict[str, dict]:
    work = tmp_path_factory.mktemp("affine")
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(A.KERNELS, pool.map(lambda k: _one(k, work), A.KERNELS)))


@pytest.mark.parametrize("kernel", A.KERNELS)
def test_kernel_matches_O3(suite, kernel: str) -> None:
    r = suite[kernel]
    assert "error" not in r, r.get("error")
    fn = "kernel_" + kernel.replace("-", "_")
    assert f"{fn} %" in r["report"], f"no SCoP in {fn}:\n{r['report']}"  # the kernel is a SCoP
    assert r["comparison"].ok, f"{kernel}: polyml's output differs from -O3's ({r['comparison']})"
    for new in sorted(r["jscop"].glob("*.jscop.new")):  # what polyml imported, checked again here
        original = J.load(new.with_suffix(""))
        legality.check(original, J.load(new), new.name)


def test_same_code_tells_kept_from_rescheduled_kernels(suite) -> None:
    """bench_affine marks kernels whose polyml build is -O3's machine code (their ratio is noise):
    trisolv keeps its source order (same code), gemm goes through Polly's GEMM optimizer (not)."""
    assert suite["trisolv"]["same_code"] is True
    assert suite["gemm"]["same_code"] is False


def test_suite_is_complete() -> None:
    assert sorted(p.stem for p in A.SUITE.glob("*.c")) == sorted(A.KERNELS)
    assert set(A.STENCILS) <= set(A.KERNELS)


def test_an_illegal_pipeline_is_refused(tmp_path, capsys) -> None:
    """Interchanging jacobi-2d's time loop with its row loop reads rows of the next step before
    they are written: polyml opt must refuse it (exit 2) and write nothing."""
    ll = tmp_path / "jacobi-2d.ll"
    subprocess.run([tool("clang"), *A.IR_FLAGS, *A.COMMON, "-DSMALL", str(A.source("jacobi-2d")), "-o", str(ll)],
                   check=True)
    out = tmp_path / "x.ll"
    assert main(["opt", str(ll), "--passes", "interchange{dims=0,2 stmts=Stmt_for_body8}", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "illegal schedule" in err and "dependence" in err
    assert not out.exists()
