"""What an artifact folder holds and how its identity is hashed.

An artifact folder is polyml's own: every regular file in it except ``manifest.json`` and the
``failed/`` folder is an artifact file (``model.so``, ``weights.bin``, the ``.ll`` files of
``--emit ll``, JSCoP files, ...), listed with its sha256 under the manifest's ``files``.

``artifact_sha256`` is the identity of a build's result, defined as

    sha256( json.dumps(D, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode() )

where ``D`` is the manifest without its volatile fields: ``seconds`` (timings),
``artifact_sha256`` itself and ``model.path`` (where the model happened to be). ``D`` keeps
``files`` (so every file's bytes count) and everything deterministic: versions, target, options,
flags, passes, the interface, the memory plan. Two builds of the same model with the same
options, build inputs and toolchain have the same ``artifact_sha256``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from importlib import metadata
from pathlib import Path

MANIFEST = "manifest.json"
FAILED = "failed"
#: manifest keys left out of ``artifact_sha256`` (``model.path`` is left out too)
VOLATILE = ("seconds", "artifact_sha256")


@functools.cache
def library_versions() -> dict[str, str]:
    """Versions of the Python side that shapes a build (read from package metadata: no imports),
    and the runtime lock's sha256 with whether the installed packages match it (polyml.lockfile)."""
    from polyml import lockfile

    versions = {"python": platform.python_version()}
    for dist in ("islpy", "numpy", "onnx", "networkx"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = ""
    return {**versions, **lockfile.manifest_fields()}


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def artifact_files(out: str | os.PathLike) -> list[str]:
    """Relative POSIX paths of the artifact files in ``out``, sorted."""
    root = Path(out)
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d != FAILED]
        for f in filenames:
            p = (rel / f).as_posix()
            if p != MANIFEST and not Path(dirpath, f).is_symlink():
                files.append(p)
    return sorted(files)


def file_hashes(out: str | os.PathLike) -> dict[str, str]:
    """``{relative path: sha256}`` of every artifact file in ``out``, in sorted order."""
    return {f: sha256_file(Path(out, f)) for f in artifact_files(out)}


def canonical_json(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def deterministic_fields(manifest: dict) -> dict:
    """The manifest without its volatile fields (see the module docstring)."""
    d = {k: v for k, v in manifest.items() if k not in VOLATILE}
    if isinstance(d.get("model"), dict):
        d["model"] = {k: v for k, v in d["model"].items() if k != "path"}
    return d


def artifact_sha256(manifest: dict) -> str:
    return hashlib.sha256(canonical_json(deterministic_fields(manifest))).hexdigest()


def read_manifest(out: str | os.PathLike) -> dict | None:
    try:
        return json.loads(Path(out, MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def clean_previous(out: str | os.PathLike) -> None:
    """Remove the files of an artifact built earlier into ``out`` (those its manifest lists,
    and top-level IR/JSCoP files), so that the new manifest lists only what this build wrote."""
    root = Path(out)
    old = read_manifest(root)
    if old is None:
        return
    stale = set(old.get("files", {})) if isinstance(old.get("files"), dict) else set()
    stale |= {p.name for pattern in ("*.ll", "*.jscop") for p in root.glob(pattern)}
    for rel in stale:
        p = root / rel
        if p.is_file() and root.resolve() in p.resolve().parents:
            p.unlink()
    (root / MANIFEST).unlink(missing_ok=True)


def verify(out: str | os.PathLike, manifest: dict | None = None) -> list[str]:
    """Differences between the files in ``out`` and its manifest (empty when intact)."""
    manifest = manifest if manifest is not None else read_manifest(out)
    if manifest is None:
        return [f"{MANIFEST}: missing or unreadable"]
    recorded = manifest.get("files", {})
    present = file_hashes(out)
    problems = [f"{f}: missing" for f in recorded if f not in present]
    problems += [f"{f}: not in the manifest" for f in present if f not in recorded]
    problems += [f"{f}: sha256 differs" for f in recorded if f in present and present[f] != recorded[f]]
    if manifest.get("artifact_sha256") != artifact_sha256(manifest):
        problems.append("artifact_sha256 does not match the manifest's contents")
    return problems
