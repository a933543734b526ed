"""polyml's schedule transforms: small named passes that map a JSCoP to a new JSCoP with islpy.

A pass is a frozen dataclass deriving from :class:`Pass`, with a class attribute ``name``, its
options as fields, and ``apply(scop) -> scop``: a pure function of the JSCoP (a dict, see
:mod:`polyml.scop.jscop`) that returns a new one with other schedules.  One file per pass, in
this package or in any distribution that registers it in the ``polyml.passes`` entry-point
group::

    [project.entry-points."polyml.passes"]
    skew = "my_package.skew:Skew"

Passes do not check legality themselves: whoever imports the result (``polyml build
--import-jscop``, ``polyml opt``, ``polyml scops --after``) checks the final schedule against
the original dependences (:mod:`polyml.scop.legality`).

Pipelines are written ``name`` or ``name{key=value key=value}``, comma-separated, with lists
comma-separated inside the braces (MLIR's pass-option syntax)::

    tile                       tile{sizes=32,8}
    interchange{dims=1,2}      interchange{dims=2,3 stmts=Stmt_n0_L5.*},tile{sizes=64}
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
import traceback
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any, ClassVar

from polyml.errors import PolymlError

ENTRY_POINT_GROUP = "polyml.passes"


class PassError(PolymlError):
    """An unknown pass, a malformed pipeline or option, or a pass that cannot apply."""


@dataclass(frozen=True)
class Pass:
    """Base class: ``apply`` maps a JSCoP to a new JSCoP (never mutating its argument)."""

    name: ClassVar[str] = ""

    def apply(self, scop: dict) -> dict:
        raise NotImplementedError

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def spec(self) -> str:
        """The pipeline text that makes this pass with these options."""
        opts = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v != f.default and not (f.default_factory is not dataclasses.MISSING and v == f.default_factory()):
                opts.append(f"{f.name}={','.join(map(str, v)) if isinstance(v, (tuple, list)) else v}")
        return f"{self.name}{{{' '.join(opts)}}}" if opts else self.name

    @classmethod
    def from_options(cls, options: dict[str, str]) -> Pass:
        """Build the pass from option strings, converted by the fields' types."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for key, text in options.items():
            if key not in fields:
                raise PassError(f"pass {cls.name!r} has no option {key!r} (options: {', '.join(fields) or 'none'})")
            kwargs[key] = _convert(cls.name, key, text, hints[key])
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise PassError(f"pass {cls.name!r}: {e}") from None


def _convert(pass_name: str, key: str, text: str, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    try:
        if origin in (tuple, list):
            item = typing.get_args(hint)[0] if typing.get_args(hint) else str
            return tuple(item(v) for v in re.split(r"[,x]", text) if v.strip()) if item is int else tuple(
                v for v in text.split(",") if v)
        if hint is bool:
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        if hint is int:
            return int(text)
        return text
    except ValueError:
        raise PassError(f"pass {pass_name!r}: option {key}={text!r} is not a valid {getattr(hint, '__name__', hint)}") from None


@dataclass(frozen=True)
class PassInfo:
    """A registered pass: its class, where it comes from and its docstring's first line."""

    name: str
    cls: type[Pass] | None
    origin: str
    summary: str
    error: str = ""


_BUILTIN: dict[str, type[Pass]] = {}
_loaded: dict[str, PassInfo] | None = None


def register(cls: type[Pass]) -> type[Pass]:
    """Class decorator for the passes of this package."""
    if not cls.name:
        raise TypeError(f"{cls.__name__}: a pass needs a non-empty class attribute 'name'")
    if cls.name in _BUILTIN and _BUILTIN[cls.name] is not cls:
        raise TypeError(f"pass {cls.name!r} registered twice ({_BUILTIN[cls.name].__name__}, {cls.__name__})")
    _BUILTIN[cls.name] = cls
    return cls


def _summary(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def available(reload: bool = False) -> dict[str, PassInfo]:
    """Every pass by name: this package's modules, then the ``polyml.passes`` entry points."""
    global _loaded
    if _loaded is not None and not reload:
        return _loaded
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")
    found = {n: PassInfo(n, c, f"polyml ({c.__module__})", _summary(c)) for n, c in sorted(_BUILTIN.items())}
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else "?"
        origin = f"{dist} ({ep.value})"
        try:
            cls = ep.load()
        except Exception as e:  # a broken plugin is listed, not fatal
            found.setdefault(ep.name, PassInfo(ep.name, None, origin, "", f"cannot load: {e}"))
            continue
        if not (isinstance(cls, type) and issubclass(cls, Pass)):
            found.setdefault(ep.name, PassInfo(ep.name, None, origin, "", "not a polyml.passes.Pass subclass"))
            continue
        name = cls.name or ep.name
        if name in found:
            continue  # built-in passes win over plugins of the same name
        found[name] = PassInfo(name, cls, origin, _summary(cls))
    _loaded = found
    return found


def split_pipeline(text: str) -> list[tuple[str, dict[str, str]]]:
    """``"a,b{k=v l=1,2}"`` → ``[("a", {}), ("b", {"k": "v", "l": "1,2"})]``."""
    items: list[tuple[str, dict[str, str]]] = []
    pos, n = 0, len(text)
    while pos < n:
        m = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*").match(text, pos)
        if not m:
            raise PassError(f"pipeline {text!r}: expected a pass name at position {pos}")
        name, pos = m.group(1), m.end()
        opts: dict[str, str] = {}
        if pos < n and text[pos] == "{":
            end = text.find("}", pos)
            if end < 0:
                raise PassError(f"pipeline {text!r}: '{{' after {name!r} is not closed")
            for item in text[pos + 1 : end].split():
                key, eq, value = item.partition("=")
                if not eq or not key:
                    raise PassError(f"pipeline {text!r}: option {item!r} of {name!r} is not key=value")
                opts[key] = value
            pos = end + 1
        items.append((name, opts))
        while pos < n and text[pos].isspace():
            pos += 1
        if pos < n:
            if text[pos] != ",":
                raise PassError(f"pipeline {text!r}: expected ',' at position {pos}")
            pos += 1
    return items


def parse_pipeline(text: str) -> list[Pass]:
    """Passes with their options from pipeline text (see the module docstring)."""
    passes = available()
    out = []
    for name, opts in split_pipeline(text):
        info = passes.get(name)
        if info is None:
            raise PassError(f"unknown pass {name!r} (available: {', '.join(sorted(passes))})")
        if info.cls is None:
            raise PassError(f"pass {name!r} from {info.origin}: {info.error}")
        out.append(info.cls.from_options(opts))
    return out


def run(passes: Sequence[Pass], scop: dict) -> dict:
    """Apply ``passes`` in order.  A pass that raises anything but a :class:`PolymlError` has a
    bug (built in or a plugin): that becomes a :class:`PassError` naming the pass, the SCoP and
    where in the pass's code it failed, instead of a traceback."""
    for i, p in enumerate(passes):
        try:
            scop = p.apply(scop)
        except PolymlError:
            raise
        except Exception as e:
            where = traceback.extract_tb(e.__traceback__)[-1]
            raise PassError(f"pass {p.spec()!r} failed on SCoP {scop.get('name', '?')!r}: {type(e).__name__}: {e} "
                            f"(at {where.filename}:{where.lineno} in {where.name}; "
                            f"reproduce with: polyml scops IN.ll --after '{','.join(q.spec() for q in passes[: i + 1])}')") from e
    return scop


__all__ = ["ENTRY_POINT_GROUP", "Pass", "PassError", "PassInfo", "available", "parse_pipeline", "register", "run",
           "split_pipeline"]
