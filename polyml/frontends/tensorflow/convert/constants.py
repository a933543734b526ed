"""Const, shape-only ops of static shapes (Shape, Size, ZerosLike, ...) and ops polyml computes
on constants only (Fill, Range, FloorDiv, FloorMod): all folded at import; Cast (folded on
constants, a Cast node at run time).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from polyml.codegen.builder import LLVM_TYPES
from polyml.errors import PolymlError
from polyml.frontends.tensorflow.convert import Converter, attr, converter
from polyml.frontends.tensorflow.loader import TF_DTYPE_NAMES, TF_DTYPES, attr_value
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, Value

#: the dtypes tensors computed at run time may have (a run-time Cast converts between them)
RUNTIME_DTYPES = tuple(LLVM_TYPES)


@converter("Const")
def _const(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    if "value" not in n.attr:
        raise Unsupported("Const without a value")
    try:
        return [attr_value(n.attr["value"])]
    except PolymlError as e:
        raise Unsupported(str(e)) from None


def _out_dtype(n, key: str = "out_type", default: int = 3) -> np.dtype:
    return TF_DTYPES.get(int(attr(n, key, default)), np.dtype(np.int32))


@converter("Shape")
def _shape(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    return [np.array(imp.tf_shape(ts[0]), _out_dtype(n))]


@converter("ShapeN")
def _shape_n(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    return [np.array(imp.tf_shape(t), _out_dtype(n)) for t in ts]


@converter("Size")
def _size(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    return [np.array(int(np.prod(imp.tf_shape(ts[0]), dtype=np.int64)), _out_dtype(n))]


@converter("Rank")
def _rank(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    return [np.array(len(imp.tf_shape(ts[0])), np.int32)]


@converter("ZerosLike", "OnesLike")
def _fill_like(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    dt = np.dtype(imp.dtype(ts[0]))
    return [np.full(imp.tf_shape(ts[0]), 0 if n.op == "ZerosLike" else 1, dt)]


def _const_only(fn: Callable[..., np.ndarray]) -> Converter:
    def conv(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
        live = [t for t in ts if not imp.is_const(t)]
        if live:
            raise Unsupported(f"only supported on constants (computed at compile time); {live[0]!r} is computed at run time")
        return [np.asarray(fn(n, *[imp.value(t) for t in ts]))]

    return conv


def _cast_value(n, x: np.ndarray) -> np.ndarray:
    return x.astype(TF_DTYPES.get(int(attr(n, "DstT", 1)), np.dtype(np.float32)))


#: ops computed at import from constant inputs only: numpy functions of (NodeDef, *input values)
#: (Cast, and Prod / All / Any, are converted in full by ``_cast`` below and in reduce.py)
CONST_ONLY: dict[str, Callable[..., np.ndarray]] = {
    "Fill": lambda n, dims, v: np.full([int(d) for d in dims], v, dtype=v.dtype),
    "Range": lambda n, a, b, d: np.arange(a, b, d).astype(np.result_type(a, b, d)),
    "FloorDiv": lambda n, a, b: np.floor_divide(a, b),
    "FloorMod": lambda n, a, b: np.mod(a, b),
}
for _op, _fn in CONST_ONLY.items():
    converter(_op)(_const_only(_fn))


@converter("Cast")
def _cast(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    if imp.is_const(ts[0]):
        return [_cast_value(n, imp.value(ts[0]))]
    code = int(attr(n, "DstT", 1))
    dst = TF_DTYPES.get(code)
    if dst is not None and dst.name == imp.dtype(ts[0]):
        return [imp.vals[ts[0]]]
    if dst is None or code == 14 or dst.name not in RUNTIME_DTYPES or imp.dtype(ts[0]) not in RUNTIME_DTYPES:
        raise Unsupported(f"Cast from {imp.dtype(ts[0])} to {TF_DTYPE_NAMES.get(code, code)} at run time "
                          f"(supported: {', '.join(RUNTIME_DTYPES)})")
    from onnx import helper

    v = imp.vals[ts[0]]
    to = int(helper.np_dtype_to_tensor_dtype(dst))
    return [Val(imp.emit("Cast", [v.name], {"to": to}, main=True, perm=v.perm), v.perm)]
