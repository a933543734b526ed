"""The optional ``plot`` extra: matplotlib (and the graphviz package), imported only when a
picture is asked for, with one clear error naming the extra when they are missing."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from polyml.errors import PolymlError

INSTALL = "pip install 'polyml[plot]'"
FORMATS = ("svg", "png")


class PlotExtraMissing(PolymlError):
    """matplotlib or graphviz is not installed (CLI: one line, exit code 2)."""


def _import(name: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise PlotExtraMissing(f"{what} needs {name.split('.')[0]}, which is not installed: {INSTALL}") from None


def pyplot(what: str = "pictures") -> ModuleType:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, with reproducible SVG output
    (fixed hash salt, no date: the same data gives byte-identical files)."""
    mpl = _import("matplotlib", what)
    mpl.use("Agg", force=True)
    mpl.rcParams["svg.hashsalt"] = "polyml"
    mpl.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, and smaller files
    return _import("matplotlib.pyplot", what)


def graphviz(what: str = "the fusion graph as DOT") -> ModuleType:
    return _import("graphviz", what)


def require(what: str) -> None:
    """Fail early (before a long build or benchmark) when the extra is missing."""
    pyplot(what)


def picture_format(path: str | Path, default: str = "svg") -> str:
    """``svg`` or ``png`` from the file's suffix (no suffix: ``default``)."""
    suffix = Path(path).suffix.lower().lstrip(".") or default
    if suffix not in FORMATS:
        raise PolymlError(f"{path}: pictures are written as {' or '.join(FORMATS)} (got .{suffix})")
    return suffix


def save(fig, path: str | Path, fmt: str | None = None) -> Path:
    """Write ``fig`` (SVG without a date, so reproducible; PNG at 120 dpi) and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fmt = fmt or picture_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"Date": None} if fmt == "svg" else {}
    fig.savefig(path, format=fmt, metadata=meta, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
