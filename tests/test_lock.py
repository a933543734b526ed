"""The lock files (requirements/runtime.txt, test.txt): exact, hashed, consistent with each other
and with pyproject.toml's ranges; polyml.lockfile reads them; manifests record the runtime lock."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from polyml import lockfile

tomllib = pytest.importorskip("tomllib")  # Python 3.11+, the locked Python

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKED_EXTRAS = ("test", "bench", "plot")  # in test.txt; the others (cuda, tf, ...) are not locked


def _entries(path: Path) -> dict[str, list[str]]:
    """{normalized name: [sha256, ...]} of a hash-locked requirements file; every requirement
    must be ``name==version`` followed by its hashes."""
    entries: dict[str, list[str]] = {}
    text = path.read_text()
    for block in re.split(r"\n(?=\S)", text):
        first = block.split("\n", 1)[0]
        if not first.strip() or first.startswith("#"):
            continue
        m = re.match(r"([A-Za-z0-9._-]+)==(\S+) \\$", first)
        assert m, f"{path.name}: not an exact, hashed pin: {first!r}"
        entries[lockfile.normalize(m.group(1))] = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
    return entries


@pytest.mark.parametrize("name", lockfile.LOCKS)
def test_every_pin_is_exact_and_hashed(name: str) -> None:
    path = REQ / f"{name}.txt"
    entries = _entries(path)
    assert entries and all(entries.values()), [k for k, v in entries.items() if not v]
    assert set(entries) == set(lockfile.pins(path.read_text()))
    assert "make lock" in path.read_text().split("\n", 3)[1], "the header names the command that writes it"


def test_runtime_pins_are_the_test_pins() -> None:
    runtime, test = (lockfile.pins((REQ / f"{n}.txt").read_text()) for n in ("runtime", "test"))
    assert runtime.items() <= test.items(), {k: (v, test.get(k)) for k, v in runtime.items() if test.get(k) != v}


def _check_satisfied(requirements: list[str], pins: dict[str, str], where: str) -> None:
    for spec in requirements:
        req = Requirement(spec)
        name = lockfile.normalize(req.name)
        assert name in pins, f"{req.name} ({where}) is not in the lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req.specifier}"


def test_pins_satisfy_pyproject_ranges() -> None:
    runtime = lockfile.pins((REQ / "runtime.txt").read_text())
    test = lockfile.pins((REQ / "test.txt").read_text())
    _check_satisfied(PYPROJECT["project"]["dependencies"], runtime, "dependencies")
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in LOCKED_EXTRAS:
        _check_satisfied(extras[extra], test, f"extra {extra}")
    _check_satisfied(PYPROJECT["build-system"]["requires"], test, "build-system")
    for extra in set(extras) - set(LOCKED_EXTRAS):  # heavy or optional: kept out of the lock
        for spec in extras[extra]:
            if lockfile.normalize(Requirement(spec).name) not in runtime:
                assert lockfile.normalize(Requirement(spec).name) not in test, f"{spec} (extra {extra}) is locked"


def test_lockfile_reads_the_checkout_and_compares_versions(monkeypatch) -> None:
    assert lockfile.path("runtime") == REQ / "runtime.txt"
    assert lockfile.pins("numpy==2.4.6 \\\n    --hash=sha256:ab\nTyping_Extensions==4.1 ; python_version<'3.12'\n# x==1\n") \
        == {"numpy": "2.4.6", "typing-extensions": "4.1"}
    with pytest.raises(ValueError):
        lockfile.path("dev")
    s = lockfile.status("runtime")
    assert s["sha256"] == hashlib.sha256(lockfile.path("runtime").read_bytes()).hexdigest()
    assert s["packages"] == len(lockfile.pins(lockfile.path("runtime").read_text()))
    # a package at another version than locked is named, and the manifest says so
    lockfile.status.cache_clear()
    real = lockfile._installed
    monkeypatch.setattr(lockfile, "_installed", lambda d: "0.0.1" if d == "numpy" else real(d))
    try:
        s = lockfile.status("runtime")
        assert not s["matches"] and any(d.startswith("numpy 0.0.1 (locked ") for d in s["differences"])
        fields = lockfile.manifest_fields()
        assert fields["lock_sha256"] == s["sha256"] and fields["lock_installed"].startswith("no: ")
        assert "numpy 0.0.1" in fields["lock_installed"]
    finally:
        lockfile.status.cache_clear()


def test_manifest_records_the_lock(tmp_path) -> None:
    import onnx

    import polyml
    from tests.test_codegen import add_relu_model

    onnx.save(add_relu_model(), str(tmp_path / "m.onnx"))
    versions = polyml.compile(tmp_path / "m.onnx", tmp_path / "art", cache=False).manifest["versions"]
    assert versions["lock_sha256"] == lockfile.status("runtime")["sha256"]
    assert versions["lock_installed"] == "yes" or versions["lock_installed"].startswith("no: ")
