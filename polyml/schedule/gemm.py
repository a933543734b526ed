"""The GEMM family: ``C = A · B`` as a plain nest, and the schedule that makes it fast.

The nest (:func:`nest`) is what ONNX means: ``Z[i, j]: C[i, j] = 0`` then
``S[i, j, k]: C[i, j] += A[i, k] · B[k, j]`` over ``M × N × K`` (isl parameters).

The schedule (:func:`schedule`) is BLIS's loop nest, written as transforms of that nest in the
way Polly's MatMul optimizer builds it: S's band ``(i, j, k)`` is strip-mined into thread
shares, cache blocks ``mc × nc × kc`` and register tiles ``mr × nr`` and permuted to
``(share, jc, pc, ic, jr, ir | i, j, k)``; B's ``kc × nc`` block is packed into ``nr``-wide
panels before the ``ic`` loop and A's ``mc × kc`` block into ``mr``-high panels before the
register tiles (per-thread buffers); the share loop is marked ``parallel``; the register tile
is tensorized onto ``fma.f32.<mr>x<nr>`` with Z folded into its first reduction step.  Sizes
come from the host's cache model (:func:`polyml.codegen.gemm.host_blocking`, ``block_kc``,
``block_nc``, ``split``).
"""

from __future__ import annotations

from dataclasses import dataclass

import islpy as isl
import llvmlite.ir as ir

from polyml.codegen import gemm as packed
from polyml.codegen.builder import F32
from polyml.schedule import legality
from polyml.schedule import tree as T
from polyml.schedule.intrinsics import FmaTile
from polyml.schedule.nest import Access, Array, Nest, Program, Statement

PARAMS = "[M, N, K]"


