"""polyml.schedule.conv: Conv as its 6-deep plain nest under the GEMM's schedule seen through im2col.

The schedule tree and the loops isl generates are pinned with FileCheck; convolutions built
through it match onnxruntime at edge shapes (partial register tiles and panels, strides,
dilations, asymmetric pads, 1x1 windows, bias and fused chains, one thread or two); the im2col
copy intrinsic writes what the loops isl generates for the same copy statement write; the
manifest records the path, and ``--no-schedule`` builds the plain nest.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import llvmlite.ir as ir
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyml.codegen import gemm as packed
from polyml.schedule import codegen
from polyml.schedule import conv as scheduled_conv
from polyml.schedule import gemm as scheduled_gemm
from polyml.schedule import tree as T
from polyml.schedule.intrinsics import FmaTile
from polyml.schedule.nest import Program
from polyml.testing import compile_and_compare
from tests.conftest import filecheck, shared_library

BLK = packed.Blocking(12, 32, 16, mc=96, kc=256, nc=512)
SHAPE = scheduled_conv.Shape(16, 40, (10, 12), (3, 3), (1, 2), (1, 1), (1, 1), (10, 6))


def _program() -> Program:
    plan = scheduled_gemm.plan(SHAPE.m, SHAPE.n, SHAPE.k, BLK, 2, a_constant=True, kc_step=SHAPE.taps)
    return scheduled_conv.schedule(plan, SHAPE, Program.of(scheduled_conv.nest(SHAPE, True, ("element",))))


def test_conv_schedule_tree_golden(golden: Path) -> None:
    filecheck(T.text(_program().tree), golden / "conv.schedule_tree.check")


def test_conv_loops_golden(golden: Path) -> None:
    filecheck(codegen.c_text(_program(), SHAPE.sizes), golden / "conv.schedule_loops.check")


def _conv_model(c: int, m: int, hw: tuple[int, int], kernel: tuple[int, int], strides=(1, 1), pads=(0, 0, 0, 0),
                dilations=(1, 1), bias: bool = True, chain: str = "", seed: int = 0) -> tuple[onnx.ModelProto, dict]:
    """Conv (constant weights, optional bias) followed by ``chain``: ``relu``, ``residual``
    (Relu then Add of a second input of the output's shape), ``clip`` or ``scale`` (Mul by a
    per-channel constant)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((m, c, *kernel)) / np.sqrt(c * kernel[0] * kernel[1])).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b"))
    ext = [(d * (k - 1) + 1) for k, d in zip(kernel, dilations)]
    out = [(hw[i] + pads[i] + pads[i + 2] - ext[i]) // strides[i] + 1 for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["c"], kernel_shape=list(kernel),
                              strides=list(strides), pads=list(pads), dilations=list(dilations))]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, *hw])]
    feeds = {"x": rng.standard_normal((1, c, *hw)).astype(np.float32)}
    last = "c"
    if chain in ("relu", "residual"):
        nodes.append(helper.make_node("Relu", [last], ["r"]))
        last = "r"
    if chain == "residual":
        inputs.append(helper.make_tensor_value_info("skip", TensorProto.FLOAT, [1, m, *out]))
        feeds["skip"] = rng.standard_normal((1, m, *out)).astype(np.float32)
        nodes.append(helper.make_node("Add", [last, "skip"], ["s"]))
        last = "s"
    if chain == "clip":
        inits += [numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["k"]))
        last = "k"
    if chain == "scale":
        inits.append(numpy_helper.from_array(rng.standard_normal((m, 1, 1)).astype(np.float32), "g"))
        nodes.append(helper.make_node("Mul", [last, "g"], ["g_out"]))
        last = "g_out"
    graph = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), feeds


#: (C, M, (H, W), kernel, strides, pads, dilations, bias, chain)
CASES = [
    (16, 40, (10, 12), (3, 3), (1, 2), (1, 1, 1, 1), (1, 1), True, "residual"),
    (32, 50, (17, 17), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, "relu"),
    (64, 64, (28, 28), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, ""),
    (8, 24, (15, 13), (5, 3), (2, 1), (2, 0, 1, 2), (1, 2), True, "clip"),
    (64, 36, (14, 14), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True, "scale"),
    (48, 64, (14, 14), (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), False, "relu"),
    (12, 13, (9, 30), (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), True, ""),
    (24, 36, (6, 4), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, ""),  # one block: no loop around the first copy
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[3][0]}x{c[3][1]}-s{c[4][0]}{c[4][1]}-{c[8] or 'none'}"
                                             for c in CASES])
