"""``polyml opt`` failures a researcher can act on.

* The suite's in-place LU through ``--passes tile``: the harness's ``affine_finish`` has two
  va_arg SCoPs that the pipeline leaves unchanged; importing them aborts opt, as after
  generating the first Polly re-analyses the second and it does not match the exported file.
  Unchanged SCoPs are not imported, so LU runs and matches -O3.
* When opt does fail (forced here with the ``identity`` round trip, which does re-import them),
  polyml shows opt's own message, not its backtrace, and keeps the IR, the JSCoPs and a command
  that reproduces the failure in ``failed/`` next to ``-o``.
* Schedules Polly's importer cannot take are prepared or refused before opt runs: a schedule
  without the SCoP's parameters (opt aborted: "position or range out of bounds") is given them;
  one with a parameter the SCoP lacks (opt aborted: "band node is not allowed to introduce new
  parameters") is refused with the reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from polyml import affine_suite as A
from polyml.cli import main
from polyml.driver.toolchain import tool, tool_message
from polyml.scop import importable
from polyml.scop import jscop as J


@pytest.fixture(scope="module")
def lu(tmp_path_factory) -> Path:
    """The suite's LU at its small size: clang's IR and the -O3 build's output."""
    d = tmp_path_factory.mktemp("lu")
    ref = A.build("lu", "O3", "small", d)
    A.run(ref, dump=d / "ref.bin")
    subprocess.run([tool("clang"), *A.IR_FLAGS, *A.COMMON, "-DSMALL", str(A.source("lu")), "-o", str(d / "lu.ll")],
                   check=True)
    return d


def test_lu_tile_imports_and_matches_O3(lu, capsys) -> None:
    out = lu / "tiled" / "lu.opt.ll"
    out.parent.mkdir()
    assert main(["opt", str(lu / "lu.ll"), "--passes", "tile", "-o", str(out)]) == 0
    report = capsys.readouterr().err  # polyml reports on stderr
    assert "kernel_lu" in report and "transformed" in report
    assert "affine_finish %for.cond---%vaarg.end: 1 statement(s), unchanged" in report
    exe = lu / "tiled" / "lu"
    subprocess.run([tool("clang"), "-O3", *A.COMMON, str(out), "-o", str(exe), *A.LIBS], check=True)
    subprocess.run([str(exe), str(lu / "tiled.bin")], check=True, capture_output=True)
    # tiling keeps each element's update order: bit for bit the -O3 result
    assert np.array_equal(np.fromfile(lu / "tiled.bin"), np.fromfile(lu / "ref.bin"))
    assert not (out.parent / "failed").exists()


