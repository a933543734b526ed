"""Plain affine nests, their isl schedule trees, and code generation from those trees.

An op's kernel describes *what* it computes as a :class:`~polyml.schedule.nest.Nest`: statements
with isl iteration domains (sizes may stay isl parameters), access relations and a scalar body.
*How* it runs is an isl schedule tree built by the transforms of :mod:`polyml.schedule.tree`
(strip-mine, permute, split into bands, pack operands into blocked copies — constants at
compile time, by evaluating the layout (:mod:`polyml.schedule.layout`) —, mark a band
parallel, tensorize a register tile onto a named intrinsic), each a pure function of a
:class:`~polyml.schedule.nest.Program` (nest + tree); :mod:`polyml.schedule.legality` checks a
tree against the nest's dependences; :mod:`polyml.schedule.codegen` turns the tree into loops
with isl's AST generator and lowers each mark: ``parallel`` to OpenMP, ``tensorize`` to an
intrinsic of :mod:`polyml.schedule.intrinsics`.  Per-family pipelines (which transforms, with
which sizes from the cache model) live beside them, e.g. :mod:`polyml.schedule.gemm`.
"""
