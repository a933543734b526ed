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


@dataclass
class IdenticalFunctions:
    """The op functions emitted so far, by normalised body (module docstring)."""

    #: by signature (policy, op type, parameter types...): the functions emitted with it, each
    #: with its module, node prefix and body key (computed once a second function shares the
    #: signature: most functions are the only one of theirs)
    emitted: dict[tuple, list[list]] = field(default_factory=dict)
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
        own = [g for name, g in module.globals.items() if name == function or name.startswith(function + ".")]
        text = "\n".join(str(g) for g in own)
        owned = {g.name for g in own}
        # the globals it refers to that it does not own, by contents (a table named by a
        # counter may hold other values in another module)
        refs = sorted({_unquote(r) for r in _GLOBAL_REF.findall(text)} - owned)
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
        entry = [function, module, prefix, None]
        earlier.append(entry)
        if len(earlier) == 1:
            return None
        for e in earlier:
            if e[3] is None:
                e[3] = self.key(e[1], e[0], e[2])
        first = next(e[0] for e in earlier if e[3] == entry[3])
        if first == function:
            return None
        earlier.pop()
        for name in [n for n in module.globals if n == function or n.startswith(function + ".")]:
            del module.globals[name]
        return first


__all__ = ["IdenticalFunctions"]
