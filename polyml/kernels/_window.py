"""The convolution geometry shared by the convolution kernels (:mod:`polyml.kernels.conv`,
:mod:`~polyml.kernels.depthwise`, :mod:`~polyml.kernels.winograd`,
:mod:`~polyml.kernels.depthwise_product`) and the pooling and other window kernels: the
host's vector ISA (:func:`_isa`: read through this module, so that one seam pins it in tests),
sliding windows (:class:`Window`, :func:`make_window`, :func:`conv_window`), the IR helpers of
their nests, and the register epilogue of the packed GEMM (:func:`register_epilogue`).

A module of its own so that :mod:`polyml.kernels.conv` can import the depthwise and Winograd
kernels it dispatches to while they import this geometry (no Kernel is registered here).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import llvmlite.ir as ir

from polyml.codegen import gemm as packed
from polyml.codegen.builder import Buffer, KernelBuilder, constant, pointer_type
from polyml.driver.toolchain import host_target
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels._scalar import PARALLEL_MIN_ELEMENTS

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
#: vector lanes of f32, by the host's vector ISA (:func:`_isa`)
VECTOR_LANES = {"avx512": 16, "avx": 8, "other": 4}


def _isa() -> str:
    features = host_target().features.split(",")
    return "avx512" if "+avx512f" in features else "avx" if "+avx" in features else "other"


Term = tuple[int, "ir.Value | int"]


# -- window geometry (shared with pool.py) ------------------------------------------------------

@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial dims: output ``o`` reads padded positions ``o*s + j*d``.

    Padded position ``p`` is input position ``p - pads_begin``; the padded extent is
    ``[-pads_begin, size + pads_end)`` in input coordinates.  ``required`` is how far the last
    window reaches in padded coordinates (it exceeds the padded extent in ceil mode).
    """

    size: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    out: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.size)

    @property
    def extent(self) -> tuple[int, ...]:
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    @property
    def required(self) -> tuple[int, ...]:
        return tuple((o - 1) * s + e for o, s, e in zip(self.out, self.strides, self.extent))

    def needs_copy(self) -> bool:
        """Whether some window reads outside the input (so a padded copy is needed)."""
        return any(pb > 0 or r - pb > n for pb, r, n in zip(self.pads_begin, self.required, self.size))

    @property
    def pointwise(self) -> bool:
        """A 1x1 unstrided window inside the input: output position p reads input position p."""
        return all(k == 1 for k in self.kernel) and all(s == 1 for s in self.strides) and not self.needs_copy()

    def padded_shape(self, lead: tuple[int, ...]) -> tuple[int, ...]:
        return (*lead, *self.required)


def _ints(node: Node, name: str, n: int, default: int) -> tuple[int, ...]:
    v = node.attrs.get(name)
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        return (default,) * n
    v = [int(x) for x in v]
    if len(v) != n:
        raise GraphError(f"{node.op_type} node {node.label!r}: {name}={v} needs {n} values")
    return tuple(v)


def auto_pad_of(node: Node) -> str:
    mode = node.attrs.get("auto_pad", "NOTSET") or "NOTSET"
    if mode not in AUTO_PADS:
        raise GraphError(f"{node.op_type} node {node.label!r}: unknown auto_pad {mode!r}")
    return mode


