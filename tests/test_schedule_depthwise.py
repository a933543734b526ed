"""polyml.schedule.depthwise: depthwise Conv as its plain nest under the depthwise schedule.

The schedule tree and the loops isl generates are pinned with FileCheck; builds record the
path and the schedule, and ``--no-schedule`` builds the plain nest.  (Whole models of depthwise layers against onnxruntime, on both lowerings:
tests/test_kernels_depthwise.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

from polyml.schedule import codegen
from polyml.schedule import depthwise as D
from polyml.schedule import tree as T
from polyml.schedule.nest import Program
from polyml.testing import compile_and_compare
from tests.conftest import filecheck
from tests.test_kernels_depthwise import _dw_model

#: 20 planes 11x37, 3x3 at stride 2 with pads 1 -> 6x19 (row-wise: a row holds a 16-lane vector)
SHAPE = D.Shape(20, (11, 37), (3, 3), (2, 2), (1, 1), (1, 1), (6, 19))


def _program() -> Program:
    plan = D.Plan(SHAPE, 16, threads=2, group=3)
    return D.schedule(plan, Program.of(D.nest(SHAPE, True, ("channel",), True)))


def test_depthwise_schedule_tree_golden(golden: Path) -> None:
    filecheck(T.text(_program().tree), golden / "depthwise.schedule_tree.check")


def test_depthwise_loops_golden(golden: Path) -> None:
    filecheck(codegen.c_text(_program(), SHAPE.sizes), golden / "depthwise.schedule_loops.check")


def test_depthwise_builds_record_the_schedule_and_no_schedule_builds_the_plain_nest(tmp_path: Path) -> None:
    """A default build runs the depthwise layer on its schedule (manifest path ``schedule``
    and the schedule tree); ``--no-schedule`` builds the plain nest (path ``plain``, the padded
    reads guarded); both match onnxruntime, with a fused SiLU."""
    model = _dw_model((1, 24, 20, 30), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, chain="silu")
    for schedule, path in ((True, "schedule"), (False, "plain")):
        out = tmp_path / path
        opts = {} if schedule else {"schedule": False}
        errs = compile_and_compare(model, output_dir=out, threads=2, cache=False, **opts)
        assert errs and max(errs.values()) <= 1e-5, errs
        manifest = json.loads((out / "manifest.json").read_text())
        conv = next(f for f in manifest["functions"] if f["op_type"] == "Conv")
        assert conv["path"] == path, conv
        if schedule:
            assert any("tensorize dw.f32" in s for s in conv["schedules"]), conv
