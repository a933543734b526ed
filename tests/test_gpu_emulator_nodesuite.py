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
import re
import unittest
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx.backend.test
import pytest
from node_suite_rules import eligible_names, verdicts

from polyml.backend import PolymlBackend, PolymlRep
from polyml.errors import EmulationError, PolymlError
from polyml.frontends.onnx import from_onnx
from polyml.gpu.build import compile_cuda

FULL = os.environ.get("POLYML_EMULATOR_FULL") == "1"
pytestmark = [pytest.mark.nodesuite, pytest.mark.emulator_full,
              pytest.mark.skipif(not FULL, reason="the emulated node suite is opt-in: POLYML_EMULATOR_FULL=1 "
                                                  "(make test-emulator)")]

NODE_SUITE = "OnnxBackendNodeModelTest"

#: eligible cases the CUDA build refuses, with the reason (the start of its error message)
EXCLUDED: dict[str, str] = {}


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
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        backend_test = onnx.backend.test.BackendTest(EmulatedBackend, __name__)
    for name in eligible_names():
        backend_test.include(rf"^{re.escape(name)}_cpu$")
    suite = backend_test.test_cases[NODE_SUITE]
    body: dict[str, object] = {}
    for v in verdicts():
        if v.eligible:
            fn = getattr(suite, f"{v.name}_cpu")
            if v.name in EXCLUDED:
                fn = unittest.skip(f"the CUDA build refuses it: {EXCLUDED[v.name]}")(fn)
            body[f"{v.name}_cpu"] = fn
    cls = type(NODE_SUITE, (unittest.TestCase,), body)
    cls.__module__ = __name__
    return cls


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
        assert str(info.value).startswith(EXCLUDED[name]), f"{name}: {info.value}"
