"""ONNX's official node test suite through :class:`polyml.backend.PolymlBackend`.

Only the node suite runs, and of it only the cases selected by the rule in
``tests/node_suite_rules.py`` (op set, float32 data, int64 shape-like operands); cases the rule
selects but polyml deliberately leaves out are reported as skipped with their reason.  Each case
compiles one small model (a second or so), so run it in parallel::

    .venv/bin/python -m pytest tests/test_onnx_node_suite.py -n 2
"""

from __future__ import annotations

import unittest

import pytest
from node_suite_rules import DOC, eligible_names, node_suite_class, report, verdicts

from polyml.backend import PolymlBackend

pytestmark = pytest.mark.nodesuite

def _node_suite() -> type[unittest.TestCase]:
    """The node suite's TestCase class: the eligible cases, and the deliberately excluded ones skipped."""
    return node_suite_class(PolymlBackend, __name__, {v.name: None if v.eligible else "; ".join(v.reasons)
                                                      for v in verdicts() if v.eligible or v.deliberate})


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
