"""Which cases of ONNX's node test suite polyml is expected to pass, and why the others are not.

The rule, applied to each case's model (``onnx.backend.test`` builds them in memory; this onnx
wheel ships no ``data/node`` folder):

1. every node's op type is in :data:`OP_SET` (default domain): the op types with a kernel in
   polyml's registry plus those the frontend always folds (:data:`FOLDED`);
2. every tensor of the graph (inputs, outputs, initializers, Constant values and intermediates,
   typed by ONNX shape inference) is one of :data:`DTYPES`;
3. no node uses a feature polyml deliberately leaves out (:func:`unsupported_feature`).

Cases failing 1 or 2 are out of scope; cases passing 1 and 2 but failing 3 are the explicit
exclusions.  ``python tests/node_suite_rules.py`` writes the reviewable list to
``docs/ONNX_NODE_SUITE.md`` (a test checks that it is current).
"""

from __future__ import annotations

import io
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

#: ops the ONNX frontend always evaluates at compile time (shapes are static)
FOLDED: frozenset[str] = frozenset({"Constant", "ConstantOfShape", "Shape", "Size"})


def _op_set() -> frozenset[str]:
    from polyml.kernels import registry

    return frozenset(op for op in registry() if not op.startswith("polyml.")) | FOLDED


#: the op types polyml lowers (or folds at compile time)
OP_SET: frozenset[str] = _op_set()

#: tensor dtypes generated code computes on
DTYPES: frozenset[str] = frozenset({"float32", "int64", "int32", "bool", "int8", "uint8"})


def _attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def _n_outputs(node: onnx.NodeProto) -> int:
    return sum(1 for o in node.output if o)


def unsupported_feature(n: onnx.NodeProto) -> str | None:
    """Why polyml deliberately leaves out this use of an op of the set (None: it does not)."""
    if n.op_type == "Pad" and _attr(n, "mode", "constant") != "constant":
        return f"Pad {_attr(n, 'mode')} mode"
    if n.op_type == "BatchNormalization" and (_attr(n, "training_mode", 0) or _n_outputs(n) > 1):
        return "BatchNormalization training mode (batch statistics outputs)"
    if n.op_type == "MaxPool" and _n_outputs(n) > 1:
        return "MaxPool Indices output"
    if n.op_type == "Dropout" and _n_outputs(n) > 1:
        return "Dropout mask output"
    if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]:
        return "Dropout training mode (elements dropped at random)"
    return None


#: (op, input positions) whose values set an output's shape: polyml compiles static shapes
SHAPE_SETTING = {"Range": (0, 1, 2)}


def _data_dependent_shapes(model: onnx.ModelProto) -> list[str]:
    """Ops whose output shape depends on values computed at run time from graph inputs (a
    graph input feeding the op directly is specialized by the backend, so it does not count)."""
    g = model.graph
    inputs = {vi.name for vi in g.input} - {i.name for i in g.initializer}
    producers = {o: n for n in g.node for o in n.output}

    def from_inputs(t: str, seen: set[str]) -> bool:
        if t in inputs:
            return True
        p = producers.get(t)
        if p is None or t in seen:
            return False
        seen.add(t)
        return any(from_inputs(i, seen) for i in p.input if i)

    found = []
    for n in g.node:
        for pos in SHAPE_SETTING.get(n.op_type, ()):
            t = n.input[pos] if pos < len(n.input) else ""
            if t and t not in inputs and t in producers and from_inputs(t, set()):
                found.append(f"{n.op_type} whose output length is computed from run-time data")
                break
    return sorted(set(found))


@dataclass
class Verdict:
    """One case: its op types and why it is not run (empty ``reasons``: eligible)."""

    name: str
    ops: list[str]
    reasons: list[str] = field(default_factory=list)
    #: True when the only reasons are deliberate exclusions (rule 3)
    deliberate: bool = False

    @property
    def eligible(self) -> bool:
        return not self.reasons

    @property
    def in_op_set(self) -> bool:
        """Whether the case uses at least one op of polyml's set."""
        return any(op in OP_SET for op in self.ops)


def _dtype(elem_type: int) -> str:
    if elem_type == TensorProto.UNDEFINED:
        return "undefined"
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:
        return TensorProto.DataType.Name(elem_type).lower()


def _tensor_types(model: onnx.ModelProto) -> dict[str, int | None]:
    """elem_type of every named value (None for non-tensor values: sequences, optionals)."""
    g = model.graph
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inferred = onnx.shape_inference.infer_shapes(model).graph
        value_info = list(inferred.value_info)
    except Exception:
        value_info = []
    types: dict[str, int | None] = {}
    for vi in [*value_info, *g.input, *g.output]:
        types[vi.name] = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else None
    for init in g.initializer:
        types[init.name] = init.data_type
    for n in g.node:
        if n.op_type == "Constant" and n.output:
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
                elif a.name in ("value_float", "value_floats"):
                    types[n.output[0]] = TensorProto.FLOAT
                elif a.name in ("value_int", "value_ints"):
                    types[n.output[0]] = TensorProto.INT64
                elif a.name.startswith("value_string") or a.name == "sparse_value":
                    types[n.output[0]] = None
    return types


