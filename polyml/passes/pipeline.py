"""polyml's default pass pipeline, the SCoPs it leaves to Polly, and the variants ``--tune`` tries.

Not a pass: the policy ``polyml opt`` (no ``--passes``) and ``polyml build --passes default``
apply per SCoP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyml.scop import jscop as J

#: isl's scheduler (fusion as isl clusters it), tiles sized by the cache model, a wavefront over
#: the tiles where no tile loop is parallel (time-tiled stencils), the outermost parallel loop
#: on OpenMP threads, the innermost parallel stride-1 loop for the vectorizer
DEFAULT = "schedule,tile,wavefront,parallel,vectorize{width=1}"
#: what the default pipeline runs on a matrix-product SCoP: nothing of polyml's; Polly's own
#: optimizer (its GEMM pattern: packing, register tiling) is faster there (docs/SCOP_WORKFLOW.md)
POLLY = "polly"


@dataclass(frozen=True)
class Choice:
    """The pipeline the default policy picks for one SCoP, and why."""

    pipeline: str
    reason: str


def is_matrix_product(scop: Mapping) -> bool:
    """Does a statement of the SCoP compute ``C[i][j] (+)= … A[i][k] … B[k][j]`` over a
    rectangular domain: a write whose subscripts leave out a loop ``k`` (a reduction), and two
    reads each indexed by ``k`` and by a different one of the write's loops (the shape Polly's
    GEMM pattern optimizer matches)?  Triangular products (symm, syrk, trmm) do not count:
    Polly's optimizer miscompiled symm's clang IR (max rel. error 0.79 on the CI size, LLVM 19)."""
    for s in scop["statements"]:
        dom = J.domain(s)
        n = dom.dim(isl.dim_type.set)
        if n < 3 or not dom.is_box():
            continue
        uses = []
        for a in s["accesses"]:
            m = J.parse(isl.Map, a["relation"], s["name"])
            uses.append((a["kind"], _used_dims(m, n), J.array_name(a["relation"])))
        for kind, w, written in uses:
            if kind != "write" or not w:
                continue
            red = set(range(n)) - w
            for k in red:
                # the factors are other arrays (floyd-warshall's d[i][j] = min(d[i][j], d[i][k] +
                # d[k][j]) has the shape over one array; Polly's optimizer made it 10x slower)
                partners = [u for kd, u, arr in uses
                            if kd == "read" and arr != written and k in u and len(u) == 2 and u - {k} <= w]
                if len({frozenset(u - {k}) for u in partners}) >= 2:
                    return True
    return False


def _used_dims(m: isl.Map, n: int) -> set[int]:
    """The input dimensions an access relation's subscripts depend on (affine pieces only)."""
    used: set[int] = set()
    try:
        pma = isl.PwMultiAff.from_map(m)
    except isl.Error:
        return set(range(n))

    def piece(_set: isl.Set, ma: isl.MultiAff) -> None:
        for d in range(ma.dim(isl.dim_type.out)):
            aff = ma.get_aff(d)
            for i in range(n):
                if not aff.get_coefficient_val(isl.dim_type.in_, i).is_zero():
                    used.add(i)
            if aff.dim(isl.dim_type.div):
                used.update(range(n))

    pma.foreach_piece(piece)
    return used


def choose(scop: Mapping, allow_polly: bool = True) -> Choice:
    """The default policy for one SCoP; ``allow_polly=False``: polyml's pipeline even on a matrix
    product (where Polly's optimizer left the SCoP unchanged)."""
    if allow_polly and is_matrix_product(scop):
        return Choice(POLLY, "a matrix product: Polly's GEMM pattern optimizer")
    return Choice(DEFAULT, "polyml's pipeline")


#: the default policy's fallback where polyml's pipeline would walk memory worse than the
#: source order: keep the schedule, run its parallel loop on threads, prepare the vectorizer
KEEP = "parallel,vectorize{width=1}"


