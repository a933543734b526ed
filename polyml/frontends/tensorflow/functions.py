"""Inlining calls into the graph's function library (``graph_def.library``).

TensorFlow 2 graphs call functions: a ``PartitionedCall`` or ``StatefulPartitionedCall`` node
names one in its ``f`` attribute, and a node whose op is the name of a library function calls it
directly.  Frozen Keras graphs keep such calls.  :func:`inline_functions` replaces each call by
the function's body:

* the body's nodes are copied under the call's name as a prefix (``call/node``; ``call/node_1``
  where that name is taken), so error messages and ``polyml scops`` name them;
* the function's input args become the call's data inputs, in order (list-typed args take as
  many inputs as their ``N`` / type-list attribute says); a body reference ``node:out_arg:i``
  becomes the copied node's flat output (``OUTPUT_ARGS`` lists the output args of ops with more
  than one; for any other op output ``i`` of its only output arg is output ``i``);
* the call node becomes an ``IdentityN`` of the ``ret`` tensors of the function's output args,
  under the call's own name: ``call``, ``call:1``, ... keep meaning the call's outputs (for its
  readers, as graph outputs and in ``--outputs``);
* control inputs (``^x``) of the body and of the call are dropped (a frozen inference graph has
  no side effects for them to order), and attribute placeholders of the body are bound to the
  call's instantiation attributes;
* calls inside a body are inlined the same way (a function calling itself is a format error).

A graph without calls is returned as it is.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyml.errors import ModelFormatError, UnsupportedError
from polyml.frontends.tensorflow.loader import check_graphdef

#: the ops that call the library function named by their ``f`` attribute
CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")

_BN_OUTPUTS = ("y", "batch_mean", "batch_variance", "reserve_space_1", "reserve_space_2")
#: output args (OpDef order, one tensor each) of ops with more than one output arg; a converter
#: for such an op needs its entry here for references from function bodies to resolve
OUTPUT_ARGS: dict[str, tuple[str, ...]] = {
    "FusedBatchNorm": _BN_OUTPUTS,
    "FusedBatchNormV2": _BN_OUTPUTS,
    "FusedBatchNormV3": (*_BN_OUTPUTS, "reserve_space_3"),
    "Switch": ("output_false", "output_true"),
    "Merge": ("output", "value_index"),
    "TopKV2": ("values", "indices"),
    "Unique": ("y", "idx"),
    "UniqueWithCounts": ("y", "idx", "count"),
    "ListDiff": ("out", "idx"),
    "MaxPoolWithArgmax": ("output", "argmax"),
    "BroadcastGradientArgs": ("r0", "r1"),
}


def inline_functions(gd, where: str = "graph"):
    """``gd`` with every call into its function library replaced by the function's body (a new
    GraphDef of the same message class; ``gd`` itself where nothing calls a function)."""
    inliner = _Inliner(gd, where)
    if not any(inliner.callee(n) for n in gd.node):
        return gd
    out = type(gd)()
    if gd.HasField("versions"):
        out.versions.CopyFrom(gd.versions)
    for n in gd.node:
        call = inliner.callee(n)
        if call is None:
            out.node.add().CopyFrom(n)
        else:
            inliner.inline(n, *call, out, ())
    check_graphdef(out, where)
    return out


class _Inliner:
    def __init__(self, gd, where: str):
        self.where = where
        self.lib = {f.signature.name: f for f in gd.library.function}
        self.taken = {n.name for n in gd.node}

    def callee(self, n) -> tuple[str, Mapping] | None:
        """(function name, instantiation attributes) of a call node, None for other nodes."""
        if n.op in CALL_OPS:
            f = n.attr["f"] if "f" in n.attr else None
            if f is None or f.WhichOneof("value") != "func":
                raise ModelFormatError(f"{self.where}: {n.op} node {n.name!r} has no function attribute 'f'")
            if f.func.name not in self.lib:
                raise ModelFormatError(f"{self.where}: {n.op} node {n.name!r} calls function {f.func.name!r}, which "
                                       "the graph's function library does not define")
            return f.func.name, f.func.attr
        if n.op in self.lib:
            return n.op, n.attr
        return None

    def count(self, arg, attrs: Mapping, fname: str) -> int:
        """How many tensors an ArgDef stands for (list-typed args: their length attribute)."""
        if arg.number_attr:
            if arg.number_attr not in attrs:
                raise ModelFormatError(f"{self.where}: the call of function {fname!r} does not set attribute "
                                       f"{arg.number_attr!r} (the length of its arg {arg.name!r})")
            return int(attrs[arg.number_attr].i)
        if arg.type_list_attr:
            if arg.type_list_attr not in attrs:
                raise ModelFormatError(f"{self.where}: the call of function {fname!r} does not set attribute "
                                       f"{arg.type_list_attr!r} (the types of its arg {arg.name!r})")
            return len(attrs[arg.type_list_attr].list.type)
        return 1

    def flat_index(self, node, arg: str, i: int, fname: str) -> int:
        """Output ``i`` of output arg ``arg`` of body node ``node`` as a flat output index."""
        if node.op in self.lib and node.op not in CALL_OPS:
            args = [(a.name, self.count(a, node.attr, node.op)) for a in self.lib[node.op].signature.output_arg]
        elif node.op in OUTPUT_ARGS:
            args = [(a, 1) for a in OUTPUT_ARGS[node.op]]
        else:
            return i
        start = 0
        for name, size in args:
            if name == arg:
                return start + i
            start += size
        raise ModelFormatError(f"{self.where}: function {fname!r} reads output {arg!r} of {node.op} node "
                               f"{node.name!r}, which has outputs {[a for a, _ in args]}")

    def inline(self, call, fname: str, attrs: Mapping, out, stack: tuple[str, ...]) -> None:
        """Append the body of ``fname`` called by NodeDef ``call`` (inputs already outer names) to ``out``."""
        if fname in stack:
            raise ModelFormatError(f"{self.where}: function {fname!r} calls itself ({' → '.join((*stack, fname))})")
        f = self.lib[fname]
        sig = f.signature
        data = [t for t in call.input if not t.startswith("^")]
        args: dict[str, list[str]] = {}
        k = 0
        for a in sig.input_arg:
            size = self.count(a, attrs, fname)
            args[a.name] = data[k : k + size]
            k += size
        if k != len(data):
            raise ModelFormatError(f"{self.where}: node {call.name!r} passes {len(data)} inputs to function {fname!r}, "
                                   f"which takes {k}")
        body = {b.name: b for b in f.node_def}
        names: dict[str, str] = {}
        for b in f.node_def:
            name, i = f"{call.name}/{b.name}", 0
            while name in self.taken:
                i += 1
                name = f"{call.name}/{b.name}_{i}"
            self.taken.add(name)
            names[b.name] = name

        def ref(t: str) -> str:
            """A body tensor reference (``arg``, ``arg:i``, ``node:out_arg:i``) as an outer tensor name."""
            parts = t.split(":")
            head, tail = parts[0], parts[1:]
            if head in args and (not tail or (len(tail) == 1 and tail[0].isdigit())):
                i = int(tail[0]) if tail else 0
                if i < len(args[head]):
                    return args[head][i]
            elif head in body:
                if not tail:
                    idx = 0
                elif len(tail) == 1 and tail[0].isdigit():
                    idx = int(tail[0])
                elif len(tail) == 2 and tail[1].isdigit():
                    idx = self.flat_index(body[head], tail[0], int(tail[1]), fname)
                else:
                    idx = None
                if idx is not None:
                    return names[head] if idx == 0 else f"{names[head]}:{idx}"
            raise ModelFormatError(f"{self.where}: function {fname!r} (called by node {call.name!r}) reads {t!r}, "
                                   "which is neither one of its inputs nor an output of one of its nodes")

        for b in f.node_def:
            node = type(call)()
            node.CopyFrom(b)
            node.name = names[b.name]
            del node.input[:]
            node.input.extend(ref(t) for t in b.input if not t.startswith("^"))
            for key in node.attr:
                v = node.attr[key]
                if v.WhichOneof("value") == "placeholder" and v.placeholder in attrs:
                    v.CopyFrom(attrs[v.placeholder])
            inner = self.callee(node)
            if inner is None:
                out.node.add().CopyFrom(node)
            else:
                self.inline(node, *inner, out, (*stack, fname))
        results = []
        for a in sig.output_arg:
            if a.name not in f.ret:
                raise ModelFormatError(f"{self.where}: function {fname!r} returns nothing for its output {a.name!r}")
            if self.count(a, attrs, fname) != 1:
                why = f"function {fname!r} returns a list of tensors as its output {a.name!r}"
                raise UnsupportedError([(call.name, call.op, why)])
            results.append(ref(f.ret[a.name]))
        ident = out.node.add(name=call.name, op="IdentityN", input=results)
        if "Tout" in call.attr:
            ident.attr["T"].CopyFrom(call.attr["Tout"])
