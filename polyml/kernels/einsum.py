"""Einsum: one- and two-operand Einstein sums, two-operand contractions on the packed GEMM.

Polyhedral view.  Every label of the equation is a dimension of one iteration domain (its
extent from the operands; "..." stands for numpy-broadcast, right-aligned dimensions; a label
of extent 1 in one operand is broadcast).  Each operand access is an affine map from the
domain to the operand's array: a repeated label (``ii``) adds the strides of its dims, so a
diagonal is a strided access like any other.  The output keeps the labels of the right-hand
side (or, implicitly, ``...`` then the letters used once, sorted); the others are summed.

Two operands L and R form a batched matrix product when every label of extent > 1 is of one
of four kinds: *batch* (in L, R and the output), *m* (L and the output), *n* (R and the
output) or *k* (L and R, summed).  Per batch index, L is then an M×K matrix, R a K×N one and
the output an M×N one, each read with two strides once each kind's labels are flattened
(possible where they are adjacent and in the same order in the operand; else the operand is
first copied into a row-major ``[batch, rows, cols]`` scratch, the only data movement).  The
products run through :func:`polyml.kernels.matmul.packed_product` (one product) or
:func:`~polyml.kernels.matmul.batched_product` (batch indices over the threads), whose packing
reads the strided operands in place: ``bhid,bhjd->bhij`` packs K transposed, Keras's
``abcd,aecd->acbe`` reads both operands with row stride ``heads·dh`` and no copy.  The plan
(including computing ``Cᵀ = Rᵀ·Lᵀ`` instead) is chosen for the fewest copied elements.

Everything else, and products too small for the packed GEMM or lowered without it (GPU, SCoP
tools, ``--gemm polly``), is one nest over all labels: ``out = -0.0``, then ``out[o] +=
Π operands`` (one operand: a transpose, diagonal, trace or reduction in the operand's order).
Three or more operands are refused (a nest over all their labels multiplies the extents of
what pairwise contractions keep apart).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import llvmlite.ir as ir

from polyml.codegen import gemm as packed
from polyml.codegen.builder import REASSOC, Buffer, KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.kernels import Kernel, Operand, register
from polyml.kernels.matmul import (
    a_in_place,
    batched_plan,
    batched_product,
    batched_temps,
    packed_plan,
    packed_product,
    packed_temps,
    prefer_wide_vectors,
    view,
)
from polyml.options import CodegenConfig

ELLIPSIS = "."  # ellipsis dimension j (right-aligned over all operands) is the label ".j"


@dataclass(frozen=True)
class Equation:
    """The parsed equation: one label per dimension of each input and of the output."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    extents: dict[str, int]

    @property
    def summed(self) -> tuple[str, ...]:
        seen = dict.fromkeys(lab for term in self.inputs for lab in term)
        return tuple(lab for lab in seen if lab not in self.output)


def _letters(node: Node, term: str) -> tuple[list[str], int | None]:
    """The letters of one term and the position of its "..." (None if absent)."""
    where = None
    if term.count("...") > 1:
        raise GraphError(f"Einsum node {node.label!r}: more than one '...' in {term!r}")
    if "..." in term:
        where = term.index("...")
        term = term.replace("...", "", 1)
    bad = [c for c in term if not ("a" <= c <= "z" or "A" <= c <= "Z")]
    if bad:
        raise GraphError(f"Einsum node {node.label!r}: subscripts must be letters or '...', got {bad[0]!r} in {term!r}")
    return list(term), where


