"""Const, shape-only ops of static shapes (Shape, Size, ZerosLike, ...) and ops polyml computes
on constants only (Cast, StridedSlice, Pack, Range, GatherV2, ...): all folded at import.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from polyml.codegen.builder import LLVM_TYPES
from polyml.errors import PolymlError
from polyml.frontends.tensorflow.convert import Converter, Unsupported, attr, converter
from polyml.frontends.tensorflow.importer import Importer, Val, Value
from polyml.frontends.tensorflow.loader import TF_DTYPE_NAMES, TF_DTYPES, attr_value

#: the dtypes tensors computed at run time may have (a run-time Cast converts between them)
RUNTIME_DTYPES = tuple(LLVM_TYPES)


@converter("Const")
def _const(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    if "value" not in n.attr:
        raise Unsupported("Const without a value")
    try:
        return [attr_value(n.attr["value"])]
    except PolymlError as e:
        raise Unsupported(str(e)) from None


def _out_dtype(n, key: str = "out_type", default: int = 3) -> np.dtype:
    return TF_DTYPES.get(int(attr(n, key, default)), np.dtype(np.int32))


@converter("Shape")
def _shape(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(imp.tf_shape(ts[0]), _out_dtype(n))]


@converter("ShapeN")
def _shape_n(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(imp.tf_shape(t), _out_dtype(n)) for t in ts]


@converter("Size")
def _size(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(int(np.prod(imp.tf_shape(ts[0]), dtype=np.int64)), _out_dtype(n))]


@converter("Rank")
def _rank(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    return [np.array(len(imp.tf_shape(ts[0])), np.int32)]


@converter("ZerosLike", "OnesLike")
def _fill_like(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    dt = np.dtype(imp.dtype(ts[0]))
    return [np.full(imp.tf_shape(ts[0]), 0 if n.op == "ZerosLike" else 1, dt)]


def _const_only(fn: Callable[..., np.ndarray]) -> Converter:
    def conv(imp: Importer, n, ts: list[str]) -> list[Value | None]:
        live = [t for t in ts if not imp.is_const(t)]
        if live:
            raise Unsupported(f"only supported on constants (computed at compile time); {live[0]!r} is computed at run time")
        return [np.asarray(fn(n, *[imp.value(t) for t in ts]))]

    return conv


def _cast_value(n, x: np.ndarray) -> np.ndarray:
    return x.astype(TF_DTYPES.get(int(attr(n, "DstT", 1)), np.dtype(np.float32)))


def _strided_slice(n, x: np.ndarray, begin: np.ndarray, end: np.ndarray, strides: np.ndarray) -> np.ndarray:
    masks = {k: int(attr(n, k, 0)) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    index: list = []
    for i in range(len(begin)):
        bit = 1 << i
        if masks["ellipsis_mask"] & bit:
            index.append(Ellipsis)
        elif masks["new_axis_mask"] & bit:
            index.append(None)
        elif masks["shrink_axis_mask"] & bit:
            index.append(int(begin[i]))
        else:
            b = None if masks["begin_mask"] & bit else int(begin[i])
            e = None if masks["end_mask"] & bit else int(end[i])
            index.append(slice(b, e, int(strides[i])))
    return np.asarray(x[tuple(index)])


#: ops computed at import from constant inputs only: numpy functions of (NodeDef, *input values)
#: (Cast, and Prod / All / Any, are converted in full by ``_cast`` below and in reduce.py)
CONST_ONLY: dict[str, Callable[..., np.ndarray]] = {
    "StridedSlice": _strided_slice,
    "Pack": lambda n, *xs: np.stack(xs, axis=int(attr(n, "axis", 0))),
    "Fill": lambda n, dims, v: np.full([int(d) for d in dims], v, dtype=v.dtype),
    "Range": lambda n, a, b, d: np.arange(a, b, d).astype(np.result_type(a, b, d)),
    "GatherV2": lambda n, x, i, axis: np.take(x, i, axis=int(axis)),
    "Slice": lambda n, x, b, s: x[tuple(slice(int(bb), None if int(ss) < 0 else int(bb) + int(ss)) for bb, ss in zip(b, s))],
    "Tile": lambda n, x, m: np.tile(x, [int(v) for v in m]),
    "FloorDiv": lambda n, a, b: np.floor_divide(a, b),
    "FloorMod": lambda n, a, b: np.mod(a, b),
}
for _op, _fn in CONST_ONLY.items():
    converter(_op)(_const_only(_fn))


@converter("Cast")
def _cast(imp: Importer, n, ts: list[str]) -> list[Value | None]:
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
