"""The graph-pass protocol: rewrites of the networkx graph IR before any loop nest exists.

A graph pass is a frozen dataclass deriving from :class:`GraphPass`, with a class attribute
``name`` and its options as fields.  ``apply(graph) -> (graph, report)`` is a pure function: it
rewrites a copy and says what it did (the manifest records each pass that ran with its options under ``graph_passes``, and its
report's ``to_json()`` under the pass's own key: ``fusion``, ``quantization``).
Subclasses write ``rewrite(g) -> report``, which may change ``g`` in place; composite passes
(``fuse``) call their parts' ``rewrite`` on the one copy they own.  Every pass of this package is
registered with :func:`register_graph_pass` and listed by ``polyml passes`` beside the JSCoP
passes of :mod:`polyml.passes`.

Graph passes are semantics-preserving by construction (each module says why its rewrite is
legal); where legality depends on the loop nests (fusing a producer into its consumer), the pass
checks it with isl on the two schedules, as :mod:`polyml.passes.fuse` does.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from polyml.graph import Graph


class Report(Protocol):
    """What a graph pass returns beside the graph."""

    def to_json(self) -> dict: ...


@dataclass
class GraphReport:
    """What graph passes did: the nests they formed (``groups``: ``{"nest", "ops", "kind"}``),
    the producer→consumer edges they left and why (``blocked``), constants folded into an op's
    parameters (``folded``), ops replaced by an equivalent form (``rewritten``), and the passes
    that ran, in order (``passes``)."""

    groups: list[dict] = field(default_factory=list)
    blocked: list[dict] = field(default_factory=list)
    folded: list[dict] = field(default_factory=list)
    rewritten: list[dict] = field(default_factory=list)
    passes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"passes": self.passes, "groups": self.groups, "blocked": self.blocked, "folded": self.folded,
                "rewritten": self.rewritten}


@dataclass(frozen=True)
class GraphPass:
    """Base class: ``apply`` maps a graph to a new graph and a report (never mutating its argument)."""

    name: ClassVar[str] = ""

    def apply(self, graph: Graph) -> tuple[Graph, Any]:
        g = copy.deepcopy(graph)
        return g, self.rewrite(g)

    def rewrite(self, g: Graph) -> Any:
        """Rewrite ``g`` in place (pruning what it leaves unread); return the report (an object with ``to_json()``)."""
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        """The pass's options as JSON values (what the manifest records)."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def record(self) -> dict:
        """The manifest entry of this pass: its name and options (its report has its own key)."""
        return {"name": self.name, "options": self.options()}


def _jsonable(v: Any) -> Any:
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _jsonable(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    return v


GRAPH_PASSES: dict[str, type[GraphPass]] = {}


def register_graph_pass(cls: type[GraphPass]) -> type[GraphPass]:
    """Class decorator for the graph passes of this package."""
    if not cls.name:
        raise TypeError(f"{cls.__name__}: a graph pass needs a non-empty class attribute 'name'")
    if GRAPH_PASSES.get(cls.name, cls) is not cls:
        raise TypeError(f"graph pass {cls.name!r} registered twice ({GRAPH_PASSES[cls.name].__name__}, {cls.__name__})")
    GRAPH_PASSES[cls.name] = cls
    return cls


def graph_passes() -> dict[str, type[GraphPass]]:
    """Every graph pass of this package by name (its modules imported first)."""
    import polyml.passes as package

    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
    return dict(sorted(GRAPH_PASSES.items()))


def summary(cls: type) -> str:
    """The first paragraph of a class's docstring, on one line."""
    doc = inspect.getdoc(cls) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


__all__ = ["GRAPH_PASSES", "GraphPass", "GraphReport", "Report", "graph_passes", "register_graph_pass", "summary"]
