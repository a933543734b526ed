"""Fused nests produced by :mod:`polyml.passes.fuse`.

``polyml.Elementwise`` is a chain of elementwise ops computed in one nest over the output: each
op's value is an LLVM register, so the chain's intermediate tensors are contracted to scalars.
:func:`epilogue` applies such a chain to a producer's output in place, in the producer's
function (conv + bias/activation/residual add).
"""

from __future__ import annotations

import llvmlite.ir as ir

from polyml.codegen.builder import Buffer, KernelBuilder, coalesced_views
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register
from polyml.kernels._scalar import outer_parallel_dims, result_dtype, scalar


def evaluate_chain(k: KernelBuilder, chain: list[Node], known: dict[str, ir.Value], buffers: dict[str, Buffer],
                   ix: list[ir.Value]) -> ir.Value:
    """Compute ``chain`` at output index ``ix``: values of earlier ops come from ``known``,
    external tensors are loaded (with numpy broadcasting) from ``buffers``."""
    vals = dict(known)
    dtypes = {t: "float32" for t in known}  # the accumulator of an epilogue host
    for n in chain:
        args, arg_types = [], []
        for t in n.inputs:
            if not t:
                continue
            if t not in vals:
                buf = buffers[t]
                vals[t] = buf.load(buf.broadcast_index(ix))
                dtypes[t] = buf.type.dtype
            args.append(vals[t])
            arg_types.append(dtypes[t])
        vals[n.outputs[0]] = scalar(k, n, args, arg_types)
        dtypes[n.outputs[0]] = result_dtype(n, arg_types)
    return vals[chain[-1].outputs[0]]


@register
class FusedElementwise(Kernel):
    """One nest computing a chain of elementwise ops (types were inferred before fusion)."""

    op_types = ("polyml.Elementwise",)
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        raise AssertionError("polyml.Elementwise is created after shape inference")

    def lower(self, k: KernelBuilder) -> None:
        out, views = coalesced_views(k.outputs[0], [b for b in k.inputs if b is not None])
        buffers = {b.name: b for b in views}
        with k.loops(out.shape, parallel=outer_parallel_dims(out.shape)) as ix:
            out.store(ix, evaluate_chain(k, k.node.attrs["body"], {}, buffers, ix))


def epilogue(k: KernelBuilder, y: Buffer) -> None:
    """Apply the node's fused elementwise chain to its output ``y`` in place:
    ``y[i] = chain(y[i], extra inputs[bcast(i)])`` (the producer's result is contracted into y)."""
    chain = k.node.attrs.get("epilogue")
    if not chain:
        return
    start = k.node.attrs["epilogue_start"]
    y, views = coalesced_views(y, [b for b in k.inputs[start:] if b is not None])
    buffers = {b.name: b for b in views}
    acc = k.node.attrs["epilogue_acc"]
    with k.loops(y.shape, names=[f"e{d}" for d in range(y.rank)], parallel=outer_parallel_dims(y.shape)) as ix:
        y.store(ix, evaluate_chain(k, chain, {acc: y.load(ix)}, buffers, ix))