def judge(name: str, model: onnx.ModelProto) -> Verdict:
    """Apply the eligibility rule to one case."""
    g = model.graph
    ops = sorted({n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in g.node})
    v = Verdict(name, ops)
    features = sorted({why for why in map(unsupported_feature, g.node) if why})
    outside = [op for op in ops if op not in OP_SET]
    if outside:
        v.reasons = ["ops outside the op set: " + ", ".join(outside), *features]
        return v
    outputs = {o.name for o in g.output}
    bad: dict[str, list[str]] = {}
    for t, et in sorted(_tensor_types(model).items()):
        if et is None:
            bad.setdefault("non-tensor (sequence/optional)", []).append(t)
        elif _dtype(et) in DTYPES:
            continue
        else:
            bad.setdefault(f"{_dtype(et)} {'output' if t in outputs else 'data'}", []).append(t)
    v.reasons = [f"{kind} ({', '.join(ts[:3])}{', ...' if len(ts) > 3 else ''})" for kind, ts in bad.items()]
    features += _data_dependent_shapes(model)
    v.deliberate = not v.reasons and bool(features)
    v.reasons += features
    return v


@cache
def verdicts() -> tuple[Verdict, ...]:
    """The verdict for every case of the node suite, in the suite's order."""
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = load_node_model_tests()
    return tuple(judge(c.name, c.model) for c in cases)


def eligible_names() -> list[str]:
    """Case names (``test_relu``) the rule selects; BackendTest runs them as ``<name>_cpu``."""
    return [v.name for v in verdicts() if v.eligible]


NODE_SUITE = "OnnxBackendNodeModelTest"


def node_suite_class(backend: type, module: str, cases: Mapping[str, str | None]) -> type:
    """The node suite's ``unittest.TestCase`` class over ``backend`` (defined in ``module``):
    one test ``<name>_cpu`` per name of ``cases``, skipped with its reason where that is not None."""
    import re
    import unittest

    import onnx.backend.test

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        backend_test = onnx.backend.test.BackendTest(backend, module)
    for name in eligible_names():
        backend_test.include(rf"^{re.escape(name)}_cpu$")
    suite = backend_test.test_cases[NODE_SUITE]
    body: dict[str, object] = {}
    for name, reason in cases.items():
        fn = getattr(suite, f"{name}_cpu")
        body[f"{name}_cpu"] = fn if reason is None else unittest.skip(reason)(fn)
    cls = type(NODE_SUITE, (unittest.TestCase,), body)
    cls.__module__ = module
    return cls


def report() -> str:
    """The Markdown list of eligible and excluded cases (``docs/ONNX_NODE_SUITE.md``)."""
    vs = verdicts()
    ours = [v for v in vs if v.in_op_set]
    eligible = [v for v in vs if v.eligible]
    deliberate = [v for v in vs if v.deliberate]
    out = [v for v in ours if not v.eligible and not v.deliberate]
    f = io.StringIO()
    w = f.write
    w("# ONNX node test suite: which cases polyml runs\n\n")
    w("Generated by `python tests/node_suite_rules.py` (do not edit); the rule is documented\n")
    w("in that file and `tests/test_onnx_node_suite.py` runs the eligible cases.\n\n")
    w(f"onnx {onnx.__version__}: {len(vs)} node cases, {len(ours)} use an op of polyml's set; ")
    w(f"{len(eligible)} eligible, {len(deliberate)} deliberately excluded, {len(out)} out of scope.\n\n")
    w(f"Op set: {', '.join(sorted(OP_SET))}.\n\n")
    w(f"Tensor dtypes: {', '.join(sorted(DTYPES))}.\n\n")
    w(f"## Eligible ({len(eligible)})\n\n")
    for v in eligible:
        w(f"- `{v.name}` ({', '.join(v.ops)})\n")
    w(f"\n## Deliberately excluded ({len(deliberate)})\n\n")
    for v in deliberate:
        w(f"- `{v.name}`: {'; '.join(v.reasons)}\n")
    w(f"\n## Out of scope: cases using an op of the set that the rule rejects ({len(out)})\n\n")
    for v in out:
        w(f"- `{v.name}`: {'; '.join(v.reasons)}\n")
    return f.getvalue()


DOC = Path(__file__).resolve().parent.parent / "docs" / "ONNX_NODE_SUITE.md"

if __name__ == "__main__":
    text = report()
    if "--stdout" in sys.argv:
        sys.stdout.write(text)
    else:
        DOC.write_text(text)
        print(f"wrote {DOC}")
