"""Named intrinsics that a ``tensorize`` mark lowers its register tile onto.

An intrinsic states the computation it performs on a tile (as a statement's accesses must
read) and emits it on an :class:`~polyml.schedule.codegen.Emitter` from the tile's bounds and
its operands' addresses (:class:`~polyml.schedule.codegen.TileBox`).

* ``fma.f32.<mr>x<nr>`` (:class:`FmaTile`): ``C[i, j] += Σ_k A[i, k] · B[k, j]`` on an
  ``mr × nr`` tile with ``A`` in an ``mr``-high packed panel (element ``(i0 + r, k0 + p)`` at
  ``p·mr + r``), ``B`` in an ``nr``-wide one (``(k0 + p, j0 + c)`` at ``p·nr + c``) and ``C``
  row-major: the vector micro-kernel of :func:`polyml.codegen.gemm.micro_kernel`
  (``mr · nr / w`` accumulators in registers, one ``llvm.fma`` each per step).  With the sizes
  known, the partial row panel's whole-width tiles run a kernel of ``M mod mr`` rows straight
  into ``C`` and the last column panel's tiles a narrower kernel; other partial tiles run the
  whole kernel into a stack tile and add its ``rows × cols`` part into ``C``.
* ``im2col.f32.<nr>`` (:class:`Im2colPanel`), a copy intrinsic: one ``nr``-wide panel of a
  convolution's im2col matrix, ``Bp[p·nr + c] = X[..]`` for rows ``k0 + p`` (whole input
  channels) and columns ``j0 + c``, zero where the window leaves the input — the copy statement
  of :func:`polyml.schedule.tree.pack` with a view, gathered through a table of source offsets
  (:func:`polyml.codegen.gemm.im2col_packer`).
* ``rows.f32.<w>x32`` (:class:`RowsTile`): a convolution's unit of the rows form, 32 output
  channels × one or two output rows of ``w`` positions × the whole reduction, the positions as
  the register tile's rows (:mod:`polyml.codegen.gemm_rows`' micro-kernel: the source read in
  place through a table of reduction-row offsets, the weights in 32-channel panels), transposed
  in registers and stored through the folded finishing statement's work.
* ``dw.f32.<L>`` (:class:`DepthwiseTile`): a depthwise convolution's plane (row by row, or
  ``.flat`` along the plane on its copy's pitch), one vector of outputs per step from all the
  taps read at constant offsets in the plane's phase-split copy (:mod:`polyml.codegen.depthwise`).
* ``dwcopy.f32.<sh>x<sw>`` (:class:`DepthwisePhaseCopy`), a copy intrinsic: a plane's rows into
  their ``sh × sw`` stride phases, pads as zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import llvmlite.ir as ir

from polyml.codegen import depthwise, gemm_rows
from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32, I64, splat, store_lanes, vector_fma


@dataclass(frozen=True)
class FmaTile:
    """``epilogue``: what a folded finishing statement (``finish=`` on the mark) computes, a
    bias of the tile's rows (read from ``bias``, indexed by the row) and ReLU/Clip steps,
    applied to the registers after the tile's last reduction step."""

    blk: packed.Blocking
    attrs: tuple[str, ...] = ()
    epilogue: packed.RegisterEpilogue | None = None
    bias: str = ""

    @property
    def name(self) -> str:
        return f"fma.f32.{self.blk.mr}x{self.blk.nr}"

    def lower(self, em, box) -> None:  # noqa: ANN001  (Emitter, TileBox: codegen imports this module's users)
        b = em.b
        stmt = em.program.nest.statement(box.statement)
        roles = _roles(stmt)
        # the tile's (i, j, k) box: the last three dimensions (a batch index before them)
        (i0, j0, k0), (i1, j1, k1) = ([em.expr(e) for e in box.lo[-3:]], [em.expr(e) for e in box.hi[-3:]])
        one = ir.Constant(I64, 1)
        rows, cols, kc = (b.add(b.sub(h, lo), one) for lo, h in ((i0, i1), (j0, j1), (k0, k1)))
        c_acc, a_acc, b_acc = (stmt.accesses[roles[r]] for r in ("C", "A", "B"))
        c_ptr = em.address(c_acc.array, box.first[roles["C"]])
        a_ptr = em.address(a_acc.array, box.first[roles["A"]])
        b_ptr = em.address(b_acc.array, box.first[roles["B"]])
        c_shape = em.program.nest.array(c_acc.array).shape
        ldc = em.extent(c_shape[-1])
        if box.init:  # the first reduction step stores (the initialisation folded into it)
            accumulate = b.not_(em.condition(box.starts))
        else:
            accumulate = ir.Constant(ir.IntType(1), 1)
        mr, nr = self.blk.mr, self.blk.nr
        epi = self.epilogue if box.finish else None
        if box.finish and epi is None:
            raise ValueError(f"{self.name}: the mark folds {box.finish} into the tile, but no epilogue was given")
        extra: list[ir.Value] = []  # the epilogue kernels' (bias of the first row, last step)
        if epi is not None:
            last = em.condition(box.ends)
            extra = [em.address(self.bias, [box.lo[-3]]) if epi.bias >= 0 else c_ptr, last]
        ukernel = packed.micro_kernel(em.module, self.blk, list(self.attrs), epilogue=epi)
        # with the sizes known: the partial row panel's kernel (M mod mr rows, straight into C)
        # and the narrow kernels of the last column panel (N mod nr columns), as the packed
        # GEMM has them; any other partial tile runs the whole kernel into the stack tile
        m_rows, n_cols = (_known(em, extent) for extent in c_shape[-2:])
        short = packed.micro_kernel(em.module, replace(self.blk, mr=m_rows % mr), list(self.attrs), a_pitch=mr,
                                    epilogue=epi) if m_rows and m_rows % mr else None
        narrow_cols, narrow = packed.narrow_kernels(em.module, self.blk, list(self.attrs), 0, n_cols % nr) \
            if n_cols else (0, ())

        def const(v: int) -> ir.Constant:
            return ir.Constant(I64, v)

        def c_addr(i: ir.Value, j: ir.Value) -> ir.Value:
            return b.gep(c_ptr, [b.add(b.mul(i, ldc, flags=["nsw"]), j, flags=["nsw"])], inbounds=True)

        def into_tile(kernel: ir.Function) -> None:
            tile = em.stack_tile("fma.tile", mr * nr)
            no = ir.Constant(ir.IntType(1), 0)  # an epilogue kernel's epilogue waits for C (below)
            b.call(kernel, [kc, a_ptr, b_ptr, tile, const(nr), no, *([extra[0], no] if kernel is ukernel and epi else [])])
            packed.add_edge_tile(b, tile, nr, c_addr, const(0), const(0), rows, cols, b.not_(accumulate),
                                 ir.Constant(F32, 0.0), b.fadd)
            if epi is not None:  # the epilogue on the tile's part of C, element by element
                with b.if_then(extra[1]):
                    _edge_epilogue(b, epi, c_addr, extra[0] if epi.bias >= 0 else None, rows, cols)

        def edge() -> None:
            if not narrow:
                into_tile(ukernel)
                return
            with b.if_else(b.icmp_signed("<=", cols, const(narrow_cols))) as (thin, wide):
                with thin:
                    into_tile(narrow[0])
                with wide:
                    into_tile(ukernel)

        full = b.and_(b.icmp_signed("==", rows, const(mr)), b.icmp_signed("==", cols, const(nr)))
        with b.if_else(full) as (then, otherwise):
            with then:
                b.call(ukernel, [kc, a_ptr, b_ptr, c_ptr, ldc, accumulate, *extra])
            with otherwise:
                if short is None:
                    edge()
                else:
                    whole_width = b.and_(b.icmp_signed("==", rows, const(m_rows % mr)),
                                         b.icmp_signed("==", cols, const(nr)))
                    with b.if_else(whole_width) as (short_tile, other):
                        with short_tile:
                            b.call(short, [kc, a_ptr, b_ptr, c_ptr, ldc, accumulate, *extra])
                        with other:
                            edge()


