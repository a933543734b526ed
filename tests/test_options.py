"""The settings registry (polyml/options.py): every POLYML_* variable the project mentions is
declared once, parsed by its type, listed by ``polyml options``, and documented in docs/OPTIONS.md."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polyml import options
from polyml.errors import PolymlError

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"POLYML_[A-Z0-9_]*[A-Z0-9]")


def _mentioned() -> set[str]:
    files = [*ROOT.glob("polyml/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("scripts/*"), *ROOT.glob("docker/*"),
             ROOT / "Makefile"]
    return {n for f in files if f.is_file() and f.name != "test_options.py" for n in NAME.findall(f.read_text(errors="replace"))}


def test_every_variable_mentioned_is_declared() -> None:
    undeclared = _mentioned() - set(options.BY_NAME)
    assert not undeclared, f"not in polyml/options.py's REGISTRY: {sorted(undeclared)}"


def test_settings_parse_by_type() -> None:
    env = {"POLYML_CACHE_MAX_MB": "3", "POLYML_DW_PRODUCT": "0", "POLYML_WINOGRAD": " 2 "}
    assert options.value("POLYML_CACHE_MAX_MB", env) == 3
    assert options.value("POLYML_CACHE_MAX_MB", {}) == 4096
    assert options.value("POLYML_DW_PRODUCT", env) is False and options.value("POLYML_DW_PRODUCT", {}) is True
    assert options.value("POLYML_WINOGRAD", env) == "2"
    with pytest.raises(PolymlError, match="POLYML_CACHE_MAX_MB='x': expected an integer"):
        options.value("POLYML_CACHE_MAX_MB", {"POLYML_CACHE_MAX_MB": "x"})
    with pytest.raises(KeyError, match="not a registered setting"):
        options.value("POLYML_NO_SUCH_THING", {})


def test_codegen_settings_hold_only_code_changing_ones() -> None:
    env = {"POLYML_IGEMM": "madd", "POLYML_CACHE_DIR": "/tmp/x", "POLYML_WINOGRAD": "", "HOME": "/root"}
    assert options.codegen_settings(env) == {"POLYML_IGEMM": "madd"}
    assert options.unknown({"POLYML_IGEM": "3", "POLYML_CACHE_DIR": "/x"}) == ["POLYML_IGEM"]


def test_codegen_config_from_settings() -> None:
    """The kernels' configuration comes from the settings given, not from the environment."""
    config = options.CodegenConfig.from_settings({"POLYML_WINOGRAD": "0", "POLYML_DW_PRODUCT": "0"}, packed=True)
    assert (config.packed, config.winograd, config.dw_product, config.conv_inplace) == (True, "0", False, "auto")
    assert options.CodegenConfig.from_settings({}) == options.CodegenConfig()


def test_polyml_options_json_lists_every_setting() -> None:
    proc = subprocess.run([sys.executable, "-m", "polyml.cli", "options", "--json"], capture_output=True, text=True,
                          env={"POLYML_IGEMM": "madd", "POLYML_TYPO": "1", "PATH": "/usr/bin:/bin"}, check=True)
    data = json.loads(proc.stdout)
    assert [s["name"] for s in data["settings"]] == [s.name for s in options.REGISTRY]
    row = next(s for s in data["settings"] if s["name"] == "POLYML_IGEMM")
    assert row["value"] == "madd" and row["set"] and row["changes_code"] and row["type"] == "str"
    assert data["unknown"] == ["POLYML_TYPO"]
    assert all(s["section"] in options.SECTIONS and s["doc"] for s in data["settings"])


def _environment_reads(path: Path) -> list[str]:
    """``os.environ`` / ``os.getenv`` reads of ``POLYML_*`` names in one file (literal names, or
    module constants holding them)."""
    import ast

    tree = ast.parse(path.read_text())
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
              and isinstance(n.value.value, str) for t in n.targets if isinstance(t, ast.Name)}

    def name_of(node: ast.AST) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        return consts.get(node.id, "") if isinstance(node, ast.Name) else ""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if (node.func.attr in ("get", "pop", "setdefault") and is_environ(node.func.value)) or node.func.attr == "getenv":
                key = node.args[0]
        if key is not None and name_of(key).startswith("POLYML_"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name_of(key)}")
    return found


def test_only_the_registry_reads_the_environment() -> None:
    """``POLYML_*`` variables are read in polyml/options.py alone; the rest of the package asks it
    (and the build edge passes the settings down in :class:`polyml.driver.flags.Options`)."""
    registry = ROOT / "polyml" / "options.py"
    reads = [r for f in sorted(ROOT.glob("polyml/**/*.py")) if f != registry for r in _environment_reads(f)]
    assert reads == [], reads


def test_build_options_take_the_settings_at_the_edge(monkeypatch) -> None:
    from polyml.driver.flags import Options

    monkeypatch.setenv("POLYML_WINOGRAD", "0")
    made = Options()
    monkeypatch.delenv("POLYML_WINOGRAD")
    assert dict(made.settings) == {"POLYML_WINOGRAD": "0"} and made.to_json()["settings"] == {"POLYML_WINOGRAD": "0"}
    assert made.codegen(packed=True, threaded=False).winograd == "0"
    assert Options().settings == ()
    assert Options(**made.to_json()) == made  # a manifest's options give the same build back
    with pytest.raises(PolymlError, match="not code-changing settings"):
        Options(settings={"POLYML_CACHE_DIR": "/x"})


def test_docs_table_is_current() -> None:
    text = (ROOT / "docs" / "OPTIONS.md").read_text()
    assert options.markdown_table() in text, "docs/OPTIONS.md is stale: polyml options --markdown writes its table"