@pytest.mark.parametrize("threads", [1, 2])
def test_scheduled_conv_matches_onnxruntime(case: tuple, threads: int, tmp_path: Path) -> None:
    c, m, hw, kernel, strides, pads, dilations, bias, chain = case
    model, feeds = _conv_model(c, m, hw, kernel, strides, pads, dilations, bias, chain)
    errs = compile_and_compare(model, feeds, output_dir=tmp_path / "b", threads=threads, conv="gemm")
    assert errs and max(errs.values()) <= 1e-5, errs
    fns = json.loads((tmp_path / "b" / "manifest.json").read_text())["functions"]
    conv = next(f for f in fns if f["op_type"] == "Conv")
    assert conv["path"] == "schedule", conv
    tree = conv["schedules"][0]
    assert "S[m, oh, ow, c, kh, kw]" in tree and "tensorize fma.f32." in tree
    assert ("tensorize im2col.f32." in tree) == (kernel != (1, 1) or strides != (1, 1))
    assert len(fns) == 1 or not chain, "the chain runs in the convolution's finishing statement"


def test_no_schedule_builds_the_plain_conv(tmp_path: Path) -> None:
    """``--no-schedule``: the convolution as its plain nest (the zero-padded reads guarded), no
    packing buffers, no weights laid out at compile time, as onnxruntime computes it."""
    model, feeds = _conv_model(8, 24, (15, 13), (5, 3), (2, 1), (2, 0, 1, 2), (1, 2), True, "residual")
    errs = compile_and_compare(model, feeds, output_dir=tmp_path / "b", schedule=False)
    assert errs and max(errs.values()) <= 1e-5, errs
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    conv = next(f for f in manifest["functions"] if f["op_type"] == "Conv")
    assert conv["path"] == "plain" and "plain" in conv["detail"]
    assert not [s for s in manifest["slots"] if s["kind"] == "weight" and "#const" in s["name"]]


def _compiled(program: Program, shape: scheduled_conv.Shape, tmp_path: Path, name: str):  # noqa: ANN202
    """``program`` as a C-callable ``conv(X, Ac, Y, Cb, Bp)`` (clang, OpenMP)."""
    module = ir.Module(name)
    f32p = ir.FloatType().as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [f32p] * 5), "conv")
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    attrs = ("nounwind",)
    fma, im2col = FmaTile(BLK, attrs), shape.im2col(BLK.nr)
    arrays = dict(zip(("X", "Ac", "Y", "Cb", "Bp"), fn.args))
    codegen.Emitter(module, fn, builder, program, arrays, shape.sizes, {fma.name: fma, im2col.name: im2col},
                    attrs).emit(shape.sizes)
    builder.ret_void()
    lib = shared_library(str(module), tmp_path, name)
    lib.conv.argtypes = [ctypes.POINTER(ctypes.c_float)] * 5
    return lib.conv


@pytest.mark.parametrize("shape", [SHAPE, scheduled_conv.Shape(5, 13, (9, 11), (3, 5), (2, 1), (2, 1), (1, 2), (5, 5))],
                         ids=["3x3", "3x5-dilated"])
def test_im2col_intrinsic_writes_what_the_copy_statement_means(shape: scheduled_conv.Shape, tmp_path: Path) -> None:
    """The convolution with its im2col panels copied by the intrinsic and by the loops isl
    generates for the copy statement (element by element, zero where the padded read leaves
    the input): both equal numpy's convolution."""
    plan = scheduled_gemm.plan(shape.m, shape.n, shape.k, BLK, 2, a_constant=True, kc_step=shape.taps)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((shape.channels, *shape.size), dtype=np.float32)
    w = rng.standard_normal((shape.m, shape.channels, *shape.kernel), dtype=np.float32)
    bias = rng.standard_normal(shape.m, dtype=np.float32)
    # the reference: y[m, oh, ow] = Σ w[m, c, kh, kw] · x[c, oh·sh + kh·dh - ph, ow·sw + kw·dw - pw] + bias[m]
    (sh, sw), (dh, dw), (ph, pw) = shape.strides, shape.dilations, shape.pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (ph, ph + 8), (pw, pw + 8)))
    ref = np.zeros((shape.m, *shape.out))
    for kh in range(shape.kernel[0]):
        for kw in range(shape.kernel[1]):
            win = xp[:, kh * dh:kh * dh + sh * shape.out[0]:sh, kw * dw:kw * dw + sw * shape.out[1]:sw]
            ref += np.einsum("mc,chw->mhw", w[:, :, kh, kw], win)
    ref = ref.reshape(shape.m, -1) + bias[:, None]
    a_const = scheduled_gemm.constant_a(plan, w.reshape(shape.m, -1))
    fp = ctypes.POINTER(ctypes.c_float)
    for copy_intrinsic in (True, False):
        program = scheduled_conv.schedule(plan, shape, Program.of(scheduled_conv.nest(shape, True)), copy_intrinsic)
        assert ("tensorize im2col" in T.text(program.tree)) == copy_intrinsic
        conv = _compiled(program, shape, tmp_path, f"conv{int(copy_intrinsic)}")
        y = np.full((shape.m, shape.n), np.nan, np.float32)
        scratch = np.full(plan.scratch_floats, np.nan, np.float32)
        conv(*(a.ctypes.data_as(fp) for a in (x, a_const, y, bias, scratch)))
        assert np.abs(y - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()), copy_intrinsic