def _edge_epilogue(b: ir.IRBuilder, epi: packed.RegisterEpilogue, c_addr, bias_rows: ir.Value | None,  # noqa: ANN001
                   rows: ir.Value, cols: ir.Value) -> None:
    """``epi`` on the ``rows × cols`` elements of C at ``c_addr`` (an edge tile, after its
    last reduction step), each as a one-lane vector."""
    one = ir.VectorType(F32, 1)
    zero = ir.Constant(ir.IntType(32), 0)
    with packed.for_range(b, 0, rows, name="fma.epi.r") as r:
        bias = b.load(b.gep(bias_rows, [r], inbounds=True)) if bias_rows is not None else None
        with packed.for_range(b, 0, cols, name="fma.epi.c") as c:
            at = c_addr(r, c)
            v = b.insert_element(ir.Constant(one, None), b.load(at), zero)
            b.store(b.extract_element(epi.apply(b, v, bias), zero), at)


def _known(em, extent: int | str) -> int:  # noqa: ANN001
    """An array extent's value where the build fixed it (0: a run-time parameter)."""
    if isinstance(extent, int):
        return extent
    v = em.params.get(extent)
    return int(v.constant) if isinstance(v, ir.Constant) else 0


def _roles(stmt) -> dict[str, int]:  # noqa: ANN001
    """Positions of C (the updated access) and A, B (the two reads, in that order)."""
    update = [p for p, a in enumerate(stmt.accesses) if a.mode == "update"]
    reads = [p for p, a in enumerate(stmt.accesses) if a.mode == "read"]
    if len(update) != 1 or len(reads) != 2:
        raise ValueError(f"fma tile: statement {stmt.name} is not C[i, j] += A[i, k] * B[k, j]")
    return {"C": update[0], "A": reads[0], "B": reads[1]}