def parse(node: Node, shapes: Sequence[tuple[int, ...]]) -> Equation:
    """Labels per dimension, output labels (explicit or implicit) and label extents; a
    GraphError/ShapeError names the node where the equation does not fit the operands."""
    eq = "".join(str(node.attrs.get("equation", "")).split())
    lhs, arrow, rhs = eq.partition("->")
    if "->" in rhs:
        raise GraphError(f"Einsum node {node.label!r}: more than one '->' in {eq!r}")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise GraphError(f"Einsum node {node.label!r}: equation {eq!r} has {len(terms)} operand terms for {len(shapes)} inputs")
    parsed = [_letters(node, t) for t in terms]
    ell = 0
    for term, (letters, where), shape in zip(terms, parsed, shapes):
        extra = len(shape) - len(letters)
        if extra < 0 or (where is None and extra):
            raise ShapeError(f"Einsum node {node.label!r}: term {term!r} does not match an operand of rank {len(shape)}")
        ell = max(ell, extra)
    inputs = []
    for (letters, where), shape in zip(parsed, shapes):
        if where is None:
            inputs.append(tuple(letters))
        else:
            e = len(shape) - len(letters)
            inputs.append((*letters[:where], *(f"{ELLIPSIS}{j}" for j in range(ell - e, ell)), *letters[where:]))
    dots = tuple(f"{ELLIPSIS}{j}" for j in range(ell))
    if arrow:
        letters, where = _letters(node, rhs)
        if len(set(letters)) != len(letters):
            raise GraphError(f"Einsum node {node.label!r}: output subscripts {rhs!r} repeat a label")
        if where is None and ell and any(where_ is not None for _, where_ in parsed):
            raise GraphError(f"Einsum node {node.label!r}: inputs have '...' but the output {rhs!r} has none")
        output = tuple(letters) if where is None else (*letters[:where], *dots, *letters[where:])
    else:
        counts: dict[str, int] = {}
        for letters, _ in parsed:
            for c in letters:
                counts[c] = counts.get(c, 0) + 1
        output = (*dots, *sorted(c for c, n in counts.items() if n == 1))
    extents: dict[str, int] = {}
    for labels, shape in zip(inputs, shapes):
        for lab, d in zip(labels, shape):
            old = extents.get(lab, 1)
            if d != 1 and old != 1 and d != old:
                raise ShapeError(f"Einsum node {node.label!r}: label {lab!r} has extents {old} and {d} in {eq!r} "
                                 f"(shapes {[tuple(s) for s in shapes]})")
            extents[lab] = d if old == 1 else old
    missing = [lab for lab in output if lab not in extents]
    if missing:
        raise GraphError(f"Einsum node {node.label!r}: output label(s) {missing} appear in no input of {eq!r}")
    return Equation(tuple(inputs), output, extents)


def label_strides(labels: Sequence[str], shape: Sequence[int]) -> dict[str, int]:
    """Element stride of each label in a row-major array (a repeated label: the sum, i.e. its
    diagonal); labels only on dims of size 1 are absent (broadcast)."""
    strides: dict[str, int] = {}
    step = 1
    for lab, d in reversed(list(zip(labels, shape))):
        if d > 1:
            strides[lab] = strides.get(lab, 0) + step
        step *= d
    return strides


@dataclass(frozen=True)
class Matrix:
    """One operand of the product seen per batch index: ``X(r, c) = base + r·rs + c·cs`` with
    ``base = Σ β_d · batch[d]``; ``copy``: read from a row-major ``[batch, rows, cols]`` scratch
    (C: written there and copied out)."""

    rows: tuple[str, ...]
    cols: tuple[str, ...]
    copy: bool
    batch: tuple[int, ...]
    rs: int
    cs: int


@dataclass(frozen=True)
class Product:
    """``out[β, m, n] = Σ_k L[β, m, k] · R[β, k, n]`` with input ``left`` as L."""

    left: int
    batch: tuple[str, ...]
    m: tuple[str, ...]
    n: tuple[str, ...]
    k: tuple[str, ...]
    a: Matrix
    b: Matrix
    c: Matrix
    sizes: tuple[int, int, int, int]  # batch count, M, N, K
    extents: dict[str, int]

    def elements(self, x: Matrix) -> int:
        return self.sizes[0] * math.prod(self.extents[lab] for lab in (*x.rows, *x.cols))

    @property
    def copied(self) -> int:
        """Elements the plan copies (operands into scratch, C out of it)."""
        return sum(self.elements(x) for x in (self.a, self.b, self.c) if x.copy)


