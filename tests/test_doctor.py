"""`polyml doctor`: the toolchain report on these machines, and a clear failure when a tool is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from polyml import cli
from polyml.commands import doctor
from polyml.errors import ToolchainError


def test_doctor_json_keys() -> None:
    proc = subprocess.run([sys.executable, "-m", "polyml.cli", "doctor", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.loads(proc.stdout)
    assert {"opt", "polly", "llvmlite", "cpu", "islpy", "threads", "cuda"} <= set(r)
    assert r["ok"] and r["missing"] == []
    assert r["opt"]["version"].startswith("19.") and r["opt"]["path"]
    assert r["polly"]["builtin"] and r["polly"]["scop_exported"] and r["polly"]["flags"]["polly-export-jscop"]
    assert r["llvmlite"]["version"] and r["llvmlite"]["llvm_version"]
    assert r["islpy"]["version"]
    assert r["cpu"]["name"] and isinstance(r["cpu"]["vector_features"], list)
    assert r["threads"]["cpu_count"] >= 1
    for tool in ("nvcc", "ptxas"):
        assert (r["cuda"][tool] is not None) == (shutil.which(tool) is not None)


def test_doctor_table(capsys) -> None:
    assert cli.main(["doctor"]) == 0
    text = capsys.readouterr().out
    for word in ("opt", "polly", "llvmlite", "islpy", "cpu", "threads", "ptxas"):
        assert word in text


def test_missing_opt_is_reported(monkeypatch, capsys) -> None:
    import polyml.driver.toolchain as toolchain

    real = toolchain.tool

    def tool(name: str) -> str:
        if name == "opt":
            raise ToolchainError("opt-19 not found: install Debian's llvm-19")
        return real(name)

    monkeypatch.setattr(toolchain, "tool", tool)
    r = doctor.collect()
    assert r["missing"] == ["opt", "polly"] and not r["ok"]
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "opt-19 not found" in out and "missing: opt, polly" in out
    assert cli.main(["doctor", "--json"]) == 1
