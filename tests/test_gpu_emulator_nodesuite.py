"""ONNX's node test suite on the CUDA emulator: every eligible case (``tests/node_suite_rules.py``)
built with ``--target cuda`` and run on the emulated grid (``polyml.gpu.emulate``), compared with
the suite's expected outputs.

Opt-in (``make test-emulator``, or ``POLYML_EMULATOR_FULL=1``): each case is a CUDA build plus a
clang-19 compile of its kernels, about 2-3 s, so the whole suite takes ~30 min on 2 cores.  Cases
the CUDA build does not support are listed in :data:`EXCLUDED` with the reason (docs/GPU.md), and
:func:`test_excluded_cases_are_refused_by_the_cuda_build` checks that the list is current.
"""

from __future__ import annotations

import os
import unittest
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx.backend.test
import pytest
from node_suite_rules import node_suite_class, verdicts

from polyml.backend import PolymlBackend, PolymlRep
from polyml.errors import EmulationError, PolymlError
from polyml.frontends.onnx import from_onnx
from polyml.gpu.build import compile_cuda

FULL = os.environ.get("POLYML_EMULATOR_FULL") == "1"
pytestmark = [pytest.mark.nodesuite, pytest.mark.emulator_full,
              pytest.mark.skipif(not FULL, reason="the emulated node suite is opt-in: POLYML_EMULATOR_FULL=1 "
                                                  "(make test-emulator)")]


#: eligible cases the CUDA build refuses (GpuLoweringError, UnsupportedError), with the reason: the
#: message (for an UnsupportedError, the node's line after its name)
EXCLUDED: dict[str, str] = {
    'test_acos': "'y': acosf has no device implementation",
    'test_acos_example': "'y': acosf has no device implementation",
    'test_acosh': "'y': acoshf has no device implementation",
    'test_acosh_example': "'y': acoshf has no device implementation",
    'test_asin': "'y': asinf has no device implementation",
    'test_asin_example': "'y': asinf has no device implementation",
    'test_asinh': "'y': asinhf has no device implementation",
    'test_asinh_example': "'y': asinhf has no device implementation",
    'test_atan': "'y': atanf has no device implementation",
    'test_atan_example': "'y': atanf has no device implementation",
    'test_atanh': "'y': atanhf has no device implementation",
    'test_atanh_example': "'y': atanhf has no device implementation",
    'test_celu': "'Y': expm1f has no device implementation",
    'test_constant_pad': "Pad node 'y': memory is accessed outside a loop nest, which no GPU kernel would execute",
    'test_constant_pad_axes': "Pad node 'y': memory is accessed outside a loop nest, which no GPU kernel would execute",
    'test_constant_pad_negative_axes': "Pad node 'y': memory is accessed outside a loop nest, which no GPU kernel would execute",
    'test_convinteger_with_padding': "'y': an address not derived from a buffer argument",
    'test_convinteger_without_padding': "'y': an address not derived from a buffer argument",
    'test_cosh': "'y': coshf has no device implementation",
    'test_cosh_example': "'y': coshf has no device implementation",
    'test_dynamicquantizelinear': "DynamicQuantizeLinear node 'y': memory is accessed outside a loop nest, which no GPU kernel would execute",
    'test_dynamicquantizelinear_max_adjusted': "DynamicQuantizeLinear node 'y': memory is accessed outside a loop nest, which no GPU kernel would execute",
    'test_dynamicquantizelinear_min_adjusted': "DynamicQuantizeLinear node 'y': memory is accessed outside a loop nest, which no GPU kernel would execute",
    'test_elu': "'y': expm1f has no device implementation",
    'test_elu_default': "'y': expm1f has no device implementation",
    'test_elu_example': "'y': expm1f has no device implementation",
    'test_mish': "'Y': log1pf has no device implementation",
    'test_mish_expanded': "'fused_Y': log1pf has no device implementation",
    'test_qlinearconv': "'y': an address not derived from a buffer argument",
    'test_qlinearmatmul_2D_int8_float32': "'y': an address not derived from a buffer argument",
    'test_qlinearmatmul_2D_uint8_float32': "'y': an address not derived from a buffer argument",
    'test_qlinearmatmul_3D_int8_float32': "'y': an address not derived from a buffer argument",
    'test_qlinearmatmul_3D_uint8_float32': "'y': an address not derived from a buffer argument",
    'test_resize_downsample_scales_cubic': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_cubic_A_n0p5_exclude_outside': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_cubic_align_corners': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_cubic_antialias': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_linear': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_linear_align_corners': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_linear_antialias': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_linear_half_pixel_symmetric': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_scales_nearest': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_sizes_cubic': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_sizes_cubic_antialias': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_sizes_linear_antialias': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_sizes_linear_pytorch_half_pixel': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_sizes_nearest': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_sizes_nearest_not_larger': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_downsample_sizes_nearest_not_smaller': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_tf_crop_and_resize': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_tf_crop_and_resize_axes_2_3': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_tf_crop_and_resize_axes_3_2': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_tf_crop_and_resize_extrapolation_value': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_cubic': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_cubic_A_n0p5_exclude_outside': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_cubic_align_corners': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_cubic_asymmetric': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_linear': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_linear_align_corners': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_linear_half_pixel_symmetric': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_nearest': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_nearest_axes_2_3': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_scales_nearest_axes_3_2': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_cubic': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest_axes_2_3': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest_axes_3_2': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest_ceil_half_pixel': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest_floor_align_corners': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest_not_larger': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest_not_smaller': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
    'test_selu': "'y': expm1f has no device implementation",
    'test_selu_default': "'y': expm1f has no device implementation",
    'test_selu_example': "'y': expm1f has no device implementation",
    'test_sinh': "'y': sinhf has no device implementation",
    'test_sinh_example': "'y': sinhf has no device implementation",
    'test_softplus': "'y': log1pf has no device implementation",
    'test_softplus_example': "'y': log1pf has no device implementation",
    'test_tan': "'y': tanf has no device implementation",
    'test_tan_example': "'y': tanf has no device implementation",
    'test_upsample_nearest': 'this lowering passes no compile-time tables (Kernel.constants); Resize runs on the CPU target only',
}


