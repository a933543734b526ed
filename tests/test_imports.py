"""polyml's import structure: the layer contracts of pyproject.toml ``[tool.importlinter]`` hold
(``lint-imports``), and no module imports itself through others (function-local imports count)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip(f"import-linter is not installed ({lint} missing; it is in the test extra)")
    proc = subprocess.run([str(lint), "--no-logo", "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_import_cycles() -> None:
    grimp = pytest.importorskip("grimp", reason="grimp (import-linter's graph library) is not installed")
    nx = pytest.importorskip("networkx")
    graph = grimp.build_graph("polyml", include_external_packages=False)
    g = nx.DiGraph()
    for m in graph.modules:
        g.add_node(m)
        for imported in graph.find_modules_directly_imported_by(m):
            g.add_edge(m, imported)
    cycles = sorted((sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1), key=len, reverse=True)
    lines = []
    for c in cycles:
        lines.append(f"{len(c)} modules: {', '.join(c)}")
        for a in c:
            for b in sorted(set(graph.find_modules_directly_imported_by(a)) & set(c)):
                for d in graph.get_import_details(importer=a, imported=b):
                    lines.append(f"  {a} -> {b} (l.{d['line_number']}: {d['line_contents']})")
    assert not cycles, "import cycles:\n" + "\n".join(lines)
