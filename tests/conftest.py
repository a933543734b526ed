"""Shared fixtures: small models built with onnx.helper."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden"

# The suite runs two workers on two cores: OpenMP threads that spin after each parallel region
# (libgomp's default, which polyml keeps) would steal the other worker's core.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")


def shared_library(module_text: str, folder: Path, name: str, opt: str = "-O2") -> ctypes.CDLL:
    """An LLVM module (its text) compiled by clang for this host into ``folder/<name>.so``
    (OpenMP through libgomp, as polyml links) and loaded."""
    from polyml.driver.toolchain import tool

    ll, so = folder / f"{name}.ll", folder / f"{name}.so"
    ll.write_text(module_text)
    subprocess.run([tool("clang"), opt, "-march=native", "-shared", "-fPIC", "-fopenmp=libgomp", str(ll), "-o", str(so)],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(so))


def filecheck(text: str, check_file: Path) -> None:
    """Run the `filecheck` package (a Python FileCheck) on ``text`` against ``check_file``."""
    exe = shutil.which("filecheck") or str(Path(sys.executable).parent / "filecheck")
    proc = subprocess.run([exe, str(check_file)], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, f"FileCheck {check_file.name} failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(autouse=True, scope="session")
def _private_compile_cache(tmp_path_factory: pytest.TempPathFactory):
    """Tests (and the polyml processes they start) use a compile cache of their own."""
    old = os.environ.get("POLYML_CACHE_DIR")
    os.environ["POLYML_CACHE_DIR"] = str(tmp_path_factory.mktemp("polyml-cache"))
    yield
    if old is None:
        os.environ.pop("POLYML_CACHE_DIR", None)
    else:
        os.environ["POLYML_CACHE_DIR"] = old


@pytest.fixture
def golden() -> Path:
    return GOLDEN
