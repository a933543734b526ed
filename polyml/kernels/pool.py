"""Pooling: MaxPool, AveragePool (1-3 spatial dims), GlobalMaxPool, GlobalAveragePool.

Windows follow :func:`polyml.kernels.conv.make_window` (pads, ``auto_pad``, strides,
dilations, ``ceil_mode``).  Where a window reads outside the input, the input is first copied
into a temp buffer padded with the reduction's identity (``-inf`` for max, ``0`` for sums), as
large as the last window needs (ceil mode can run past the end padding).  Then:

* small windows (at most ``UNROLL_TAPS`` taps): one nest over the output,
  ``y[n, c, o] = reduce_j src[n, c, o*s + j*d]`` with the taps unrolled in the statement;
* larger windows: ``y = identity`` then ``y[n, c, o] op= src[n, c, o*s + j*d]`` over
  ``[n, c, j..., o...]`` (the taps outside, the output plane inside).

Max pooling that would need the padded copy, with every window holding an input row
(:func:`separable_max`; ResNet's 3x3/2 pad 1), skips the copy and goes row by row instead
(so does one without padding whose output rows are shorter than a vector)
(:func:`_max_rows`): per output row ``(n, c, o')`` (``o'`` the output position without its
last dim), the max over the leading taps at every input column (contiguous, so it vectorizes)
into a stack row padded with the identity, then the max of the last dim's taps read from that
row with the stride.  A leading tap that falls in the padding is clamped to the nearest input
row of its window, which is also a tap (dilation 1), so the max is unchanged: results equal
the unrolled form's bit for bit (up to which of ``-0.0``/``+0.0`` a tie keeps).  The CUDA
build (whose kernels address buffer arguments only, no stack row) takes the unrolled form
there, reading the input through :class:`GuardedSource` instead of a padded copy.
On AVX-512, float32 max pools of stride 2 along the row with 2 or 3 taps there and dilation 1
(ResNet's, SqueezeNet's, Inception's) keep the row in registers instead (:func:`_max_rows_vectors`):
the leading taps' maxima of 16 input columns at a time, split into even and odd columns by one
shuffle each; without padding at any output width.  AveragePool always takes the forms above.

All nests run in parallel over ``(n, c)`` when the pool is large enough to pay for a parallel
region (:func:`polyml.kernels.conv.copy_parallel`).

Average pooling divides by the number of taps inside ``[0, size)`` (``count_include_pad=0``)
or inside the padded extent ``[-pad_begin, size + pad_end)`` (``count_include_pad=1``; taps
that ceil mode adds past the end padding never count).  The count factors over dimensions,
``cnt(o) = prod_d #{j : lo_d <= o_d*s_d + j*d_d - pb_d < hi_d}``; where it varies with ``o_d``
it is computed in the statement from integer compares on the loop counters (no table).

Fused prologue (:mod:`polyml.passes.fuse`): a node with ``attrs["prologue"]`` reads no stored
input; its inputs are the external tensors of an elementwise chain ``f`` and the window source
is ``x[n, c, p] = f(...)[n, c, p]``, evaluated where an element is read (once per element in the
padded copy, per tap otherwise).  Padding is the reduction's identity and never goes through
``f``, exactly as the unfused pool pads the stored ``f`` output.

Polly policy ``off``: at the pipeline position polyml runs Polly, these nests (unrolled taps,
padded copies) are dismissed as SCoPs, so ``polly``/``tile``/``off`` measured the same
(before the row form: MaxPool 3x3/2 on 1x64x112x112: 0.39 ms each; AveragePool 3x3 on
1x192x28x28: 0.115 ms).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import llvmlite.ir as ir
import numpy as np

from polyml.codegen.builder import (
    REASSOC,
    Buffer,
    KernelBuilder,
    constant,
    is_float,
    llvm_type,
    masked_intrinsic,
    skip_polly,
    store_lanes,
)
from polyml.errors import GraphError, ShapeError
from polyml.gpu.builder import GpuKernelBuilder
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register
from polyml.kernels.conv import Window, _isa, affine, copy_parallel, make_window, nest, padded_source, view
from polyml.kernels.fused import evaluate_chain
from polyml.kernels.reduce import vmax

#: windows with at most this many taps are unrolled into one statement
UNROLL_TAPS = 32
#: the widest row (elements) the row form of max pooling keeps on the stack of a (worker) thread
MAX_ROW = 1 << 14
#: max pooling that needs no padded copy goes row by row too where its output rows are at
#: most this wide: the unrolled nest's last loop is shorter than a 16-lane vector there and
#: LLVM vectorized an outer loop with gathers (single MaxPool, 1 thread,
#: minimum of 300, unrolled -> rows: 2x2/2 512@28 0.342 -> 0.093 ms, 512@14 0.056 -> 0.027,
#: 3x3/2 480@28 0.335 -> 0.121, 256@27 (SqueezeNet) 0.180 -> 0.073, 832@14 0.110 -> 0.050;
#: from 16 columns the unrolled nest is as fast or faster: 2x2/2 128@32 0.013 vs 0.017,
#: 256@56 0.053 vs 0.083, 3x3/2 256@40 0.049 vs 0.076, 128@55 and 64@111 tie)
ROWS_MAX_UNPADDED_WIDTH = 15
#: :func:`_max_rows_vectors` for the pools it applies to: the separable ones and, without
#: padding, any output width (SqueezeNet's 3x3/2 pools per step at 2
#: threads, minimum of 20: 27x27 -> 13x13 0.50 against the row loops, 111 -> 55 and 55 -> 27
#: 0.78 against the unrolled nest; ResNet-50's padded 112 -> 56 alone 0.96-1.03).
ROW_VECTORS = True

NEG_INF = float("-inf")


def pool_window(node: Node, x: TensorType) -> Window:
    if len(x.shape) < 3:
        raise ShapeError(f"{node.op_type} node {node.label!r}: input {x.shape} must be N-C-spatial")
    ks = node.attrs.get("kernel_shape")
    if not ks:
        raise GraphError(f"{node.op_type} node {node.label!r}: kernel_shape is required")
    if len(ks) != len(x.shape) - 2:
        raise ShapeError(f"{node.op_type} node {node.label!r}: kernel_shape {list(ks)} for input {x.shape}")
    ceil_mode = bool(node.attrs.get("ceil_mode", 0))
    return make_window(node, tuple(x.shape[2:]), tuple(int(v) for v in ks), ceil_mode=ceil_mode, same_uses_dilation=False)


def tap_counts(win: Window, lo: tuple[int, ...], hi: tuple[int, ...]) -> list[np.ndarray]:
    """Per dimension, for each output position, the number of taps in ``[lo, hi)`` (input coords)."""
    counts = []
    for d in range(win.rank):
        o = np.arange(win.out[d])[:, None]
        j = np.arange(win.kernel[d])[None, :]
        pos = o * win.strides[d] + j * win.dilations[d] - win.pads_begin[d]
        counts.append(((pos >= lo[d]) & (pos < hi[d])).sum(axis=1))
    return counts


def _count_in_nest(k: KernelBuilder, win: Window, os: list, d: int, lo: int, hi: int) -> ir.Value:
    """``#{j : lo <= o*s + j*d - pb < hi}`` as i64 arithmetic on the loop counter ``o``."""
    b = k.b
    total: ir.Value | None = None
    for j in range(win.kernel[d]):
        pos = affine(k, [(win.strides[d], os[d])], j * win.dilations[d] - win.pads_begin[d])
        ok = b.and_(b.icmp_signed(">=", pos, k.i64(lo)), b.icmp_signed("<", pos, k.i64(hi)))
        v = b.zext(ok, ir.IntType(64))
        total = v if total is None else b.add(total, v)
    return total


