"""A plain affine nest: statements over isl domains with access relations and scalar bodies.

This is the program before any schedule: each statement instance ``S[i, j, k]`` reads and
writes array elements given by its access relations (isl maps from the domain to an array's
index space, possibly piecewise or quasi-affine: a clamped read ``A[min(i, M - 1), k]``, a
blocked layout ``Ap[(i mod 96) div 12, k mod 256, i mod 12]``) and its body combines the
elements.  Sizes may be isl parameters (``[M, N, K] -> { ... }``); the nest's ``context``
constrains them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import islpy as isl
import llvmlite.ir as ir

#: ``body(builder, pointers)``: the statement instance on the element pointers of its
#: accesses, in the order of :attr:`Statement.accesses`
Body = Callable[[ir.IRBuilder, Sequence[ir.Value]], None]


@dataclass(frozen=True)
class Array:
    """A row-major array; ``shape`` entries are ints or parameter names.  ``padding``: the
    value of an element outside the shape (a convolution's zero padding: its accesses may
    leave the array, and read that value there); None: every access stays inside."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"
    padding: float | None = None


@dataclass(frozen=True)
class Access:
    """``relation``: an isl map from the statement's domain to ``array``'s index space;
    ``mode``: ``read``, ``write`` or ``update`` (read, then written: ``C[i, j] += ...``)."""

    array: str
    relation: str
    mode: str = "read"

    @property
    def reads(self) -> bool:
        return self.mode in ("read", "update")

    @property
    def writes(self) -> bool:
        return self.mode in ("write", "update")

    def map(self) -> isl.Map:
        return isl.Map(self.relation)


@dataclass(frozen=True)
class Statement:
    """``view``: an isl map from the domain to the iteration space of the intrinsic a
    ``tensorize`` mark puts the statement on (a convolution's instances as the GEMM's
    ``(i, j, k)``: output channel, output position, input channel and tap); the tile's bounds
    and its first reduction step are taken there.  Empty: the domain itself."""

    name: str
    domain: str
    accesses: tuple[Access, ...]
    body: Body = field(compare=False, repr=False)
    view: str = ""

    def domain_set(self) -> isl.Set:
        return isl.Set(self.domain)


@dataclass(frozen=True)
class Nest:
    """Statements in textual order (the order of the initial schedule), over ``arrays``."""

    name: str
    params: tuple[str, ...]
    arrays: tuple[Array, ...]
    statements: tuple[Statement, ...]
    context: str = ""

    def statement(self, name: str) -> Statement:
        for s in self.statements:
            if s.name == name:
                return s
        raise KeyError(f"nest {self.name}: no statement {name!r}")

    def array(self, name: str) -> Array:
        for a in self.arrays:
            if a.name == name:
                return a
        raise KeyError(f"nest {self.name}: no array {name!r}")

    def context_set(self) -> isl.Set:
        params = ", ".join(self.params)
        return isl.Set(self.context or f"[{params}] -> {{ : }}")

    def domain(self) -> isl.UnionSet:
        dom = isl.UnionSet.empty(self.context_set().get_space())
        for s in self.statements:
            dom = dom.union(isl.UnionSet.from_set(s.domain_set()))
        return dom.intersect_params(self.context_set())

    def accesses(self, write: bool) -> isl.UnionMap:
        """Every statement's reads (``write`` False) or writes, as one union map."""
        rel = isl.UnionMap.empty(self.context_set().get_space())
        for s in self.statements:
            for a in s.accesses:
                if (a.writes if write else a.reads):
                    rel = rel.union(isl.UnionMap.from_map(a.map().intersect_domain(s.domain_set())))
        return rel

    def with_statement(self, stmt: Statement, before: str | None = None) -> Nest:
        """A new nest with ``stmt`` replacing the statement of its name, or added (before
        statement ``before``, else last)."""
        names = [s.name for s in self.statements]
        if stmt.name in names:
            stmts = tuple(stmt if s.name == stmt.name else s for s in self.statements)
        elif before is not None:
            at = names.index(before)
            stmts = (*self.statements[:at], stmt, *self.statements[at:])
        else:
            stmts = (*self.statements, stmt)
        return replace(self, statements=stmts)

    def with_array(self, array: Array) -> Nest:
        return replace(self, arrays=(*[a for a in self.arrays if a.name != array.name], array))

    def initial_schedule(self) -> isl.Schedule:
        """The nest as written: statements in sequence, each its domain in lexicographic order
        (one band per statement)."""
        ctx = self.context_set()
        if len(self.statements) == 1:
            s = self.statements[0]
            return _identity(isl.Schedule.from_domain(self.domain()).get_root().child(0), s).get_schedule()
        filters = isl.UnionSetList.alloc(ctx.get_ctx(), len(self.statements))
        for s in self.statements:
            filters = filters.add(isl.UnionSet.from_set(isl.Set.universe(s.domain_set().get_space())))
        node = isl.Schedule.from_domain(self.domain()).get_root().child(0).insert_sequence(filters)
        for pos, s in enumerate(self.statements):
            node = _identity(node.child(pos).child(0), s).parent().parent()
        return node.get_schedule()


def _identity(node: isl.ScheduleNode, s: Statement) -> isl.ScheduleNode:
    space = s.domain_set().get_space()
    n = space.dim(isl.dim_type.set)
    if n == 0:
        return node
    ma = isl.MultiAff.identity(isl.Space.map_from_set(space)).reset_tuple_id(isl.dim_type.out)
    return node.insert_partial_schedule(isl.MultiUnionPwAff.from_multi_aff(ma))


@dataclass(frozen=True)
class Program:
    """A nest and the schedule tree that runs it (what the transforms map to new programs)."""

    nest: Nest
    tree: isl.Schedule

    @staticmethod
    def of(nest: Nest) -> Program:
        return Program(nest, nest.initial_schedule())
