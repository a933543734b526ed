"""QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked) and DynamicQuantizeLinear.

Each is one parallel nest over the tensor whose statement reads the scale and zero point at
the element's quantization parameter index: ``[]`` per tensor, ``[i_axis]`` per axis, and for
opset 21's blocked form (``block_size = B`` > 0, parameters of the input's rank with
``ceil(d_axis / B)`` along the axis) ``[..., i_axis / B, ...]``.  Numerics follow the ONNX
spec (:mod:`polyml.codegen.quant`): ``y = saturate(round_half_even(x / s) + zp)`` and
``y = (x - zp) * s``; scales and zero points may be computed at run time (the node suite
feeds them as graph inputs), so they are loaded, not folded.

DynamicQuantizeLinear: ``min``/``max`` reduction (ranges always include 0), then
``s = (max - min) / 255`` (1 when ``max == min``, as onnxruntime), ``zp = round(clamp(-min / s,
0, 255))``, then the uint8 quantization nest reading ``s`` and ``zp`` back.

Data types: quantized tensors are int8/uint8 (int32 also dequantizes, e.g. biases); 16-bit,
4-bit and float8 quantization are refused with the dtype in the message.
"""

from __future__ import annotations

from collections.abc import Callable

import llvmlite.ir as ir
import numpy as np

from polyml.codegen import quant
from polyml.codegen.builder import Buffer, KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, normalize_axis, register, unsupported_dtype
from polyml.kernels._scalar import outer_parallel_dims
from polyml.kernels.reduce import vmax, vmin

FLOAT = frozenset({"float32"})
QUANTIZED = quant.QTYPES
#: DequantizeLinear also takes int32 (biases quantized with scale x_s * w_s, zero point 0)
DEQUANTIZABLE = QUANTIZED | {"int32"}
#: TensorProto codes of QuantizeLinear's opset-21 ``output_dtype`` polyml produces
OUTPUT_DTYPES = {2: "uint8", 3: "int8"}