#: the default policy on streaming SCoPs (:func:`is_streaming`): isl's schedule (a better loop
#: order, parallel loops) without tiles, which only add loop overhead where nothing is reused
STREAM = "schedule,parallel,vectorize{width=1}"


def is_streaming(scop: Mapping) -> bool:
    """Is every access to the SCoP's largest arrays one element per statement instance, with
    as many loops as those arrays have dimensions (matrix-vector kernels: each matrix element
    is read once, so tiles have nothing to keep in cache)?"""
    rank, depth = 0, 0
    per: list[tuple[int, bool]] = []
    for s in scop["statements"]:
        dom = J.domain(s)
        depth = max(depth, dom.dim(isl.dim_type.set))
        for a in s["accesses"]:
            m = J.parse(isl.Map, a["relation"], s["name"]).intersect_domain(dom)
            r = m.dim(isl.dim_type.out)
            rank = max(rank, r)
            per.append((r, m.is_injective()))
    return rank >= 2 and rank == depth and all(inj for r, inj in per if r == rank)


def apply_default(scop: Mapping, threads: int = 0, allow_polly: bool = True) -> tuple[dict, str]:
    """The default policy on one SCoP: the new JSCoP and the pipeline that made it.

    A matrix product goes to Polly (:func:`choose`, unless ``allow_polly`` is False).  Otherwise :data:`DEFAULT` runs, and its
    result is kept unless its innermost loops walk memory worse than the source order's
    (:func:`polyml.passes.vectorize.innermost_score`: +rank per stride-1 access, -rank per
    strided one): isl maximises outer parallelism, and on a matrix-vector product it puts the row loop
    innermost (atax's ``y[j] += A[i][j] * tmp[i]`` read A down its columns: 0.54x -O3); then
    :data:`KEEP` runs on the original schedule instead."""
    from polyml import passes
    from polyml.passes.vectorize import innermost_score

    choice = choose(scop, allow_polly)
    first = STREAM if choice.pipeline == DEFAULT and is_streaming(scop) else choice.pipeline
    text = with_threads(first, threads)
    out = passes.run(passes.parse_pipeline(text), dict(scop))
    if first in (DEFAULT, STREAM) and innermost_score(out) < innermost_score(dict(scop)):
        text = with_threads(KEEP, threads)
        out = passes.run(passes.parse_pipeline(text), dict(scop))
    return out, text


def with_threads(pipeline: str, threads: int) -> str:
    """``pipeline`` with ``parallel{threads=N}``; ``threads == 1`` drops the parallel pass."""
    from polyml.passes import split_pipeline

    items = []
    for name, opts in split_pipeline(pipeline):
        if name == "parallel":
            if threads == 1:
                continue
            if threads > 1:
                opts = {**opts, "threads": str(threads)}
        items.append(name + ("{" + " ".join(f"{k}={v}" for k, v in opts.items()) + "}" if opts else ""))
    return ",".join(items)


def tune_variants(limit: int) -> list[str]:
    """Up to ``limit`` pipelines ``--tune`` measures, most promising first: the default, Polly's
    optimizer, the untiled schedule, then fusion and tile-size and vector-width variants."""
    out = [DEFAULT, POLLY, "schedule,parallel,vectorize{width=1}", "identity"]
    for fusion in ("max", "min"):
        out.append(f"schedule{{fusion={fusion}}},tile,wavefront,parallel,vectorize{{width=1}}")
    for sizes in ("32,256,128", "64,64,256", "16,128,128", "32,32,32", "128,128,128", "8,64,512"):
        out.append(f"schedule,tile{{sizes={sizes}}},wavefront,parallel,vectorize{{width=1}}")
    for width in (0, 32, 64):
        out.append(f"schedule,tile,wavefront,parallel,vectorize{{width={width}}}")
    seen: list[str] = []
    for p in out:
        if p not in seen:
            seen.append(p)
    return seen[: max(1, limit)]
