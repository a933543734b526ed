"""Pooling: MaxPool, MaxPoolV2, AvgPool (padding not counted), MaxPool3D, AvgPool3D."""

from __future__ import annotations

from polyml.frontends.tensorflow.convert import attr, converter
from polyml.frontends.tensorflow.convert.conv import layout_of, window_pads
from polyml.frontends.tensorflow.values import TFValues, Unsupported, Value


@converter("MaxPool", "AvgPool", "MaxPoolV2", "MaxPool3D", "AvgPool3D")
def _pool(imp: TFValues, n, ts: list[str]) -> list[Value | None]:
    x = ts[0]
    rank = len(imp.tf_shape(x))
    need, sp, ch = layout_of(n, rank)
    shape = imp.tf_shape(x)
    if n.op == "MaxPoolV2":
        ks = [int(v) for v in imp.value(ts[1]).reshape(-1)]
        st = [int(v) for v in imp.value(ts[2]).reshape(-1)]
    else:
        ks, st = attr(n, "ksize", []), attr(n, "strides", [])
    if len(ks) != rank or len(st) != rank or ks[0] != 1 or ks[ch] != 1 or st[0] != 1 or st[ch] != 1:
        raise Unsupported(f"ksize {ks} / strides {st}: pooling over the batch or channel dimension")
    kernel, strides = [int(ks[d]) for d in sp], [int(st[d]) for d in sp]
    pads = window_pads(n, [shape[d] for d in sp], kernel, strides, [1] * len(sp), sp)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    op = "MaxPool" if n.op.startswith("MaxPool") else "AveragePool"
    if op == "AveragePool":
        attrs["count_include_pad"] = 0
    y = imp.emit(op, [imp.ir(x, need)], attrs, main=True, perm=need)
    return [imp.finish(y, need)]
