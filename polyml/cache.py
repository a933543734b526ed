"""A content-addressed compile cache: artifact folders keyed by everything a build depends on.

The key (:func:`cache_inputs`) is the sha256 of the model file's sha256, the build options (and
the contents of any file or folder an option names), input shapes, output names, ``emit``, the
module count per policy, the toolchain (tool paths and versions, Python library versions), the
host target and every LLVM flag, and polyml's version plus a hash of its own source files, so
that editing polyml invalidates the cache.

Layout under :func:`cache_dir` (``POLYML_CACHE_DIR``, else the user cache folder)::

    artifacts/<key>/artifact/   the artifact files and manifest.json
    artifacts/<key>/entry.json  what the key was computed from; its mtime is the last use
    locks/<key>.lock            held while one process builds a key (others wait, then hit)
    tmp/                        entries being written or deleted

After each store the least recently used entries are deleted beyond ``POLYML_CACHE_MAX_MB``
(default 4096).

Safe under concurrent builds: an entry is written into ``tmp/`` and renamed into place in one
step, so a reader sees a whole entry or none; a hit is checked against its manifest's hashes
(a damaged entry is dropped and rebuilt); and a reader that loses an entry to ``clear`` mid-copy
rebuilds instead.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from filelock import FileLock

from polyml import options as settings
from polyml._version import __version__
from polyml.codegen.gemm import blocking_for_host
from polyml.driver import artifact, flags
from polyml.driver.artifact import MANIFEST
from polyml.driver.toolchain import TOOLS, host_target, tool, toolchain_versions
from polyml.userdirs import cache_dir

FORMAT = 1
ENV_DISABLE = "POLYML_NO_CACHE"
ENV_MAX_MB = "POLYML_CACHE_MAX_MB"
DEFAULT_MAX_MB = 4096


def max_bytes() -> int:
    """The size the cache is pruned to after each store (``POLYML_CACHE_MAX_MB``, default 4 GiB)."""
    try:
        return int(float(settings.raw(ENV_MAX_MB) or DEFAULT_MAX_MB) * 2**20)
    except ValueError:
        return DEFAULT_MAX_MB * 2**20


def enabled_by_default() -> bool:
    return settings.raw(ENV_DISABLE).strip().lower() in ("", "0", "false", "no")


def _hash_tree(h: hashlib._Hash, root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith((".pyc", ".pyo")):
                continue
            p = Path(dirpath, f)
            h.update(p.relative_to(root).as_posix().encode() + b"\0")
            h.update(artifact.sha256_file(p).encode())


@functools.cache
def source_hash() -> str:
    """sha256 over polyml's own files (the ``polyml`` package folder), so that a code change
    gives new cache keys."""
    h = hashlib.sha256()
    for pkg in ("polyml",):
        spec = importlib.util.find_spec(pkg)
        for loc in sorted(spec.submodule_search_locations or []) if spec else []:
            h.update(pkg.encode() + b"\0")
            _hash_tree(h, Path(loc))
    return h.hexdigest()


def _content_hash(path: Path) -> str:
    if path.is_file():
        return artifact.sha256_file(path)
    h = hashlib.sha256()
    _hash_tree(h, path)
    return h.hexdigest()


def _option_files(options: flags.Options) -> dict[str, str]:
    """Contents of files or folders named by option values (e.g. JSCoP folders to import)."""
    found = {}
    for f in dataclasses.fields(options):
        values = getattr(options, f.name)
        for i, v in enumerate(values if isinstance(values, (list, tuple)) else [values]):
            if isinstance(v, (str, os.PathLike)) and str(v) and os.path.exists(v):
                found[f"{f.name}[{i}]"] = _content_hash(Path(v))
    return found


def model_companions(path: str | os.PathLike) -> dict[str, str] | None:
    """sha256 of the files a model reads besides itself (ONNX external data), by location.

    None when one is missing or lies outside the model's folder: the frontend reports that, and
    such a build is not cached.
    """
    p = Path(path)
    if p.suffix.lower() != ".onnx" or b"location" not in p.read_bytes():
        return {}  # external data entries are keyed "location": without the word there are none
    import onnx
    from onnx.external_data_helper import uses_external_data

    from polyml.frontends.onnx import _all_tensors

    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception:
        return None
    base = p.parent.resolve()
    found = {}
    for t in _all_tensors(model):
        if uses_external_data(t):
            loc = {e.key: e.value for e in t.external_data}.get("location", "")
            target = (base / loc).resolve()
            if not loc or os.path.isabs(loc) or not target.is_relative_to(base) or not target.is_file():
                return None
            if loc not in found:
                found[loc] = artifact.sha256_file(target)
    return dict(sorted(found.items()))


def cache_inputs(
    model_sha256: str,
    options: flags.Options,
    input_shapes: Mapping[str, Sequence[int]] | None,
    outputs: Sequence[str] | None,
    emit: Sequence[str],
    chunks: int,
    companions: Mapping[str, str] | None = None,
) -> dict:
    """Everything a build's result depends on (the cache key is the hash of this);
    ``companions``: :func:`model_companions`."""
    target = host_target()
    return {
        "format": FORMAT,
        "model_sha256": model_sha256,
        "model_companions": dict(companions or {}),
        "options": options.to_json(),
        "option_files": _option_files(options),
        "input_shapes": {k: list(v) for k, v in sorted((input_shapes or {}).items())},
        "outputs": list(outputs) if outputs else None,
        "emit": sorted(set(emit)),
        "chunks": chunks,
        "versions": toolchain_versions(),
        "tools": {t: tool(t) for t in TOOLS if t != "llvm-link"},
        "target": dataclasses.asdict(target),
        "flags": {
            "opt": {p: flags.opt_flags(p, options) for p in flags.POLICIES},
            "llc": flags.llc_flags(),
            "link": flags.link_flags(),
        },
        "polyml": {"version": __version__, "source_sha256": source_hash()},
        # host caches and POLYML_GEMM_BLOCKING (in the options' settings) decide the GEMM's blocks
        "gemm_blocking": dataclasses.asdict(blocking_for_host(options.codegen(False, False).gemm_blocking)),
    }


def cache_key(inputs: dict) -> str:
    return hashlib.sha256(artifact.canonical_json(inputs)).hexdigest()


def _copy_artifact(src: Path, dst: Path, files: Sequence[str]) -> None:
    for rel in files:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, target)


class CompileCache:
    """The cache folder: look up, restore, store, list and clear entries."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else cache_dir()

    def _entry(self, key: str) -> Path:
        return self.root / "artifacts" / key

    def lock(self, key: str) -> FileLock:
        """A lock held while one process builds ``key``; others wait for it, then hit."""
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / "locks" / f"{key}.lock"))

    def lookup(self, key: str) -> Path | None:
        """The artifact folder cached for ``key``, checked against its manifest; or None."""
        art = self._entry(key) / "artifact"
        if not (art / MANIFEST).is_file():
            return None
        try:
            problems = artifact.verify(art)
        except OSError:
            return None  # removed meanwhile
        if problems:
            self._remove(self._entry(key))
            return None
        return art

    def restore(self, key: str, art: Path, outdir: str | os.PathLike, model_path: str = "") -> dict:
        """Copy the cached artifact ``art`` into ``outdir``; returns its manifest there."""
        out = Path(outdir)
        out.mkdir(parents=True, exist_ok=True)
        manifest = json.loads((art / MANIFEST).read_text())
        artifact.clean_previous(out)
        _copy_artifact(art, out, list(manifest["files"]))
        if model_path:  # not part of artifact_sha256: the same model may sit elsewhere now
            manifest["model"]["path"] = model_path
        (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        try:
            os.utime(self._entry(key) / "entry.json")  # last use, for `polyml cache ls`
        except OSError:
            pass
        return manifest

    def store(self, key: str, outdir: str | os.PathLike, inputs: dict) -> Path | None:
        """Copy the freshly built artifact ``outdir`` in as ``key`` (atomically)."""
        out = Path(outdir)
        manifest = artifact.read_manifest(out)
        if manifest is None:
            return None
        tmp = self.root / "tmp" / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        try:
            (tmp / "artifact").mkdir(parents=True)
            _copy_artifact(out, tmp / "artifact", list(manifest["files"]))
            shutil.copyfile(out / MANIFEST, tmp / "artifact" / MANIFEST)
            meta = {"key": key, "created": time.time(), "model": manifest.get("model", {}), "inputs": inputs}
            (tmp / "entry.json").write_text(json.dumps(meta, indent=1) + "\n")
            final = self._entry(key)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(tmp, final)
            except OSError:  # another process stored the same key first
                return final if final.is_dir() else None
            return final
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _remove(self, entry: Path) -> bool:
        """Move ``entry`` out of sight in one step, then delete it."""
        trash = self.root / "tmp" / f"trash.{entry.name}.{uuid.uuid4().hex[:8]}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(entry, trash)
        except OSError:
            return False
        shutil.rmtree(trash, ignore_errors=True)
        return True

    def entries(self) -> list[dict]:
        """One dict per entry: key, model, options, size, created, last used; newest use first."""
        rows = []
        base = self.root / "artifacts"
        for entry in base.iterdir() if base.is_dir() else []:
            try:
                meta = json.loads((entry / "entry.json").read_text())
                used = (entry / "entry.json").stat().st_mtime
                size = sum(p.stat().st_size for p in (entry / "artifact").rglob("*") if p.is_file())
            except (OSError, ValueError):
                continue
            inputs = meta.get("inputs", {})
            rows.append({
                "key": entry.name,
                "model": meta.get("model", {}).get("name", ""),
                "model_path": meta.get("model", {}).get("path", ""),
                "model_sha256": inputs.get("model_sha256", ""),
                "options": inputs.get("options", {}),
                "emit": inputs.get("emit", []),
                "bytes": size,
                "created": meta.get("created", 0.0),
                "last_used": used,
                "path": str(entry / "artifact"),
            })
        return sorted(rows, key=lambda r: -r["last_used"])

    def prune(self, limit: int, keep: str = "") -> int:
        """Delete the least recently used entries (never ``keep``) until the cache holds at most
        ``limit`` bytes; returns how many were deleted."""
        total, removed = 0, 0
        for row in self.entries():  # most recently used first
            total += row["bytes"]
            if total > limit and row["key"] != keep:
                removed += self._remove(self._entry(row["key"]))
                total -= row["bytes"]
        return removed

    def clear(self) -> int:
        """Delete every entry (and leftovers of interrupted writes); returns the entry count."""
        base = self.root / "artifacts"
        n = sum(self._remove(e) for e in list(base.iterdir())) if base.is_dir() else 0
        tmp = self.root / "tmp"
        for t in list(tmp.iterdir()) if tmp.is_dir() else []:
            try:  # leave entries other processes are writing right now alone
                if t.name.startswith("trash.") or time.time() - t.stat().st_mtime > 3600:
                    shutil.rmtree(t, ignore_errors=True)
            except OSError:
                pass
        return n


def cached_compile(build, output_dir: str | os.PathLike | None, inputs: dict, model_path: str = "", root=None):
    """``build()`` through the cache: on a hit copy the cached artifact into ``output_dir`` (a
    temporary folder when None) and load it; on a miss build and store. Sets ``model.cache``."""
    import tempfile

    from polyml.runtime.model import CompiledModel

    t0 = time.perf_counter()
    key = cache_key(inputs)
    cache = CompileCache(root)
    try:
        lock = cache.lock(key)
    except OSError:  # an unwritable cache folder: build without it
        model = build()
        model.cache = {"hit": False, "key": None}
        return model
    with lock:
        art = cache.lookup(key)
        if art is not None:
            tmp = tempfile.TemporaryDirectory(prefix="polyml-build-") if output_dir is None else None
            out = tmp.name if tmp is not None else output_dir
            try:
                cache.restore(key, art, out, model_path)
            except OSError:
                art = None  # cleared meanwhile: build
            if art is not None:
                model = CompiledModel(out)
                model._tmp = tmp
                model.cache = {"hit": True, "key": key, "seconds": time.perf_counter() - t0}
                return model
        model = build()
        try:
            cache.store(key, model.dir, inputs)
            cache.prune(max_bytes(), keep=key)
        except OSError:
            pass  # a full or unwritable cache costs the next build its hit, nothing more
        model.cache = {"hit": False, "key": key}
        return model
