"""Convolutions: Conv2D, DepthwiseConv2dNative, Conv3D (filters re-laid out to OIHW at import), and
the SpaceToBatchND → Conv → BatchToSpaceND pattern TensorFlow writes for a dilated convolution.
Also the ``data_format`` and window-padding helpers the pooling and batch-norm converters share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from polyml.errors import GraphError, PolymlError, ShapeError
from polyml.frontends.tensorflow.convert import attr, converter
from polyml.frontends.tensorflow.convert.identity import PASS_THROUGH
from polyml.frontends.tensorflow.loader import attr_value
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Value, norm_perm, split_name, tensor_name


def layout_of(n, rank: int = 4) -> tuple[tuple[int, ...] | None, list[int], int]:
    """(IR permutation the op needs, TF spatial dims, TF channel dim) from ``data_format``."""
    fmt = attr(n, "data_format", "NHWC")
    if fmt in ("NHWC", "NDHWC") or fmt is None:
        perm = (0, rank - 1, *range(1, rank - 1))
        return norm_perm(perm), list(range(1, rank - 1)), rank - 1
    if fmt in ("NCHW", "NCDHW"):
        return None, list(range(2, rank)), 1
    raise Unsupported(f"data_format {fmt!r}")


def window_pads(n, size: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                fmt_dims: list[int]) -> list[int]:
    """ONNX ``pads`` (all begins, then all ends) for TF's SAME / VALID / EXPLICIT padding."""
    mode = attr(n, "padding", "VALID")
    r = len(size)
    if mode == "VALID":
        return [0] * (2 * r)
    if mode == "SAME":
        begin, end = [], []
        for i, s, k, d in zip(size, strides, kernel, dilations):
            out = -(-i // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - i, 0)
            begin.append(total // 2)
            end.append(total - total // 2)
        return begin + end
    if mode == "EXPLICIT":
        ep = [int(v) for v in attr(n, "explicit_paddings", []) or []]
        if len(ep) != 2 * (r + 2):
            raise GraphError(f"explicit_paddings {ep} needs {2 * (r + 2)} values")
        pairs = [ep[2 * d : 2 * d + 2] for d in fmt_dims]
        return [p[0] for p in pairs] + [p[1] for p in pairs]
    raise Unsupported(f"padding {mode!r}")


def _spatial(n, name: str, dims: list[int], ch: int, default: int = 1) -> list[int]:
    v = [int(x) for x in (attr(n, name, None) or [])]
    if not v:
        return [default] * len(dims)
    if len(v) == 1:
        return v * len(dims)
    if len(v) != len(dims) + 2:
        raise GraphError(f"{name}={v} needs {len(dims) + 2} values")
    if v[0] != 1 or v[ch] != 1:
        raise Unsupported(f"{name}={v} along the batch or channel dimension")
    return [v[d] for d in dims]


@converter("Conv2D", "DepthwiseConv2dNative", "Conv3D")
def _conv(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, w = ts
    dilated = imp.s2b.get(x)
    if dilated is not None:
        x = dilated[0]
    rank = len(imp.tf_shape(x))
    if rank != (5 if n.op == "Conv3D" else 4):
        raise ShapeError(f"input of rank {rank}")
    need, sp, ch = layout_of(n, rank)
    if not imp.is_const(w):
        raise Unsupported("the filter is computed at run time (only constant filters are supported)")
    wv = imp.value(w)
    if wv.ndim != rank:
        raise ShapeError(f"filter of shape {list(wv.shape)} for a rank-{rank} input")
    shape = imp.tf_shape(x)
    cin = shape[ch]
    kernel = list(wv.shape[: rank - 2])
    strides = _spatial(n, "strides", sp, ch)
    dilations = _spatial(n, "dilations", sp, ch)
    spatial_axes = tuple(range(rank - 2))
    if n.op == "DepthwiseConv2dNative":
        c, m = wv.shape[-2:]
        if c != cin:
            raise ShapeError(f"depthwise filter {list(wv.shape)} for {cin} input channels")
        # (KH, KW, C, M) → (C*M, 1, KH, KW): output channel c*M + m, as TensorFlow orders them
        wir = np.transpose(wv.reshape(*kernel, c * m), (rank - 2, *spatial_axes))[:, None]
        group = int(c)
    else:
        i, o = wv.shape[-2:]
        if i == 0 or cin % i:
            raise ShapeError(f"filter {list(wv.shape)} for {cin} input channels")
        wir = np.transpose(wv, (rank - 1, rank - 2, *spatial_axes))  # (..., I, O) → (O, I, ...)
        group = int(cin // i)
    pads = window_pads(n, [shape[d] for d in sp], kernel, strides, dilations, sp)
    if dilated is not None:
        dilations, pads = dilated[1], dilated[2]
        imp.b2s.add(n.name)
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "group": group}
    wname = imp.const(np.ascontiguousarray(wir, dtype=wv.dtype), f"{w}#oihw")
    y = imp.emit("Conv", [imp.ir(x, need), wname], attrs, main=True, perm=need)
    return [imp.finish(y, need)]


def _static(imp: TFValues, t: str) -> np.ndarray | None:
    """The value of TF tensor ``t`` if it is constant, looking through Identity to a Const
    node not converted yet (None otherwise)."""
    v = imp.vals.get(t)
    if isinstance(v, np.ndarray):
        return v
    node = imp.by_name.get(split_name(t)[0])
    while node is not None and node.op in PASS_THROUGH and node.input:
        node = imp.by_name.get(split_name(node.input[0])[0])
    if node is not None and node.op == "Const" and "value" in node.attr:
        try:
            return attr_value(node.attr["value"])
        except PolymlError:
            return None
    return None


def _dilation_pattern(imp: TFValues, n, ts: list[str]) -> tuple[list[int], list[int]] | str:
    """``SpaceToBatchND(x, b, p) → Conv2D/DepthwiseConv2dNative(VALID, stride 1) →
    BatchToSpaceND(·, b, c)`` (how TensorFlow writes a dilated convolution) is that convolution
    with dilations ``b`` and pads ``p - c``: (dilations, ONNX pads), or why it does not match."""
    block, paddings = (_static(imp, t) for t in ts[1:3])
    readers = imp.readers.get(n.name, [])
    if block is None or paddings is None or len(readers) != 1:
        return "its block shape or paddings are computed at run time, or it has several readers"
    conv = readers[0]
    if conv.op not in ("Conv2D", "DepthwiseConv2dNative") or attr(conv, "padding", "") != "VALID" \
            or attr(conv, "data_format", "NHWC") != "NHWC" or any(int(v) != 1 for v in attr(conv, "strides", []) or [1]) \
            or any(int(v) != 1 for v in attr(conv, "dilations", []) or [1]):
        return "it is not read by a stride-1 VALID NHWC Conv2D or DepthwiseConv2dNative"
    after = imp.readers.get(conv.name, [])
    if len(after) != 1 or after[0].op != "BatchToSpaceND":
        return "the convolution's output is not read by one BatchToSpaceND"
    b2s = after[0]
    block2 = _static(imp, tensor_name(b2s.input[1]))
    crops = _static(imp, tensor_name(b2s.input[2]))
    block = [int(v) for v in np.asarray(block).reshape(-1)]
    if block2 is None or crops is None or [int(v) for v in np.asarray(block2).reshape(-1)] != block or len(block) != 2:
        return "the BatchToSpaceND's block shape differs or its crops are computed at run time"
    p = np.asarray(paddings).reshape(-1, 2).astype(int)
    c = np.asarray(crops).reshape(-1, 2).astype(int)
    begin, end = list(p[:, 0] - c[:, 0]), list(p[:, 1] - c[:, 1])
    if min(begin + end) < 0:
        return f"paddings {p.tolist()} minus crops {c.tolist()} are negative"
    return block, [int(v) for v in begin + end]


@converter("SpaceToBatchND")
def _space_to_batch(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    match = _dilation_pattern(imp, n, ts)
    if isinstance(match, str):
        raise Unsupported(f"supported only as part of a dilated convolution (SpaceToBatchND → Conv2D → "
                          f"BatchToSpaceND); here {match}")
    if imp.is_const(ts[0]):
        raise Unsupported("dilated convolution of a constant")
    imp.s2b[n.name] = (ts[0], *match)
    return [imp.vals[ts[0]]]


@converter("BatchToSpaceND")
def _batch_to_space(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    if split_name(ts[0])[0] not in imp.b2s:
        raise Unsupported("supported only as part of a dilated convolution (SpaceToBatchND → Conv2D → BatchToSpaceND)")
    return [imp.vals[ts[0]]]
