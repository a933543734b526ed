"""The pass layer: registry and entry points, pipeline syntax, and what each pass does to a
schedule (checked with isl: the new schedules, their legality, the dependences they keep)."""

from __future__ import annotations

import sys
import textwrap

import islpy as isl
import pytest

from polyml import passes
from polyml.cli import main
from polyml.passes import PassError, parse_pipeline, split_pipeline
from polyml.scop import legality, printer
from polyml.scop import schedule as sched
from tests.test_scop_legality import GEMM, STENCIL


def schedules(j: dict) -> dict[str, isl.Map]:
    return {s["name"]: isl.Map(s["schedule"]) for s in j["statements"]}


def test_builtin_passes_are_registered() -> None:
    infos = passes.available()
    for name in ("identity", "interchange", "tile"):
        assert infos[name].cls is not None and infos[name].origin.startswith("polyml")
        assert infos[name].summary


@pytest.mark.parametrize("text,expected", [
    ("tile", [("tile", {})]),
    ("tile{sizes=32,8}", [("tile", {"sizes": "32,8"})]),
    (" interchange{dims=1,2 stmts=S.*} , tile ", [("interchange", {"dims": "1,2", "stmts": "S.*"}), ("tile", {})]),
])
def test_pipeline_syntax(text, expected) -> None:
    assert split_pipeline(text) == expected


@pytest.mark.parametrize("text,message", [
    ("nosuch", "unknown pass 'nosuch'"),
    ("tile{sizes=32", "is not closed"),
    ("tile{sizes}", "is not key=value"),
    ("tile{depth=2}", "pass 'tile' has no option 'depth'"),
    ("tile{sizes=a,b}", "option sizes='a,b' is not a valid"),
    ("tile tile", "expected ','"),
])
def test_pipeline_errors(text, message) -> None:
    with pytest.raises(PassError, match=message):
        parse_pipeline(text)


def test_spec_round_trips() -> None:
    for text in ("identity", "tile{sizes=32,8}", "interchange{dims=2,3}"):
        (p,) = parse_pipeline(text)
        assert p.spec() == text
    (p,) = parse_pipeline("tile{sizes=16x4}")
    assert p.sizes == (16, 4)


def test_identity_is_pure() -> None:
    (p,) = parse_pipeline("identity")
    out = p.apply(GEMM)
    assert out == GEMM and out is not GEMM


def test_interchange_swaps_schedule_dims() -> None:
    out = passes.run(parse_pipeline("interchange{dims=2,3 stmts=P}"), GEMM)
    s = schedules(out)
    assert s["P"].is_equal(isl.Map("{ P[i, k, j] -> [1, i, j, k] }"))
    assert s["I"].is_equal(isl.Map("{ I[i, j] -> [0, i, j, 0] }"))
    legality.check(GEMM, out, "gemm")


def test_interchange_default_and_illegal() -> None:
    out = passes.run(parse_pipeline("interchange"), STENCIL)  # the two outermost loops
    assert schedules(out)["S"].is_equal(isl.Map("{ S[i, j] -> [j, i] }"))
    with pytest.raises(legality.IllegalScheduleError, match="dependence S -> S on array A"):
        legality.check(STENCIL, out, "stencil")
    with pytest.raises(PassError, match="out of range"):
        passes.run(parse_pipeline("interchange{dims=1,7}"), STENCIL)


def test_tree_of_a_flat_schedule() -> None:
    """[0, i, j, 0] / [1, i, k, j]: a sequence of two bands (the init nest, then the product)."""
    tree = sched.to_tree(GEMM)
    bands = sched.bands(tree)
    assert [b.band_n_member() for b in bands] == [2, 3]
    from polyml.scop import dependences

    deps = dependences.compute(GEMM).all()
    assert [sched.permutable_prefix(b, deps) for b in bands] == [2, 3]


def test_tile_gemm() -> None:
    out = passes.run(parse_pipeline("tile{sizes=4,4}"), GEMM)
    s = schedules(out)
    assert s["I"].is_equal(isl.Map("{ I[i, j] -> [0, floor(i/4), floor(j/4), i, j, 0] }"))
    assert s["P"].is_equal(isl.Map("{ P[i, k, j] -> [1, floor(i/4), floor(k/4), i, k, j] }"))
    legality.check(GEMM, out, "gemm")
    assert "for (int c1 = 0; c1 <= 1; c1 += 1)" in printer.ast_c(out)


def test_tile_stops_at_a_non_permutable_member() -> None:
    """The stencil's distance (1, -1): j runs backwards, so only i is tiled (j stays a point loop)."""
    out = passes.run(parse_pipeline("tile{sizes=4,4}"), STENCIL)
    assert schedules(out)["S"].is_equal(isl.Map("{ S[i, j] -> [floor(i/4), i, j] }"))
    legality.check(STENCIL, out, "stencil")


def test_third_party_pass_from_an_entry_point(tmp_path, monkeypatch, capsys) -> None:
    """A distribution registering ``polyml.passes = reverse = ...`` shows up in `polyml passes`
    and runs in pipelines."""
    pkg = tmp_path / "site"
    (pkg / "reverse_pass-1.0.dist-info").mkdir(parents=True)
    (pkg / "reverse_pass-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: reverse-pass\nVersion: 1.0\n")
    (pkg / "reverse_pass-1.0.dist-info" / "entry_points.txt").write_text(
        "[polyml.passes]\nreverse = reverse_pass:Reverse\nbroken = reverse_pass:Missing\n")
    (pkg / "reverse_pass.py").write_text(textwrap.dedent('''
        from dataclasses import dataclass
        from typing import ClassVar
        from polyml.passes import Pass
        from polyml.scop import jscop as J

        @dataclass(frozen=True)
        class Reverse(Pass):
            """Reverse the innermost schedule dimension: t_n -> -t_n."""
            name: ClassVar[str] = "reverse"

            def apply(self, scop):
                import islpy as isl
                w = J.schedule_width(scop)
                t = ", ".join(f"t{i}" for i in range(w))
                rev = isl.Map(f"{{ [{t}] -> [{t[:-len(f't{w-1}')]}-t{w-1}] }}")
                return J.with_schedules(scop, {s["name"]: J.schedule_map(s).apply_range(rev) for s in scop["statements"]})
    '''))
    monkeypatch.syspath_prepend(str(pkg))
    try:
        infos = passes.available(reload=True)
        assert infos["reverse"].origin == "reverse-pass 1.0 (reverse_pass:Reverse)"
        assert infos["reverse"].summary == "Reverse the innermost schedule dimension: t_n -> -t_n."
        assert "cannot load" in infos["broken"].error
        out = passes.run(parse_pipeline("reverse"), STENCIL)
        assert schedules(out)["S"].is_equal(isl.Map("{ S[i, j] -> [i, -j] }"))
        assert main(["passes"]) == 0
        listing = capsys.readouterr().out
        assert "reverse" in listing and "reverse-pass 1.0" in listing
        with pytest.raises(PassError, match="cannot load"):
            parse_pipeline("broken")
    finally:
        sys.modules.pop("reverse_pass", None)
        monkeypatch.undo()
        passes.available(reload=True)