@dataclass(frozen=True)
class Im2colPanel:
    """A convolution's im2col panel copy (geometry of :class:`polyml.schedule.conv.Shape`)."""

    size: tuple[int, int]
    kernel: tuple[int, int]
    out_width: int
    columns: int
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]
    nr: int

    @property
    def name(self) -> str:
        return f"im2col.f32.{self.nr}"

    def lower(self, em, box) -> None:  # noqa: ANN001  (Emitter, TileBox)
        stmt = em.program.nest.statement(box.statement)
        (dst_at, dst), (_, src) = ((p, a) for p, a in enumerate(stmt.accesses))
        if not dst.writes or not src.reads:
            raise ValueError(f"im2col: statement {stmt.name} is not a copy")
        b = em.b
        if b.block is b.function.entry_basic_block:  # the packer allocates at the entry's start
            start = b.function.append_basic_block("im2col.start")
            b.branch(start)
            b.position_at_end(start)
        k0, k1, j0 = em.expr(box.lo[-2]), em.expr(box.hi[-2]), em.expr(box.lo[-1])
        kc = b.add(b.sub(k1, k0), ir.Constant(I64, 1))
        pack = packed.im2col_packer(0, self.size, self.kernel, self.out_width, self.columns, self.strides,
                                    self.dilations, self.pads, self.nr)
        pack(b, [em.arrays[src.array]], em.address(dst.array, box.first[dst_at]), k0, kc, j0)


@dataclass(frozen=True)
class RowsTile:
    """``spec``: the convolution's rows form (:class:`polyml.codegen.gemm_rows.RowsSpec`);
    ``finish(em, b, i, j, v)``: the folded finishing statement's work on output element
    ``(i, j)`` (channel, position) of value ``v``, reading its operands from ``em.arrays``."""

    spec: gemm_rows.RowsSpec
    attrs: tuple[str, ...] = ()
    finish: Callable | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return f"rows.f32.{self.spec.width}x{gemm_rows.CHANNELS}"

    def lower(self, em, box) -> None:  # noqa: ANN001  (Emitter, TileBox)
        b, spec = em.b, self.spec
        stmt = em.program.nest.statement(box.statement)
        roles = _roles(stmt)
        c_acc, w_acc, p_acc = (stmt.accesses[roles[r]] for r in ("C", "A", "B"))
        y_ptr = em.address(c_acc.array, box.first[roles["C"]])
        bp = em.address(w_acc.array, box.first[roles["A"]])
        src_row = em.address(p_acc.array, box.first[roles["B"]])
        m0, r0 = em.expr(box.lo[0]), em.expr(box.lo[1])
        channels = b.add(b.sub(em.expr(box.hi[0]), m0), ir.Constant(I64, 1))
        rows = b.add(b.sub(em.expr(box.hi[1]), r0), ir.Constant(I64, 1))
        plane = em.extent(em.program.nest.array(c_acc.array).shape[-1])
        const = lambda v: ir.Constant(I64, v)  # noqa: E731
        attrs = list(self.attrs)
        single = gemm_rows.micro_kernel(em.module, spec, attrs)
        stacked = gemm_rows.micro_kernel(em.module, spec, attrs, spec.stack) if spec.stack > 1 else single
        positions = spec.stack * spec.width
        ch_ = gemm_rows.CHANNELS
        tile = em.stack_tile("rows.tile", positions * ch_)
        tile_t = em.stack_tile("rows.tile_t", ch_ * gemm_rows.WIDTH)  # channel-major, 16 positions each
        table = b.gep(gemm_rows.offsets_table(em.module, spec), [ir.Constant(ir.IntType(32), 0)] * 2, inbounds=True)
        j0 = b.mul(r0, const(spec.width))

        def per_tile(emit: Callable[[bool], None]) -> None:
            if spec.stack == 1:
                emit(False)
                return
            with b.if_else(b.icmp_signed("==", rows, const(spec.stack))) as (then, otherwise):
                with then:
                    emit(True)
                with otherwise:
                    emit(False)

        per_tile(lambda whole: b.call(stacked if whole else single, [const(spec.k), src_row, table, bp, tile]))
        gemm_rows.transpose_tile(b, tile, tile_t, positions)

        def store(count: int) -> None:
            with packed.for_range(b, 0, channels, name="rows.ch") as ch:
                dst = b.gep(y_ptr, [b.mul(ch, plane)], inbounds=True)
                with packed.for_range(b, 0, count, name="rows.ow") as ow:
                    v = b.load(b.gep(tile_t, [b.add(b.mul(ch, const(gemm_rows.WIDTH)), ow)], inbounds=True))
                    if box.finish and self.finish is not None:
                        v = self.finish(em, b, b.add(m0, ch), b.add(j0, ow), v)
                    b.store(v, b.gep(dst, [ow], inbounds=True))

        per_tile(lambda whole: store(positions if whole else spec.width))


