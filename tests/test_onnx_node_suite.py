"""ONNX's official node test suite through :class:`polyml.backend.PolymlBackend`.

Only the node suite runs, and of it only the cases selected by the rule in
``tests/node_suite_rules.py`` (op set, float32 data, int64 shape-like operands); cases the rule
selects but polyml deliberately leaves out are reported as skipped with their reason.  Each case
compiles one small model (a second or so), so run it in parallel::

    .venv/bin/python -m pytest tests/test_onnx_node_suite.py -n 2
"""

from __future__ import annotations

import re
import unittest
import warnings

import numpy as np
import onnx.backend.test
import pytest
from node_suite_rules import DOC, eligible_names, report, verdicts

from polyml.backend import PolymlBackend

pytestmark = pytest.mark.nodesuite

NODE_SUITE = "OnnxBackendNodeModelTest"


def _node_suite() -> type[unittest.TestCase]:
    """The node suite's TestCase class, restricted to eligible and deliberately excluded cases."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        backend_test = onnx.backend.test.BackendTest(PolymlBackend, __name__)
    for name in eligible_names():
        backend_test.include(rf"^{re.escape(name)}_cpu$")
    suite = backend_test.test_cases[NODE_SUITE]
    body: dict[str, object] = {}
    for v in verdicts():
        if v.eligible:
            body[f"{v.name}_cpu"] = getattr(suite, f"{v.name}_cpu")
        elif v.deliberate:
            body[f"{v.name}_cpu"] = unittest.skip("; ".join(v.reasons))(getattr(suite, f"{v.name}_cpu"))
    cls = type(NODE_SUITE, (unittest.TestCase,), body)
    cls.__module__ = __name__
    return cls


OnnxBackendNodeModelTest = _node_suite()


def test_eligibility_doc_is_current() -> None:
    """docs/ONNX_NODE_SUITE.md is what ``python tests/node_suite_rules.py`` writes now."""
    assert DOC.read_text() == report(), "regenerate it: .venv/bin/python tests/node_suite_rules.py"


def test_eligible_cases_are_registered() -> None:
    """The rule selects a real set of cases, and each is a test of the node suite."""
    names = eligible_names()
    assert len(names) > 100
    for name in names:
        assert hasattr(OnnxBackendNodeModelTest, f"{name}_cpu")
