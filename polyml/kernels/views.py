"""View ops: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout (inference).

They change only the shape, never the row-major order of elements, so they emit no loop nest:
the output shares the input's memory (``alias``).  Where a view is a graph output the lowering
copies it into the output buffer.
"""

from __future__ import annotations

import numpy as np

from polyml.codegen.builder import LLVM_TYPES
from polyml.errors import ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, const_ints, normalize_axis, register, unsupported_dtype


class _View(Kernel):
    alias = True
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        x = ins[0]  # views keep the bytes of any dtype the generated code can hold
        if x is not None and x.type.dtype not in LLVM_TYPES:
            return unsupported_dtype(0, x, frozenset(LLVM_TYPES))
        return None

    def view(self, node: Node, ins: list[Operand | None]) -> tuple[int, ...]:
        raise NotImplementedError

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        shape = tuple(int(d) for d in self.view(node, ins))
        if int(np.prod(shape, dtype=np.int64)) != ins[0].type.size:
            raise ShapeError(f"{node.op_type} node {node.label!r}: cannot view {ins[0].type.shape} as {shape}")
        return [TensorType(shape, ins[0].type.dtype)]


@register
class Reshape(_View):
    """Reshape with a constant target shape (0 copies a dim unless ``allowzero``, -1 infers)."""

    op_types = ("Reshape",)
    static_inputs = (1,)

    def view(self, node: Node, ins: list[Operand | None]) -> tuple[int, ...]:
        src = ins[0].type.shape
        if len(ins) > 1 and ins[1] is not None:
            target = const_ints(node, ins[1], "the target shape")
        else:
            target = list(node.attrs.get("shape", []))  # opset < 5
        allowzero = node.attrs.get("allowzero", 0)
        out = [src[i] if (d == 0 and not allowzero) else d for i, d in enumerate(target)]
        if out.count(-1) > 1:
            raise ShapeError(f"Reshape node {node.label!r}: more than one -1 in {target}")
        if -1 in out:
            known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
            total = int(np.prod(src, dtype=np.int64))
            if known == 0 or total % known:
                raise ShapeError(f"Reshape node {node.label!r}: cannot reshape {src} to {target}")
            out[out.index(-1)] = total // known
        return tuple(out)


@register
class Flatten(_View):
    """Flatten to 2-D at ``axis`` (default 1)."""

    op_types = ("Flatten",)

    def view(self, node: Node, ins: list[Operand | None]) -> tuple[int, ...]:
        shape = ins[0].type.shape
        axis = node.attrs.get("axis", 1)
        axis = axis + len(shape) if axis < 0 else axis
        if not 0 <= axis <= len(shape):
            raise ShapeError(f"Flatten node {node.label!r}: axis {node.attrs.get('axis')} out of range")
        return (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))


@register
class Squeeze(_View):
    """Squeeze: axes from the attribute (opset < 13) or a constant input; none means all 1s."""

    op_types = ("Squeeze",)
    static_inputs = (1,)

    def view(self, node: Node, ins: list[Operand | None]) -> tuple[int, ...]:
        shape = ins[0].type.shape
        axes = const_ints(node, ins[1], "axes") if len(ins) > 1 and ins[1] is not None else node.attrs.get("axes")
        if axes is None:
            return tuple(d for d in shape if d != 1)
        axes = {normalize_axis(node, a, len(shape)) for a in axes}
        bad = [a for a in axes if shape[a] != 1]
        if bad:
            raise ShapeError(f"Squeeze node {node.label!r}: axes {bad} of {shape} are not 1")
        return tuple(d for i, d in enumerate(shape) if i not in axes)


@register
class Unsqueeze(_View):
    """Unsqueeze: insert size-1 dims at ``axes`` (attribute before opset 13, input after)."""

    op_types = ("Unsqueeze",)
    static_inputs = (1,)

    def view(self, node: Node, ins: list[Operand | None]) -> tuple[int, ...]:
        shape = list(ins[0].type.shape)
        axes = const_ints(node, ins[1], "axes") if len(ins) > 1 and ins[1] is not None else node.attrs.get("axes", [])
        rank = len(shape) + len(axes)
        axes = sorted(normalize_axis(node, a, rank) for a in axes)
        if len(set(axes)) != len(axes):
            raise ShapeError(f"Unsqueeze node {node.label!r}: repeated axes {axes}")
        for a in axes:
            shape.insert(a, 1)
        return tuple(shape)


@register
class Identity(_View):
    """Identity, and Dropout in inference mode (its optional mask output is not supported)."""

    op_types = ("Identity", "Dropout")
    static_inputs = (1, 2)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        why = super().supports(node, ins)
        if why:
            return why
        if node.op_type == "Dropout" and len(node.outputs) > 1 and node.outputs[1]:
            return "the mask output of Dropout is not supported"
        if node.op_type == "Dropout" and len(ins) > 2 and ins[2] is not None:
            if ins[2].value is None or bool(np.asarray(ins[2].value)):
                return "Dropout in training mode is not supported"
        return None

    def view(self, node: Node, ins: list[Operand | None]) -> tuple[int, ...]:
        return ins[0].type.shape