def make_window(node: Node, size: tuple[int, ...], kernel: tuple[int, ...], *, ceil_mode: bool = False,
                same_uses_dilation: bool = True) -> Window:
    """The geometry of a Conv or pooling node with onnxruntime's conventions.

    ``auto_pad`` SAME_*: the output is ``ceil(size / stride)`` and the total padding
    ``(out - 1)*stride + span - size`` (``span`` the dilated kernel for Conv, the plain kernel for
    pools, as onnxruntime does), split with the odd element at the end (UPPER) or begin (LOWER).
    ``ceil_mode`` rounds the output size up, dropping a last window that would start in the
    end padding.
    """
    r = len(size)
    strides = _ints(node, "strides", r, 1)
    dilations = _ints(node, "dilations", r, 1)
    pads = _ints(node, "pads", 2 * r, 0)
    mode = auto_pad_of(node)
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations) or any(k < 1 for k in kernel):
        raise GraphError(f"{node.op_type} node {node.label!r}: strides, dilations and kernel must be positive")
    ext = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pb, pe = [], []
        for n, s, k, e in zip(size, strides, kernel, ext):
            target = -(-n // s)
            total = max(0, (target - 1) * s + (e if same_uses_dilation else k) - n)
            head = total // 2 if mode == "SAME_UPPER" else total - total // 2
            pb.append(head)
            pe.append(total - head)
    elif mode == "VALID":
        pb, pe = [0] * r, [0] * r
    else:
        pb, pe = list(pads[:r]), list(pads[r:])
    out = []
    for i in range(r):
        span = size[i] + pb[i] + pe[i] - ext[i]
        o = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (o - 1) * strides[i] >= size[i] + pb[i]:
            o -= 1
        if o < 1:
            raise ShapeError(
                f"{node.op_type} node {node.label!r}: window {kernel} (dilations {list(dilations)}) does not fit "
                f"input {list(size)} with pads {pb + pe}"
            )
        out.append(o)
    return Window(tuple(size), tuple(kernel), strides, dilations, tuple(pb), tuple(pe), tuple(out))


# -- IR helpers ------------------------------------------------------------------------------

def affine(k: KernelBuilder, terms: list[Term], const: int = 0) -> ir.Value:
    """``sum(c * v) + const`` as nsw i64 arithmetic (``v`` an IR value or a Python int)."""
    acc: ir.Value | None = None
    for c, v in terms:
        if isinstance(v, int):
            const += c * v
            continue
        if c == 0:
            continue
        t = v if c == 1 else k.b.mul(v, k.i64(c), flags=["nsw"])
        acc = t if acc is None else k.b.add(acc, t, flags=["nsw"])
    if acc is None:
        return k.i64(const)
    return k.b.add(acc, k.i64(const), flags=["nsw"]) if const else acc


@contextmanager
def nest(k: KernelBuilder, extents: Sequence[int | tuple[int, int]], names: Sequence[str],
         parallel: int = 0) -> Iterator[list[ir.Value | int]]:
    """``k.loops`` without the loops of a single iteration: their counter is the Python int.

    LLVM's canonicalization turns a one-trip loop into a boolean phi whose trip count SCEV cannot
    compute, which makes Polly reject the whole nest; an int index folds into the subscript.
    """
    spans = [(0, e) if isinstance(e, int) else tuple(e) for e in extents]
    kept = [i for i, (lo, hi) in enumerate(spans) if hi - lo != 1]
    with k.loops([spans[i] for i in kept], names=[names[i] for i in kept], parallel=sum(1 for i in kept if i < parallel)) as ivs:
        out: list[ir.Value | int] = [lo for lo, _ in spans]
        for i, iv in zip(kept, ivs):
            out[i] = iv
        yield out


def copy_parallel(extents: Sequence[int | tuple[int, int]]) -> int:
    """How many leading (batch, channel) dims of an elementwise copy/fill nest over
    ``extents`` run in parallel: both when the nest has enough elements to pay for a parallel
    region (:data:`polyml.kernels._scalar.PARALLEL_MIN_ELEMENTS`), else none."""
    size = math.prod((e if isinstance(e, int) else e[1] - e[0]) for e in extents)
    return 2 if size >= PARALLEL_MIN_ELEMENTS else 0


def view(k: KernelBuilder, buf: Buffer, shape: tuple[int, ...], name: str) -> Buffer:
    """The same memory seen with another shape of equal size (row-major order is unchanged)."""
    tt = TensorType(tuple(shape), buf.type.dtype)
    assert tt.size == buf.type.size, (shape, buf.shape)
    return Buffer(k, k.b.bitcast(buf.ptr, pointer_type(tt)), tt, name)


def padded_source(k: KernelBuilder, x: Buffer, win: Window, temp: Buffer | None, fill: float) -> tuple[Buffer, list[int]]:
    """The buffer to read windows from and the shift to add to padded positions.

    With ``temp`` (shape ``win.padded_shape``): ``temp = fill`` on the border slabs of each
    spatial dim, then ``temp[n, c, p + pb] = x[n, c, p]`` over the input positions that land
    inside it; reads are
    ``temp[n, c, o*s + j*d]``.  Without it (no read leaves the input) reads are
    ``x[n, c, o*s + j*d - pb]``.
    """
    if temp is None:
        return x, [-pb for pb in win.pads_begin]
    lead = list(x.shape[:2])
    # the fill only covers the border: per spatial dim, the slabs before and after the copy
    for d, (pb, n, r) in enumerate(zip(win.pads_begin, win.size, win.required)):
        for slab in ((0, min(pb, r)), (min(pb + n, r), r)):
            if slab[1] > slab[0]:
                extents = [*lead, *win.required[:d], slab, *win.required[d + 1 :]]
                with nest(k, extents, names=[f"z{i}" for i in range(temp.rank)], parallel=copy_parallel(extents)) as ix:
                    temp.store(ix, constant(temp.type.dtype, fill))
    ranges = [(max(0, -pb), min(n, r - pb)) for pb, n, r in zip(win.pads_begin, win.size, win.required)]
    with nest(k, [*lead, *ranges], names=["pn", "pc", *[f"p{d}" for d in range(win.rank)]],
              parallel=copy_parallel([*lead, *ranges])) as ix:
        dst = [*ix[:2], *[affine(k, [(1, i)], pb) for i, pb in zip(ix[2:], win.pads_begin)]]
        temp.store(dst, x.load(ix))
    return temp, [0] * win.rank


def conv_window(node: Node, x: TensorType, w: TensorType) -> Window:
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        raise ShapeError(f"Conv node {node.label!r}: input {x.shape} and weight {w.shape} must both be N-C-spatial")
    kernel = tuple(w.shape[2:])
    ks = node.attrs.get("kernel_shape")
    if ks and tuple(int(v) for v in ks) != kernel:
        raise ShapeError(f"Conv node {node.label!r}: kernel_shape {list(ks)} but the weight is {w.shape}")
    return make_window(node, tuple(x.shape[2:]), kernel)


def register_epilogue(bias_at: int | None, chain: list[Node] | None, extras: list) -> packed.RegisterEpilogue | None:
    """The GEMM epilogue in the form its micro-kernels apply in registers: a bias and a chain
    (possibly empty) of ReLUs and Clips with constant bounds, each reading the one before, with
    no inputs of its own (None otherwise: the epilogue pass)."""
    if extras or (bias_at is None and not chain):
        return None
    steps = []
    for prev, n in zip([None, *(chain or [])], chain or []):
        if prev is not None and n.inputs[:1] != prev.outputs[:1]:
            return None
        if n.op_type == "Relu":
            steps.append(("relu", None, None))
        elif n.op_type == "Clip" and not any(n.inputs[1:]):
            lo, hi = n.attrs.get("min"), n.attrs.get("max")
            steps.append(("clip", None if lo is None else float(lo), None if hi is None else float(hi)))
        else:
            return None
    return packed.RegisterEpilogue(-1 if bias_at is None else bias_at, tuple(steps))
