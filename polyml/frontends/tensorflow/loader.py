"""Reading a frozen GraphDef: ``.pb`` (binary) and ``.pbtxt`` (text) files, their format errors,
and TensorProto / AttrValue contents as numpy arrays and Python values.

Reading needs no TensorFlow: the GraphDef schema comes from ``tensorboard.compat.proto`` (the
same messages as ``tensorflow.core.framework``; the wire and text formats do not depend on the
package name).  A missing, truncated or non-GraphDef file is a :class:`ModelFormatError`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from polyml.errors import ModelFormatError, PolymlError

#: TF DataType enum → numpy dtype (DT_BFLOAT16 is widened to float32 when read)
TF_DTYPES: dict[int, np.dtype] = {
    1: np.dtype(np.float32),
    2: np.dtype(np.float64),
    3: np.dtype(np.int32),
    4: np.dtype(np.uint8),
    5: np.dtype(np.int16),
    6: np.dtype(np.int8),
    7: np.dtype(object),
    9: np.dtype(np.int64),
    10: np.dtype(np.bool_),
    14: np.dtype(np.float32),
    17: np.dtype(np.uint16),
    19: np.dtype(np.float16),
    22: np.dtype(np.uint32),
    23: np.dtype(np.uint64),
}
TF_DTYPE_NAMES = {1: "float", 2: "double", 3: "int32", 4: "uint8", 5: "int16", 6: "int8", 7: "string", 8: "complex64",
                  9: "int64", 10: "bool", 14: "bfloat16", 17: "uint16", 18: "complex128", 19: "half", 20: "resource",
                  21: "variant", 22: "uint32", 23: "uint64"}


def _protos():
    """The GraphDef protobuf modules (tensorboard's copy of TensorFlow's schema)."""
    try:
        from tensorboard.compat.proto import graph_pb2
    except ImportError as e:  # pragma: no cover - a dependency of polyml
        raise ModelFormatError(f"reading TensorFlow graphs needs the 'tensorboard' package ({e})") from None
    return graph_pb2


def load_graphdef(path: str | os.PathLike):
    """Read a frozen GraphDef (binary ``.pb`` or text ``.pbtxt``) with one clear error per way it can be bad."""
    from google.protobuf import message, text_format

    graph_pb2 = _protos()
    p = Path(path)
    if not p.is_file():
        raise ModelFormatError(f"{p}: no such model file")
    data = p.read_bytes()
    gd = graph_pb2.GraphDef()
    if p.suffix.lower() == ".pbtxt":
        try:
            text_format.Parse(data.decode("utf-8"), gd)
        except (text_format.ParseError, UnicodeDecodeError) as e:
            raise ModelFormatError(f"{p}: not a readable text GraphDef ({type(e).__name__}: {e})") from None
    else:
        try:
            gd.ParseFromString(data)
        except (message.DecodeError, RuntimeError, ValueError) as e:
            raise ModelFormatError(f"{p}: not a readable GraphDef (truncated or another format?) ({type(e).__name__}: {e})") from None
        # TensorFlow writes `versions` after all nodes: a file cut between two nodes parses
        # but has lost it (and every node after the cut)
        if gd.node and not gd.HasField("versions"):
            raise ModelFormatError(f"{p}: GraphDef without its 'versions' field: the file is truncated "
                                   "(or was not written by TensorFlow)")
    check_graphdef(gd, str(p))
    return gd


def check_graphdef(gd, where: str = "graph") -> None:
    """Structural checks: nodes exist, have names and ops, names are unique, inputs resolve."""
    if not gd.node:
        hint = ""
        if len(gd.library.function):
            hint = " (it holds only a function library: a SavedModel's graph? freeze it with convert_variables_to_constants_v2)"
        raise ModelFormatError(f"{where}: not a TensorFlow GraphDef (no nodes; truncated or another format?){hint}")
    names: set[str] = set()
    for i, n in enumerate(gd.node):
        if not n.name or not n.op:
            raise ModelFormatError(f"{where}: node #{i} has no {'name' if not n.name else 'op'}: not a TensorFlow GraphDef?")
        if n.name in names:
            raise ModelFormatError(f"{where}: two nodes are named {n.name!r}")
        names.add(n.name)
    missing = []
    for n in gd.node:
        for t in n.input:
            src = t[1:] if t.startswith("^") else t.split(":")[0]
            if src not in names:
                missing.append(f"{n.name!r} reads {t!r}")
    if missing:
        raise ModelFormatError(f"{where}: inputs of nodes name no node of the graph (truncated file?): "
                               + "; ".join(missing[:8]) + (f"; and {len(missing) - 8} more" if len(missing) > 8 else ""))


def tensor_to_numpy(t) -> np.ndarray:
    """A TensorProto as a numpy array (``tensor_content`` or the typed ``*_val`` fields; fewer
    values than elements repeat the last one, as TensorFlow does)."""
    dt = t.dtype
    if dt not in TF_DTYPES:
        raise PolymlError(f"constant of dtype {TF_DTYPE_NAMES.get(dt, dt)} is not supported")
    np_dt = TF_DTYPES[dt]
    if t.tensor_shape.unknown_rank:
        raise ModelFormatError("constant tensor with unknown rank")
    shape = tuple(int(d.size) for d in t.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise ModelFormatError(f"constant tensor with unknown dimensions {list(shape)}")
    size = int(np.prod(shape, dtype=np.int64))
    if t.tensor_content:
        if dt == 14:  # bfloat16: the upper half of a float32
            raw = np.frombuffer(t.tensor_content, dtype="<u2").astype(np.uint32) << 16
            arr = raw.view(np.float32)
        elif np_dt.kind == "O":
            raise PolymlError("string constants are not supported")
        else:
            if len(t.tensor_content) != size * np_dt.itemsize:
                raise ModelFormatError(f"constant tensor of shape {list(shape)}: {len(t.tensor_content)} content bytes, "
                                       f"expected {size * np_dt.itemsize}")
            arr = np.frombuffer(t.tensor_content, dtype=np_dt.newbyteorder("<")).astype(np_dt)
        return arr.reshape(shape).copy()
    if dt == 1:
        vals = np.asarray(t.float_val, np.float32)
    elif dt == 2:
        vals = np.asarray(t.double_val, np.float64)
    elif dt in (3, 4, 5, 6, 17):
        vals = np.asarray(t.int_val, np.int64).astype(np_dt)
    elif dt == 9:
        vals = np.asarray(t.int64_val, np.int64)
    elif dt == 10:
        vals = np.asarray(t.bool_val, np.bool_)
    elif dt == 19:
        vals = np.asarray(t.half_val, np.uint16).view(np.float16)
    elif dt == 14:
        vals = (np.asarray(t.half_val, np.uint32) << 16).view(np.float32)
    elif dt == 22:
        vals = np.asarray(t.uint32_val, np.uint32)
    elif dt == 23:
        vals = np.asarray(t.uint64_val, np.uint64)
    else:
        vals = np.asarray([s for s in t.string_val], dtype=object)
    if vals.size > size:
        raise ModelFormatError(f"constant tensor of shape {list(shape)} has {vals.size} values")
    if vals.size == 0:
        return np.zeros(shape, np_dt)
    if vals.size < size:
        vals = np.concatenate([vals, np.full(size - vals.size, vals[-1], dtype=vals.dtype)])
    return vals.astype(np_dt).reshape(shape)


def attr_value(a):
    """An AttrValue as a Python value (lists as lists, tensors as arrays, shapes as dim lists)."""
    kind = a.WhichOneof("value")
    if kind == "s":
        return a.s.decode("utf-8", "replace")
    if kind in ("i", "f", "b", "type"):
        return getattr(a, kind)
    if kind == "shape":
        return None if a.shape.unknown_rank else [int(d.size) for d in a.shape.dim]
    if kind == "tensor":
        return tensor_to_numpy(a.tensor)
    if kind == "list":
        lv = a.list
        for f in ("i", "f", "b", "type"):
            if len(getattr(lv, f)):
                return list(getattr(lv, f))
        if len(lv.s):
            return [s.decode("utf-8", "replace") for s in lv.s]
        if len(lv.shape):
            return [None if s.unknown_rank else [int(d.size) for d in s.dim] for s in lv.shape]
        return []
    if kind == "func":
        return a.func.name
    return None