def _reciprocal_count(k: KernelBuilder, win: Window, os: list, lo: tuple[int, ...], hi: tuple[int, ...]) -> ir.Value:
    """``1 / count(o)``: a constant where the count does not vary, else computed in the statement."""
    counts = tap_counts(win, lo, hi)
    const = 1
    varying: ir.Value | None = None
    for d, cnt in enumerate(counts):
        if np.all(cnt == cnt[0]):
            const *= int(cnt[0])
        else:
            c = _count_in_nest(k, win, os, d, lo[d], hi[d])
            varying = c if varying is None else k.b.mul(varying, c)
    if varying is None:
        return k.f32(1.0 / max(const, 1))
    if const != 1:
        varying = k.b.mul(varying, k.i64(const))
    # a count of 0 (a window entirely in the padding) gives 1/0 = inf, times a 0 sum: NaN, as
    # onnxruntime's 0/0; clamp to 1 so such windows average to 0 instead
    varying = k.b.select(k.b.icmp_signed(">", varying, k.i64(0)), varying, k.i64(1))
    return k.b.fdiv(k.f32(1.0), k.b.sitofp(varying, ir.FloatType()))


def _maxnum(k: KernelBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """``llvm.maxnum.f32`` (declared here: ``KernelBuilder.intrinsic`` declares unary signatures)."""
    fn = k.module.globals.get("llvm.maxnum.f32")
    if fn is None:
        f32 = ir.FloatType()
        fn = ir.Function(k.module, ir.FunctionType(f32, [f32, f32]), "llvm.maxnum.f32")
    return k.b.call(fn, [a, b])


def separable_max(win: Window) -> bool:
    """Whether :func:`_max_rows` computes this max pool: some window reads outside the input
    (the row form's gain is the padded copy it drops; where no copy is needed the unrolled form
    reads the input once and was faster: 2x2/2 on int8 1x64x56x56 0.007 ms against 0.017 ms)
    or the output rows are narrow (:data:`ROWS_MAX_UNPADDED_WIDTH`); every window holds an
    input position in each leading dim, a leading dim whose taps can leave the input has
    dilation 1 (so the clamped tap stays in the window), both tap loops are small enough to
    unroll and the padded row fits :data:`MAX_ROW`."""
    if not win.needs_copy() and win.out[-1] > ROWS_MAX_UNPADDED_WIDTH:
        return False
    if math.prod(win.kernel[:-1]) > UNROLL_TAPS or win.kernel[-1] > UNROLL_TAPS or win.required[-1] > MAX_ROW:
        return False
    counts = tap_counts(win, (0,) * win.rank, win.size)
    return all(counts[d].min() == win.kernel[d] or (counts[d].min() > 0 and win.dilations[d] == 1)
               for d in range(win.rank - 1))


def _clamped_rows(k: KernelBuilder, win: Window, os: list, js: tuple[int, ...]) -> list:
    """Input positions of leading tap ``js`` for output ``os``, clamped into ``[0, size)``
    where some output puts the tap outside (see :func:`separable_max`)."""
    b, rows = k.b, []
    for d, j in enumerate(js):
        off = j * win.dilations[d] - win.pads_begin[d]
        pos = affine(k, [(win.strides[d], os[d])], off)
        if off < 0:
            pos = b.select(b.icmp_signed("<", pos, k.i64(0)), k.i64(0), pos)
        if (win.out[d] - 1) * win.strides[d] + off >= win.size[d]:
            last = k.i64(win.size[d] - 1)
            pos = b.select(b.icmp_signed(">", pos, last), last, pos)
        rows.append(pos)
    return rows


def _unroll_disabled(module: ir.Module, tag: str) -> ir.MDValue:
    """A loop ID (``!llvm.loop``) asking LLVM not to unroll the loop, so the loop vectorizer
    sees it: a short strided loop that LLVM fully unrolls is vectorized by SLP with gathers
    (2x2/2 on float32 1x64x56x56: 0.040 ms, 0.019 ms with the hint).  ``tag`` (unique in the
    module) keeps loop IDs apart: llvmlite uniques metadata by its operands."""
    hint = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.disable")])
    loop = module.add_metadata([hint, ir.MetaDataString(module, tag)])
    loop.operands = (loop, hint)  # a loop ID's first operand is itself
    return loop


#: lanes of the explicit vectors of :func:`_max_rows_vectors` (AVX-512)
ROW_LANES = 16


def _row_vectors_apply(x: Buffer | ChainSource, win: Window) -> bool:
    """Whether :func:`_max_rows_vectors` can compute this max pool (one without padding, or a
    separable one: :meth:`_Pool.lower` asks): AVX-512, float32
    read from a stored tensor (no prologue chain), two spatial dims, a last dim of stride 2,
    dilation 1 and 2 or 3 taps."""
    return (ROW_VECTORS and isinstance(x, Buffer) and x.type.dtype == "float32" and win.rank == 2
            and win.strides[-1] == 2 and win.dilations[-1] == 1 and win.kernel[-1] in (2, 3) and _isa() == "avx512")


def _max_rows_vectors(k: KernelBuilder, x: Buffer, y: Buffer, win: Window, identity: float,
                      combine: Callable[[ir.Value, ir.Value], ir.Value]) -> None:
    """:func:`_max_rows` in registers: per output row and block of 16 outputs ``o0..``, the
    maxima over the leading taps of the input columns ``c = 2·o0 - pb ..`` as vectors (masked
    loads, the identity outside the row), split into even and odd columns by one shuffle each,
    ``y[o] = max(even[o], odd[o], even[o + 1])`` (the third tap: ``even`` shifted by a lane,
    its last lane from the next block's first), stored whole or masked.  The row loops' stack
    row came back through gathers that LLVM made of the masked stride-2 loop, each waiting on
    the row's stores (SqueezeNet's 3x3/2 on 27x27)."""
    lanes = ROW_LANES
    vec = ir.VectorType(ir.FloatType(), lanes)
    width, ow_n, pb, kw = win.size[-1], win.out[-1], win.pads_begin[-1], win.kernel[-1]
    f32p = ir.FloatType().as_pointer()
    fill = ir.Constant(vec, [identity] * lanes)
    align = ir.Constant(ir.IntType(32), 4)
    with nest(k, [*y.shape[:-1]], names=["n", "c", "oh"], parallel=copy_parallel(x.shape)) as ix:
        b = k.b  # the nest's builder (a parallel nest outlines its body)
        skip_polly(b.function)
        n, c, oh = (k.i64(i) if isinstance(i, int) else i for i in ix)
        plane = b.add(b.mul(n, k.i64(x.shape[1])), c)
        rows = [_clamped_rows(k, win, [oh], (int(j),))[0] for j in range(win.kernel[0])]
        row_ptrs = [b.gep(b.bitcast(x.ptr, f32p), [b.mul(b.add(b.mul(plane, k.i64(win.size[0])), r), k.i64(width))],
                          inbounds=True) for r in rows]
        y_row = b.gep(b.bitcast(y.ptr, f32p), [b.mul(b.add(b.mul(plane, k.i64(y.shape[2])), oh), k.i64(ow_n))],
                      inbounds=True)
        columns: dict[int, ir.Value] = {}

        def column_max(col: int) -> ir.Value:
            """Max over the leading taps of input columns col .. col + 15 (identity outside)."""
            if col not in columns:
                on = [0 <= col + u < width for u in range(lanes)]
                acc = None
                if any(on):
                    for ptr in row_ptrs:
                        first = max(col, 0) if all(on) else col
                        at = b.bitcast(b.gep(ptr, [k.i64(first)], inbounds=all(on)), vec.as_pointer())
                        if all(on):
                            v = b.load(at, align=4)
                        else:
                            load, mask = masked_intrinsic(b, "load", vec, on)
                            v = b.call(load, [at, align, mask, fill])
                        acc = v if acc is None else combine(acc, v)
                columns[col] = acc if acc is not None else fill
            return columns[col]

        int_vec = ir.VectorType(ir.IntType(32), lanes)
        for o0 in range(0, ow_n, lanes):
            c0 = 2 * o0 - pb
            a, z = column_max(c0), column_max(c0 + lanes)
            even = b.shuffle_vector(a, z, ir.Constant(int_vec, list(range(0, 2 * lanes, 2))))
            out = combine(even, b.shuffle_vector(a, z, ir.Constant(int_vec, list(range(1, 2 * lanes, 2)))))
            if kw == 3:
                after = column_max(c0 + 2 * lanes)
                out = combine(out, b.shuffle_vector(even, after, ir.Constant(int_vec, list(range(1, lanes + 1)))))
            store_lanes(b, out, b.bitcast(b.gep(y_row, [k.i64(o0)], inbounds=True), vec.as_pointer()), ow_n - o0)


def _max_rows(k: KernelBuilder, x: Buffer | ChainSource, y: Buffer, win: Window, identity: float,
              combine: Callable[[ir.Value, ir.Value], ir.Value]) -> None:
    """Max pooling row by row (the module docstring): per ``(n, c, o')``
    ``row[p] = max_{j'} x[n, c, o'*s' + j'*d' - pb', p - pb]`` over the input columns ``p - pb``
    (the identity on the rest of ``row``), then ``y[n, c, o', o] = max_j row[o*s + j*d]``."""
    dtype = x.type.dtype
    lead = win.rank - 1
    width, pb = win.required[-1], win.pads_begin[-1]
    cols = min(win.size[-1], width - pb)
    fill = constant(dtype, identity)
    with nest(k, [*y.shape[:-1]], names=["n", "c", *[f"o{d}" for d in range(lead)]],
              parallel=copy_parallel(x.shape)) as ix:
        row = k.entry_alloca(ir.ArrayType(llvm_type(dtype), width), "pool.row")

        def at(p: ir.Value | int) -> ir.Value:
            return k.b.gep(row, [k.i64(0), k.i64(p)], inbounds=True)

        for p in [*range(pb), *range(pb + cols, width)]:
            k.b.store(fill, at(p))
        n, c, os = ix[0], ix[1], ix[2:]
        taps = [_clamped_rows(k, win, os, tuple(int(j) for j in js)) for js in np.ndindex(*win.kernel[:-1])]
        with k.loop(0, cols, "col") as q:
            acc: ir.Value | None = None
            for rows in taps:
                v = x.load([n, c, *rows, q])
                acc = v if acc is None else combine(acc, v)
            k.b.store(acc, at(affine(k, [(1, q)], pb)))
        with k.loop(0, win.out[-1], "ow") as o:
            acc = None
            for j in range(win.kernel[-1]):
                v = k.b.load(at(affine(k, [(win.strides[-1], o)], j * win.dilations[-1])))
                acc = v if acc is None else combine(acc, v)
            y.store([*ix, o], acc)
            latch = k.b.block
        if win.strides[-1] > 1:
            latch.terminator.set_metadata("llvm.loop", _unroll_disabled(k.module, f"{k.fn.name}.{latch.name}"))


class GuardedSource:
    """The padded input without a copy: ``load`` at a padded position reads the input where the
    position is inside it (at a clamped index, so no read leaves the buffer) and gives the
    identity elsewhere, as the padded copy holds.  What the CUDA build reads where the host
    takes :func:`_max_rows` (its kernels address buffer arguments only, no stack row)."""

    def __init__(self, k: KernelBuilder, x: Buffer | ChainSource, win: Window, fill: ir.Constant):
        self.k, self.x, self.win, self.fill = k, x, win, fill

    def load(self, idx: list) -> ir.Value:
        b, k = self.k.b, self.k
        inside: ir.Value | None = None
        pos = []
        for i, pb, n in zip(idx[2:], self.win.pads_begin, self.win.size):
            p = affine(k, [(1, i)], -pb)
            ok = b.and_(b.icmp_signed(">=", p, k.i64(0)), b.icmp_signed("<", p, k.i64(n)))
            inside = ok if inside is None else b.and_(inside, ok)
            p = b.select(b.icmp_signed("<", p, k.i64(0)), k.i64(0), p)
            pos.append(b.select(b.icmp_signed(">", p, k.i64(n - 1)), k.i64(n - 1), p))
        return b.select(inside, self.x.load([*idx[:2], *pos]), self.fill)


class ChainSource:
    """A pool's input computed by a fused elementwise prologue wherever it is read (duck-types
    the ``shape``/``rank``/``type``/``load`` part of :class:`Buffer` that windows use)."""

    def __init__(self, k: KernelBuilder, chain: list[Node], buffers: dict[str, Buffer], ttype: TensorType):
        self.k, self.chain, self.buffers, self.type, self.name = k, chain, buffers, ttype, "prologue"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def rank(self) -> int:
        return len(self.type.shape)

    def load(self, idx: list) -> ir.Value:
        return evaluate_chain(self.k, self.chain, {}, self.buffers, list(idx))


def pool_input_type(node: Node, ins: list[Operand | None]) -> TensorType:
    """The type of the window source: the stored input, or the fused prologue's result."""
    return node.attrs.get("prologue_type") or ins[0].type


class _Pool(Kernel):
    """Shared lowering of MaxPool and AveragePool."""

    polly = "off"
    is_max = False

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if any(int(p) < 0 for p in node.attrs.get("pads", []) or []):
            return f"negative pads {list(node.attrs['pads'])}"
        return super().supports(node, ins)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x = ins[0].type
        win = pool_window(node, x)
        return [TensorType((*x.shape[:2], *win.out), x.dtype)]

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        x = pool_input_type(node, ins)
        win = pool_window(node, x)
        if self.is_max and separable_max(win):
            return []
        return [TensorType(win.padded_shape(x.shape[:2]), x.dtype)] if win.needs_copy() else []

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        if k.node.attrs.get("prologue"):
            x = ChainSource(k, k.node.attrs["prologue"], {b.name: b for b in k.inputs if b is not None},
                            k.node.attrs["prologue_type"])
        win = pool_window(k.node, x.type)
        dtype = x.type.dtype
        identity = (NEG_INF if is_float(dtype) else int(np.iinfo(dtype).min)) if self.is_max else 0.0

        def combine(acc: ir.Value, v: ir.Value) -> ir.Value:
            if self.is_max:
                return k.maxf(acc, v) if is_float(dtype) else vmax(k, acc, v, dtype)
            return k.b.fadd(acc, v)

        r = win.rank
        host = not isinstance(k, GpuKernelBuilder)
        # in registers: the separable pools and, without padding, any width (see ROW_VECTORS)
        if self.is_max and host and _row_vectors_apply(x, win) and (not win.needs_copy() or separable_max(win)):
            _max_rows_vectors(k, x, y, win, identity, combine)
            return
        if self.is_max and separable_max(win):  # no temp (see temps)
            if host:
                _max_rows(k, x, y, win, identity, combine)
                return
            if win.needs_copy():
                src, shift = GuardedSource(k, x, win, constant(dtype, identity)), [0] * r
            else:
                src, shift = padded_source(k, x, win, None, identity)
        else:
            src, shift = padded_source(k, x, win, k.temps[0] if k.temps else None, identity)
        taps = math.prod(win.kernel)
        onames = [f"o{d}" for d in range(r)]
        par = copy_parallel(y.shape)

        def tap_index(n, c, os, js) -> list:
            return [n, c, *[affine(k, [(s, o), (d, j)], sh) for o, j, s, d, sh in zip(os, js, win.strides, win.dilations, shift)]]

        def finish(os: list, total: ir.Value) -> ir.Value:
            if self.is_max:
                return total
            if k.attr("count_include_pad", 0):
                lo = tuple(-pb for pb in win.pads_begin)
                hi = tuple(n + pe for n, pe in zip(win.size, win.pads_end))
            else:
                lo, hi = (0,) * r, win.size
            return k.b.fmul(total, _reciprocal_count(k, win, os, lo, hi))

        if taps <= UNROLL_TAPS:
            # y[n, c, o] = finish(reduce over the unrolled taps j of src[n, c, o*s + j*d])
            with nest(k, y.shape, names=["n", "c", *onames], parallel=par) as ix:
                n, c, os = ix[0], ix[1], ix[2:]
                acc: ir.Value | None = None
                for js in np.ndindex(*win.kernel):
                    v = src.load(tap_index(n, c, os, [int(j) for j in js]))
                    acc = v if acc is None else combine(acc, v)
                y.store(ix, finish(os, acc))
            return
        # y = identity; y[n, c, o] op= src[n, c, o*s + j*d] over [n, c, j..., o...]; y = finish(y)
        with nest(k, y.shape, names=["in", "ic", *[f"io{d}" for d in range(r)]], parallel=par) as ix:
            y.store(ix, constant(dtype, identity))
        with nest(k, [*y.shape[:2], *win.kernel, *win.out], names=["n", "c", *[f"j{d}" for d in range(r)], *onames],
                  parallel=par) as ix:
            n, c, js, os = ix[0], ix[1], ix[2 : 2 + r], ix[2 + r :]
            yi = [n, c, *os]
            y.store(yi, combine(y.load(yi), src.load(tap_index(n, c, os, js))))
        if not self.is_max:
            with nest(k, y.shape, names=["fn", "fc", *[f"fo{d}" for d in range(r)]], parallel=par) as ix:
                y.store(ix, finish(ix[2:], y.load(ix)))


@register
class MaxPool(_Pool):
    """ONNX MaxPool (output ``Y`` only; the ``Indices`` output is not supported)."""

    op_types = ("MaxPool",)
    is_max = True
    #: max commutes with the monotone quantization, so quantized models pool int8/uint8 directly
    dtypes = frozenset({"float32", "int8", "uint8"})

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if len(node.outputs) > 1 and node.outputs[1]:
            return "MaxPool's Indices output is not supported"
        return super().supports(node, ins)


@register
class AveragePool(_Pool):
    """ONNX AveragePool (``count_include_pad`` selects the divisor, see the module docstring)."""

    op_types = ("AveragePool",)


@register
class GlobalPool(Kernel):
    """GlobalAveragePool, GlobalMaxPool: ``y[n, c, 1...] = reduce_p x[n, c, p]`` over the flattened
    spatial positions ``p``, accumulated in ``y`` (reassociation allowed, so the reduction loop
    vectorizes)."""

    op_types = ("GlobalAveragePool", "GlobalMaxPool")
    polly = "off"

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        x = ins[0].type
        if len(x.shape) < 3:
            raise ShapeError(f"{node.op_type} node {node.label!r}: input {x.shape} must be N-C-spatial")
        return [TensorType((*x.shape[:2], *([1] * (len(x.shape) - 2))), x.dtype)]

    def lower(self, k: KernelBuilder) -> None:
        x, y = k.inputs[0], k.outputs[0]
        n_, c_ = x.shape[:2]
        p_ = math.prod(x.shape[2:])
        is_max = k.node.op_type == "GlobalMaxPool"
        xf: Buffer = view(k, x, (n_, c_, p_), "x_flat")
        yf: Buffer = view(k, y, (n_, c_), "y_flat")
        # one nest, parallel over (n, c) when large enough: the SE blocks' pools of EfficientNet
        # (0.23 ms in all at 1 thread) had run on one thread in three nests
        with nest(k, [n_, c_], names=["n", "c"], parallel=copy_parallel(x.shape)) as (n, c):
            yf.store([n, c], xf.load([n, c, 0]))
            with k.loop(1, p_, "p") as p:
                acc, v = yf.load([n, c]), xf.load([n, c, p])
                if is_max:
                    r = _maxnum(k, acc, v)
                else:
                    r = k.b.fadd(acc, v, flags=REASSOC)
                yf.store([n, c], r)
            if not is_max and p_ > 1:
                yf.store([n, c], k.b.fmul(yf.load([n, c]), k.f32(1.0 / p_)))
