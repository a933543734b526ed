"""Resize (ONNX opsets 10-19) and the deprecated Upsample, as table-driven gathers.

Resize is separable and its source coordinates depend only on the output index: along a resized
axis ``a``, output position ``o`` reads input positions ``idx_a[o, t]`` with weights
``w_a[o, t]`` (``t < T_a``: 1 tap for nearest, 2 for linear, 4 for cubic, a scale-dependent
footprint with antialias).  Those tables are computed at compile time (:meth:`Resize.constants`,
float64 as ONNX's reference does, then stored as int64/float32 next to the weights), so the
lowering is one perfect nest over the output domain with a single statement

    ``y[o_0, ..., o_r] = Σ_t Π_a w_a[o_a, t_a] · x[idx_0[o_0, t_0], ..., idx_r[o_r, t_r]]``

(the taps unrolled, the weights of each axis applied innermost-first); axes that are not resized
read ``x`` at ``o_a`` itself and runs of them are merged into one flat dimension.  The subscripts
of ``x`` are table lookups, not affine functions, so the nest is no SCoP (Polly policy ``off``);
every output point is independent, so the outermost loop runs in parallel.

Interpolating axes (more than one tap) are resized one per pass, through temps, each pass a nest
of the same form over its own output domain: the taps then cost ``Σ_a T_a`` instead of
``Π_a T_a`` per output, and a pass along an outer axis reads whole contiguous rows (1x128x64x64
bilinear 2x, one thread: 3.4 ms in one nest, 1.9 ms in two passes, onnxruntime 2.9 ms; bicubic
43 ms vs 4.0 ms).  One-tap (nearest) axes are all gathered in the first pass.

Semantics follow the ONNX specification and its reference implementation (which the node suite
checks): coordinate modes ``half_pixel``, ``half_pixel_symmetric``, ``pytorch_half_pixel``,
``align_corners`` (on the fractional output length ``scale · length``, as the reference),
``asymmetric``, ``tf_half_pixel_for_nn``, ``tf_crop_and_resize`` (constant ``roi``; outputs whose
source coordinate leaves the input take ``extrapolation_value``); nearest modes
``round_prefer_floor``/``round_prefer_ceil``/``floor``/``ceil`` and opset 10's truncation;
``cubic_coeff_a``, ``exclude_outside``, ``antialias``, ``axes`` and ``keep_aspect_ratio_policy``.
Sources outside the input are clamped to its edge.  Nearest also moves int64/int32/bool data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import Buffer, KernelBuilder, constant
from polyml.errors import GraphError, ShapeError, UnsupportedError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register, unsupported_dtype
from polyml.kernels._scalar import PARALLEL_MIN_ELEMENTS
from polyml.kernels.conv import nest, view

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_half_pixel_for_nn", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")
DTYPES = frozenset({"float32", "int64", "int32", "bool"})


# -- settings and geometry ----------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    """The attributes of a Resize/Upsample node with the defaults of its opset."""

    mode: str
    coordinates: str
    #: a NEAREST_MODES entry, or "simple" (opset 10 and Upsample: truncate, ceil when shrinking)
    nearest: str
    cubic_a: float
    exclude_outside: bool
    antialias: bool
    extrapolation: float
    policy: str
    axes: tuple[int, ...] | None


def _legacy(node: Node) -> bool:
    """Upsample, or Resize of opset 10: inputs (X, scales), asymmetric coordinates."""
    return node.op_type == "Upsample" or 0 < node.opset < 11


def settings(node: Node) -> Settings:
    a = node.attrs
    mode = str(a.get("mode", "nearest"))
    if _legacy(node):
        return Settings(mode, "asymmetric", "simple", -0.75, False, False, 0.0, "stretch", None)
    axes = a.get("axes")
    return Settings(
        mode,
        str(a.get("coordinate_transformation_mode", "half_pixel")),
        str(a.get("nearest_mode", "round_prefer_floor")),
        float(a.get("cubic_coeff_a", -0.75)),
        bool(a.get("exclude_outside", 0)),
        bool(a.get("antialias", 0)),
        float(a.get("extrapolation_value", 0.0)),
        str(a.get("keep_aspect_ratio_policy", "stretch")),
        tuple(int(v) for v in axes) if axes is not None and len(axes) else None,
    )


def _value(node: Node, ins: list[Operand | None], i: int, what: str) -> np.ndarray | None:
    """Input ``i`` as a flat array, None when omitted or empty; it must be a constant."""
    op = ins[i] if i < len(ins) else None
    if op is None or op.type.size == 0:
        return None
    if op.value is None:
        raise ShapeError(f"{node.op_type} node {node.label!r}: {what} ({op.name!r}) must be a compile-time constant "
                         "(polyml compiles static shapes)")
    return np.asarray(op.value).reshape(-1)


@dataclass(frozen=True)
class Geometry:
    """Per axis: output length, scale (float64) and, for tf_crop_and_resize, the roi span."""

    size: tuple[int, ...]
    out: tuple[int, ...]
    scales: tuple[float, ...]
    roi: tuple[tuple[np.float32 | float, np.float32 | float], ...] | None

    def identity(self, a: int) -> bool:
        """The reference skips an axis of scale 1 whose length and roi do not change."""
        roi_same = self.roi is None or (math.isclose(float(self.roi[a][0]), 0.0) and math.isclose(float(self.roi[a][1]), 1.0))
        return math.isclose(self.scales[a], 1.0) and self.out[a] == self.size[a] and roi_same


def geometry(node: Node, ins: list[Operand | None]) -> Geometry:
    """Output shape and per-axis scales, as ONNX's reference computes them."""
    st = settings(node)
    size = tuple(ins[0].type.shape)
    r = len(size)
    where = f"{node.op_type} node {node.label!r}"
    if _legacy(node):
        if node.op_type == "Upsample" and "scales" in node.attrs:
            scales = np.asarray(node.attrs["scales"], np.float32).reshape(-1)
        else:
            scales = _value(node, ins, 1, "scales")
        if scales is None or len(scales) != r:
            raise ShapeError(f"{where}: needs {r} scales, got {None if scales is None else list(scales)}")
        fs = [float(s) for s in scales]
        if any(s <= 0 for s in fs):
            raise ShapeError(f"{where}: scales {fs} must be positive")
        return Geometry(size, tuple(int(s * n) for s, n in zip(fs, size)), tuple(fs), None)
    axes = list(range(r))
    if st.axes is not None:
        if any(not -r <= v < r for v in st.axes) or len(set(v % r for v in st.axes)) != len(st.axes):
            raise GraphError(f"{where}: axes {list(st.axes)} invalid for rank {r}")
        axes = [v % r for v in st.axes]
    roi_v = _value(node, ins, 1, "roi") if st.coordinates == "tf_crop_and_resize" else None
    scales_v = _value(node, ins, 2, "scales")
    sizes_v = _value(node, ins, 3, "sizes")
    if (scales_v is None) == (sizes_v is None):
        raise ShapeError(f"{where}: exactly one of scales and sizes must be given (non-empty)")
    given = scales_v if scales_v is not None else sizes_v
    if len(given) != len(axes):
        raise ShapeError(f"{where}: {len(given)} {'scales' if scales_v is not None else 'sizes'} for {len(axes)} axes")
    roi = None
    if st.coordinates == "tf_crop_and_resize":
        if roi_v is None or len(roi_v) != 2 * len(axes):
            raise ShapeError(f"{where}: tf_crop_and_resize needs a constant roi of {2 * len(axes)} values")
        spans = [(0.0, 1.0)] * r
        for i, a in enumerate(axes):
            # float32 scalars: the reference's roi arithmetic is float32 ((r1 - r0), r0 * (n - 1))
            spans[a] = (np.float32(roi_v[i]), np.float32(roi_v[len(axes) + i]))
        roi = tuple(spans)
    if scales_v is not None:
        fs = [1.0] * r
        for i, a in enumerate(axes):
            fs[a] = float(scales_v[i])
        if any(s <= 0 for s in fs):
            raise ShapeError(f"{where}: scales {list(scales_v)} must be positive")
        out = [int(s * n) for s, n in zip(fs, size)]
    else:
        out = list(size)
        for i, a in enumerate(axes):
            out[a] = int(sizes_v[i])
        if any(d < 0 for d in out):
            raise ShapeError(f"{where}: negative sizes {list(sizes_v)}")
        fs = [o / n if n else 1.0 for o, n in zip(out, size)]
        if st.policy != "stretch":
            pick = min if st.policy == "not_larger" else max
            s = pick(fs[a] for a in axes)
            fs = [s if a in axes else 1.0 for a in range(r)]
            out = [int(s * size[a] + 0.5) if a in axes else size[a] for a in range(r)]
    return Geometry(size, tuple(out), tuple(fs), roi)


