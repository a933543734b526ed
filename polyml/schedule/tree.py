"""Schedule-tree transforms: pure functions from a node (or a :class:`Program`) to a new one.

Each says what it means in polyhedral terms; none checks legality by itself
(:mod:`polyml.schedule.legality` checks the final tree against the nest's dependences).

* :func:`strip_mine` — one band member ``m`` becomes two, the tile origin ``m - m mod s`` and
  the offset ``m mod s`` (tiling one dimension);
* :func:`permute` — reorder a band's members (loop interchange inside a permutable band);
* :func:`split` — cut a band into an outer and an inner band (to place nodes between levels);
* :func:`pack` — a copy-in statement, grafted as an extension node before a subtree, that
  copies the elements a statement reads from an array within each iteration of the prefix
  into a buffer of another layout; the statement's access is rewritten to the copy (the
  data-layout transformation of Polly's MatMul optimizer);
* :func:`pack_constant` — the same for a constant array, at compile time: only the access is
  rewritten (the buffer is made by evaluating the layout, :mod:`polyml.schedule.layout`);
* :func:`fold_init` — drop an initialising statement whose work the first reduction step of a
  tensorized update does instead (the intrinsic stores rather than accumulates there);
* :func:`mark` — a mark node above a subtree: ``parallel`` (OpenMP over the band's first
  member), ``unroll`` (the loops below fully unrolled by LLVM), ``vectorize`` (the loops below
  vectorized by LLVM as they stand) or ``tensorize <intrinsic> <statement> [init=<statement>]
  [finish=<statement>]`` (the register tile below is one call of a named intrinsic,
  :mod:`polyml.schedule.intrinsics`, which also does the folded statements' work on it).
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from polyml.schedule.nest import Access, Array, Nest, Program, Statement


def text(tree: isl.Schedule) -> str:
    """The tree in isl's block YAML (one node per line: the dump and golden-test form)."""
    printer = isl.Printer.to_str(tree.get_ctx()).set_yaml_style(isl.yaml_style.BLOCK)
    return printer.print_schedule(tree).get_str()


def members(node: isl.ScheduleNode) -> list[isl.UnionPwAff]:
    mupa = node.band_get_partial_schedule()
    return [mupa.get_union_pw_aff(i) for i in range(mupa.dim(isl.dim_type.set))]


def with_members(node: isl.ScheduleNode, new: list[isl.UnionPwAff], permutable: bool = True) -> isl.ScheduleNode:
    """The band at ``node`` replaced by one of ``new`` members (coincidence flags cleared); at
    a leaf, the band inserted there."""
    if node.get_type() == isl.schedule_node_type.band:
        node = node.delete()
    if not new:
        return node
    space = new[0].get_space().set_from_params().add_dims(isl.dim_type.set, len(new))
    mupa = isl.MultiUnionPwAff.from_union_pw_aff_list(space, _upa_list(new))
    return node.insert_partial_schedule(mupa).band_set_permutable(int(permutable))


def _upa_list(items: list[isl.UnionPwAff]) -> isl.UnionPwAffList:
    lst = isl.UnionPwAffList.alloc(items[0].get_ctx(), len(items))
    for it in items:
        lst = lst.add(it)
    return lst


def strip_mine(node: isl.ScheduleNode, pos: int, size: int) -> isl.ScheduleNode:
    """Member ``pos`` ``m`` becomes ``m - m mod size`` (at ``pos``) and ``m mod size`` (at ``pos + 1``)."""
    ms = members(node)
    return with_members(node, [*ms[:pos], origin(ms[pos], size), offset(ms[pos], size), *ms[pos + 1:]])


def origin(m: isl.UnionPwAff, size: int) -> isl.UnionPwAff:
    """``m - m mod size``: the origin of ``m``'s tile (the outer member of a strip-mine)."""
    return m.sub(m.mod_val(isl.Val(size)))


def offset(m: isl.UnionPwAff, size: int) -> isl.UnionPwAff:
    """``m mod size``: the position in ``m``'s tile (the inner member of a strip-mine)."""
    return m.mod_val(isl.Val(size))


