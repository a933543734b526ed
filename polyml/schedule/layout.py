"""Array layouts as isl functions, evaluated on whole index grids with numpy.

A layout maps an array's index to a position in a buffer (a blocked, panelled or padded
copy): ``{ B[k, j] -> Bc[floor(k/256)*8192 + floor(j/32)*8192 + (k mod 256)*32 + j mod 32] }``.
Where a schedule reads a constant array through such a layout (:func:`polyml.schedule.tree.pack_constant`),
the buffer is made at compile time by evaluating the same function on every index, so the
copy and the code that reads it cannot disagree.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import islpy as isl
import numpy as np


def _numerator(aff: isl.Aff, grids: list[np.ndarray], params: Mapping[str, int]) -> tuple[np.ndarray, int]:
    """(numerator on the grids, denominator) of a quasi-affine expression; isl's divs are
    floors of expressions of their own (``isl_aff_get_div`` gives the argument)."""
    den = int(aff.get_denominator_val().to_python())

    def scaled(v: isl.Val) -> int:
        return int((v * isl.Val(den)).to_python())

    terms = [np.int64(scaled(aff.get_constant_val()))]  # grids are sparse: terms broadcast
    for d, g in enumerate(grids):
        terms.append(scaled(aff.get_coefficient_val(isl.dim_type.in_, d)) * g)
    for p in range(aff.dim(isl.dim_type.param)):
        terms.append(np.int64(scaled(aff.get_coefficient_val(isl.dim_type.param, p))
                              * int(params[aff.get_dim_name(isl.dim_type.param, p)])))
    for k in range(aff.dim(isl.dim_type.div)):
        c = scaled(aff.get_coefficient_val(isl.dim_type.div, k))
        if c:
            n, d = _numerator(aff.get_div(k), grids, params)
            terms.append(c * np.floor_divide(n, d))
    # terms of the same axes first, so that only the last sums are full-size arrays
    by_shape: dict[tuple[int, ...], np.ndarray] = {}
    for t in terms:
        by_shape[np.shape(t)] = by_shape.get(np.shape(t), 0) + t
    num = np.int64(0)
    for shape in sorted(by_shape, key=lambda sh: int(np.prod(sh))):
        num = num + by_shape[shape]
    return num, den


def offsets(layout: str, shape: tuple[int, ...], params: Mapping[str, int]) -> np.ndarray:
    return _offsets(layout, tuple(shape), tuple(sorted(params.items())))


@functools.lru_cache(maxsize=4)  # a model's layers share a few weight shapes
def _offsets(layout: str, shape: tuple[int, ...], params_items: tuple[tuple[str, int], ...]) -> np.ndarray:
    """The buffer position of every element of an array of ``shape`` under ``layout`` (an isl
    map from the index to a one-dimensional buffer index, one quasi-affine piece on the array)."""
    params = dict(params_items)
    pma = isl.PwMultiAff.from_map(isl.Map(layout))
    if pma.dim(isl.dim_type.out) != 1:
        raise ValueError(f"layout {layout}: expected a one-dimensional buffer")
    pieces: list[isl.Aff] = []
    pma.get_pw_aff(0).foreach_piece(lambda _set, aff: pieces.append(aff))
    if len(pieces) != 1:
        raise ValueError(f"layout {layout}: expected one piece, got {len(pieces)}")
    num, den = _numerator(pieces[0], list(np.indices(shape, dtype=np.int64, sparse=True)), params)
    num = np.broadcast_to(num, shape)
    num.flags.writeable = False  # shared by the cache
    if den == 1:
        return num
    if np.any(num % den):
        raise ValueError(f"layout {layout}: not integral on the array")
    return num // den


def evaluated(layout: str, array: np.ndarray, floats: int, params: Mapping[str, int] | None = None) -> np.ndarray:
    """``array`` copied into a buffer of ``floats`` zeros at ``layout`` (a constant operand in
    the layout a schedule reads it in, :func:`polyml.schedule.tree.pack_constant`)."""
    out = np.zeros(floats, dtype=np.float32)
    out[offsets(layout, array.shape, params or {})] = array
    return out
