"""polyml.schedule.depthwise: depthwise Conv as its plain nest under the depthwise schedule.

The schedule tree and the loops isl generates are pinned with FileCheck; builds record the
path and the schedule, and ``--no-schedule`` builds the plain nest.  (Whole models of depthwise layers against onnxruntime, on both lowerings:
tests/test_kernels_depthwise.py.)
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llvmlite.ir as ir
import numpy as np
import pytest

from polyml.schedule import codegen
from polyml.schedule import depthwise as D
from polyml.schedule import tree as T
from polyml.schedule.intrinsics import DepthwisePhaseCopy, DepthwiseTile
from polyml.schedule.nest import Program
from polyml.testing import compile_and_compare
from tests.conftest import filecheck, shared_library
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


def _aligned(n: int) -> np.ndarray:
    """``n`` NaN floats starting on a 64-byte boundary, as the arena places every buffer (the
    tile intrinsic reads the phase copy with aligned vector loads)."""
    raw = np.full(n + 16, np.nan, np.float32)
    start = (-raw.ctypes.data % 64) // 4
    return raw[start:start + n]


def _compiled(program: Program, plan: D.Plan, tmp_path: Path, name: str):  # noqa: ANN202
    """``program`` as a C-callable ``dw(X, W, Y, Cb, Xph)`` (clang, OpenMP)."""
    module = ir.Module(name)
    f32p = ir.FloatType().as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [f32p] * 5), "dw")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    attrs = ("nounwind",)
    tile, copy = DepthwiseTile(plan.geometry, attrs, None, "Cb"), DepthwisePhaseCopy(plan.geometry)
    arrays = dict(zip(("X", "W", "Y", "Cb", "Xph"), fn.args))
    codegen.Emitter(module, fn, builder, program, arrays, plan.shape.sizes, {tile.name: tile, copy.name: copy},
                    attrs).emit(plan.shape.sizes)
    builder.ret_void()
    lib = shared_library(str(module), tmp_path, name)
    lib.dw.argtypes = [ctypes.POINTER(ctypes.c_float)] * 5
    return lib.dw


#: 7 planes 9x9, 3x3 stride 1 pads 1: rows shorter than a vector, the plane on the ``.flat`` tile
FLAT = D.Shape(7, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1), (9, 9))
#: 5 planes 14x20, 5x3 stride (1, 2), dilation (2, 1), pads (4, 1)
DILATED = D.Shape(5, (14, 20), (5, 3), (1, 2), (2, 1), (4, 1), (14, 10))
INTRINSIC_PLANS = {
    "rows-groups": D.Plan(SHAPE, 16, threads=2, group=3),
    "row-bands": D.Plan(SHAPE, 16, threads=2, band=2),
    "flat": D.Plan(FLAT, 16, threads=2, group=2),
    "dilated-one-thread": D.Plan(DILATED, 16, threads=1, group=2),
}


@pytest.mark.parametrize("key", list(INTRINSIC_PLANS))
def test_depthwise_intrinsics_compute_what_the_statements_mean(key: str, tmp_path: Path) -> None:
    """The scheduled depthwise nest with its phase copy made by ``dwcopy`` and by the loops isl
    generates for the copy statement (from the padding's first row and column, -1: the loop
    counters start below zero), its planes on ``dw.f32``: both equal numpy's convolution."""
    plan = INTRINSIC_PLANS[key]
    shape = plan.shape
    rng = np.random.default_rng(11)
    x = rng.standard_normal((shape.channels, *shape.size), dtype=np.float32)
    w = rng.standard_normal((shape.channels, *shape.kernel), dtype=np.float32)
    bias = rng.standard_normal(shape.channels, dtype=np.float32)
    (sh, sw), (dh, dw), (ph, pw) = shape.strides, shape.dilations, shape.pads_begin
    xp = np.pad(x.astype(np.float64), ((0, 0), (ph, ph + 16), (pw, pw + 16)))
    ref = np.zeros((shape.channels, *shape.out))
    for kh in range(shape.kernel[0]):
        for kw in range(shape.kernel[1]):
            win = xp[:, kh * dh:kh * dh + sh * shape.out[0]:sh, kw * dw:kw * dw + sw * shape.out[1]:sw]
            ref += w[:, kh, kw][:, None, None] * win
    ref = ref.reshape(shape.channels, -1) + bias[:, None]
    fp = ctypes.POINTER(ctypes.c_float)
    for copy_intrinsic in (True, False):
        program = D.schedule(plan, Program.of(D.nest(shape, True)), False, copy_intrinsic)
        assert ("tensorize dwcopy" in T.text(program.tree)) == copy_intrinsic
        fn = _compiled(program, plan, tmp_path, f"dw{int(copy_intrinsic)}")
        y = np.full((shape.channels, shape.out[0] * shape.out[1]), np.nan, np.float32)
        fn(*(a.ctypes.data_as(fp) for a in (x, w, y, bias, _aligned(plan.scratch_floats))))
        assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), copy_intrinsic