def test_failed_import_shows_opt_message_and_keeps_inputs(lu, capsys) -> None:
    out = lu / "round-trip" / "lu.opt.ll"
    out.parent.mkdir()
    assert main(["opt", str(lu / "lu.ll"), "--passes", "identity", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "The number of memory accesses in the JSop file and the number of memory accesses differ" in err
    assert "LLVM ERROR: Tried to import a malformed jscop file." in err
    assert "Stack dump" not in err and "llvm::" not in err  # opt's message, not its backtrace
    failed = out.parent / "failed"
    assert (failed / "lu.ll").is_file() and (failed / "lu.stderr.txt").is_file()
    staged = sorted(p.name for p in (failed / "stage").glob("*.jscop"))
    assert any(n.startswith("kernel_lu___") for n in staged) and any(n.startswith("affine_finish___") for n in staged)
    command = (failed / "lu.command.sh").read_text()
    assert f"-polly-import-jscop-dir={failed / 'stage'}" in command and str(failed / "lu.ll") in command
    assert "reproduce with: " + command.strip() in err
    # the kept command reproduces the failure from anywhere, after polyml's temp folder is gone
    proc = subprocess.run(["bash", str(failed / "lu.command.sh")], capture_output=True, text=True, cwd="/")
    assert proc.returncode != 0
    assert tool_message(proc.stderr) == tool_message((failed / "lu.stderr.txt").read_text())


def test_tool_message_of_a_plain_error() -> None:
    proc = subprocess.run([tool("opt"), "-passes=no-such-pass", "/dev/null", "-disable-output"], capture_output=True,
                          text=True)
    assert proc.returncode != 0
    assert "no-such-pass" in tool_message(proc.stderr)


PARAMETRIC = """
void k2(int n, int m, double A[restrict n][m]) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < m; j++)
      A[i][j] = A[i][j] * 2.0 + i;
}
int main(void) {
  enum { N = 37, M = 29 };
  static double A[N][M];
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) A[i][j] = i * 0.5 - j;
  k2(N, M, A);
  double s = 0;
  for (int i = 0; i < N; i++)
    for (int j = 0; j < M; j++) s += A[i][j] * (i + 1) * (j + 3);
  __builtin_printf("%.17g\\n", s);
  return 0;
}
"""


@pytest.fixture(scope="module")
def parametric(tmp_path_factory) -> tuple[Path, dict, str]:
    """A kernel over parameters [n, m], its IR and its exported JSCoP."""
    d = tmp_path_factory.mktemp("param")
    (d / "k2.c").write_text(PARAMETRIC)
    subprocess.run([tool("clang"), *A.IR_FLAGS, str(d / "k2.c"), "-o", str(d / "k2.ll")], check=True)
    assert main(["opt", str(d / "k2.ll"), "--passes", "identity", "-o", str(d / "id.ll"), "--jscop-dir",
                 str(d / "jscop")]) == 0
    (path,) = [p for p in J.find(d / "jscop") if p.name.startswith("k2___")]
    ref = subprocess.run([tool("clang"), "-O2", str(d / "k2.c"), "-o", str(d / "ref")], check=True)
    ref = subprocess.run([str(d / "ref")], capture_output=True, text=True, check=True).stdout
    return d, {"name": path.name, "data": J.load(path)}, ref


def _edit(d: Path, scop: dict, schedule: str, folder: str) -> Path:
    data = json.loads(json.dumps(scop["data"]))
    (stmt,) = data["statements"]
    stmt["schedule"] = schedule.replace("S", stmt["name"])
    (d / folder).mkdir()
    J.dump(data, d / folder / scop["name"])
    return d / folder


def test_schedule_without_the_scop_parameters_is_given_them(parametric, capsys) -> None:
    d, scop, ref = parametric
    assert "[n, m]" in scop["data"]["context"]
    edits = _edit(d, scop, "{ S[i0, i1] -> [i1, i0] }", "no-params")  # opt-19 aborted on this before
    out = d / "interchanged.ll"
    assert main(["opt", str(d / "k2.ll"), "--import-jscop", str(edits), "-o", str(out)]) == 0
    assert "k2 %entry.split---%for.end13: 1 statement(s), transformed" in capsys.readouterr().err
    subprocess.run([tool("clang"), "-O2", str(out), "-o", str(d / "interchanged")], check=True)
    got = subprocess.run([str(d / "interchanged")], capture_output=True, text=True, check=True).stdout
    assert got == ref


def test_schedule_with_a_new_parameter_is_refused(parametric, capsys) -> None:
    d, scop, _ = parametric
    edits = _edit(d, scop, "[n, m, T] -> { S[i0, i1] -> [i0, i1 + T] }", "new-param")
    out = d / "bad" / "k2.ll"
    out.parent.mkdir()
    assert main(["opt", str(d / "k2.ll"), "--import-jscop", str(edits), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "parameter(s) T that the SCoP does not have (its parameters: n, m)" in err
    assert not out.exists() and not (out.parent / "failed").exists()  # refused before opt ran


def test_prepare_aligns_parameters_and_unnames_the_range() -> None:
    scop = {"context": "[n, m] -> { : }", "statements": [
        {"name": "S", "domain": "[n, m] -> { S[i, j] : 0 <= i < n and 0 <= j < m }", "accesses": [],
         "schedule": "[m, n] -> { S[i, j] -> T[j + m, i] }"},
        {"name": "U", "domain": "[n, m] -> { U[i] : 0 <= i < n }", "accesses": [], "schedule": "{ U[i] -> [i] }"}]}
    out = importable.prepare(scop, "x")
    s, u = (J.schedule_map(st) for st in out["statements"])
    for m in (s, u):
        assert [m.get_space().get_dim_name(J.isl.dim_type.param, i) for i in range(2)] == ["n", "m"]
        assert not m.has_tuple_id(J.isl.dim_type.out) and m.dim(J.isl.dim_type.out) == 2
    assert s.is_equal(J.isl.Map("[n, m] -> { S[i, j] -> [j + m, i] }"))
    assert importable.same_schedules(scop, out) and not importable.same_schedules(
        scop, J.with_schedules(scop, {"U": "{ U[i] -> [i + 1] }"}))


def test_a_pass_that_crashes_is_named(parametric) -> None:
    """A bug in a pass (here one that indexes past its statements) is a PassError naming the
    pass, the SCoP and the line, not a traceback out of polyml."""
    from dataclasses import dataclass

    from polyml import passes

    @dataclass(frozen=True)
    class Broken(passes.Pass):
        name = "broken"

        def apply(self, scop: dict) -> dict:
            return scop["statements"][5]

    _, scop, _ = parametric
    with pytest.raises(passes.PassError) as info:
        passes.run([*passes.parse_pipeline("identity"), Broken()], scop["data"])
    msg = str(info.value)
    assert "pass 'broken' failed on SCoP '%entry.split---%for.end13': IndexError" in msg
    assert "test_opt_failures.py:" in msg and "--after 'identity,broken'" in msg