def _zero(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    b.store(ir.Constant(F32, 0.0), ptrs[0])


def _update(b: ir.IRBuilder, ptrs) -> None:  # noqa: ANN001
    c, a, bb = ptrs
    b.store(b.fadd(b.load(c), b.fmul(b.load(a), b.load(bb))), c)


def nest() -> Nest:
    """``C (M×N) = A (M×K) · B (K×N)``, row-major, sizes as parameters."""
    return Nest(
        "gemm", ("M", "N", "K"),
        (Array("A", ("M", "K")), Array("B", ("K", "N")), Array("C", ("M", "N"))),
        (Statement("Z", f"{PARAMS} -> {{ Z[i, j] : 0 <= i < M and 0 <= j < N }}",
                   (Access("C", f"{PARAMS} -> {{ Z[i, j] -> C[i, j] }}", "write"),), _zero),
         Statement("S", f"{PARAMS} -> {{ S[i, j, k] : 0 <= i < M and 0 <= j < N and 0 <= k < K }}",
                   (Access("C", f"{PARAMS} -> {{ S[i, j, k] -> C[i, j] }}", "update"),
                    Access("A", f"{PARAMS} -> {{ S[i, j, k] -> A[i, k] }}"),
                    Access("B", f"{PARAMS} -> {{ S[i, j, k] -> B[k, j] }}")), _update)),
        context=f"{PARAMS} -> {{ : M > 0 and N > 0 and K > 0 }}",
    )


@dataclass(frozen=True)
class Plan:
    """The sizes of one product's schedule: register tile, cache blocks, thread shares."""

    blk: packed.Blocking
    kc: int
    nc: int
    split: str  # "m": shares of rows, "n": of columns
    share: int
    parts: int
    #: the register tiles row panel by row panel (``ir`` outside ``jr``: :func:`polyml.codegen.gemm.rows_outer`)
    rows_outer: bool = False

    @property
    def thread_floats(self) -> int:
        """One thread's packing buffers: ``[A block mc·kc][B block kc·nc]``."""
        return self.blk.mc * self.kc + self.kc * self.nc

    @property
    def scratch_floats(self) -> int:
        return self.parts * self.thread_floats


def plan(m: int, n: int, k: int, blk: packed.Blocking, parts: int) -> Plan:
    spec = packed.GemmSpec(m, n, k, packed.matrix_loader(0, k), packed.matrix_loader(1, n), 2)
    dim, share = packed.split(spec, blk, parts)
    kc = min(packed.block_kc(spec, blk), k)
    nc = min(packed.block_nc(spec, blk), _round_up(share if dim == "n" else n, blk.nr))
    total = m if dim == "m" else n
    count = -(-total // share)
    return Plan(blk, kc, nc, dim, share, count, packed.rows_outer(spec, blk))


def _round_up(x: int, q: int) -> int:
    return -(-x // q) * q


def _band_node(tree: isl.Schedule, statement: str) -> isl.ScheduleNode:
    """The band that schedules ``statement`` (below the sequence filter that selects it)."""
    node = tree.get_root().child(0)
    while node.get_type() != isl.schedule_node_type.band:
        if node.get_type() == isl.schedule_node_type.sequence:
            for c in range(node.n_children()):
                if any(s.get_tuple_name() == statement for s in _sets(node.child(c).filter_get_filter())):
                    node = node.child(c).child(0)
                    break
        else:
            node = node.child(0)
    return node


def _sets(us: isl.UnionSet) -> list[isl.Set]:
    out: list[isl.Set] = []
    us.foreach_set(out.append)
    return out


def schedule(p: Plan, program: Program | None = None) -> Program:
    """The BLIS schedule of :func:`nest` for the sizes of ``p`` (see the module docstring)."""
    program = T.fold_init(program or Program.of(nest()), "Z")
    blk = p.blk
    mr, nr, mc, kc, nc, sh = blk.mr, blk.nr, blk.mc, p.kc, p.nc, p.share
    node = _band_node(program.tree, "S")
    i, j, k = T.members(node)
    by_rows = p.split == "m"
    share, i_s, j_s = (T.origin(i, sh), T.offset(i, sh), j) if by_rows else (T.origin(j, sh), i, T.offset(j, sh))
    i_c, i_m = T.origin(i_s, mc), T.offset(i_s, mc)
    i_r, i_p = T.origin(i_m, mr), T.offset(i_m, mr)
    j_c, j_n = T.origin(j_s, nc), T.offset(j_s, nc)
    j_r, j_p = T.origin(j_n, nr), T.offset(j_n, nr)
    k_c, k_p = T.origin(k, kc), T.offset(k, kc)
    tiles = [i_r, j_r] if p.rows_outer else [j_r, i_r]
    node = T.with_members(node, [share, j_c, k_c, i_c, *tiles, i_p, j_p, k_p])
    if not legality.is_legal(node.get_schedule(), legality.dependences(program.nest)):
        raise ValueError(f"GEMM schedule for {p}: the blocked band violates the nest's dependences")
    node = T.split(node, [1, 2, 1, 2, 3])
    if p.parts > 1:
        node = T.mark(node, "parallel").child(0)
    # per-thread buffers: thread t's at t · thread_floats, A's block first, then B's
    per = p.thread_floats
    a_at, b_at = 0, blk.mc * kc
    t_of = f"floor(p0/{sh})*{per}"
    node = node.child(0).child(0)  # the ic band, below (share) and (jc, pc)
    j_rel = "e1 - p1" if by_rows else "e1 - p0 - p1"
    b_layout = (f"{PARAMS} -> {{ Pack_Bp[p0, p1, p2, e0, e1] -> Bp[{t_of} + {b_at} + floor(({j_rel})/{nr})*{kc * nr}"
                f" + (e0 - p2)*{nr} + ({j_rel}) mod {nr}] }}")
    program, node = T.pack(
        program, node, "S", "B", Array("Bp", (p.parts * per,)), b_layout,
        pad=f"{PARAMS} -> {{ B[k, j] -> B[k, j2] : floor(j2/{nr}) = floor(j/{nr}) }}",
        clamp=(f"{PARAMS} -> {{ Pack_Bp[p0, p1, p2, e0, e1] -> B[e0, e1] : e1 < N; "
               f"Pack_Bp[p0, p1, p2, e0, e1] -> B[e0, N - 1] : e1 >= N }}"),
        order=(f"floor(e1/{nr})", "e0", f"e1 mod {nr}"))
    node = node.child(0)  # the register tiles' band, below ic
    i_rel = "e0 - p0 - p3" if by_rows else "e0 - p3"
    a_layout = (f"{PARAMS} -> {{ Pack_Ap[p0, p1, p2, p3, e0, e1] -> Ap[{t_of} + {a_at} + floor(({i_rel})/{mr})*{kc * mr}"
                f" + (e1 - p2)*{mr} + ({i_rel}) mod {mr}] }}")
    program, node = T.pack(
        program, node, "S", "A", Array("Ap", (p.parts * per,)), a_layout,
        pad=f"{PARAMS} -> {{ A[i, k] -> A[i2, k] : floor(i2/{mr}) = floor(i/{mr}) }}",
        clamp=(f"{PARAMS} -> {{ Pack_Ap[p0, p1, p2, p3, e0, e1] -> A[e0, e1] : e0 < M; "
               f"Pack_Ap[p0, p1, p2, p3, e0, e1] -> A[M - 1, e1] : e0 >= M }}"),
        order=(f"floor(e0/{mr})", "e1", f"e0 mod {mr}"), unroll=1)
    node = T.mark(node.child(0), T.tensorize_text(FmaTile(blk).name, "S", init="Z"))
    return Program(program.nest, node.get_schedule())
