"""ConvTranspose (ONNX, NCHW, 1-3 spatial dimensions): the adjoint of a strided convolution.

Input position ``i`` and tap ``j`` contribute to the position ``p = i*s + j*d`` of the *full*
output (length ``(in-1)*s + (k-1)*d + 1``); the output ``y`` is the window ``p = o + b`` of it
(``b`` the begin padding, from ``pads``, ``auto_pad`` or ``output_shape``; positions past the full
output, from ``output_padding`` or a larger ``output_shape``, get the bias only).  Written as a
scatter the access ``p = i*s + j*d`` is affine, with no divisibility condition, so two lowerings
need no modular arithmetic:

* ``direct`` — ``acc = 0``;
  ``acc[n, g*Mg + m, i*s + j*d] += x[n, g*Cg + c, i] * w[g*Cg + c, m, j]`` over
  ``{[n, g, m, c, j, i]}`` (``n, g, m`` parallel: disjoint slices of ``acc``), then
  ``y[n, m, o] = acc[n, m, o + b] + bias[m]``.  ``acc`` is a temp as large as the full output
  with its last dim split into stride phases (so the innermost loop is contiguous, see
  :func:`_lower_direct`), or ``y`` itself when nothing is cropped and the last stride is 1
  (then initialized to the bias).  Used for groups (depthwise 4x4/2 128 channels @28x28, one
  thread: 0.5-1.0 ms, onnxruntime 0.7-1.1) and where the packed GEMM is off or declines.
* ``gemm`` (host builds with the packed GEMM, one group) — the product
  ``cols[(m, j), (n, i)] = Σ_c W[c, (m, j)] · x[n, c, i]`` through :mod:`polyml.codegen.gemm` (constant
  weights pre-packed at compile time, ``Kernel.constants``), then col2im as one nest per tap ``j``
  over the input positions whose target lies in ``y``:
  ``y[n, m, i*s + j*d - b] += cols[m, j, n, i]`` (constant bounds per tap), after ``y = bias``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import I64, Buffer, KernelBuilder, pointer_type
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register
from polyml.kernels.conv import affine, auto_pad_of, copy_parallel, nest, view, window_problem
from polyml.options import CodegenConfig

#: the gemm mode's col2im emits one nest per tap: kernels with more taps use the direct nest
GEMM_MAX_TAPS = 64


@dataclass(frozen=True)
class Geometry:
    """Per spatial dim: input length, kernel, stride, dilation, begin padding ``b`` and output."""

    size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.size)

    @property
    def full(self) -> tuple[int, ...]:
        """Length of the full output, where the last tap of the last input lands (+1)."""
        return tuple((n - 1) * s + (k - 1) * d + 1 for n, s, k, d in zip(self.size, self.strides, self.kernel, self.dilations))

    @property
    def extent(self) -> tuple[int, ...]:
        """The accumulator's length: the full output, or as far as the cropped window reaches."""
        return tuple(max(f, b + o) for f, b, o in zip(self.full, self.begin, self.out))

    def crops(self) -> bool:
        return any(b != 0 or e != o for b, e, o in zip(self.begin, self.extent, self.out))

    def tap_range(self, d: int, j: int) -> tuple[int, int]:
        """Input positions ``i`` whose tap ``j`` lands in ``[0, out)``: ``0 <= i*s + j*dil - b < out``."""
        s, dil, b = self.strides[d], self.dilations[d], self.begin[d]
        lo = max(0, -((j * dil - b) // s))
        hi = min(self.size[d], (self.out[d] - 1 + b - j * dil) // s + 1)
        return lo, max(lo, hi)


def _ints(node: Node, name: str, n: int, default: int) -> tuple[int, ...]:
    v = node.attrs.get(name)
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return (default,) * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise GraphError(f"{node.op_type} node {node.label!r}: {name}={v} needs {n} values")
    return tuple(v)


def geometry(node: Node, x: TensorType, w: TensorType) -> Geometry:
    """The ONNX rules: ``output_shape`` (or ``auto_pad`` SAME_*, output ``in*s``) fixes the output
    and the total padding ``full + output_padding - out`` is split with the odd element at the
    end for SAME_UPPER, at the begin otherwise (a negative total extends the end); else
    ``out = full + output_padding - pads_begin - pads_end``."""
    where = f"{node.op_type} node {node.label!r}"
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ShapeError(f"{where}: input {x.shape} and weight {w.shape} must both be N-C-spatial")
    r = len(x.shape) - 2
    size, kernel = tuple(x.shape[2:]), tuple(w.shape[2:])
    ks = node.attrs.get("kernel_shape")
    if ks and tuple(int(v) for v in ks) != kernel:
        raise ShapeError(f"{where}: kernel_shape {list(ks)} but the weight is {w.shape}")
    strides = _ints(node, "strides", r, 1)
    dilations = _ints(node, "dilations", r, 1)
    adj = _ints(node, "output_padding", r, 0)
    pads = _ints(node, "pads", 2 * r, 0)
    if min(strides) < 1 or min(dilations) < 1 or min(kernel) < 1:
        raise GraphError(f"{where}: strides, dilations and kernel must be positive")
    mode = auto_pad_of(node)
    full = [(n - 1) * s + (k - 1) * d + 1 + a for n, s, k, d, a in zip(size, strides, kernel, dilations, adj)]
    shape = node.attrs.get("output_shape")
    if shape is not None and len(shape):
        shape = [int(v) for v in shape]
        if len(shape) not in (r, r + 2):
            raise GraphError(f"{where}: output_shape {shape} for {r} spatial dims")
        target = shape[-r:]
    elif mode in ("SAME_UPPER", "SAME_LOWER"):
        target = [n * s for n, s in zip(size, strides)]
    else:
        target = None
    if target is not None:
        begin = []
        for f, t in zip(full, target):
            total = f - t
            head = total // 2 if mode == "SAME_UPPER" else total - total // 2
            begin.append(max(head, 0) if total > 0 else 0)
        out = list(target)
    elif mode == "VALID":
        begin, out = [0] * r, full
    else:
        begin = list(pads[:r])
        out = [f - pb - pe for f, pb, pe in zip(full, pads[:r], pads[r:])]
    if any(o < 1 for o in out):
        raise ShapeError(f"{where}: output {out} is empty (input {list(size)}, kernel {list(kernel)}, pads {list(pads)})")
    return Geometry(size, kernel, strides, dilations, tuple(begin), tuple(out))


@dataclass(frozen=True)
class Plan:
    mode: str
    geo: Geometry
    temps: tuple[TensorType, ...]


def _plan(config: CodegenConfig, node: Node, x: TensorType, w: TensorType) -> Plan:
    geo = geometry(node, x, w)
    group = int(node.attrs.get("group", 1))
    n, c = x.shape[:2]
    m = w.shape[1] * group
    taps = math.prod(geo.kernel)
    scratch = _gemm_scratch(config, x, w, geo, group)
    if scratch is not None:
        return Plan("gemm", geo, (TensorType((m * taps, n * math.prod(geo.size))), scratch))
    st, ext = geo.strides[-1], geo.extent
    acc = (TensorType((n, m, *ext[:-1], st, -(-ext[-1] // st))),) if geo.crops() or st > 1 else ()
    return Plan("direct", geo, acc)


def _gemm_scratch(config: CodegenConfig, x: TensorType, w: TensorType, geo: Geometry, group: int) -> TensorType | None:
    """The packed GEMM's scratch when the gemm mode applies, else None.

    Wherever the packed GEMM takes the product (one group, ``--conv`` not ``direct``): measured
    on one thread, it beat the direct scatter from the smallest eligible shapes on (4x4/2
    64->3 @64x64, a GAN's last layer: 0.37 ms vs 12.4 ms, onnxruntime 0.37; 3x3/2 8->8 @64x64:
    0.22 vs 1.2, onnxruntime 0.26; 4x4/2 256->128 @32x32: 26 ms, onnxruntime 29), whose strided
    read-modify-write of the accumulator does not vectorize."""
    from polyml.kernels.matmul import packed_plan, packed_temps

    c, m = x.shape[1], w.shape[1]
    taps = math.prod(geo.kernel)
    rows, cols = m * taps, x.shape[0] * math.prod(geo.size)
    if (not config.packed or config.conv == "direct" or group != 1
            or taps > GEMM_MAX_TAPS or packed_plan(config, rows, cols, c) is None):
        return None
    return packed_temps(config, rows, cols, c)[0]


@register
class ConvTranspose(Kernel):
    """ONNX ConvTranspose: strides, pads, dilations, groups (incl. depthwise), output_padding,
    output_shape, auto_pad, optional bias; 1-3 spatial dims."""

    op_types = ("ConvTranspose",)
    polly = "off"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        return super().supports(node, ins) or window_problem(node, ins, ("pads", "output_padding"))

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x, w = ins[0].type, ins[1].type
        group = int(node.attrs.get("group", 1))
        geo = geometry(node, x, w)
        c = x.shape[1]
        if group < 1 or c % group or w.shape[0] != c:
            raise ShapeError(f"ConvTranspose node {node.label!r}: input {x.shape}, weight {w.shape} and group={group} "
                             "do not agree (the weight is C x M/group x kernel)")
        m = w.shape[1] * group
        if len(ins) > 2 and ins[2] is not None and ins[2].type.shape != (m,):
            raise ShapeError(f"ConvTranspose node {node.label!r}: bias {ins[2].type.shape} should be ({m},)")
        return [TensorType((x.shape[0], m, *geo.out), x.dtype)]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        return list(_plan(self.config, node, ins[0].type, ins[1].type).temps)

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        p = _plan(self.config, node, ins[0].type, ins[1].type)
        g = int(node.attrs.get("group", 1))
        return (f"{'x'.join(map(str, p.geo.kernel))}/{max(p.geo.strides)} {ins[0].type.shape[1]}->{outs[0].shape[1]}"
                f"{f' g{g}' if g > 1 else ''} @{'x'.join(map(str, p.geo.size))} {p.mode}")

    def _prepacks(self, node: Node, ins: list[Operand | None]) -> bool:
        return ins[1].value is not None and _plan(self.config, node, ins[0].type, ins[1].type).mode == "gemm"

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        """Constant weights of the gemm mode as the product's A = Wᵀ (M·taps x C), pre-packed."""
        if not self._prepacks(node, ins):
            return []
        from polyml.codegen import gemm as packed

        w = np.asarray(ins[1].value, np.float32)
        blk = packed.blocking_for_host(self.config.gemm_blocking)
        return [packed.prepack_a(np.ascontiguousarray(w.reshape(w.shape[0], -1).T), blk)]

    def replaced_inputs(self, node: Node, ins: list[Operand | None]) -> set[int]:
        return {1} if self._prepacks(node, ins) else set()

    def lower(self, k: KernelBuilder) -> None:
        x = k.inputs[0]
        p = _plan(self.config, k.node, x.type, k.in_types[1])
        if p.mode == "gemm":
            _lower_gemm(k, p)
        else:
            _lower_direct(k, p)


def _bias_fill(k: KernelBuilder, y: Buffer, bias: Buffer | None) -> None:
    """``y[n, m, o] = bias[m]`` (or 0)."""
    with nest(k, y.shape, names=["bn", "bm", *[f"b{d}" for d in range(y.rank - 2)]], parallel=copy_parallel(y.shape)) as ix:
        y.store(ix, bias.load([ix[1]]) if bias is not None else k.f32(0.0))


def _lower_direct(k: KernelBuilder, p: Plan) -> None:
    """The scatter, into ``y`` or into ``acc[n, m, p_0, ..., ph, q]``: the accumulator with its
    last dim split into ``s`` phases, ``p_last = q*s + ph``.  Tap ``j`` of the last dim lands in
    phase ``(j*d) % s`` at ``q = i + (j*d) // s``; the taps of one phase are ``j0 + t*L``
    (``L = s / gcd(s, d)``), an affine family, so each phase is one nest whose innermost loop
    runs over contiguous ``x`` and ``acc`` (a plain ``i*s + j*d`` store strided by ``s`` does not
    vectorize).  Then ``y[n, m, o] = acc[n, m, o + b] + bias[m]``, one nest per phase."""
    x, w, y = k.inputs[0], k.inputs[1], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    geo, r = p.geo, p.geo.rank
    group = int(k.attr("group", 1))
    n_, c_ = x.shape[:2]
    m_ = y.shape[1]
    cg, mg = c_ // group, w.shape[1]
    st, dl, kl = geo.strides[-1], geo.dilations[-1], geo.kernel[-1]
    acc = k.temps[0] if p.temps else None
    if acc is None:
        _bias_fill(k, y, bias)
    else:
        k.fill(acc, 0.0)
    step = st // math.gcd(st, dl)
    for ph in sorted({(j * dl) % st for j in range(kl)}):
        j0 = next(j for j in range(kl) if (j * dl) % st == ph)
        count = len(range(j0, kl, step))
        q0, qstep = (j0 * dl) // st, step * dl // st
        # acc[n, g*Mg + m, i*s + j*d, ph, i_l + q0 + t*qstep] += x[n, g*Cg + c, i, i_l] * w[g*Cg + c, m, j, j0 + t*step]
        # loops n, g, m, c, i_outer, j_outer, t, i_last: the taps inside the outer input rows,
        # so that a short last row fully unrolled leaves tap loops (not rows) to vectorize
        extents = [n_, group, mg, cg, *geo.size[:-1], *geo.kernel[:-1], count, geo.size[-1]]
        names = ["n", "g", "m", "c", *[f"i{d}" for d in range(r - 1)], *[f"j{d}" for d in range(r - 1)], "t", "il"]
        with nest(k, extents, names=names, parallel=3) as iv:
            n, g, m, c = iv[:4]
            is_ = [*iv[4 : 3 + r], iv[-1]]
            js, t = iv[3 + r : 2 + 2 * r], iv[2 + 2 * r]
            ic = affine(k, [(cg, g), (1, c)])
            oc = affine(k, [(mg, g), (1, m)])
            rows = [affine(k, [(s, i), (d, j)]) for i, j, s, d in zip(is_[:-1], js, geo.strides[:-1], geo.dilations[:-1])]
            col = affine(k, [(1, is_[-1]), (qstep, t)], q0)
            # stride 1 and nothing cropped: straight into y
            dst, at = (acc, [n, oc, *rows, ph, col]) if acc is not None else (y, [n, oc, *rows, col])
            wv = w.load([ic, m, *js, affine(k, [(step, t)], j0)])
            prod = k.b.fmul(x.load([n, ic, *is_]), wv, flags=("contract",))
            dst.store(at, k.b.fadd(dst.load(at), prod, flags=("contract",)))
    if acc is None:
        return
    # y[n, m, o, q*s + ph - b_l] = acc[n, m, o + b, ph, q] + bias[m] over the q landing in y
    b_l, out_l = geo.begin[-1], geo.out[-1]
    for ph in range(st):
        lo, hi = max(0, -((ph - b_l) // st)), min(acc.shape[-1], (out_l - 1 + b_l - ph) // st + 1)
        if hi <= lo:
            continue
        extents = [n_, m_, *geo.out[:-1], (lo, hi)]
        with nest(k, extents, names=["cn", "cm", *[f"o{d}" for d in range(r)]], parallel=copy_parallel(extents)) as ix:
            src = [*ix[:2], *[affine(k, [(1, o)], b) for o, b in zip(ix[2:-1], geo.begin[:-1])], ph, ix[-1]]
            v = acc.load(src)
            if bias is not None:
                v = k.b.fadd(v, bias.load([ix[1]]))
            y.store([*ix[:-1], affine(k, [(st, ix[-1])], ph - b_l)], v)


def _lower_gemm(k: KernelBuilder, p: Plan) -> None:
    from polyml.codegen import gemm as packed
    from polyml.kernels.matmul import packed_product

    x, y = k.inputs[0], k.outputs[0]
    bias = k.inputs[2] if len(k.inputs) > 2 else None
    geo, r = p.geo, p.geo.rank
    cols, scratch = k.temps
    n_, c_ = x.shape[:2]
    m_ = y.shape[1]
    taps, hw = math.prod(geo.kernel), math.prod(geo.size)
    rows = m_ * taps
    prepacked = bool(k.constants)
    a = k.constants[0] if prepacked else k.inputs[1]
    # cols[(m, j), (n, i)] = Σ_c A[(m, j), c] · x[n, c, i] with A = Wᵀ (W is C x (M·taps))
    load_a = packed.matrix_loader(0, rows, transposed=True)
    if n_ == 1:
        load_b = packed.matrix_loader(1, hw)
    else:
        def load_b(b, ops, row, col):  # noqa: ANN001, ANN202 -- column n*HW + i is x[n, row, i]
            n, i = b.udiv(col, ir.Constant(I64, hw)), b.urem(col, ir.Constant(I64, hw))
            at = b.add(b.mul(n, ir.Constant(I64, c_ * hw)), b.add(b.mul(row, ir.Constant(I64, hw)), i))
            return b.load(b.gep(ops[1], [at], inbounds=True))
    spec = packed.GemmSpec(rows, n_ * hw, c_, load_a, load_b, 2, prepacked_a=prepacked)
    packed_product(k, spec, [a, x], view(k, cols, (1, rows, n_ * hw), "cols_flat"), scratch)
    _bias_fill(k, y, bias)
    ctype = TensorType((m_, taps, n_, *geo.size))
    cv = Buffer(k, k.b.bitcast(cols.ptr, pointer_type(ctype)), ctype, "cols_taps")
    for jflat, js in enumerate(np.ndindex(*geo.kernel)):
        ranges = [geo.tap_range(d, int(j)) for d, j in enumerate(js)]
        if any(hi <= lo for lo, hi in ranges):
            continue
        # y[n, m, i*s + j*d - b] += cols[m, j, n, i] over the i whose target lies in y
        with nest(k, [n_, m_, *ranges], names=["n", "m", *[f"i{d}" for d in range(r)]], parallel=2) as iv:
            n, m, is_ = iv[0], iv[1], iv[2:]
            at = [n, m, *[affine(k, [(s, i)], int(j) * d - b)
                          for i, j, s, d, b in zip(is_, js, geo.strides, geo.dilations, geo.begin)]]
            y.store(at, k.b.fadd(y.load(at), cv.load([m, jflat, n, *is_])))


__all__ = ["ConvTranspose", "Geometry", "geometry"]
