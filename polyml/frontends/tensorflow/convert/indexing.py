"""Indexing and replication, folded on constants and otherwise computed at run time in TF's
element order: GatherV2 → Gather, StridedSlice / Slice → Slice (+ a Reshape view for shrunk and
new axes), Split / SplitV / Unpack → one Slice per output, Pack → Reshape views + Concat,
Tile → Tile, BroadcastTo → Expand.

Shapes are static: begin / end / size / multiples / axis must be compile-time constants (Keras'
shape arithmetic folds to constants at import); the data may be any run-time tensor (float32,
int64, int32, bool).
"""

from __future__ import annotations

import numpy as np

from polyml.errors import GraphError, ShapeError
from polyml.frontends.tensorflow.convert import attr, converter, norm_axis
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, Value


def _i64(imp: TFValues, values, hint: str = "shape") -> str:
    return imp.const(np.array([int(v) for v in values], np.int64), hint)


def _reshape(imp: TFValues, x: str, shape: list[int], main: bool = True) -> str:
    return imp.emit("Reshape", [x, _i64(imp, shape)], main=main, what="view")


def strided_index(n, begin, end, strides) -> list:
    """StridedSlice's masks and operands as a numpy index (ints, slices, None, Ellipsis)."""
    masks = {k: int(attr(n, k, 0)) for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
    begin, end, strides = (np.asarray(v).reshape(-1) for v in (begin, end, strides))
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
    return index


def slice_plan(index: list, shape: tuple[int, ...]) -> tuple[list[tuple[int, int, int, int]], list[int]]:
    """(per sliced input dim ``(axis, start, end, step)`` in ONNX Slice's terms, the output
    shape) of a numpy basic index on a tensor of ``shape``."""
    rank = len(shape)
    real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if real > rank or sum(i is Ellipsis for i in index) > 1:
        raise GraphError(f"index {index} for a rank-{rank} tensor")
    full: list = []
    for i in index:
        full.extend([slice(None)] * (rank - real) if i is Ellipsis else [i])
    if Ellipsis not in index:
        full.extend([slice(None)] * (rank - real))
    axes, out, d = [], [], 0
    for i in full:
        if i is None:
            out.append(1)
            continue
        dim = shape[d]
        if isinstance(i, int):
            j = i + dim if i < 0 else i
            if not 0 <= j < dim:
                raise ShapeError(f"index {i} out of range for dimension {d} of size {dim}")
            axes.append((d, j, j + 1, 1))
        else:
            start, stop, step = i.indices(dim)
            count = len(range(start, stop, step))
            if (start, step, count) != (0, 1, dim):
                axes.append((d, start, stop if stop >= 0 else -(dim + 1), step))
            out.append(count)
        d += 1
    return axes, out


def sliced(imp: TFValues, x: str, plan: list[tuple[int, int, int, int]], shape: list[int], main: bool = True) -> Value:
    """TF tensor ``x`` sliced by ``plan`` and viewed as ``shape`` (``main``: the node's output 0)."""
    src = imp.tf_order(x)
    if not plan and list(imp.types[src].shape) == list(shape):
        return imp.vals[x]  # the whole tensor
    y = src
    if plan:
        cols = list(zip(*plan))
        ins = [src, _i64(imp, cols[1], "starts"), _i64(imp, cols[2], "ends"), _i64(imp, cols[0], "axes"),
               _i64(imp, cols[3], "steps")]
        y = imp.emit("Slice", ins, main=main and _shape_after(imp.types[src].shape, plan) == list(shape), what="slice")
    if list(imp.types[y].shape) != list(shape):
        y = _reshape(imp, y, shape, main=main)
    return Val(y)


def _shape_after(shape: tuple[int, ...], plan: list[tuple[int, int, int, int]]) -> list[int]:
    """The shape ONNX Slice gives ``shape`` with ``plan`` (as kernels/slice.py clamps)."""
    out = list(shape)
    for a, start, end, step in plan:
        dim = out[a]
        end = end + dim if end < 0 else end
        if step > 0:
            out[a] = max(0, -(-(min(max(end, 0), dim) - start) // step))
        else:
            out[a] = max(0, -(-(start - min(max(end, -1), dim - 1)) // -step))
    return out


@converter("StridedSlice")
def _strided_slice(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, *rest = ts
    index = strided_index(n, *[imp.value(t) for t in rest])
    if imp.is_const(x):
        return [np.asarray(imp.value(x)[tuple(index)])]
    plan, shape = slice_plan(index, imp.tf_shape(x))
    return [sliced(imp, x, plan, shape)]


@converter("Slice")
def _slice(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, b, s = ts
    begin = [int(v) for v in imp.value(b).reshape(-1)]
    size = [int(v) for v in imp.value(s).reshape(-1)]
    index = [slice(bb, None if ss < 0 else bb + ss) for bb, ss in zip(begin, size)]
    if imp.is_const(x):
        return [np.asarray(imp.value(x)[tuple(index)])]
    plan, shape = slice_plan(index, imp.tf_shape(x))
    return [sliced(imp, x, plan, shape)]


def _split_sizes(n, total: int, sizes: list[int]) -> list[int]:
    if sizes.count(-1) > 1:
        raise GraphError(f"size_splits {sizes} has more than one -1")
    if -1 in sizes:
        sizes[sizes.index(-1)] = total - sum(s for s in sizes if s != -1)
    if sum(sizes) != total or min(sizes, default=0) < 0:
        raise ShapeError(f"size_splits {sizes} for a dimension of {total}")
    return sizes


@converter("Split", "SplitV", "Unpack")
def _split(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    if n.op == "Split":
        a, x = ts
        axis = int(imp.value(a).reshape(-1)[0])
    elif n.op == "SplitV":
        x, s, a = ts
        axis = int(imp.value(a).reshape(-1)[0])
    else:
        x = ts[0]
        axis = int(attr(n, "axis", 0))
    shape = list(imp.tf_shape(x))
    axis = norm_axis(axis, len(shape), n)
    if n.op == "Split":
        k = int(attr(n, "num_split", 1))
        if shape[axis] % k:
            raise ShapeError(f"cannot split a dimension of {shape[axis]} into {k}")
        sizes = [shape[axis] // k] * k
    elif n.op == "SplitV":
        sizes = _split_sizes(n, shape[axis], [int(v) for v in imp.value(s).reshape(-1)])
    else:
        sizes = [1] * shape[axis]
    offsets = np.cumsum([0, *sizes])
    outs: list[Value | None] = []
    for i, size in enumerate(sizes):
        index = [slice(None)] * axis + [int(offsets[i]) if n.op == "Unpack" else slice(int(offsets[i]), int(offsets[i]) + size)]
        if imp.is_const(x):
            outs.append(np.asarray(imp.value(x)[tuple(index)]))
            continue
        plan, out = slice_plan(index, tuple(shape))
        outs.append(sliced(imp, x, plan, out, main=i == 0))
    return outs


@converter("Pack")
def _pack(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    rank = len(imp.tf_shape(ts[0]))
    axis = norm_axis(int(attr(n, "axis", 0)), rank + 1, n)
    if all(imp.is_const(t) for t in ts):
        return [np.stack([imp.value(t) for t in ts], axis=axis)]
    shape = list(imp.tf_shape(ts[0]))
    shape.insert(axis, 1)
    parts = [_reshape(imp, imp.tf_order(t), shape, main=False) for t in ts]
    return [Val(imp.emit("Concat", parts, {"axis": axis}, main=True))]


@converter("GatherV2", "Gather")
def _gather(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    params, indices = ts[:2]
    axis = int(imp.value(ts[2]).reshape(-1)[0]) if len(ts) > 2 else 0
    if int(attr(n, "batch_dims", 0)):
        raise Unsupported("batch_dims != 0")
    if imp.is_const(params) and imp.is_const(indices):
        return [np.take(imp.value(params), imp.value(indices), axis=axis)]
    axis = norm_axis(axis, len(imp.tf_shape(params)), n)
    return [Val(imp.emit("Gather", [imp.tf_order(params), imp.tf_order(indices)], {"axis": axis}, main=True))]


@converter("Tile")
def _tile(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, m = ts
    reps = [int(v) for v in imp.value(m).reshape(-1)]
    if imp.is_const(x):
        return [np.tile(imp.value(x), reps)]
    return [Val(imp.emit("Tile", [imp.tf_order(x), _i64(imp, reps, "repeats")], main=True))]


@converter("BroadcastTo")
def _broadcast_to(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, s = ts
    shape = [int(v) for v in imp.value(s).reshape(-1)]
    if imp.is_const(x):
        return [np.broadcast_to(imp.value(x), shape).copy()]
    return [Val(imp.emit("Expand", [imp.tf_order(x), _i64(imp, shape)], main=True))]
