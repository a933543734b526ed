"""The convolution family: ONNX Conv (one image, one group, two spatial dimensions) as a plain
nest, and its schedule — the GEMM's (:func:`polyml.schedule.gemm.blis`) seen through im2col.

The nest (:func:`nest`) is the convolution as written::

    Z[m, oh, ow]:             Y[m, OW·oh + ow] = 0
    S[m, oh, ow, c, kh, kw]:  Y[m, OW·oh + ow] += W[m, c, kh, kw] · X[c, sh·oh + dh·kh - ph, sw·ow + dw·kw - pw]
    E[m, oh, ow]:             Y[m, OW·oh + ow] = chain(Y[m, OW·oh + ow] + bias[m], R0.., ...)

``X`` is zero-padded (:attr:`polyml.schedule.nest.Array.padding`: S reads 0 where the window
leaves the input); ``E`` (with a bias or a fused elementwise chain) is the finishing statement.

Its GEMM view (:data:`View` rows, and S's :attr:`~polyml.schedule.nest.Statement.view`) is
``i = m``, ``j = OW·oh + ow``, ``k = KH·KW·c + KW·kh + kw``: output channels × output
positions × (input channels, taps).  The schedule (:func:`schedule`) lays the weights out at
compile time as the GEMM's constant A (:func:`polyml.schedule.tree.pack_constant`), packs the
im2col matrix ``B[k, j] = X[...]`` — a virtual operand whose elements repeat the input's —
block by block into ``nr``-wide panels (:func:`polyml.schedule.tree.pack` with a view; each
panel's copy tensorized onto ``im2col.f32.<nr>``, which gathers it through a table of source
offsets; a 1x1 unstrided window's copy is plain), and blocks, orders, threads and tensorizes as
the GEMM does, E fused into each register tile after its last reduction block.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import islpy as isl
import llvmlite.ir as ir

from polyml.codegen.builder import F32
from polyml.schedule import codegen
from polyml.schedule import tree as T
from polyml.schedule.gemm import PARAMS, Plan, View, blis, pack_panels
from polyml.schedule.intrinsics import Im2colPanel
from polyml.schedule.nest import Access, Array, Nest, Program, Statement


@dataclass(frozen=True)
class Shape:
    """One image's convolution: ``filters`` output channels over ``channels`` input channels,
    ``size`` → ``out`` (height, width) through ``kernel`` at ``strides``/``dilations`` with
    ``pads`` before."""

    channels: int
    filters: int
    size: tuple[int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]
    out: tuple[int, int]

    @property
    def taps(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def m(self) -> int:
        return self.filters

    @property
    def n(self) -> int:
        return self.out[0] * self.out[1]

    @property
    def k(self) -> int:
        return self.channels * self.taps

    @property
    def pointwise(self) -> bool:
        """A 1x1 unstrided window inside the input: its im2col matrix is X itself."""
        return self.kernel == (1, 1) and self.strides == (1, 1) and self.pads == (0, 0) and self.out == self.size

    @property
    def sizes(self) -> dict[str, int]:
        return {"M": self.m, "N": self.n, "K": self.k}

    def _exprs(self) -> tuple[str, str, str]:
        """The GEMM view of S's index ``[m, oh, ow, c, kh, kw]``: ``(i, j, k)``."""
        return "m", f"{self.out[1]}*oh + ow", f"{self.taps}*c + {self.kernel[1]}*kh + kw"

    def view(self) -> View:
        i, j, k = self._exprs()
        return View((("S", "[m, oh, ow, c, kh, kw]", i, j, k), ("E", "[m, oh, ow]", i, j, "K - 1")))

    def x_index(self, oh: str, ow: str, kh: str, kw: str) -> str:
        """The input element of output ``(oh, ow)`` at tap ``(kh, kw)`` (outside X in the padding)."""
        if self.pointwise:
            return f"{self.out[1]}*{oh} + {ow}"
        (sh, sw), (dh, dw), (ph, pw) = self.strides, self.dilations, self.pads
        return f"{sh}*{oh} + {dh}*{kh} - {ph}, {sw}*{ow} + {dw}*{kw} - {pw}"

    def im2col(self, nr: int) -> Im2colPanel:
        """The copy intrinsic of this convolution's ``nr``-wide im2col panels."""
        return Im2colPanel(self.size, self.kernel, self.out[1], self.n, self.strides, self.dilations, self.pads, nr)