def param_layout(node: Node, x: TensorType, scale: TensorType, zp: TensorType | None) -> tuple[str, int, int]:
    """How the scale indexes the input: ``("tensor"|"axis"|"block", axis, block_size)``."""
    rank = len(x.shape)
    block = int(node.attrs.get("block_size", 0) or 0)
    if zp is not None and zp.shape != scale.shape:
        raise ShapeError(f"{node.op_type} node {node.label!r}: zero point {zp.shape} and scale {scale.shape} differ in shape")
    if scale.size == 1 and len(scale.shape) <= 1 and block <= 0:
        return "tensor", 0, 0
    axis = normalize_axis(node, int(node.attrs.get("axis", 1)), rank)
    if block > 0:
        want = tuple(-(-d // block) if i == axis else d for i, d in enumerate(x.shape))
        if scale.shape != want:
            raise ShapeError(f"{node.op_type} node {node.label!r}: blocked scale {scale.shape}, expected {want} "
                             f"(input {x.shape}, axis {axis}, block_size {block})")
        return "block", axis, block
    if len(scale.shape) == 1 and rank and scale.shape[0] == x.shape[axis]:
        return "axis", axis, 0
    raise ShapeError(f"{node.op_type} node {node.label!r}: scale {scale.shape} is neither a scalar nor 1-D of "
                     f"length {x.shape[axis] if rank else '?'} along axis {axis} of input {x.shape}")


def param_index(k: KernelBuilder, layout: tuple[str, int, int], param: Buffer, ix: list) -> list:
    """The scale/zero-point index of the element at ``ix``."""
    mode, axis, block = layout
    if mode == "tensor":
        return [0] * param.rank
    if mode == "axis":
        return [ix[axis]]
    return [k.b.udiv(k.i64(i), k.i64(block)) if d == axis else i for d, i in enumerate(ix)]


def zero_point(k: KernelBuilder, zp: Buffer | None, idx: list) -> ir.Value:
    """A zero point as float32 (0 when the input is omitted)."""
    if zp is None:
        return k.f32(0.0)
    return quant.to_float(k.b, zp.load(idx), zp.type.dtype)


class _Quant(Kernel):
    polly = "off"

    def _types(self, ins: list[Operand | None]) -> tuple[TensorType, TensorType, TensorType | None]:
        x, s = ins[0].type, ins[1].type
        zp = ins[2].type if len(ins) > 2 and ins[2] is not None else None
        return x, s, zp

    def _elementwise(self, k: KernelBuilder,
                     value: Callable[[Buffer, Buffer, Buffer | None, list[ir.Value], list[ir.Value]], ir.Value]) -> None:
        """``y[ix] = value(x, scale, zero_point, ix, pi)`` over the output, ``pi`` the index of
        ``ix``'s scale / zero point (per tensor, per axis or per block: :func:`param_layout`)."""
        x, s = k.inputs[0], k.inputs[1]
        zp = k.inputs[2] if len(k.inputs) > 2 else None
        y = k.outputs[0]
        layout = param_layout(k.node, x.type, s.type, zp.type if zp is not None else None)
        with k.loops(y.shape, parallel=outer_parallel_dims(y.shape)) as ix:
            pi = param_index(k, layout, s, ix)
            y.store(ix, value(x, s, zp, ix, pi))


@register
class QuantizeLinear(_Quant):
    """``y = saturate(round(x / y_scale) + y_zero_point)`` to uint8/int8."""

    op_types = ("QuantizeLinear",)

    def out_dtype(self, node: Node, ins: list[Operand | None]) -> str:
        if len(ins) > 2 and ins[2] is not None:
            return ins[2].type.dtype
        code = int(node.attrs.get("output_dtype", 0) or 0)
        if code and code not in OUTPUT_DTYPES:
            return f"code {code}"
        return OUTPUT_DTYPES.get(code, "uint8")

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if len(ins) < 2 or ins[1] is None:
            return "y_scale is required"
        if ins[0].type.dtype not in FLOAT | {"int32"}:
            return unsupported_dtype(0, ins[0], FLOAT | {"int32"})
        if ins[1].type.dtype not in FLOAT:
            return unsupported_dtype(1, ins[1], FLOAT)
        dt = self.out_dtype(node, ins)
        if dt not in QUANTIZED:
            return f"quantizing to {dt} is not supported (supported: int8, uint8)"
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x, s, zp = self._types(ins)
        param_layout(node, x, s, zp)
        return [TensorType(x.shape, self.out_dtype(node, ins))]

    def lower(self, k: KernelBuilder) -> None:
        def value(x: Buffer, s: Buffer, zp: Buffer | None, ix: list[ir.Value], pi: list[ir.Value]) -> ir.Value:
            v = k.b.fdiv(quant.to_float(k.b, x.load(ix), x.type.dtype), s.load(pi))
            return quant.quantize_value(k.b, v, zero_point(k, zp, pi), k.outputs[0].type.dtype)

        self._elementwise(k, value)


@register
class DequantizeLinear(_Quant):
    """``y = (x - x_zero_point) * x_scale`` as float32."""

    op_types = ("DequantizeLinear",)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if len(ins) < 2 or ins[1] is None:
            return "x_scale is required"
        if ins[0].type.dtype not in DEQUANTIZABLE:
            return unsupported_dtype(0, ins[0], DEQUANTIZABLE)
        if ins[1].type.dtype not in FLOAT:
            return unsupported_dtype(1, ins[1], FLOAT)
        if len(ins) > 2 and ins[2] is not None and ins[2].type.dtype != ins[0].type.dtype:
            return f"zero point is {ins[2].type.dtype}, input is {ins[0].type.dtype}"
        if int(node.attrs.get("output_dtype", 0) or 0) not in (0, 1):
            return "output_dtype other than float32"
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x, s, zp = self._types(ins)
        param_layout(node, x, s, zp)
        return [TensorType(x.shape, "float32")]

    def lower(self, k: KernelBuilder) -> None:
        self._elementwise(k, lambda x, s, zp, ix, pi: quant.dequantize_value(
            k.b, x.load(ix), x.type.dtype, zero_point(k, zp, pi), s.load(pi)))


@register
class DynamicQuantizeLinear(_Quant):
    """uint8 quantization with the scale and zero point of the data's own range."""

    op_types = ("DynamicQuantizeLinear",)
    dtypes = FLOAT

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x = ins[0].type
        return [TensorType(x.shape, "uint8"), TensorType((), "float32"), TensorType((), "uint8")]

    def lower(self, k: KernelBuilder) -> None:
        x = k.inputs[0]
        y, ys, yzp = k.outputs
        b = k.b
        lo_slot = b.alloca(ir.FloatType(), name="min")
        hi_slot = b.alloca(ir.FloatType(), name="max")
        b.store(k.f32(0.0), lo_slot)  # the range always includes 0
        b.store(k.f32(0.0), hi_slot)
        if x.type.size:
            with k.loops(x.shape, names=[f"r{d}" for d in range(x.rank)]) as ix:
                v = x.load(ix)
                b.store(vmin(k, b.load(lo_slot), v), lo_slot)
                b.store(vmax(k, b.load(hi_slot), v), hi_slot)
        lo, hi = b.load(lo_slot), b.load(hi_slot)
        same = b.fcmp_ordered("==", lo, hi)
        scale = b.select(same, k.f32(1.0), b.fdiv(b.fsub(hi, lo), k.f32(255.0)))
        zp = quant.saturate(b, quant.rint(b, b.fsub(k.f32(0.0), b.fdiv(lo, scale))), "uint8")
        if ys is not None:
            ys.store([], scale)
        if yzp is not None:
            yzp.store([], zp)
        zpf = b.uitofp(zp, ir.FloatType())
        if not x.type.size:
            return
        # scale and zp are values of the op function; the parallel body may only take buffers
        with k.loops(y.shape, names=[f"q{d}" for d in range(y.rank)]) as ix:
            y.store(ix, quant.quantize_value(b, b.fdiv(x.load(ix), scale), zpf, "uint8"))


def check_constant_params(node: Node, ins: list[Operand | None], positions: tuple[int, ...]) -> None:
    """Refuse computed scales/zero points where a kernel folds them at compile time."""
    for i in positions:
        if i < len(ins) and ins[i] is not None and ins[i].value is None:
            raise GraphError(f"{node.op_type} node {node.label!r}: input {i} ({ins[i].name!r}) must be a compile-time constant")


def scalar_param(op: Operand | None, default: float = 0.0) -> float:
    """A per-tensor constant scale or zero point as a Python float."""
    if op is None:
        return default
    return float(np.asarray(op.value).reshape(-1)[0])


