"""Shared fixtures: small models built with onnx.helper."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"


def filecheck(text: str, check_file: Path) -> None:
    """Run the `filecheck` package (a Python FileCheck) on ``text`` against ``check_file``."""
    exe = shutil.which("filecheck") or str(Path(sys.executable).parent / "filecheck")
    proc = subprocess.run([exe, str(check_file)], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, f"FileCheck {check_file.name} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture
def golden() -> Path:
    return GOLDEN
