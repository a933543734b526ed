"""Data movement: Reshape, ExpandDims, Squeeze, Transpose (absorbed into the layout), Concat, Pad."""

from __future__ import annotations

import numpy as np

from polyml.errors import GraphError, ShapeError
from polyml.frontends.tensorflow.convert import attr, converter, norm_axis
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Val, Value, compose, drop_dims, norm_perm


@converter("Reshape")
def _reshape(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, s = ts
    target = [int(d) for d in imp.value(s).reshape(-1)]
    shape = imp.tf_shape(x)
    total = int(np.prod(shape, dtype=np.int64))
    if target.count(-1) > 1:
        raise ShapeError(f"more than one -1 in the target shape {target}")
    if -1 in target:
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"cannot reshape {list(shape)} to {target}")
        target[target.index(-1)] = total // known
    if imp.is_const(x):
        return [imp.value(x).reshape(target)]
    attrs = {"allowzero": 1} if 0 in target else {}
    return [Val(imp.emit("Reshape", [imp.tf_order(x), imp.const(np.array(target, np.int64), "shape")], attrs, main=True))]


@converter("ExpandDims")
def _expand_dims(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, a = ts
    shape = list(imp.tf_shape(x))
    axis = int(imp.value(a).reshape(-1)[0])
    axis = norm_axis(axis, len(shape) + 1, n)
    shape.insert(axis, 1)
    if imp.is_const(x):
        return [imp.value(x).reshape(shape)]
    return [Val(imp.emit("Reshape", [imp.tf_order(x), imp.const(np.array(shape, np.int64), "shape")], main=True))]


@converter("Squeeze")
def _squeeze(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    shape = imp.tf_shape(x)
    axes = [norm_axis(int(a), len(shape), n) for a in (attr(n, "squeeze_dims", None) or attr(n, "axis", None) or [])]
    if not axes:
        axes = [i for i, d in enumerate(shape) if d == 1]
    bad = [a for a in axes if shape[a] != 1]
    if bad:
        raise ShapeError(f"cannot squeeze dims {bad} of {list(shape)}")
    if imp.is_const(x):
        return [np.squeeze(imp.value(x), axis=tuple(axes)) if axes else imp.value(x)]
    v = imp.vals[x]
    if not axes:
        return [v]
    ir_axes = sorted(v.perm.index(a) for a in axes) if v.perm else sorted(axes)
    return [Val(imp.emit("Squeeze", [v.name], {"axes": ir_axes}, main=True, perm=drop_dims(v.perm, ir_axes)),
                drop_dims(v.perm, ir_axes))]


@converter("Transpose")
def _transpose(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, p = ts
    q = [int(i) for i in imp.value(p).reshape(-1)]
    rank = len(imp.tf_shape(x))
    if sorted(q) != list(range(rank)):
        raise GraphError(f"perm {q} is not a permutation of {rank} axes")
    if imp.is_const(x):
        return [np.transpose(imp.value(x), q)]
    v = imp.vals[x]
    # IR = transpose(TF_in, p); TF_out = transpose(TF_in, q) → IR = transpose(TF_out, qinv∘p)
    qinv = [q.index(i) for i in range(rank)]
    return [Val(v.name, norm_perm([qinv[d] for d in compose(v.perm, rank)]))]


@converter("ConcatV2", "Concat")
def _concat(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    if n.op == "Concat":
        a, parts = ts[0], ts[1:]
    else:
        a, parts = ts[-1], ts[:-1]
    rank = len(imp.tf_shape(parts[0]))
    axis = norm_axis(int(imp.value(a).reshape(-1)[0]), rank, n)
    if all(imp.is_const(t) for t in parts):
        return [np.concatenate([imp.value(t) for t in parts], axis=axis)]
    perms = {imp.vals[t].perm for t in parts if not imp.is_const(t)}
    target = perms.pop() if len(perms) == 1 else None
    names = [imp.ir(t, target) for t in parts]
    ir_axis = target.index(axis) if target else axis
    return [Val(imp.emit("Concat", names, {"axis": ir_axis}, main=True, perm=target), target)]


@converter("Pad", "PadV2", "MirrorPad")
def _pad(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x, p = ts[:2]
    if n.op == "MirrorPad":
        raise Unsupported(f"MirrorPad mode {attr(n, 'mode', '?')!r} is not supported (only constant padding)")
    pads = imp.value(p).reshape(-1, 2).astype(np.int64)
    cv = float(imp.value(ts[2]).reshape(-1)[0]) if len(ts) > 2 else 0.0
    if imp.is_const(x):
        v = imp.value(x)
        return [np.pad(v, [tuple(r) for r in pads], constant_values=np.asarray(cv, v.dtype))]
    v = imp.vals[x]
    rank = len(imp.types[v.name].shape)
    if pads.shape[0] != rank:
        raise ShapeError(f"paddings of shape {list(pads.shape)} for a rank-{rank} input")
    order = compose(v.perm, rank)
    begin = [int(pads[order[i], 0]) for i in range(rank)]
    end = [int(pads[order[i], 1]) for i in range(rank)]
    attrs = {"pads": begin + end, "mode": "constant"}
    if cv:
        attrs["value"] = cv
    return [Val(imp.emit("Pad", [v.name], attrs, main=True, perm=v.perm), v.perm)]