@dataclass(frozen=True)
class DepthwiseTile:
    """``dw.f32.<L>`` on a depthwise convolution's S (:mod:`polyml.schedule.depthwise`): for one
    plane ``m`` and the output rows of the tile, ``Y[m, oh, ow] = Σ_{kh,kw} W[m, kh, kw] ·
    Xph[..]`` read from the plane's phase-split copy (``geometry``,
    :class:`polyml.codegen.depthwise.Geometry`), one vector of outputs per step from all the
    taps (:func:`polyml.codegen.depthwise.step`), the weights broadcast once per tile.  Row by
    row where a row holds a vector (stored from the registers, the last vector masked), else
    (``.flat``) along the plane flattened on the copy's pitch into a stack accumulator, then
    cropped.  It stores its first sums (``init=``).  With ``finish=``: the bias (``bias``, read
    at ``m``) starts the sums and ``epilogue`` (ReLU/Clip) is applied to each vector.  The
    phase copy is read with aligned vector loads: its buffer must start on a vector boundary
    (the arena aligns every buffer to 64 bytes)."""

    geometry: depthwise.Geometry
    attrs: tuple[str, ...] = ()
    epilogue: packed.RegisterEpilogue | None = None
    bias: str = ""

    @property
    def name(self) -> str:
        return f"dw.f32.{self.geometry.lanes}" + ("" if self.geometry.rowwise else ".flat")

    def lower(self, em, box) -> None:  # noqa: ANN001  (Emitter, TileBox)
        b, g = em.b, self.geometry
        stmt = em.program.nest.statement(box.statement)
        roles = _roles(stmt)  # Y updated, W and the phase copy read
        y, w, x = (em.address(stmt.accesses[roles[r]].array, box.first[roles[r]]) for r in ("C", "A", "B"))
        lanes, (kh, kw), (oh_n, ow_n) = g.lanes, g.win.kernel, g.win.out
        vec = ir.VectorType(F32, lanes)
        fma = vector_fma(em.module, lanes)
        const = lambda v: ir.Constant(I64, v)  # noqa: E731
        taps = [(i, j, g.tap_offset(i, j)) for i in range(kh) for j in range(kw)]
        weights = [splat(b, b.load(b.gep(w, [const(i * kw + j)], inbounds=True)), vec) for i, j, _ in taps]
        start = ir.Constant(vec, [0.0] * lanes)
        if box.finish and self.bias in em.arrays:
            start = splat(b, b.load(b.gep(em.arrays[self.bias], [em.expr(box.lo[0])], inbounds=True)), vec)

        def finished(s: ir.Value) -> ir.Value:
            return self.epilogue.apply(b, s, None) if box.finish and self.epilogue is not None else s

        if g.rowwise:
            rows = b.add(b.sub(em.expr(box.hi[1]), em.expr(box.lo[1])), const(1))
            with packed.for_range(b, 0, rows, name="dw.row") as r:
                x_row = b.gep(x, [b.mul(r, const(g.pitch))], inbounds=True)
                y_row = b.gep(y, [b.mul(r, const(ow_n))], inbounds=True)
                for d in range(0, g.acc_floats, lanes):
                    s = finished(depthwise.step(b, x_row, const(d), taps, weights, start, fma, vec))
                    store_lanes(b, s, b.bitcast(b.gep(y_row, [const(d)], inbounds=True), vec.as_pointer()), ow_n - d)
            return
        acc = em.stack_tile("dw.acc", g.flat)
        with packed.for_range(b, 0, g.flat, lanes, name="dw.f") as f:
            s = finished(depthwise.step(b, x, f, taps, weights, start, fma, vec))
            b.store(s, b.bitcast(b.gep(acc, [f], inbounds=True), vec.as_pointer()), align=4)
        with packed.for_range(b, 0, oh_n, name="dw.oh") as oh:
            with packed.for_range(b, 0, ow_n, name="dw.ow") as ow:
                v = b.load(b.gep(acc, [b.add(b.mul(oh, const(g.pitch)), ow)], inbounds=True))
                b.store(v, b.gep(y, [b.add(b.mul(oh, const(ow_n)), ow)], inbounds=True))


