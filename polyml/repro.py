"""Rebuilding an artifact from its ``manifest.json`` and reporting every difference.

``polyml build --from-manifest DIR/manifest.json`` reads the model (checking its sha256), the
options and build inputs the manifest records, rebuilds without the cache and compares:

* the toolchain and target recorded against the ones here,
* every file: the hash the manifest records, the file next to the manifest (when the artifact
  folder is there: a changed file is reported as tampered) and the rebuilt file,
* the other deterministic manifest fields (interface, memory plan, flags, passes) and
  ``artifact_sha256`` (recorded, recomputed from the recorded manifest, rebuilt).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from polyml.driver import artifact
from polyml.errors import ModelFormatError, PolymlError


@dataclass
class Difference:
    """One thing that is not the same: ``what`` (a file name or manifest field) and why."""

    what: str
    kind: str  # "file", "manifest", "toolchain", "artifact"
    detail: str


@dataclass
class RebuildReport:
    manifest_path: Path
    output_dir: Path
    recorded_sha256: str
    rebuilt_sha256: str
    files: list[tuple[str, str, str, str, str]] = field(default_factory=list)  # name, recorded, here, rebuilt, status
    differences: list[Difference] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.differences


def load_manifest(path: str | os.PathLike) -> dict:
    p = Path(path)
    if p.is_dir():
        p = p / artifact.MANIFEST
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        raise ModelFormatError(f"{p}: no such manifest") from None
    except ValueError as e:
        raise ModelFormatError(f"{p}: malformed manifest ({e})") from None


def _short(h: str | None) -> str:
    return h[:10] if h else "-"


def _clip(v: object) -> str:
    s = str(v)
    return s if len(s) < 40 else f"{s[:37]}..."


def compare(recorded: dict, rebuilt: dict, recorded_dir: Path | None, rebuilt_dir: Path) -> tuple[list, list[Difference]]:
    """File rows and differences between a recorded manifest (and its folder) and a rebuild."""
    diffs: list[Difference] = []
    for section, kind in (("versions", "toolchain"), ("target", "toolchain")):
        a, b = recorded.get(section, {}), rebuilt.get(section, {})
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diffs.append(Difference(f"{section}.{k}", kind, f"recorded {_clip(a.get(k))}, here {_clip(b.get(k))}"))
    rec_files: dict[str, str] = recorded.get("files", {})
    new_files: dict[str, str] = rebuilt.get("files", {})
    have_dir = recorded_dir is not None and any((recorded_dir / f).is_file() for f in rec_files)
    rows = []
    for f in sorted(set(rec_files) | set(new_files)):
        r, n = rec_files.get(f), new_files.get(f)
        h = artifact.sha256_file(recorded_dir / f) if have_dir and (recorded_dir / f).is_file() else None
        problems = []
        if have_dir and r is not None and h is None:
            problems.append("missing next to the manifest")
        if h is not None and r is not None and h != r:
            problems.append("tampered: differs from its manifest hash")
        if r is None:
            problems.append("not in the recorded manifest")
        elif n is None:
            problems.append("not produced by the rebuild")
        elif n != r:
            problems.append("rebuilt file differs")
        status = "; ".join(problems) or "same"
        rows.append((f, _short(r), _short(h) if have_dir else "-", _short(n), status))
        if problems:
            diffs.append(Difference(f, "file", status))
    skip = {"files", "jscop", "versions", "target", "artifact_sha256", "seconds"}
    a, b = artifact.deterministic_fields(recorded), artifact.deterministic_fields(rebuilt)
    for k in sorted((set(a) | set(b)) - skip):
        if a.get(k) != b.get(k):
            diffs.append(Difference(k, "manifest", "differs between the recorded manifest and the rebuild"))
    rec_sha = recorded.get("artifact_sha256", "")
    if rec_sha != artifact.artifact_sha256(recorded):
        diffs.append(Difference("artifact_sha256", "artifact", "the recorded manifest was edited: its artifact_sha256 does not match its contents"))
    if rec_sha != rebuilt.get("artifact_sha256"):
        diffs.append(Difference("artifact_sha256", "artifact", f"recorded {_short(rec_sha)}, rebuilt {_short(rebuilt.get('artifact_sha256'))}"))
    return rows, diffs


def rebuild(manifest_path: str | os.PathLike, output_dir: str | os.PathLike | None = None,
            model: str | os.PathLike | None = None) -> RebuildReport:
    """Rebuild what ``manifest_path`` describes (into ``output_dir`` or a temporary folder) and compare."""
    from polyml.compiler import compile as polyml_compile
    from polyml.compiler import file_sha256
    from polyml.driver.flags import Options

    mpath = Path(manifest_path)
    mpath = mpath / artifact.MANIFEST if mpath.is_dir() else mpath
    recorded = load_manifest(mpath)
    where = str(model or recorded.get("model", {}).get("path") or "")
    if not where or not Path(where).is_file():
        raise ModelFormatError(f"{mpath}: the model {where or '(no path recorded)'} is not there; pass its path as MODEL")
    model_path = Path(where)
    want = recorded.get("model", {}).get("sha256", "")
    got = file_sha256(model_path)
    if want and got != want:
        raise PolymlError(f"{model_path}: sha256 {got[:12]}... is not the {want[:12]}... the manifest was built from")
    opts = dict(recorded.get("options", {}))
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(opts) - known)
    if unknown:
        raise PolymlError(f"{mpath}: options this polyml does not know: {', '.join(unknown)}")
    if "extra_opt_flags" in opts:
        opts["extra_opt_flags"] = tuple(opts["extra_opt_flags"])
    b = recorded.get("build", {})
    emit = b.get("emit", ["ll"] if any(f.endswith(".ll") for f in recorded.get("files", {})) else [])
    shapes = {k: tuple(v) for k, v in (b.get("input_shapes") or {}).items()}
    if output_dir is not None and Path(output_dir).resolve() == mpath.parent.resolve():
        raise PolymlError(f"{output_dir}: rebuild into another folder than the manifest's (it is compared against)")
    tmp = tempfile.TemporaryDirectory(prefix="polyml-rebuild-") if output_dir is None else None
    out = Path(tmp.name if tmp is not None else output_dir)
    try:
        compiled = polyml_compile(model_path, out, input_shapes=shapes or None, outputs=b.get("outputs"), emit=emit,
                                  cache=False, chunks=b.get("chunks"), **opts)
        rows, diffs = compare(recorded, compiled.manifest, mpath.parent, out)
        return RebuildReport(mpath, out, recorded.get("artifact_sha256", ""), compiled.manifest.get("artifact_sha256", ""), rows, diffs)
    finally:
        if tmp is not None:
            tmp.cleanup()


def cmd_rebuild(args, console) -> int:
    """``polyml build --from-manifest``: rebuild, print a file-by-file table; 1 on any difference."""
    from rich.markup import escape
    from rich.table import Table

    report = rebuild(args.from_manifest, args.output, args.model)
    table = Table(title=f"rebuild of {report.manifest_path}", show_header=True)
    table.add_column("file", no_wrap=True)
    for col in ("recorded", "next to manifest", "rebuilt", "status"):
        table.add_column(col)
    for name, rec, here, new, status in report.files:
        style = "green" if status == "same" else "bold red"
        table.add_row(escape(name), rec, here, new, f"[{style}]{escape(status)}[/]")
    console.print(table)
    for d in report.differences:
        if d.kind != "file":
            console.print(f"[bold red]difference[/] ({d.kind}) {escape(d.what)}: {escape(d.detail)}", highlight=False)
    if report.identical:
        console.print(f"[green]no difference[/]: artifact_sha256 {report.rebuilt_sha256}", highlight=False)
        return 0
    console.print(f"[bold red]{len(report.differences)} difference(s)[/]; recorded artifact_sha256 "
                  f"{report.recorded_sha256[:12]}, rebuilt {report.rebuilt_sha256[:12]}", highlight=False)
    return 1