def _chain(order: Sequence[str], strides: dict[str, int], extents: dict[str, int]) -> int | None:
    """The stride of labels ``order`` flattened into one index (row-major over them), or None
    where they are not adjacent in that order in the array (0 for no labels)."""
    if not order:
        return 0
    for outer, inner in itertools.pairwise(order):
        if strides[outer] != strides[inner] * extents[inner]:
            return None
    return strides[order[-1]]


def _matrix(rows: tuple[str, ...], cols: tuple[str, ...], batch: tuple[str, ...], strides: dict[str, int],
            extents: dict[str, int], unit_cols: bool = False) -> Matrix:
    """The strided view of one operand, or its row-major copy where one is needed."""
    rs, cs = _chain(rows, strides, extents), _chain(cols, strides, extents)
    if rs is not None and cs is not None and (cs == 1 or not cols or not unit_cols):
        return Matrix(rows, cols, False, tuple(strides.get(lab, 0) for lab in batch), rs if rows else 0, cs if cols else 1)
    inner = math.prod(extents[lab] for lab in (*rows, *cols))
    steps, step = [], inner
    for lab in reversed(batch):
        steps.append(step)
        step *= extents[lab]
    return Matrix(rows, cols, True, tuple(reversed(steps)), math.prod(extents[lab] for lab in cols) if rows else 0, 1)


def _orders(group: Sequence[str], *strides: dict[str, int]) -> list[tuple[str, ...]]:
    """Candidate flattening orders of a group: decreasing stride in each holder."""
    out = []
    for st in strides:
        order = tuple(sorted(group, key=lambda lab: -st[lab]))
        if order not in out:
            out.append(order)
    return out or [()]


def _subsets(labels: Sequence[str]) -> list[tuple[str, ...]]:
    """Every subset of ``labels`` (just the empty one past 8 labels)."""
    if len(labels) > 8:
        return [()]
    return [c for r in range(len(labels) + 1) for c in itertools.combinations(labels, r)]


def product_plan(config: CodegenConfig, eq: Equation, shapes: Sequence[tuple[int, ...]]) -> Product | None:
    """The packed-GEMM plan with the fewest copied elements, then the fewest products, or None
    (not a product, a matrix-vector product, too small, or the packed GEMM is off in ``config``).

    Besides L/R and the flattening orders, the plan may treat m or n labels as batch labels
    of the other operand with stride 0 (numpy-broadcast batch dims, as MatMul's): a label
    that would break the flattening of C or of its operand then costs smaller products
    instead of a copy."""
    if len(eq.inputs) != 2 or not config.packed or any(v == 0 for v in eq.extents.values()):
        return None
    ext = eq.extents
    st = [label_strides(lab, shp) for lab, shp in zip(eq.inputs, shapes)]
    st_out = label_strides(eq.output, [ext[lab] for lab in eq.output])
    labels = [lab for lab in dict.fromkeys((*eq.inputs[0], *eq.inputs[1])) if ext[lab] > 1]
    best = None
    for left in (0, 1):
        sl, sr = st[left], st[1 - left]
        kinds: dict[str, list[str]] = {"batch": [], "m": [], "n": [], "k": []}
        for lab in labels:
            where = (lab in sl, lab in sr, lab in st_out)
            kind = {(True, True, True): "batch", (True, False, True): "m", (False, True, True): "n",
                    (True, True, False): "k"}.get(where)
            if kind is None:
                return None  # summed from one operand only: not a product
            kinds[kind].append(lab)
        for dm, dn in itertools.product(_subsets(kinds["m"]), _subsets(kinds["n"])):
            batch = tuple(lab for lab in eq.output if lab in kinds["batch"] or lab in dm or lab in dn)
            ms = [lab for lab in kinds["m"] if lab not in dm]
            ns = [lab for lab in kinds["n"] if lab not in dn]
            count = math.prod(ext[lab] for lab in batch)
            mm, nn, kk = (math.prod(ext[lab] for lab in group) for group in (ms, ns, kinds["k"]))
            if nn < 2 or not (batched_plan(config, count, mm, nn, kk) if count > 1 else packed_plan(config, mm, nn, kk)):
                continue
            for om, on, ok in itertools.product(_orders(ms, st_out, sl), _orders(ns, st_out, sr),
                                                _orders(kinds["k"], sl, sr)):
                plan = Product(left, batch, om, on, ok, _matrix(om, ok, batch, sl, ext), _matrix(ok, on, batch, sr, ext),
                               _matrix(om, on, batch, st_out, ext, unit_cols=True), (count, mm, nn, kk), ext)
                key = (plan.copied, count, left)
                if best is None or key < best[0]:
                    best = (key, plan)
    return best[1] if best else None