# -- per-axis tables ------------------------------------------------------------------------------

@dataclass(frozen=True)
class AxisTable:
    """Output position ``o`` of one axis reads ``idx[o, t]`` with weight ``w[o, t]`` (``w`` None:
    one tap of weight 1); ``inside[o]`` is 0 where the output takes ``extrapolation_value``."""

    idx: np.ndarray
    w: np.ndarray | None
    inside: np.ndarray | None

    @property
    def taps(self) -> int:
        return int(self.idx.shape[1])

    def is_identity(self, size: int) -> bool:
        return (self.w is None and self.inside is None and self.idx.shape[0] == size
                and bool(np.all(self.idx[:, 0] == np.arange(size))))


def _source_coordinates(st: Settings, n_in: int, n_out: int, scale: float,
                        roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray | None]:
    """x_original of every output position (float64) and, for tf_crop_and_resize, where it is
    outside ``[0, n_in - 1]``."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # the fractional output length
    mode = st.coordinates
    outside = None
    if mode == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        r0, r1 = roi if roi is not None else (0.0, 1.0)
        x = np.full(n_out, (r1 - r0) * (n_in - 1) / 2) if width == 1 else y * (r1 - r0) * (n_in - 1) / (width - 1)
        x = x + r0 * (n_in - 1)
        outside = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        x = offset + (y + 0.5) / scale - 0.5
    elif mode == "tf_half_pixel_for_nn":
        x = (y + 0.5) / scale
    else:  # half_pixel
        x = (y + 0.5) / scale - 0.5
    return x, outside


def _coefficients(st: Settings, scale: float) -> Callable[[float], np.ndarray]:
    """The tap weights for a fractional offset ``ratio`` in (0, 1] (ONNX's interpolation kernels)."""
    a = st.cubic_a
    if st.mode == "nearest":
        mode = st.nearest

        def nearest(ratio: float) -> np.ndarray:
            if ratio == 1.0 or mode == "ceil":
                return np.array([0.0, 1.0])
            if mode == "floor":
                return np.array([1.0, 0.0])
            right = ratio > 0.5 if mode == "round_prefer_floor" else ratio >= 0.5
            return np.array([0.0, 1.0]) if right else np.array([1.0, 0.0])

        return nearest
    if st.mode == "linear" and not st.antialias:
        return lambda ratio: np.array([1 - ratio, ratio])
    if st.mode == "linear":
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)

        def linear_aa(ratio: float) -> np.ndarray:
            c = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
            return c / c.sum()

        return linear_aa

    def cubic(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        if x < 2:
            return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
        return 0.0

    if not st.antialias:
        return lambda ratio: np.array([cubic(ratio + 1), cubic(ratio), cubic(1 - ratio), cubic(2 - ratio)])
    s = min(scale, 1.0)
    i0 = int(np.floor(-2 / s) + 1)

    def cubic_aa(ratio: float) -> np.ndarray:
        c = np.array([cubic(s * (i - ratio)) for i in range(i0, 2 - i0)])
        return c / c.sum()

    return cubic_aa


def axis_table(st: Settings, n_in: int, n_out: int, scale: float, roi: tuple[float, float] | None) -> AxisTable:
    """The taps of one resized axis: the n source positions nearest ``x_original`` (the lower
    one on ties, clamped to the edge) with the mode's weights, duplicates merged and zero
    weights dropped, rows padded with weight-0 taps to a common count."""
    x, outside = _source_coordinates(st, n_in, n_out, scale, roi)
    if st.mode == "nearest" and st.nearest == "simple":
        src = np.ceil(x) if scale < 1 else np.trunc(x)
        idx = np.clip(src, 0, n_in - 1).astype(np.int64)[:, None]
        coeffs = np.ones((n_out, 1))
    else:
        base = np.floor(x)
        ratios = np.where(x == base, 1.0, x - base)
        coef = _coefficients(st, scale)
        coeffs = np.array([coef(float(r)) for r in ratios]).reshape(n_out, -1)
        n = coeffs.shape[1]
        pad = math.ceil(n / 2)
        xp = x + pad
        p = np.floor(xp)
        frac = xp - p
        if n % 2 == 0:
            offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
        else:
            offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
        neighbors = (p + offset).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
        if st.exclude_outside:
            coeffs = np.where((neighbors < 0) | (neighbors >= n_in), 0.0, coeffs)
            total = coeffs.sum(axis=1, keepdims=True)
            coeffs = coeffs / np.where(total == 0, 1.0, total)
        idx = np.clip(neighbors, 0, n_in - 1)
    rows: list[list[tuple[int, float]]] = []
    for o in range(n_out):
        merged: dict[int, float] = {}
        for i, c in zip(idx[o].tolist(), coeffs[o].tolist()):
            merged[i] = merged.get(i, 0.0) + c
        taps = [(i, c) for i, c in merged.items() if c != 0.0] or [(int(idx[o, 0]), 0.0)]
        rows.append(taps)
    t = max(len(r) for r in rows) if rows else 1
    tab_i = np.zeros((n_out, t), np.int64)
    tab_w = np.zeros((n_out, t), np.float64)
    for o, taps in enumerate(rows):
        for j in range(t):
            i, c = taps[j] if j < len(taps) else (taps[0][0], 0.0)
            tab_i[o, j], tab_w[o, j] = i, c
    inside = None
    if outside is not None and outside.any():
        tab_w[outside] = 0.0
        inside = (~outside).astype(np.float32)
    unit = t == 1 and bool(np.all(tab_w == 1.0))
    return AxisTable(tab_i, None if unit else tab_w.astype(np.float32), inside)


# -- plan -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """The tables of the resized axes and the passes (groups of axes) that apply them."""

    geometry: Geometry
    tables: dict[int, AxisTable]
    passes: tuple[tuple[int, ...], ...]
    extrapolation: float

    def shape_after(self, p: int) -> tuple[int, ...]:
        """The tensor's shape after pass ``p``."""
        done = {a for q in self.passes[: p + 1] for a in q}
        return tuple(o if a in done else n for a, (n, o) in enumerate(zip(self.geometry.size, self.geometry.out)))

    def arrays(self) -> list[np.ndarray]:
        """The compile-time constants, in the order :meth:`Resize.lower` reads them."""
        out: list[np.ndarray] = []
        for a in sorted(self.tables):
            t = self.tables[a]
            # tap-major (T, out): each tap's row is contiguous along the output axis
            out += [np.ascontiguousarray(t.idx.T)] + ([np.ascontiguousarray(t.w.T)] if t.w is not None else [])
            out += [t.inside] if t.inside is not None else []
        return out


def plan(node: Node, ins: list[Operand | None]) -> Plan:
    st = settings(node)
    geo = geometry(node, ins)
    tables: dict[int, AxisTable] = {}
    for a, (n, o, s) in enumerate(zip(geo.size, geo.out, geo.scales)):
        if geo.identity(a) or o == 0 or n == 0:
            continue
        table = axis_table(st, n, o, s, geo.roi[a] if geo.roi else None)
        if not table.is_identity(n):
            tables[a] = table
    # one pass per interpolating axis (shrinking ones first, so the temps stay small); the
    # one-tap (nearest) axes gather in the first pass
    single = [a for a in sorted(tables) if tables[a].taps == 1]
    multi = sorted((a for a in tables if tables[a].taps > 1), key=lambda a: (geo.out[a] / geo.size[a], a))
    passes: list[tuple[int, ...]] = []
    if multi:
        passes = [tuple(sorted([*single, multi[0]]))] + [(a,) for a in multi[1:]]
    elif single:
        passes = [tuple(single)]
    return Plan(geo, tables, tuple(passes), st.extrapolation)


# -- lowering -------------------------------------------------------------------------------------

def _merge_identity(shape_in: tuple[int, ...], shape_out: tuple[int, ...], resized: set[int]) -> tuple[list[int], list[int], list[int | None]]:
    """Views of input and output with each run of consecutive untouched axes merged into one:
    (input view shape, output view shape, per view dim the resized axis it is or None)."""
    vin: list[int] = []
    vout: list[int] = []
    axis: list[int | None] = []
    for a, (n, o) in enumerate(zip(shape_in, shape_out)):
        if a in resized:
            vin.append(n)
            vout.append(o)
            axis.append(a)
        elif axis and axis[-1] is None:
            vin[-1] *= n
            vout[-1] *= o
        else:
            vin.append(n)
            vout.append(o)
            axis.append(None)
    return vin, vout, axis


def _resize_pass(k: KernelBuilder, src: Buffer, dst: Buffer, axes: tuple[int, ...],
                 tabs: dict[int, tuple[Buffer, Buffer | None, Buffer | None]], taps: dict[int, int],
                 extrapolation: float) -> None:
    """``dst[o] = Σ_t Π_a w_a[o_a, t_a] · src[idx_a[o_a, t_a] | o_b]`` over the output domain
    of this pass, resized axes ``axes`` read through their tables, the others at ``o``."""
    vin, vout, which = _merge_identity(src.shape, dst.shape, set(axes))
    s = view(k, src, tuple(vin), f"{src.name}_v") if list(src.shape) != vin else src
    d = view(k, dst, tuple(vout), f"{dst.name}_v") if list(dst.shape) != vout else dst
    dtype = dst.type.dtype
    par = len(vout) if dst.type.size >= PARALLEL_MIN_ELEMENTS else 0
    with nest(k, vout, names=[f"o{i}" for i in range(len(vout))], parallel=par) as ix:
        per_dim: list[list[tuple[ir.Value | int, ir.Value | None]]] = []
        inside: ir.Value | None = None
        for dim, a in enumerate(which):
            if a is None:
                per_dim.append([(ix[dim], None)])
                continue
            idx, w, m = tabs[a]
            per_dim.append([(idx.load([t, ix[dim]]), w.load([t, ix[dim]]) if w is not None else None)
                            for t in range(taps[a])])
            if m is not None:
                mv = m.load([ix[dim]])
                inside = mv if inside is None else k.b.fmul(inside, mv)

        def gather(level: int, at: list) -> ir.Value:
            if level == len(per_dim):
                return s.load(at)
            acc: ir.Value | None = None
            for i, wv in per_dim[level]:
                v = gather(level + 1, [*at, i])
                if wv is not None:
                    v = k.b.fmul(v, wv)
                acc = v if acc is None else k.b.fadd(acc, v)
            return acc

        value = gather(0, [])
        if inside is not None:
            value = k.b.select(k.b.fcmp_ordered(">", inside, k.f32(0.5)), value, constant(dtype, extrapolation))
        d.store(ix, value)


def _copy(k: KernelBuilder, src: Buffer, dst: Buffer) -> None:
    """``dst = src`` over one flat dimension (a Resize that changes nothing)."""
    s = view(k, src, (src.type.size,), f"{src.name}_flat")
    d = view(k, dst, (dst.type.size,), f"{dst.name}_flat")
    par = 1 if dst.type.size >= PARALLEL_MIN_ELEMENTS else 0
    with nest(k, [dst.type.size], names=["c"], parallel=par) as (i,):
        d.store([i], s.load([i]))


@register
class Resize(Kernel):
    """ONNX Resize: nearest/linear/cubic, every coordinate transformation mode, antialias,
    axes and keep_aspect_ratio_policy; roi/scales/sizes compile-time constants."""

    op_types = ("Resize",)
    static_inputs = (1, 2, 3)
    polly = "off"
    dtypes = DTYPES

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        st = settings(node)
        if st.mode not in MODES:
            return f"mode {st.mode!r} (supported: {', '.join(MODES)})"
        if st.coordinates not in COORDINATE_MODES:
            return f"coordinate_transformation_mode {st.coordinates!r}"
        if st.mode == "nearest" and st.nearest not in (*NEAREST_MODES, "simple"):
            return f"nearest_mode {st.nearest!r}"
        if st.policy not in POLICIES:
            return f"keep_aspect_ratio_policy {st.policy!r}"
        if st.antialias and st.mode == "nearest":
            return "antialias with mode nearest (ONNX defines it for linear and cubic only)"
        x = ins[0]
        if x.type.dtype not in DTYPES:
            return unsupported_dtype(0, x, DTYPES)
        if x.type.dtype != "float32" and st.mode != "nearest":
            return f"{st.mode} interpolation of {x.type.dtype} data (only nearest moves integer data)"
        if not x.type.shape:
            return "a scalar input"
        return None

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        return [TensorType(geometry(node, ins).out, ins[0].type.dtype)]

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        p = plan(node, ins)
        st = settings(node)
        taps = "x".join(str(p.tables[a].taps) for a in sorted(p.tables)) or "copy"
        mode = st.mode if st.mode != "nearest" else f"nearest/{st.nearest}"
        return (f"{mode} {st.coordinates} {'x'.join(map(str, p.geometry.size))}->{'x'.join(map(str, p.geometry.out))}"
                f" taps {taps} passes {len(p.passes)}")

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        p = plan(node, ins)
        return [TensorType(p.shape_after(i), ins[0].type.dtype) for i in range(len(p.passes) - 1)]

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        return plan(node, ins).arrays()

    def lower(self, k: KernelBuilder) -> None:
        ins = [Operand(f"in{i}", t, v) if t is not None else None for i, (t, v) in enumerate(zip(k.in_types, k.values))]
        p = plan(k.node, ins)
        x, y = k.inputs[0], k.outputs[0]
        if y.type.size == 0:
            return
        if not p.passes:
            _copy(k, x, y)
            return
        if len(k.constants) != len(p.arrays()):
            raise UnsupportedError([(k.node.label, k.node.op_type, "this lowering passes no compile-time tables "
                                     "(Kernel.constants); Resize runs on the CPU target only")])
        it = iter(k.constants)
        tabs: dict[int, tuple[Buffer, Buffer | None, Buffer | None]] = {}
        for a in sorted(p.tables):
            t = p.tables[a]
            tabs[a] = (next(it), next(it) if t.w is not None else None, next(it) if t.inside is not None else None)
        taps = {a: t.taps for a, t in p.tables.items()}
        src = x
        for i, axes in enumerate(p.passes):
            dst = y if i == len(p.passes) - 1 else k.temps[i]
            _resize_pass(k, src, dst, axes, tabs, taps, p.extrapolation)
            src = dst


@register
class Upsample(Resize):
    """ONNX Upsample (opsets 7-9, deprecated): Resize with asymmetric coordinates and
    truncating nearest; scales from the attribute (opset 7) or input 1 (opset 9)."""

    op_types = ("Upsample",)
    static_inputs = (1,)

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        mode = str(node.attrs.get("mode", "nearest"))
        if mode not in ("nearest", "linear"):
            return f"Upsample mode {mode!r} (nearest or linear)"
        return super().supports(node, ins)


__all__ = ["AxisTable", "Resize", "Upsample", "axis_table", "geometry", "plan", "settings"]