class EmulatedRep(PolymlRep):
    """A prepared model compiled for CUDA and run on the emulator."""

    def _compile(self, feeds: Mapping[str, np.ndarray]):  # noqa: ANN202 - EmulatedModel
        graph = from_onnx(self.model, input_shapes={n: tuple(feeds[n].shape) for n in self.dynamic},
                          input_values={n: feeds[n] for n in self.specialized})
        return compile_cuda(graph, None, "cuda-emulated", **self.options)


class EmulatedBackend(PolymlBackend):
    """The ONNX backend API over ``--target cuda-emulated``."""

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PolymlRep:
        return EmulatedRep(model, kwargs)


def _node_suite() -> type[unittest.TestCase]:
    return node_suite_class(EmulatedBackend, __name__, {
        v.name: f"the CUDA build refuses it: {EXCLUDED[v.name]}" if v.name in EXCLUDED else None
        for v in verdicts() if v.eligible})


if FULL:  # collecting the suite judges every case (shape inference): only when it runs
    OnnxBackendNodeModelTest = _node_suite()


def test_excluded_cases_are_refused_by_the_cuda_build() -> None:
    """Each excluded case still fails to build for CUDA, with its recorded reason (and not
    because the emulator found a fault)."""
    from onnx.backend.test.loader import load_node_model_tests

    cases = {c.name: c for c in load_node_model_tests() if c.name in EXCLUDED}
    assert set(cases) == set(EXCLUDED)
    for name, case in cases.items():
        with pytest.raises(PolymlError) as info:
            rep = EmulatedBackend.prepare(case.model)
            inputs = [np.asarray(i) for i in case.data_sets[0][0]] if case.data_sets else []
            rep.run(inputs)
        assert not isinstance(info.value, EmulationError), f"{name}: {info.value}"
        assert EXCLUDED[name] in str(info.value), f"{name}: {info.value}"