def _loader(index: int, m: Matrix) -> packed.Loader:
    """The packing loader of operand ``index``: row-major, transposed, or two strides."""
    if m.cs == 1:
        return packed.matrix_loader(index, m.rs)
    if m.rs == 1 or not m.rows:
        return packed.matrix_loader(index, m.cs, transposed=True)
    rs, cs = m.rs, m.cs

    def load(b: ir.IRBuilder, ops: Sequence[ir.Value], row: ir.Value, col: ir.Value) -> ir.Value:
        i64 = ir.IntType(64)
        off = b.add(b.mul(row, ir.Constant(i64, rs), flags=["nsw"]), b.mul(col, ir.Constant(i64, cs), flags=["nsw"]))
        return b.load(b.gep(ops[index], [off], inbounds=True))

    return load


def _index(labels: Sequence[str], shape: Sequence[int], at: dict[str, ir.Value]) -> list:
    """An operand's index for the loop variables ``at`` (0 on dims of size 1: broadcast)."""
    return [at[lab] if d > 1 else 0 for lab, d in zip(labels, shape)]


@register
class Einsum(Kernel):
    """numpy ``einsum`` of one or two float32 operands (see the module docstring)."""

    op_types = ("Einsum",)
    polly = "polly"

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        if len(ins) not in (1, 2) or any(op is None for op in ins):
            return (f"Einsum with {len(ins)} operands: polyml lowers one- and two-operand equations "
                    "(contract more pairwise, e.g. with one Einsum per pair)")
        return super().supports(node, ins)

    def _setup(self, node: Node, ins: Sequence[TensorType | None]) -> tuple[Equation, list[tuple[int, ...]], Product | None]:
        shapes = [t.shape for t in ins]
        eq = parse(node, shapes)
        return eq, shapes, product_plan(self.config, eq, shapes)

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        eq = parse(node, [op.type.shape for op in ins])
        return [TensorType(tuple(eq.extents[lab] for lab in eq.output), ins[0].type.dtype)]

    def policy(self, node: Node, ins: list[Operand | None]) -> str:
        eq, _, plan = self._setup(node, [op.type for op in ins])
        if plan is not None:
            return "off"
        if len(ins) == 1 and eq.summed:
            return "off"  # a streaming reduction, as kernels/reduce.py
        return self.polly

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        eq, _, plan = self._setup(node, [op.type for op in ins])
        text = str(node.attrs.get("equation", "")).replace(" ", "")
        if plan is None:
            return f"{text} nests"
        count, m, n, kk = plan.sizes
        copies = [x for x, mat in zip("LRC", (plan.a, plan.b, plan.c)) if mat.copy]
        how = f"copies {''.join(copies)}" if copies else "no copies"
        return f"{text} {count} x {m}x{kk} @ {kk}x{n} packed ({how})"

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        """Packing scratch, then the row-major copies the plan needs (L, R, C)."""
        _, _, plan = self._setup(node, [op.type for op in ins])
        if plan is None:
            return []
        count, m, n, kk = plan.sizes
        t = batched_temps(self.config, count, m, n, kk) if count > 1 else packed_temps(self.config, m, n, kk)
        t += [TensorType((plan.elements(mat),)) for mat in (plan.a, plan.b, plan.c) if mat.copy]
        return t

    def lower(self, k: KernelBuilder) -> None:
        eq, _, plan = self._setup(k.node, k.in_types)
        if k.outputs[0].type.size == 0:
            return
        if plan is None:
            self._nests(k, eq)
        else:
            self._product(k, eq, plan)

    # -- the packed GEMM ------------------------------------------------------------------------
    def _product(self, k: KernelBuilder, eq: Equation, plan: Product) -> None:
        prefer_wide_vectors(k.fn)
        ext = eq.extents
        temps = iter(k.temps[1:])
        left, right, out = k.inputs[plan.left], k.inputs[1 - plan.left], k.outputs[0]
        lab_l, lab_r = eq.inputs[plan.left], eq.inputs[1 - plan.left]

        def canonical(mat: Matrix) -> tuple[Buffer, list[str]]:
            labs = [*plan.batch, *mat.rows, *mat.cols]
            return view(k, next(temps), [ext[lab] for lab in labs] or [1]), labs

        operands = []
        for mat, src, labs in ((plan.a, left, lab_l), (plan.b, right, lab_r)):
            if not mat.copy:
                operands.append(src)
                continue
            tmp, tl = canonical(mat)  # tmp[β, rows, cols] = src[...]: a permuted (diagonal) copy
            with k.loops([ext[lab] for lab in tl] or [1], names=[f"c{d}" for d in range(len(tl) or 1)]) as ivs:
                at = dict(zip(tl, ivs))
                tmp.store(ivs, src.load(_index(labs, src.shape, at)))
            operands.append(tmp)
        c_tmp, c_labs = canonical(plan.c) if plan.c.copy else (out, [])
        count, m, n, kk = plan.sizes
        lda = plan.a.rs if count > 1 and plan.a.cs == 1 and a_in_place(self.config, n) else 0
        spec = packed.GemmSpec(m, n, kk, _loader(0, plan.a), _loader(1, plan.b), 2, ldc=plan.c.rs or n, lda=lda)
        if count > 1:
            batched_product(k, spec, operands, c_tmp, k.temps[0], [ext[lab] for lab in plan.batch],
                            [plan.a.batch, plan.b.batch, plan.c.batch])
        else:
            packed_product(k, spec, operands, c_tmp, k.temps[0])
        if plan.c.copy:  # out[...] = C[β, m, n] in the output's order
            with k.loops(out.shape, names=[f"o{d}" for d in range(out.rank)]) as ivs:
                at = dict(zip(eq.output, ivs))
                out.store(ivs, c_tmp.load([at[lab] for lab in c_labs] or [0]))

    # -- nests over all labels --------------------------------------------------------------
    @staticmethod
    def _nests(k: KernelBuilder, eq: Equation) -> None:
        """``out = Π operands`` where nothing is summed, else ``out = -0.0; out[o] += Π``."""
        ext = eq.extents
        out = k.outputs[0]
        summed = eq.summed
        if summed and any(ext[lab] == 0 for lab in summed):
            k.fill(out, 0.0)
            return
        if not summed:
            order = list(eq.output)
        elif len(eq.inputs) == 1:
            order = list(dict.fromkeys(eq.inputs[0]))  # the operand's own order: unit-stride reads
        else:  # i, k, j: output labels of the left operand, the summed ones, then the rest
            first = [lab for lab in eq.output if lab in eq.inputs[0]]
            order = [*first, *summed, *(lab for lab in eq.output if lab not in first)]
        if summed:
            k.fill(out, -0.0)
        with k.loops([ext[lab] for lab in order], names=[f"e{d}" for d in range(len(order))]) as ivs:
            at = dict(zip(order, ivs))
            v = None
            for x, labels in zip(k.inputs, eq.inputs):
                xv = x.load(_index(labels, x.shape, at))
                v = xv if v is None else k.b.fmul(v, xv, flags=REASSOC)
            o = _index(eq.output, out.shape, at)
            out.store(o, k.b.fadd(out.load(o), v, flags=REASSOC) if summed else v)
