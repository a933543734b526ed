"""polyml.schedule.exchange: ``--emit schedules`` writes what the scheduled functions ran and
``--import-schedules`` reads it back: unchanged files give the same ``model.so``, edited cache
tiles change that function's code (and its results stay onnxruntime's), bad files are refused
with the file and the reason."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest

from polyml.compiler import compile as polyml_compile
from polyml.errors import PolymlError
from polyml.testing import compile_and_compare
from tests.test_schedule_conv import _conv_model


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """A 3x3 convolution (32 -> 50 channels at 17x17: reduction blocks of whole channels, 9 taps
    each) built with ``--emit schedules``; (model file, artifact, feeds)."""
    root = tmp_path_factory.mktemp("exchange")
    model, feeds = _conv_model(32, 50, (17, 17), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, "relu")
    path = root / "conv.onnx"
    onnx.save(model, str(path))
    polyml_compile(path, root / "a", emit=["schedules"], threads=2, conv="gemm", cache=False)
    return path, root / "a", feeds


def _edited(exported: tuple[Path, Path, dict], tmp_path: Path, change) -> Path:  # noqa: ANN001
    """A copy of the exported files with ``change(entry)`` applied to the convolution's."""
    edits = tmp_path / "edits"
    shutil.copytree(exported[1] / "schedules", edits)
    (f,) = [p for p in edits.glob("*.json") if json.loads(p.read_text())["op_type"] == "Conv"]
    entry = json.loads(f.read_text())
    change(entry)
    f.write_text(json.dumps(entry))
    return edits


def _conv_function(artifact: Path) -> dict:
    return next(f for f in json.loads((artifact / "manifest.json").read_text())["functions"] if f["op_type"] == "Conv")


def test_export_holds_tiles_plan_trees_and_loops(exported: tuple[Path, Path, dict]) -> None:
    (f,) = list((exported[1] / "schedules").glob("*.json"))
    entry = json.loads(f.read_text())
    fn = _conv_function(exported[1])
    assert entry["function"] == fn["function"] and entry["family"] == "gemm"
    assert set(entry["tiles"]) == {"mc", "kc", "nc"}
    assert entry["fixed"]["kc_step"] == 9 and entry["fixed"]["k"] == 32 * 9
    assert entry["trees"] == fn["schedules"] and "tensorize fma.f32." in entry["loops"][0]
    assert fn["plans"][0]["tiles"] == entry["tiles"] and "cost_model_tiles" not in fn["plans"][0]


def test_importing_a_builds_own_schedules_gives_the_same_library(exported: tuple[Path, Path, dict], tmp_path: Path) -> None:
    edits = tmp_path / "edits"
    shutil.copytree(exported[1] / "schedules", edits)
    polyml_compile(exported[0], tmp_path / "b", import_schedules=str(edits), threads=2, conv="gemm", cache=False)
    assert (tmp_path / "b" / "model.so").read_bytes() == (exported[1] / "model.so").read_bytes()


def test_edited_tiles_change_the_code_and_keep_the_results(exported: tuple[Path, Path, dict], tmp_path: Path) -> None:
    own = json.loads(next((exported[1] / "schedules").glob("*.json")).read_text())["tiles"]
    new = {"mc": 24, "kc": 9 * 8, "nc": 64}
    assert new != own
    edits = _edited(exported, tmp_path, lambda e: e.update(tiles=new))
    model = onnx.load(str(exported[0]))
    errs = compile_and_compare(model, exported[2], output_dir=tmp_path / "b", import_schedules=str(edits), threads=2,
                               conv="gemm", cache=False)
    assert errs and max(errs.values()) <= 1e-5, errs
    assert (tmp_path / "b" / "model.so").read_bytes() != (exported[1] / "model.so").read_bytes()
    fn = _conv_function(tmp_path / "b")
    assert fn["plans"][0]["tiles"] == new and fn["plans"][0]["cost_model_tiles"] == own
    assert "mod 72" in fn["schedules"][0] and "mod 24" in fn["schedules"][0]  # k in blocks of 72, i of 24