def permute(node: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """Members in the order ``order`` (``order[p]``: the old position of new member ``p``)."""
    ms = members(node)
    if sorted(order) != list(range(len(ms))):
        raise ValueError(f"permute: {order} is not a permutation of {len(ms)} members")
    return with_members(node, [ms[p] for p in order])


def split(node: isl.ScheduleNode, sizes: list[int]) -> isl.ScheduleNode:
    """The band cut into consecutive bands of ``sizes`` members; returns the outermost."""
    if sum(sizes) != node.band_n_member():
        raise ValueError(f"split: {sizes} do not add up to {node.band_n_member()} members")
    depth = 0
    for n in sizes[:-1]:
        node = node.band_split(n).child(0)
        depth += 1
    for _ in range(depth):
        node = node.parent()
    return node


def mark(node: isl.ScheduleNode, text: str) -> isl.ScheduleNode:
    """A mark node ``text`` inserted above ``node``; returns the mark."""
    return node.insert_mark(isl.Id(text))


def tensorize_text(intrinsic: str, statement: str, init: str = "", finish: str = "") -> str:
    return f"tensorize {intrinsic} {statement}" + (f" init={init}" if init else "") + (f" finish={finish}" if finish else "")


def parse_tensorize(text: str) -> tuple[str, str, str, str] | None:
    """(intrinsic, statement, init, finish) of a tensorize mark, None for other marks."""
    words = text.split()
    if not words or words[0] != "tensorize" or len(words) < 3:
        return None
    init = next((w[5:] for w in words[3:] if w.startswith("init=")), "")
    finish = next((w[7:] for w in words[3:] if w.startswith("finish=")), "")
    return words[1], words[2], init, finish


def fold_init(program: Program, init: str) -> Program:
    """The tree without statement ``init`` (its domain removed): the tensorized update writes
    its first reduction step instead of accumulating, which the mark records (``init=``).
    The same for a finishing statement whose work the intrinsic does in registers after the
    tile's last reduction step (``finish=``)."""
    keep = isl.UnionSet.empty(program.tree.get_domain().get_space())
    for s in program.nest.statements:
        if s.name != init:
            keep = keep.union(isl.UnionSet.from_set(s.domain_set()))
    return replace(program, tree=program.tree.intersect_domain(keep))


def pack(program: Program, node: isl.ScheduleNode, statement: str, array: str, buffer: Array, layout: str,
         pad: str = "", clamp: str = "", order: tuple[str, ...] = (), inner: int = 0, inner_mark: str = "unroll",
         view: str = "", source: str = "") -> tuple[Program, isl.ScheduleNode]:
    """Copy-in of ``array`` for ``statement`` before the subtree at ``node``.

    The copy statement ``Pack_<buffer>`` runs, in each iteration of ``node``'s prefix schedule,
    over the elements of ``array`` that ``statement`` reads below it (their footprint),
    widened by ``pad`` (a map from an element to the elements of its register panel, so that
    whole panels are written), reading through ``clamp`` where the widened elements lie
    outside the array (a map from the copy's domain to the element read), and writing
    ``buffer`` at ``layout`` (a map from the copy's domain to ``buffer``'s index).  The copy's
    domain is the prefix's values followed by the element's index, so a layout may depend on
    the iteration (a buffer per thread).  ``statement``'s access to ``array`` is rewritten to
    ``layout`` composed with its index.  ``order``: the copy's loops, as expressions of its
    element index ``e0, e1, ..`` (default: the index in order); ``inner``: how many of the
    innermost of those loops go into a band of their own under the mark ``inner_mark``
    (``unroll``: unrolled fully by LLVM, so that it vectorizes the loop around them; a
    ``tensorize`` mark: the copy of those elements is one call of a copy intrinsic).

    ``view`` and ``source`` pack an operand as the statement sees it rather than the array's
    elements: ``view`` maps the statement's instances to a virtual operand ``V[e]`` (a
    convolution's im2col matrix ``B[k, j]``, whose elements repeat the input's) and ``source``
    maps ``V`` to the array's element (where ``array`` is padded, outside it); their
    composition must be the statement's access (checked).  The copy then runs over ``V``'s
    elements, ``pad`` and ``clamp`` are in ``V``'s terms, and the statement reads the copy at
    ``layout`` of ``view``.  Returns the new program and the node of the subtree.
    """
    nest = program.nest
    stmt, acc = _read_only_access(nest, statement, array, "pack")
    dom = isl.UnionSet.from_set(stmt.domain_set()).intersect_params(nest.context_set())
    prefix = node.get_prefix_schedule_union_map().intersect_domain(dom)
    prefix_map = isl.Map.from_union_map(prefix)
    n_prefix = prefix_map.dim(isl.dim_type.out)
    # { [prefix] -> array[e] }: what the subtree reads in each prefix iteration
    access = acc.map()
    through = access  # the statement's instance -> the element the copy holds for it
    if view:
        through = isl.Map(view)
        if not through.apply_range(isl.Map(source)).intersect_domain(stmt.domain_set()).is_equal(
                access.intersect_domain(stmt.domain_set())):
            raise ValueError(f"pack: {view} then {source} is not {statement}'s access {acc.relation}")
    footprint = prefix_map.reverse().apply_range(through)
    if pad:
        footprint = footprint.apply_range(isl.Map(pad))
    copy_name = f"Pack_{buffer.name}"
    rank = footprint.dim(isl.dim_type.out)
    p_names = [f"p{d}" for d in range(n_prefix)]
    e_names = [f"e{d}" for d in range(rank)]
    params = f"[{', '.join(nest.params)}]"
    tuple_ = ", ".join(p_names + e_names)
    to_copy = isl.Map(f"{params} -> {{ [{tuple_}] -> {copy_name}[{tuple_}] }}")
    graph = footprint.reset_tuple_id(isl.dim_type.out)
    both = isl.Map.identity(isl.Space.map_from_set(graph.domain().get_space())).intersect_domain(graph.domain()) \
        .flat_range_product(graph)
    ext = both.apply_range(to_copy)  # [prefix] -> Pack[prefix, e]
    copy_domain = ext.range()
    held = through.get_tuple_name(isl.dim_type.out)
    read = isl.Map(clamp or f"{params} -> {{ {copy_name}[{tuple_}] -> {held}[{', '.join(e_names)}] }}")
    if view:
        read = read.apply_range(isl.Map(source))
    copy = Statement(copy_name, str(copy_domain), (
        Access(buffer.name, layout, "write"),
        Access(array, str(read)),
    ), body=_copy_body)
    # the statement now reads the copy: compose its access with the layout (prefix, element)
    # composed as functions (pullbacks): a composition of relations hides that the result is
    # one, and isl then takes tens of milliseconds to find it again at every use
    flat = isl.PwMultiAff.from_map(prefix_map).flat_range_product(
        isl.PwMultiAff.from_map(through.reset_tuple_id(isl.dim_type.out)))  # S[x] -> [prefix, e]
    nest = _reading(nest, stmt, acc, buffer, isl.PwMultiAff.from_map(isl.Map(layout)).pullback_pw_multi_aff(
        isl.PwMultiAff.from_map(to_copy).pullback_pw_multi_aff(flat)))
    nest = nest.with_statement(copy, before=statement)
    ext_node = isl.ScheduleNode.from_extension(isl.UnionMap.from_map(ext))
    exprs = order or tuple(e_names)
    band = isl.MultiUnionPwAff(f"{params} -> [" + ", ".join(f"{{ {copy_name}[{tuple_}] -> [({e})] }}" for e in exprs) + "]")
    copy_band = ext_node.child(0).insert_partial_schedule(band)
    if inner:
        copy_band = mark(copy_band.band_split(len(exprs) - inner).child(0), inner_mark)
    ext_node = copy_band.root()
    node = node.graft_before(ext_node)
    return Program(nest, node.get_schedule()), node


def pack_constant(program: Program, statement: str, array: str, buffer: Array, layout: str) -> Program:
    """``statement`` reads the constant ``array`` from ``buffer`` at ``layout`` (a map from the
    array's index to the buffer's): the same data-layout transformation as :func:`pack`, done
    once at compile time, so no copy statement runs (the kernel makes the buffer with
    :func:`polyml.schedule.layout.offsets` of the same layout)."""
    stmt, acc = _read_only_access(program.nest, statement, array, "pack_constant")
    new = isl.PwMultiAff.from_map(isl.Map(layout)).pullback_pw_multi_aff(isl.PwMultiAff.from_map(acc.map()))
    return Program(_reading(program.nest, stmt, acc, buffer, new), program.tree)


def _read_only_access(nest: Nest, statement: str, array: str, what: str) -> tuple[Statement, Access]:
    """``statement`` and its read of ``array``, which no statement of ``nest`` may write (a
    copy of it must stay what the statement would read)."""
    if any(a.array == array and a.writes for s in nest.statements for a in s.accesses):
        raise ValueError(f"{what}: {array} is written in nest {nest.name}; only read-only arrays are packed")
    stmt = nest.statement(statement)
    return stmt, next(a for a in stmt.accesses if a.array == array and a.mode == "read")


def _reading(nest: Nest, stmt: Statement, acc: Access, buffer: Array, relation: isl.PwMultiAff) -> Nest:
    """``nest`` with ``stmt`` reading ``buffer`` at ``relation`` where it read through ``acc``."""
    accesses = tuple(Access(buffer.name, str(isl.Map.from_pw_multi_aff(relation))) if a is acc else a
                     for a in stmt.accesses)
    return nest.with_statement(replace(stmt, accesses=accesses)).with_array(buffer)


def _copy_body(b, ptrs) -> None:  # noqa: ANN001
    dst, src = ptrs
    b.store(b.load(src), dst)
