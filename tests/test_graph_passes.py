"""The graph-pass protocol (passes/graph.py): every pass is a frozen dataclass whose ``apply``
returns a new graph and a report and leaves its argument alone; ``fuse-operators`` reports the
passes it composed, in order; ``polyml passes --json`` lists the graph passes beside the JSCoP ones."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from polyml.cli import main
from polyml.graph import Graph, Node, TensorType
from polyml.passes.fuse import FuseOperators
from polyml.passes.graph import GraphPass, graph_passes
from polyml.passes.silu import FoldSilu

BUILT_IN = {"attention", "clip-bounds", "conv-scales", "depthwise-products", "fuse-operators", "quantize", "silu"}


def _silu_relu() -> Graph:
    t = TensorType((1, 4, 5, 5))
    nodes = [Node("sig", "Sigmoid", ["x"], ["s"]), Node("mul", "Mul", ["s", "x"], ["y"]), Node("relu", "Relu", ["y"], ["z"])]
    return Graph("g", nodes, {"x": t, "s": t, "y": t, "z": t}, {}, ["x"], ["z"])


def test_every_graph_pass_is_a_registered_frozen_dataclass() -> None:
    found = graph_passes()
    assert BUILT_IN <= set(found)
    for name, cls in found.items():
        assert issubclass(cls, GraphPass) and cls.name == name
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, name
        with pytest.raises(dataclasses.FrozenInstanceError):
            cls().x = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_apply_leaves_its_argument_alone(name: str) -> None:
    g = _silu_relu()
    before = copy.deepcopy(g)
    out, report = graph_passes()[name]().apply(g)
    assert [(n.name, n.op_type, n.inputs, n.outputs) for n in g.nodes] == [
        (n.name, n.op_type, n.inputs, n.outputs) for n in before.nodes]
    assert isinstance(report.to_json(), dict) and isinstance(out, Graph)


def test_silu_pass_rewrites_and_reports() -> None:
    out, report = FoldSilu().apply(_silu_relu())
    assert [n.op_type for n in out.nodes] == ["Swish", "Relu"]
    assert report.to_json()["passes"] == ["silu"] and len(report.rewritten) == 1


def test_fuse_operators_reports_its_parts_in_order() -> None:
    out, report = FuseOperators().apply(_silu_relu())
    assert [n.op_type for n in out.nodes] == ["polyml.Elementwise"]  # Swish then Relu: one nest
    assert report.passes == ["fuse-operators", "silu", "clip-bounds", "attention", "conv-scales", "depthwise-products"]
    assert report.rewritten[0]["op_type"] == "Sigmoid+Mul→Swish"
    _, off = FuseOperators(silu=False, attention=False).apply(_silu_relu())
    assert "silu" not in off.passes and "attention" not in off.passes
    assert FuseOperators(attention=False).record() == {"name": "fuse-operators", "options": {
        **FuseOperators().options(), "attention": False}}


def test_passes_command_lists_graph_and_jscop_passes(capsys) -> None:
    assert main(["passes", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    kinds = {(r["name"], r["kind"]) for r in rows}
    assert {(n, "graph") for n in BUILT_IN} <= kinds and ("tile", "jscop") in kinds
    fuse = next(r for r in rows if r["name"] == "fuse-operators")
    assert {"attention", "silu", "config"} <= set(fuse["options"]) and fuse["summary"]