def _zero(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    b.store(ir.Constant(F32, 0.0), ptrs[0])


def _update(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    y, w, x = ptrs
    b.store(b.fadd(b.load(y), b.fmul(b.load(w), b.load(x))), y)


def add_bias(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    """E's body with a bias and no chain: ``y += bias[m]``."""
    b.store(b.fadd(b.load(ptrs[0]), b.load(ptrs[1])), ptrs[0])


#: how E reads a fused chain's operand: one value per output channel, per output element, or one
EXTRA_INDEX = {"channel": ("[m]", ("M",)), "element": ("[m, {j}]", ("M", "N")), "scalar": ("[0]", (1,))}


def nest(shape: Shape, bias: bool = False, extras: tuple[str, ...] = (), chain: bool = False) -> Nest:
    """The convolution of ``shape`` as its plain nest (see the module docstring).  ``bias``:
    E adds ``bias[m]``; ``extras``: E reads one more operand ``R<t>`` each (a fused chain's
    inputs, :data:`EXTRA_INDEX`: ``channel``, ``element`` or ``scalar``); ``chain``: E applies
    a fused chain (its body is bound when emitting).  No E without any of them."""
    (oh_, ow_), (kh_, kw_) = shape.out, shape.kernel
    c = shape.channels
    x_shape = (c, shape.n) if shape.pointwise else (c, *shape.size)
    out = f"Y[m, {ow_}*oh + ow]"
    arrays = [Array("X", x_shape, padding=None if shape.pointwise else 0.0),
              Array("W", (shape.m, c, kh_, kw_)), Array("Y", (shape.m, shape.n))]
    plane = f"0 <= m < M and 0 <= oh < {oh_} and 0 <= ow < {ow_}"
    window = f"{plane} and 0 <= c < {c} and 0 <= kh < {kh_} and 0 <= kw < {kw_}"
    i, j, k = shape._exprs()
    stmts = [
        Statement("Z", f"{PARAMS} -> {{ Z[m, oh, ow] : {plane} }}",
                  (Access("Y", f"{PARAMS} -> {{ Z[m, oh, ow] -> {out} }}", "write"),), _zero),
        Statement("S", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] : {window} }}",
                  (Access("Y", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> {out} }}", "update"),
                   Access("W", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> W[m, c, kh, kw] }}"),
                   Access("X", f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> X[c, {shape.x_index('oh', 'ow', 'kh', 'kw')}] }}")),
                  _update, view=f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> [{i}, {j}, {k}] }}")]
    if bias or extras or chain:
        accesses = [Access("Y", f"{PARAMS} -> {{ E[m, oh, ow] -> {out} }}", "update")]
        if bias:
            arrays.append(Array("Cb", (shape.m,)))
            accesses.append(Access("Cb", f"{PARAMS} -> {{ E[m, oh, ow] -> Cb[m] }}"))
        for t, kind in enumerate(extras):
            at, dims = EXTRA_INDEX[kind]
            arrays.append(Array(f"R{t}", tuple(shape.sizes.get(d, d) for d in dims)))
            accesses.append(Access(f"R{t}", f"{PARAMS} -> {{ E[m, oh, ow] -> R{t}{at.format(j=j)} }}"))
        stmts.append(Statement("E", f"{PARAMS} -> {{ E[m, oh, ow] : {plane} }}", tuple(accesses),
                               add_bias if bias else _keep))
    ctx = f"{PARAMS} -> {{ : M = {shape.m} and N = {shape.n} and K = {shape.k} }}"
    return Nest("conv", ("M", "N", "K"), tuple(arrays), tuple(stmts), context=ctx)


def _keep(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001, ARG001
    """E's body where only the kernel's chain (bound at emission) changes Y."""


def schedule(p: Plan, shape: Shape, program: Program, copy_intrinsic: bool = True,
             finish_in_registers: bool = False) -> Program:
    """The GEMM's BLIS schedule of the convolution ``program`` (:func:`nest` of ``shape``)
    for the sizes of ``p`` (a plan with a constant A, reduction blocks of whole channels);
    ``copy_intrinsic`` False: the im2col panels copied by the loops isl generates for the copy
    statement (reading the padded input element by element) rather than by the intrinsic;
    ``finish_in_registers``: E folded into the FMA intrinsic (a bias and ReLU/Clip applied to
    the tile's registers: :func:`polyml.schedule.gemm.blis`)."""
    program = T.fold_init(program, "Z")
    i, j, k = shape._exprs()
    program = T.pack_constant(program, "S", "W", Array("Ac", (p.a_floats,)), p.a_layout("W[m, c, kh, kw]", i, k))
    taps, kw_, ow_ = shape.taps, shape.kernel[1], shape.out[1]
    view = f"{PARAMS} -> {{ S[m, oh, ow, c, kh, kw] -> B[{k}, {j}] }}"
    if shape.pointwise:
        source = f"{PARAMS} -> {{ B[k, j] -> X[k, j] }}"
    else:
        at = shape.x_index(f"floor(j/{ow_})", f"(j mod {ow_})", f"floor((k mod {taps})/{kw_})", f"(k mod {kw_})")
        source = f"{PARAMS} -> {{ B[k, j] -> X[floor(k/{taps}), {at}] }}"
    copy_mark = "" if shape.pointwise or not copy_intrinsic else T.tensorize_text(shape.im2col(p.blk.nr).name, "Pack_Bp")

    def pack_b(program: Program, node: isl.ScheduleNode, by_rows: bool) -> tuple[Program, isl.ScheduleNode]:
        return pack_panels(program, node, "X", "Bp", 3, "e1", "e0", p.blk.nr, "N",
                           "e1 - p1" if by_rows else "e1 - p0 - p1", "p2", 0, p, unroll=1, view=view, source=source,
                           copy_mark=copy_mark, by_rows=shape.pointwise)

    return blis(program, p, shape.view(), pack_b, None, finish_in_registers)


@functools.lru_cache(maxsize=64)
def built(p: Plan, shape: Shape, bias: bool = False, extras: tuple[str, ...] = (), chain: bool = False,
          finish_in_registers: bool = False) -> tuple[Program, object]:
    """The scheduled program of :func:`nest` and its AST, once per distinct convolution (a
    CNN repeats a few shapes; E's body is bound per node when emitting)."""
    program = schedule(p, shape, Program.of(nest(shape, bias, extras, chain)), finish_in_registers=finish_in_registers)
    return program, codegen.ast_of(program, shape.sizes)
