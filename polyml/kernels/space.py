"""Blocks between channels and space: DepthToSpace and SpaceToDepth (modes DCR and CRD), NCHW.

Both are a permutation of the elements, written as one affine copy statement in one nest of six
loops ``(n, c, h, i, w, j)`` — ``(i, j)`` the position inside a ``b × b`` block — whose order
makes the writes row-major (contiguous):

* DepthToSpace, nest ``(n, c, h, i, w, j)``:
  ``y[n, c, b·h + i, b·w + j] = x[n, (b·i + j)·C' + c, h, w]`` (DCR) or
  ``x[n, b²·c + b·i + j, h, w]`` (CRD), ``C' = C / b²``;
* SpaceToDepth, the inverse: ``y[n, (b·i + j)·C + c, h, w]`` (DCR, nest ``(n, i, j, c, h, w)``)
  or ``y[n, b²·c + b·i + j, h, w]`` (CRD, nest ``(n, c, i, j, h, w)``)
  ``= x[n, c, b·h + i, b·w + j]``.

Any dtype the code generator knows.
"""

from __future__ import annotations

from polyml.codegen.builder import KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register
from polyml.kernels._scalar import outer_parallel_dims
from polyml.kernels.conv import affine
from polyml.kernels.expand import movable

MODES = ("DCR", "CRD")


class _Blocks(Kernel):
    polly = "off"  # a permuting copy with contiguous writes

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        mode = self.mode(node)
        if mode not in MODES:
            return f"{node.op_type} mode {mode!r} is not supported (DCR or CRD)"
        return movable(ins[0], 0)

    @staticmethod
    def mode(node: Node) -> str:
        mode = node.attrs.get("mode", "DCR")
        return mode.decode() if isinstance(mode, bytes) else str(mode)

    @staticmethod
    def blocksize(node: Node, shape: tuple[int, ...]) -> int:
        if len(shape) != 4:
            raise ShapeError(f"{node.op_type} node {node.label!r}: input of shape {shape} is not 4-D (NCHW)")
        if "blocksize" not in node.attrs:
            raise GraphError(f"{node.op_type} node {node.label!r}: the 'blocksize' attribute is required")
        b = int(node.attrs["blocksize"])
        if b < 1:
            raise GraphError(f"{node.op_type} node {node.label!r}: blocksize {b} is not positive")
        return b

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        return f"{self.mode(node)}, blocksize {node.attrs.get('blocksize')}"


@register
class DepthToSpace(_Blocks):
    """DepthToSpace: channel blocks of ``b²`` become ``b × b`` spatial blocks."""

    op_types = ("DepthToSpace",)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        b = self.blocksize(node, shape)
        n, c, h, w = shape
        if c % (b * b):
            raise ShapeError(f"DepthToSpace node {node.label!r}: {c} channels are not a multiple of blocksize² = {b * b}")
        return [TensorType((n, c // (b * b), h * b, w * b), ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        if not y.type.size:
            return
        b = self.blocksize(k.node, x.shape)
        n, cc, h, w = y.shape[0], y.shape[1], x.shape[2], x.shape[3]
        crd = self.mode(k.node) == "CRD"
        ext = (n, cc, h, b, w, b)
        with k.loops(ext, names=["n", "c", "h", "i", "w", "j"], parallel=outer_parallel_dims(ext)) as (vn, vc, vh, vi, vw, vj):
            if crd:
                ch = affine(k, [(b * b, vc), (b, vi), (1, vj)])
            else:
                ch = affine(k, [(b * cc, vi), (cc, vj), (1, vc)])
            dst = [vn, vc, affine(k, [(b, vh), (1, vi)]), affine(k, [(b, vw), (1, vj)])]
            y.store(dst, x.load([vn, ch, vh, vw]))


@register
class SpaceToDepth(_Blocks):
    """SpaceToDepth: ``b × b`` spatial blocks become channel blocks of ``b²``."""

    op_types = ("SpaceToDepth",)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = ins[0].type.shape
        b = self.blocksize(node, shape)
        n, c, h, w = shape
        if h % b or w % b:
            raise ShapeError(f"SpaceToDepth node {node.label!r}: spatial size {h}x{w} is not a multiple of blocksize {b}")
        return [TensorType((n, c * b * b, h // b, w // b), ins[0].type.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        if not y.type.size:
            return
        b = self.blocksize(k.node, x.shape)
        n, c, h, w = x.shape[0], x.shape[1], y.shape[2], y.shape[3]
        crd = self.mode(k.node) == "CRD"
        if crd:
            ext, names = (n, c, b, b, h, w), ["n", "c", "i", "j", "h", "w"]
        else:
            ext, names = (n, b, b, c, h, w), ["n", "i", "j", "c", "h", "w"]
        with k.loops(ext, names=names, parallel=outer_parallel_dims(ext)) as ivs:
            iv = dict(zip(names, ivs))
            vn, vc, vi, vj, vh, vw = (iv[s] for s in "ncijhw")
            if crd:
                ch = affine(k, [(b * b, vc), (b, vi), (1, vj)])
            else:
                ch = affine(k, [(b * c, vi), (c, vj), (1, vc)])
            src = [vn, vc, affine(k, [(b, vh), (1, vi)]), affine(k, [(b, vw), (1, vj)])]
            y.store([vn, ch, vh, vw], x.load(src))
