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
    env = {"POLYML_GEMM_COLUMNS": "3", "POLYML_C_PREFETCH": "0", "POLYML_WINOGRAD": " 2 "}
    assert options.value("POLYML_GEMM_COLUMNS", env) == 3
    assert options.value("POLYML_GEMM_COLUMNS", {}) == 12
    assert options.value("POLYML_C_PREFETCH", env) is False and options.value("POLYML_C_PREFETCH", {}) is True
    assert options.value("POLYML_WINOGRAD", env) == "2"
    with pytest.raises(PolymlError, match="POLYML_GEMM_COLUMNS='x': expected an integer"):
        options.value("POLYML_GEMM_COLUMNS", {"POLYML_GEMM_COLUMNS": "x"})
    with pytest.raises(KeyError, match="not a registered setting"):
        options.value("POLYML_NO_SUCH_THING", {})


def test_codegen_settings_hold_only_code_changing_ones() -> None:
    env = {"POLYML_GEMM_COLUMNS": "3", "POLYML_CACHE_DIR": "/tmp/x", "POLYML_WINOGRAD": "", "HOME": "/root"}
    assert options.codegen_settings(env) == {"POLYML_GEMM_COLUMNS": "3"}
    assert options.unknown({"POLYML_GEMM_COLUMS": "3", "POLYML_CACHE_DIR": "/x"}) == ["POLYML_GEMM_COLUMS"]


def test_polyml_options_json_lists_every_setting() -> None:
    proc = subprocess.run([sys.executable, "-m", "polyml.cli", "options", "--json"], capture_output=True, text=True,
                          env={"POLYML_GEMM_COLUMNS": "5", "POLYML_TYPO": "1", "PATH": "/usr/bin:/bin"}, check=True)
    data = json.loads(proc.stdout)
    assert [s["name"] for s in data["settings"]] == [s.name for s in options.REGISTRY]
    row = next(s for s in data["settings"] if s["name"] == "POLYML_GEMM_COLUMNS")
    assert row["value"] == "5" and row["set"] and row["changes_code"] and row["type"] == "int"
    assert data["unknown"] == ["POLYML_TYPO"]
    assert all(s["section"] in options.SECTIONS and s["doc"] for s in data["settings"])


def test_docs_table_is_current() -> None:
    text = (ROOT / "docs" / "OPTIONS.md").read_text()
    assert options.markdown_table() in text, "docs/OPTIONS.md is stale: polyml options --markdown writes its table"
