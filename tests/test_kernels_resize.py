"""Resize and Upsample against onnxruntime (and ONNX's reference where onnxruntime has no
implementation) on seeded data.

Cases reach every coordinate transformation and nearest mode, linear/cubic/antialias, scale < 1
and non-integer scales, 1x1 outputs and 1x1 inputs, sizes with axes and keep_aspect_ratio_policy,
tf_crop_and_resize with extrapolation, the opset 10/11/13 input forms, Upsample, int data, ranks
2-5, and shapes big enough for the parallel nests.  Errors are max|Δ| / max|ref| ≤ 1e-5 (nearest:
exact).  Ties of nearest rounding follow ONNX's reference (float64 coordinates); cases avoid
coordinates where onnxruntime's float32 arithmetic lands on the other side of an integer.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from polyml.compiler import compile as polyml_compile
from polyml.errors import ShapeError, UnsupportedError
from polyml.frontends.onnx import from_onnx
from polyml.graph import Node, TensorType
from polyml.kernels import Operand
from polyml.kernels.resize import axis_table, plan, settings
from polyml.testing import compile_and_compare, rel_error

TOL = 1e-5


def resize_model(xs: tuple[int, ...], opset: int = 19, scales=None, sizes=None, roi=None, dtype=np.float32,
                 op: str = "Resize", as_inputs: bool = False, **attrs) -> onnx.ModelProto:
    """One Resize (or Upsample) node; roi/scales/sizes as initializers (or graph inputs)."""
    consts: dict[str, np.ndarray] = {}
    names = ["x"]
    if op == "Resize" and opset >= 11:
        names += ["roi" if roi is not None else "", "scales" if scales is not None else "",
                  "sizes" if sizes is not None else ""]
        while names[-1] == "":
            names.pop()
        if roi is not None:
            consts["roi"] = np.array(roi, np.float32)
        if scales is not None:
            consts["scales"] = np.array(scales, np.float32)
        if sizes is not None:
            consts["sizes"] = np.array(sizes, np.int64)
    elif scales is not None:
        names.append("scales")
        consts["scales"] = np.array(scales, np.float32)
    node = helper.make_node(op, names, ["y"], **attrs)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [helper.make_tensor_value_info("x", elem, list(xs))]
    if as_inputs:
        inputs += [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
                   for k, v in consts.items()]
    inits = [] if as_inputs else [numpy_helper.from_array(v, k) for k, v in consts.items()]
    graph = helper.make_graph([node], "resize", inputs, [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def data(xs: tuple[int, ...], dtype=np.float32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.float32:
        return rng.standard_normal(xs).astype(np.float32)
    if dtype == np.bool_:
        return rng.integers(0, 2, xs).astype(np.bool_)
    return rng.integers(-50, 50, xs).astype(dtype)


def run_polyml(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path) -> np.ndarray:
    onnx.save(model, str(tmp_path / "m.onnx"))
    return polyml_compile(tmp_path / "m.onnx", tmp_path / "build", cache=False).run(feeds)["y"]


# (x shape, keyword arguments of resize_model)
CASES = [
    # nearest: every coordinate transformation and rounding mode, up and down
    *[((1, 2, 5, 7), dict(scales=[1, 1, 2.0, 3.0], mode="nearest", coordinate_transformation_mode=c, nearest_mode=n))
      for c in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn")
      for n in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")],
    ((1, 3, 9, 11), dict(scales=[1, 1, 0.5, 0.37], mode="nearest")),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 4, 20], mode="nearest", nearest_mode="round_prefer_ceil")),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 1, 1], mode="nearest")),
    # linear: every coordinate mode, up, down, non-integer scales, 1x1 in and out
    *[((1, 2, 5, 7), dict(scales=[1, 1, 2.0, 3.0], mode="linear", coordinate_transformation_mode=c))
      for c in ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")],
    *[((1, 2, 6, 9), dict(sizes=[1, 2, 13, 4], mode="linear", coordinate_transformation_mode=c))
      for c in ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")],
    ((1, 3, 9, 11), dict(scales=[1, 1, 0.5, 0.37], mode="linear")),
    ((1, 3, 9, 11), dict(scales=[1, 1, 1.7, 2.3], mode="linear")),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 1, 1], mode="linear")),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 1, 1], mode="linear", coordinate_transformation_mode="pytorch_half_pixel")),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 1, 1], mode="linear", coordinate_transformation_mode="align_corners")),
    ((1, 3, 1, 1), dict(sizes=[1, 3, 4, 5], mode="linear")),
    ((1, 9, 11, 3), dict(scales=[1, 2.0, 1.6, 1], mode="linear")),  # NHWC
    ((2, 9, 11), dict(scales=[1, 2.0, 0.7], mode="linear")),
    ((1, 2, 4, 9, 11), dict(scales=[1, 1, 2.0, 1.6, 0.7], mode="linear")),  # trilinear
    # cubic, exclude_outside, antialias
    ((1, 2, 6, 9), dict(sizes=[1, 2, 13, 4], mode="cubic")),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 5, 4], mode="cubic", coordinate_transformation_mode="align_corners")),
    ((1, 3, 9, 11), dict(scales=[1, 1, 0.61, 0.37], mode="cubic")),
    ((9, 11), dict(scales=[2.0, 1.6], mode="cubic", coordinate_transformation_mode="asymmetric")),
    ((1, 3, 9, 11), dict(scales=[1, 1, 1.5, 2.0], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5)),
    ((1, 3, 9, 11), dict(scales=[1, 1, 0.6, 0.8], mode="cubic", exclude_outside=1)),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 4, 5], mode="linear", antialias=1)),
    ((1, 3, 9, 11), dict(scales=[1, 1, 0.5, 0.37], mode="linear", antialias=1)),
    ((1, 3, 19, 21), dict(sizes=[1, 3, 4, 5], mode="cubic", antialias=1)),
    # axes (opset 18) and keep_aspect_ratio_policy
    ((1, 3, 9, 11), dict(sizes=[5, 7], axes=[2, 3], mode="linear")),
    ((1, 3, 9, 11), dict(sizes=[7, 5], axes=[3, 2], mode="nearest")),
    ((1, 3, 9, 11), dict(scales=[2.0, 0.5], axes=[-1, -2], mode="linear")),
    ((1, 3, 9, 11), dict(sizes=[5, 7], axes=[2, 3], mode="linear", keep_aspect_ratio_policy="not_larger")),
    ((1, 3, 9, 11), dict(sizes=[5, 7], axes=[2, 3], mode="nearest", keep_aspect_ratio_policy="not_smaller")),
    # tf_crop_and_resize: roi over all axes or the given ones, extrapolation
    ((1, 3, 9, 11), dict(sizes=[1, 3, 5, 7], roi=[0, 0, 0.2, 0.1, 1, 1, 0.9, 1.3], mode="linear",
                         coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=3.5)),
    ((1, 3, 9, 11), dict(sizes=[1, 3, 5, 7], roi=[0, 0, -0.2, 0.1, 1, 1, 0.9, 0.6], mode="nearest",
                         coordinate_transformation_mode="tf_crop_and_resize")),
    ((1, 3, 9, 11), dict(sizes=[5, 7], axes=[2, 3], roi=[0.2, 0.1, 0.9, 1.3], mode="linear",
                         coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-1.0)),
    # older forms: Resize-10 (X, scales), Resize-11 with an empty roi, Resize-13 sizes, Upsample-9
    ((1, 3, 9, 11), dict(opset=10, scales=[1, 1, 2.0, 1.5], mode="nearest")),
    ((1, 3, 9, 11), dict(opset=10, scales=[1, 1, 0.6, 0.5], mode="nearest")),
    ((1, 3, 9, 11), dict(opset=10, scales=[1, 1, 2.0, 1.5], mode="linear")),
    ((1, 3, 9, 11), dict(opset=11, scales=[1, 1, 2.0, 1.5], roi=[], mode="linear")),
    ((1, 3, 9, 11), dict(opset=13, sizes=[1, 3, 4, 20], mode="linear")),
    ((1, 3, 9, 11), dict(opset=9, op="Upsample", scales=[1, 1, 2.0, 3.0], mode="nearest")),
    ((1, 3, 9, 11), dict(opset=9, op="Upsample", scales=[1, 1, 2.0, 1.5], mode="linear")),
    # integer data (nearest moves it)
    ((1, 3, 9, 11), dict(dtype=np.int32, sizes=[1, 3, 4, 20], mode="nearest", coordinate_transformation_mode="asymmetric",
                         nearest_mode="floor")),
    # big enough for the parallel nests and the two-pass temp
    ((2, 64, 56, 56), dict(scales=[1, 1, 2.0, 2.0], mode="linear")),
    ((2, 64, 56, 56), dict(scales=[1, 1, 2.0, 2.0], mode="nearest")),
    ((1, 32, 40, 40), dict(scales=[1, 1, 2.0, 2.0], mode="cubic")),
    ((1, 3, 9, 11), dict(scales=[1, 1, 1.0, 1.0], mode="linear")),  # nothing resized: a copy
]


def _id(case) -> str:
    xs, kw = case
    return "x" + "x".join(map(str, xs)) + "-" + "-".join(
        f"{k}{'' if v is None else (v.__name__ if isinstance(v, type) else v)}" for k, v in kw.items()).replace(" ", "")


@pytest.mark.parametrize("xs,kw", CASES, ids=[_id(c) for c in CASES])
def test_resize_matches_onnxruntime(xs, kw) -> None:
    dtype = kw.get("dtype", np.float32)
    errs = compile_and_compare(resize_model(xs, **kw), {"x": data(xs, dtype)})
    assert errs["y"] <= (0 if kw.get("mode") == "nearest" else TOL), errs


REFERENCE_CASES = [
    # onnxruntime has no int64/bool Resize, no 3-D cubic
    ((1, 3, 9, 11), dict(dtype=np.int64, scales=[1, 1, 2.0, 0.5], mode="nearest")),
    ((1, 3, 5, 6, 7), dict(scales=[1, 1, 2.0, 2.0, 1.5], mode="cubic")),
    ((3, 5, 6, 7), dict(scales=[2.0, 1, 0.5, 1.5], mode="linear")),  # the batch axis too
    # align_corners on the fractional output length scale*length (onnxruntime uses the integer one)
    ((1, 1, 2, 4), dict(scales=[1, 1, 0.6, 0.6], mode="linear", coordinate_transformation_mode="align_corners")),
]


@pytest.mark.parametrize("xs,kw", REFERENCE_CASES, ids=[_id(c) for c in REFERENCE_CASES])
def test_resize_matches_onnx_reference(xs, kw, tmp_path) -> None:
    model = resize_model(xs, **kw)
    x = data(xs, kw.get("dtype", np.float32))
    got = run_polyml(model, {"x": x}, tmp_path)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert rel_error(got, ref) <= TOL


def test_resize_bool_data(tmp_path) -> None:
    """bool data moves like integers (the reference cannot run bool: compared on int32)."""
    xs, kw = (2, 5, 4), dict(sizes=[2, 9, 3], mode="nearest", nearest_mode="ceil")
    x = data(xs, np.bool_)
    got = run_polyml(resize_model(xs, dtype=np.bool_, **kw), {"x": x}, tmp_path)
    ref = ReferenceEvaluator(resize_model(xs, dtype=np.int32, **kw)).run(None, {"x": x.astype(np.int32)})[0]
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref.astype(np.bool_))


def test_upsample_opset7_scales_attribute() -> None:
    xs = (1, 2, 3, 4)
    x = data(xs)
    node = helper.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 3.0])
    graph = helper.make_graph([node], "up", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(xs))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 6, 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 7)])
    errs = compile_and_compare(model, {"x": x})
    assert errs["y"] == 0


def test_scales_as_specialized_graph_inputs() -> None:
    """The backend compiles float32 scales given at run time in as constants (the node suite's form)."""
    from polyml.backend import PolymlBackend

    xs = (1, 2, 4, 5)
    model = resize_model(xs, scales=[1, 1, 2.0, 0.6], mode="linear", as_inputs=True)
    x = data(xs)
    scales = np.array([1, 1, 2.0, 0.6], np.float32)
    rep = PolymlBackend.prepare(model)
    got = rep.run([x, scales])[0]
    ref = ReferenceEvaluator(model).run(None, {"x": x, "scales": scales})[0]
    assert rel_error(got, ref) <= TOL
    got2 = rep.run([x, np.array([1, 1, 1.0, 2.0], np.float32)])[0]  # another specialization
    assert got2.shape == (1, 2, 4, 10)


def _node(**attrs) -> Node:
    return Node("r", "Resize", ["x", "", "scales"], ["y"], attrs, opset=19)


def _ops(xs, scales) -> list[Operand | None]:
    s = np.array(scales, np.float32)
    return [Operand("x", TensorType(xs)), None, Operand("scales", TensorType(s.shape), s)]


def test_tables_linear_half_pixel() -> None:
    """2x bilinear: output o reads (o+0.5)/2-0.5, clamped at the edges; 2 taps per row."""
    t = axis_table(settings(_node(mode="linear")), 4, 8, 2.0, None)
    assert t.taps == 2
    # o=0 reads -0.25: both taps clamp to 0 and merge into one, padded with a weight-0 tap
    np.testing.assert_array_equal(t.idx[:3], [[0, 0], [0, 1], [0, 1]])
    np.testing.assert_allclose(t.w[:3], [[1.0, 0.0], [0.75, 0.25], [0.25, 0.75]])
    assert t.idx[-1].tolist() == [3, 3] and t.w[-1].tolist() == [1.0, 0.0]


def test_plan_passes_and_constants() -> None:
    """Nearest gathers every axis in one pass with unit weights; bilinear is one pass per axis
    (the shrinking one first) with an index and a weight table each."""
    near = plan(_node(mode="nearest"), _ops((1, 3, 4, 6), [1, 1, 2.0, 3.0]))
    assert near.passes == ((2, 3),) and all(t.w is None for t in near.tables.values())
    assert [a.dtype for a in near.arrays()] == [np.int64, np.int64]
    lin = plan(_node(mode="linear"), _ops((1, 3, 4, 6), [1, 1, 2.0, 0.5]))
    assert lin.passes == ((3,), (2,))
    assert lin.shape_after(0) == (1, 3, 4, 3)
    assert [a.shape for a in lin.arrays()] == [(2, 8), (2, 8), (2, 3), (2, 3)]
    same = plan(_node(mode="linear"), _ops((1, 3, 4, 6), [1, 1, 1.0, 1.0]))
    assert same.passes == () and same.arrays() == []


@pytest.mark.parametrize("attrs,dtype,why", [
    ({"mode": "nearest", "antialias": 1}, np.float32, "antialias with mode nearest"),
    ({"mode": "linear"}, np.int64, "linear interpolation of int64"),
    ({"mode": "bicubic"}, np.float32, "mode 'bicubic'"),
    ({"mode": "linear", "coordinate_transformation_mode": "corners"}, np.float32, "coordinate_transformation_mode"),
])
def test_resize_refuses_with_reason(attrs, dtype, why) -> None:
    model = resize_model((1, 1, 3, 3), scales=[1, 1, 2.0, 2.0], dtype=dtype, **attrs)
    with pytest.raises(UnsupportedError, match=why):
        from_onnx(model)


def test_resize_needs_constant_scales() -> None:
    model = resize_model((1, 1, 3, 3), scales=[1, 1, 2.0, 2.0], mode="nearest", as_inputs=True)
    with pytest.raises(ShapeError, match="compile-time constant"):
        from_onnx(model)


def test_resize_refuses_lowerings_without_constants() -> None:
    """The CUDA lowering passes no ``Kernel.constants``: a clear refusal, not a wrong nest."""
    from polyml.gpu.lower import lower_graph_cuda

    graph = from_onnx(resize_model((1, 2, 4, 5), scales=[1, 1, 2.0, 1.5], mode="linear"))
    with pytest.raises(UnsupportedError, match="CPU target only"):
        lower_graph_cuda(graph)
