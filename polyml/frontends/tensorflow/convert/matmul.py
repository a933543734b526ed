"""Matrix products: MatMul (transpose flags) and BatchMatMul / V2 / V3 (adjoint flags)."""

from __future__ import annotations

import numpy as np

from polyml.frontends.tensorflow.convert import Unsupported, attr, converter
from polyml.frontends.tensorflow.importer import Importer, Val, Value


@converter("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def _matmul(imp: Importer, n, ts: list[str]) -> list[Value | None]:
    a, b = ts
    batch = n.op != "MatMul"
    ta = bool(attr(n, "adj_x" if batch else "transpose_a", False))
    tb = bool(attr(n, "adj_y" if batch else "transpose_b", False))

    def operand(t: str, trans: bool) -> tuple[str, bool]:
        if imp.is_const(t) and trans:
            key = f"{t}#T"
            imp.vals[key] = np.swapaxes(imp.value(t), -1, -2)
            return key, False
        return t, trans

    if imp.is_const(a) and imp.is_const(b):
        x, y = imp.value(a), imp.value(b)
        return [np.matmul(np.swapaxes(x, -1, -2) if ta else x, np.swapaxes(y, -1, -2) if tb else y)]
    a, ta = operand(a, ta)
    b, tb = operand(b, tb)
    ra, rb = len(imp.tf_shape(a)), len(imp.tf_shape(b))
    if ta or tb:
        if ra != 2 or rb != 2:
            raise Unsupported("adjoint batch matrix products computed at run time")
        return [Val(imp.emit("Gemm", [imp.tf_order(a), imp.tf_order(b)], {"transA": int(ta), "transB": int(tb)}, main=True))]
    return [Val(imp.emit("MatMul", [imp.tf_order(a), imp.tf_order(b)], main=True))]
