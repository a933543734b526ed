"""Op functions compiled once per distinct body.

Two ops with the same type, attributes, shapes and dtypes (the repeated blocks of a ResNet, the
layers of a transformer) lower to the same code: their weights and activations are pointer
parameters.  After each op function is emitted, its body — the function and the globals it
owns (its outlined parallel workers, its constant tables: names beginning with the
function's) — is compared with those emitted before it in the same Polly policy, with the
names that only say which node it was (the function's, the node's block-label prefix, the
module's counter of loop ids) normalised away, and with every other global and metadata node
it refers to replaced by its contents.  An identical body is dropped from its module and the op
calls the first one: ``opt`` and ``llc`` see each distinct function once.

The comparison is on the emitted IR, not on the ops' attributes: a kernel that bakes a
constant input's value into its code (a Clip bound, an int8 multiplier table) gives different
bodies for different values, and those stay separate functions.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import llvmlite.ir as ir

#: a reference to a global (``@name`` or ``@"quoted name"``)
_GLOBAL_REF = re.compile(r'@("(?:[^"\\]|\\.)*"|[-\w.$]+)')
#: a reference to an unnamed metadata node
_METADATA_REF = re.compile(r"!(\d+)\b")
#: polyml's loop identity (:func:`polyml.codegen.builder.counted_loop`): a module-wide counter
_LOOP_ID = re.compile(r'!"polyml\.loop\.id", !"(\d+)"')


def _unquote(ref: str) -> str:
    return ref[1:-1] if ref.startswith('"') else ref


def _owned(module: ir.Module, function: str) -> list[str]:
    """The globals of ``module`` that belong to ``function``: itself and those named after it."""
    return [name for name in module.globals if name == function or name.startswith(function + ".")]


def callers(steps: Sequence) -> dict[str, list[str]]:  # noqa: ANN001 - codegen.lower.Step
    """Function → the nodes whose ops call it, in step order (the first is the one it was
    emitted for)."""
    out: dict[str, list[str]] = {}
    for s in steps:
        out.setdefault(s.function, []).append(s.node)
    return out


@dataclass
class _Emitted:
    function: str
    module: ir.Module
    prefix: str
    #: its body key, computed once a second function shares its signature
    key: str | None = None


@dataclass
class IdenticalFunctions:
    """The op functions emitted so far, by normalised body (module docstring)."""

    #: by signature (policy, op type, parameter types...): the functions emitted with it (keys
    #: are made only once a second function shares a signature: most are the only one of theirs)
    emitted: dict[tuple, list[_Emitted]] = field(default_factory=dict)
    _metadata: dict[int, tuple[int, dict[str, str]]] = field(default_factory=dict)

    def _metadata_of(self, module: ir.Module) -> dict[str, str]:
        """``{number: contents}`` of ``module``'s unnamed metadata (kept up to date as it grows)."""
        count, table = self._metadata.get(id(module), (0, {}))
        for md in module.metadata[count:]:
            table[str(md.name)] = str(md).split(" = ", 1)[1]
        self._metadata[id(module)] = (len(module.metadata), table)
        return table

    def key(self, module: ir.Module, function: str, prefix: str) -> str:
        """``function``'s body and what it refers to, without the names of its node."""
        owned = _owned(module, function)
        text = "\n".join(str(module.globals[name]) for name in owned)
        # the globals it refers to that it does not own, by contents (a table named by a
        # counter may hold other values in another module)
        refs = sorted({_unquote(r) for r in _GLOBAL_REF.findall(text)} - set(owned))
        shared = [str(module.globals[r]) for r in refs
                  if r in module.globals and isinstance(module.globals[r], ir.GlobalVariable)]
        metadata = self._metadata_of(module)
        resolved: dict[str, str] = {}

        def contents(n: str, path: tuple[str, ...] = ()) -> str:
            if n in path:  # a self-referencing (distinct) node
                return "self"
            if n not in resolved:
                body = metadata.get(n, f"!{n}")
                resolved[n] = _METADATA_REF.sub(lambda m: contents(m.group(1), (*path, n)), body)
            return resolved[n]

        text = "\n".join([text, *shared])
        text = _METADATA_REF.sub(lambda m: contents(m.group(1)), text)
        loops: dict[str, int] = {}
        text = _LOOP_ID.sub(lambda m: f'!"polyml.loop.id", !"{loops.setdefault(m.group(1), len(loops))}"', text)
        text = text.replace(function, "F")
        return re.sub(r"(?<![\w.])" + re.escape(prefix) + r"\.", "P.", text)

    def owner(self, module: ir.Module, function: str, prefix: str, signature: tuple) -> str | None:
        """The earlier function identical to ``function`` (then removed, with the globals it
        owns, from ``module``), or None if it is the first of its body; only functions of the
        same ``signature`` (the Polly policy, the parameter types) are compared."""
        earlier = self.emitted.setdefault(signature, [])
        entry = _Emitted(function, module, prefix)
        earlier.append(entry)
        if len(earlier) == 1:
            return None
        for e in earlier:
            if e.key is None:
                e.key = self.key(e.module, e.function, e.prefix)
        first = next(e.function for e in earlier if e.key == entry.key)
        if first == function:
            return None
        earlier.pop()
        for name in _owned(module, function):
            del module.globals[name]
        return first


__all__ = ["IdenticalFunctions", "callers"]
