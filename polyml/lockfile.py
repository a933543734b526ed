"""The lock files: exact versions (and hashes) of the Python packages polyml is tested with.

``requirements/runtime.txt`` (what ``polyml build`` imports) and ``requirements/test.txt`` (that
plus the test, bench and plot extras and the build backend) are written by ``make lock``
(``scripts/lock.sh``, uv) from ``pyproject.toml``'s ranges. ``make setup``, CI and the Docker
image install from them with ``pip --require-hashes``. The wheel carries both as
``polyml/requirements/*.txt``, so an installed polyml can tell whether the packages around it are
the locked ones: ``polyml doctor`` reports it, and every build manifest records the runtime lock's
sha256 and whether the environment matches it (``versions.lock_sha256``, ``versions.lock_installed``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import metadata
from pathlib import Path

LOCKS = ("runtime", "test")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def path(name: str = "runtime") -> Path | None:
    """The lock file ``name`` (``runtime`` or ``test``): the copy in the installed package, or
    ``requirements/`` of the checkout an editable install runs from; None when there is none."""
    if name not in LOCKS:
        raise ValueError(f"unknown lock {name!r}: one of {', '.join(LOCKS)}")
    here = Path(__file__).resolve().parent
    for p in (here / "requirements" / f"{name}.txt", here.parent / "requirements" / f"{name}.txt"):
        if p.is_file():
            return p
    return None


def normalize(dist: str) -> str:
    """PEP 503 name normalization (``Typing_Extensions`` → ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def pins(text: str) -> dict[str, str]:
    """``{normalized name: version}`` of the ``name==version`` lines of a requirements file."""
    found = {}
    for line in text.splitlines():
        m = _PIN.match(line.strip())
        if m:
            found[normalize(m.group(1))] = m.group(2)
    return found


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def status(name: str = "runtime") -> dict:
    """The lock ``name`` and how the installed packages compare with it:
    ``{"name", "file", "sha256", "packages", "matches", "differences": ["numpy 2.3.0 (locked 2.4.6)", ...]}``;
    ``file`` and ``sha256`` are None when polyml has no such lock file (``matches`` is then False)."""
    p = path(name)
    if p is None:
        return {"name": name, "file": None, "sha256": None, "packages": 0, "matches": False,
                "differences": [f"no requirements/{name}.txt next to polyml"]}
    data = p.read_bytes()
    locked = pins(data.decode())
    differences = []
    for dist, want in sorted(locked.items()):
        have = _installed(dist)
        if have != want:
            differences.append(f"{dist} {have or 'missing'} (locked {want})")
    return {"name": name, "file": str(p), "sha256": hashlib.sha256(data).hexdigest(), "packages": len(locked),
            "matches": not differences, "differences": differences}


def manifest_fields() -> dict[str, str]:
    """What every build manifest records under ``versions``: the runtime lock's sha256 and whether
    the installed packages are exactly its pins (``yes``, or ``no:`` and the first differences)."""
    s = status("runtime")
    if s["matches"]:
        installed = "yes"
    else:
        more = len(s["differences"]) - 3
        installed = "no: " + "; ".join(s["differences"][:3]) + (f"; {more} more" if more > 0 else "")
    return {"lock_sha256": s["sha256"] or "", "lock_installed": installed}