@pytest.mark.parametrize(("change", "message"), [
    (lambda e: e["tiles"].update(mc=13), "multiple of the register tile's mr"),
    (lambda e: e["tiles"].update(nc=40), "multiple of the register tile's nr"),
    (lambda e: e["tiles"].update(kc=10), "whole input channels"),
    (lambda e: e["tiles"].update(mr=4), "not cache tiles"),
    (lambda e: e["tiles"].update(kc=0), "positive integer"),
    (lambda e: e.update(node="no_such_node"), "no function of this build"),
    (lambda e: e["fixed"].update(m=64), "written for another product"),
    (lambda e: e["trees"].__setitem__(0, e["trees"][0].replace("mod 12", "mod 6")), "trees are derived from the tiles"),
], ids=["mc", "nc", "kc-step", "unknown", "zero", "node", "shape", "tree"])
def test_bad_schedule_files_are_refused(exported: tuple[Path, Path, dict], tmp_path: Path, change, message: str) -> None:  # noqa: ANN001
    edits = _edited(exported, tmp_path, change)
    with pytest.raises(PolymlError, match=message):
        polyml_compile(exported[0], tmp_path / "b", import_schedules=str(edits), threads=2, conv="gemm", cache=False)


def test_malformed_and_missing_folders_are_refused(exported: tuple[Path, Path, dict], tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.json").write_text("{not json")
    for folder, message in ((tmp_path / "bad", "not a schedule file"), (tmp_path / "none", "not a folder")):
        with pytest.raises(PolymlError, match=message):
            polyml_compile(exported[0], tmp_path / "b", import_schedules=str(folder), cache=False)


@pytest.mark.parametrize(("xs", "strides", "tile"), [((1, 24, 20, 30), [2, 2], "group"), ((1, 5, 60, 40), [1, 1], "band")])
def test_depthwise_units_are_tiles_too(xs: tuple, strides: list, tile: str, tmp_path: Path) -> None:
    """A depthwise convolution's file holds its unit (``group`` planes, or ``band`` rows of every
    plane for large planes at two threads): imported unchanged it gives the same library, edited
    it changes the code and keeps onnxruntime's results, out of range it is refused."""
    from tests.test_kernels_depthwise import _dw_model

    if tile == "band" and (os.cpu_count() or 1) < 2:
        pytest.skip("row bands need two threads")
    model = _dw_model(xs, (3, 3), {"pads": [1, 1, 1, 1], "strides": strides}, chain="silu")
    path = tmp_path / "dw.onnx"
    onnx.save(model, str(path))
    polyml_compile(path, tmp_path / "a", emit=["schedules"], threads=2, cache=False)
    (f,) = [p for p in (tmp_path / "a" / "schedules").glob("*.json") if json.loads(p.read_text())["op_type"] == "Conv"]
    entry = json.loads(f.read_text())
    assert entry["family"] == "depthwise" and list(entry["tiles"]) == [tile]
    edits = tmp_path / "edits"
    edits.mkdir()
    (edits / f.name).write_text(f.read_text())
    polyml_compile(path, tmp_path / "b", import_schedules=str(edits), threads=2, cache=False)
    assert (tmp_path / "b" / "model.so").read_bytes() == (tmp_path / "a" / "model.so").read_bytes()
    own = entry["tiles"][tile]
    entry["tiles"][tile] = 1 if own != 1 else 2
    (edits / f.name).write_text(json.dumps(entry))
    errs = compile_and_compare(model, output_dir=tmp_path / "c", import_schedules=str(edits), threads=2, cache=False)
    assert errs and max(errs.values()) <= 1e-5, errs
    assert (tmp_path / "c" / "model.so").read_bytes() != (tmp_path / "a" / "model.so").read_bytes()
    fn = _conv_function(tmp_path / "c")
    assert fn["plans"][0]["tiles"] == entry["tiles"] and fn["plans"][0]["cost_model_tiles"] == {tile: own}
    entry["tiles"][tile] = 10_000
    (edits / f.name).write_text(json.dumps(entry))
    with pytest.raises(PolymlError, match=f"tile {tile}=10000 must be an integer from 1"):
        polyml_compile(path, tmp_path / "d", import_schedules=str(edits), threads=2, cache=False)