#: the build's own choice (``--conv auto``): Winograd's products and the ``rows`` tiles on the
#: schedule path too — (case, the lowering the cost model picks)
AUTO_CASES = [
    ((64, 64, (28, 28), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, "residual"), "winograd"),
    ((128, 128, (15, 13), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, "relu"), "winograd"),
    ((512, 512, (7, 7), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), True, "residual"), "rows"),
    ((256, 256, (14, 14), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), True, "relu"), "rows"),
    ((512, 128, (7, 7), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), False, "scale"), "rows"),
    ((96, 40, (11, 9), (3, 3), (2, 1), (1, 0, 1, 1), (1, 1), True, "clip"), "rows"),
    ((128, 32, (16, 16), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), True, "relu"), "rows"),
]


@pytest.mark.parametrize("case,form", AUTO_CASES, ids=[f"{c[0]}-{c[1]}-{c[2][0]}-{c[3][0]}x{c[3][1]}-{f}"
                                                       for c, f in AUTO_CASES])
@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_and_rows_on_the_schedule_path(case: tuple, form: str, threads: int, tmp_path: Path) -> None:
    """Winograd's α² products as the batched GEMM nest under its schedule, and the small-map
    ``rows`` form as the convolution's nest tensorized onto ``rows.f32.<w>x32``: as onnxruntime
    computes, the chain applied in the same function."""
    model, feeds = _conv_model(*case)
    errs = compile_and_compare(model, feeds, output_dir=tmp_path / "b", threads=threads)
    assert errs and max(errs.values()) <= (1e-4 if form == "winograd" else 1e-5), errs
    fns = json.loads((tmp_path / "b" / "manifest.json").read_text())["functions"]
    conv = next(f for f in fns if f["op_type"] == "Conv")
    if form == "rows" and threads == 1 and "winograd" in conv["detail"]:
        pytest.skip("one thread: the cost model takes Winograd here")
    assert conv["detail"].endswith(form) and conv["path"] == "schedule", conv
    tree = conv["schedules"][0]
    if form == "winograd":
        assert "S[l, i, j, k]" in tree and "tensorize fma.f32." in tree
    else:
        assert "S[m, oh, ow, c, kh, kw]" in tree and "tensorize rows.f32." in tree
    assert len(fns) == 1


def test_batched_products_share_one_parallel_loop(tmp_path: Path) -> None:
    """The batched GEMM schedule: three products cut into shares (more shares than threads),
    a constant A laid out product by product, every size and remainder as numpy computes."""
    blk = packed.blocking_for_host("")
    for batch, m, n, k, a_constant in [(3, 200, 300, 70, False), (16, 64, 49, 64, True), (5, 13, 33, 7, True)]:
        plan = scheduled_gemm.plan(m, n, k, blk, 2, a_constant=a_constant, batch=batch)
        program, ast = scheduled_gemm.built(plan)
        assert "S[l, i, j, k]" in T.text(program.tree)
        module = ir.Module("batched")
        f32p = ir.FloatType().as_pointer()
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [f32p] * 4), "g")
        a, b, c, work = fn.args
        builder = ir.IRBuilder(fn.append_basic_block("entry"))
        fma = FmaTile(blk, ("nounwind",))
        sizes = {"M": m, "N": n, "K": k}
        codegen.Emitter(module, fn, builder, program, {"A": a, "Ac": a, "B": b, "C": c, "Ap": work, "Bp": work},
                        sizes, {fma.name: fma}, ("nounwind",)).emit(sizes, ast)
        builder.ret_void()
        lib = shared_library(str(module), tmp_path, f"b{batch}")
        fp = ctypes.POINTER(ctypes.c_float)
        lib.g.argtypes = [fp] * 4
        rng = np.random.default_rng(batch)
        x = rng.standard_normal((batch, m, k), dtype=np.float32)
        y = rng.standard_normal((batch, k, n), dtype=np.float32)
        out = np.full((batch, m, n), np.nan, np.float32)
        scratch = np.zeros(max(plan.scratch_floats, 1), np.float32)
        operand = scheduled_gemm.constant_a(plan, x) if a_constant else x
        lib.g(*(arr.ctypes.data_as(fp) for arr in (operand, y, out, scratch)))
        ref = x.astype(np.float64) @ y.astype(np.float64)
        assert np.abs(out - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()), (batch, m, n, k)