@dataclass(frozen=True)
class DepthwisePhaseCopy:
    """``dwcopy.f32.<sh>x<sw>``, a copy intrinsic: one plane's rows ``[r0, r1]`` (padded
    columns all) of the copy statement ``Pack_Xph[.., m, r, q]`` of :mod:`polyml.schedule.depthwise`,
    ``Xph[phase(r, q)] = X[m, r, q]`` (0 in the padding), written row by row into the ``sh × sw``
    phase planes: an input row by :func:`polyml.codegen.depthwise.copy_row` (whole vectors split
    into the column phases by shuffles), its pad columns and the pad rows as zeros."""

    geometry: depthwise.Geometry

    @property
    def name(self) -> str:
        return f"dwcopy.f32.{self.geometry.phases[0]}x{self.geometry.phases[1]}"

    def lower(self, em, box) -> None:  # noqa: ANN001  (Emitter, TileBox)
        b, g = em.b, self.geometry
        win = g.win
        (sh, sw), (ph, pw), (h, wd) = g.phases, win.pads_begin, win.size
        stmt = em.program.nest.statement(box.statement)
        dst_at = next(i for i, a in enumerate(stmt.accesses) if a.writes)
        const = lambda v: ir.Constant(I64, v)  # noqa: E731
        m, r0, q0 = (em.expr(e) for e in box.lo[-3:])
        r1 = em.expr(box.hi[-2])
        # the plane's copy starts where the layout puts padded (0, 0): the corner's address less its offset
        pr0, pq0 = b.add(r0, const(ph)), b.add(q0, const(pw))
        plane_rows = g.rows * g.pitch
        corner = b.add(b.add(b.mul(b.add(b.mul(b.srem(pr0, const(sh)), const(sw)), b.srem(pq0, const(sw))),
                                   const(plane_rows)), b.mul(b.sdiv(pr0, const(sh)), const(g.pitch))),
                       b.sdiv(pq0, const(sw)))
        work = b.gep(em.address(stmt.accesses[dst_at].array, box.first[dst_at]), [b.neg(corner)], inbounds=True)
        src = b.gep(em.arrays[stmt.accesses[1 - dst_at].array], [b.mul(m, const(h * wd))], inbounds=True)
        zero = ir.Constant(F32, 0.0)
        columns = [depthwise.phase_range(pc, sw, pw, wd, win.required[1]) for pc in range(sw)]
        widths = [-(-(win.required[1] - pc) // sw) for pc in range(sw)]

        def phase_row(pr: int, pc: int, i: ir.Value) -> ir.Value:
            return b.gep(work, [b.add(b.mul(i, const(g.pitch)), const((pr * sw + pc) * plane_rows))], inbounds=True)

        for pr in range(sh):
            i0, i1 = depthwise.phase_range(pr, sh, ph, h, win.required[0])
            lo = b.sdiv(b.add(pr0, const(sh - 1 - pr)), const(sh))
            hi = b.sdiv(b.add(b.add(r1, const(ph)), const(sh - pr)), const(sh))
            with packed.for_range(b, lo, hi, name="dwcopy.i") as i:
                inside = b.and_(b.icmp_signed(">=", i, const(i0)), b.icmp_signed("<", i, const(i1)))
                with b.if_else(inside) as (then, otherwise):
                    with then:  # an input row: its columns, then its pad columns' zeros
                        depthwise.copy_row(b, g, src, work, pr, i)
                        for pc, ((a, z), width) in enumerate(zip(columns, widths)):
                            row = phase_row(pr, pc, i)
                            for j in [*range(0, a), *range(max(z, a), width)]:
                                b.store(zero, b.gep(row, [const(j)], inbounds=True))
                    with otherwise:  # a pad row
                        for pc, width in enumerate(widths):
                            row = phase_row(pr, pc, i)
                            with packed.for_range(b, 0, width, name="dwcopy.z") as j:
                                b.store(zero, b.gep(row, [j], inbounds=True))
