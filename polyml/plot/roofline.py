"""The roofline of a compiled model: each op function against the host's measured roofs.

Model (Williams, Waterman, Patterson 2009): an op that performs ``F`` flops and must move
``B`` bytes has arithmetic intensity ``I = F / B``; on a machine with peak ``P`` flop/s and
memory bandwidth ``W`` byte/s it cannot exceed ``min(P, I·W)``.  Here

* ``F``: polyml's flop count (:mod:`polyml.flops`: 2 × multiply-adds of products,
  convolutions and attention); ops without multiply-adds count one operation per output
  element (drawn hollow: their "flops" are elements);
* ``B``: the bytes of the distinct inputs, outputs and constants the op function receives
  (manifest ``functions[].bytes``: compulsory traffic, each operand moved once; scratch
  buffers not counted);
* achieved flop/s: ``F`` over the op function's median time from ``bench --profile``
  (each step run alone through ``polyml_step``);
* ``P``: the packed GEMM's measured peak on this host: an n×n×n float32 MatMul compiled by
  polyml (:mod:`polyml.codegen.gemm`'s micro-kernel) with the same thread count, best of
  several runs (as ``scripts/bench_gemm.py`` measures it);
* ``W``: measured on the spot with a STREAM-like triad ``a = b + s·c`` over arrays larger
  than the last-level cache, *compiled by polyml* (an ONNX Mul + Add that fusion turns into one
  elementwise nest, OpenMP-parallel like the ops it is compared with), counting 3 arrays
  moved per run (STREAM's convention: no write-allocate traffic), best of several runs.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from polyml.errors import PolymlError

GEMM_N = 512  # the compute roof's MatMul size
TRIAD_N = 1 << 24  # floats per triad array (64 MiB: beyond the last-level caches of common hosts)
LABELLED = 10  # the costliest op functions get their name written beside the point


@dataclass(frozen=True)
class Roofs:
    """The host's measured limits (``peak_gflops``: GFLOP/s, ``bandwidth_gbs``: GB/s)."""

    peak_gflops: float
    bandwidth_gbs: float
    threads: int
    how: str

    @property
    def ridge(self) -> float:
        """The intensity (flop/byte) where the two roofs meet."""
        return self.peak_gflops / self.bandwidth_gbs


@dataclass(frozen=True)
class OpPoint:
    function: str
    op_type: str
    flops: float  # counted flops, or output elements (counted=False)
    bytes: int
    seconds: float
    counted: bool

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9


def points(profile: Sequence[dict]) -> list[OpPoint]:
    """One point per op function of a ``CompiledModel.profile`` result."""
    out = []
    for r in profile:
        if "bytes" not in r:
            raise PolymlError("the artifact's manifest has no per-function bytes (built by an older polyml): rebuild it")
        flops = float(r.get("flops") or 0.0)
        counted = flops > 0
        work = flops if counted else float(max(1, r.get("out_elements", 0)))
        out.append(OpPoint(r["function"], r["op_type"], work, max(1, int(r["bytes"])), max(float(r["median_s"]), 1e-9), counted))
    return out


def _best_seconds(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_roofs(threads: int = 0, gemm_n: int | None = None, triad_n: int | None = None, repeat: int = 10) -> Roofs:
    """Compile and time the packed GEMM and the triad (see the module docstring); sizes
    default to :data:`GEMM_N` and :data:`TRIAD_N`."""
    gemm_n = gemm_n or GEMM_N
    triad_n = triad_n or TRIAD_N
    import onnx
    from onnx import TensorProto, helper

    from polyml.compiler import compile as polyml_compile
    from polyml.testing import single_node_model

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="polyml-roofs-") as tmp:
        work = Path(tmp)
        onnx.save(single_node_model("MatMul", {"a": (gemm_n, gemm_n), "b": (gemm_n, gemm_n)}), str(work / "gemm.onnx"))
        gemm = polyml_compile(work / "gemm.onnx", work / "gemm", threads=threads)
        feeds = {k: rng.standard_normal((gemm_n, gemm_n), dtype=np.float32) for k in ("a", "b")}
        peak = 2.0 * gemm_n**3 / _best_seconds(lambda: gemm.run(feeds), repeat) / 1e9
        vec = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [triad_n]) for n in ("b", "c")]
        s = helper.make_tensor("s", TensorProto.FLOAT, [1], [3.0])
        graph = helper.make_graph([helper.make_node("Mul", ["c", "s"], ["sc"], name="scale"),
                                   helper.make_node("Add", ["b", "sc"], ["a"], name="triad")], "triad", vec,
                                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [triad_n])], initializer=[s])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(work / "triad.onnx"))
        triad = polyml_compile(work / "triad.onnx", work / "triad", threads=threads)
        tfeeds = {k: rng.standard_normal(triad_n, dtype=np.float32) for k in ("b", "c")}
        got = triad.run(tfeeds)["a"]
        if not np.allclose(got, tfeeds["b"] + np.float32(3.0) * tfeeds["c"], rtol=1e-5, atol=1e-5):
            raise PolymlError("the triad measuring memory bandwidth computed wrong values")
        bandwidth = 3 * 4 * triad_n / _best_seconds(lambda: triad.run(tfeeds), repeat) / 1e9
    how = (f"compute: packed GEMM {gemm_n}³ (best of {repeat}); memory: triad a = b + s·c, "
           f"3 × {4 * triad_n >> 20} MiB (best of {repeat}); threads={threads or 'all'}")
    return Roofs(peak, bandwidth, threads, how)


def draw(ops: Sequence[OpPoint], roofs: Roofs, path: str | Path, title: str = "", labelled: int = LABELLED) -> Path:
    """The roofline: SVG ids ``op-K`` (one point per op function, costliest first), ``roof-compute``, ``roof-memory``."""
    from matplotlib.lines import Line2D

    from polyml.plot import _extra

    plt = _extra.pyplot("--plot roofline.svg")
    if not ops:
        raise PolymlError("the roofline needs at least one op function")
    fig, ax = plt.subplots(figsize=(8.5, 6.0))
    xs = [p.intensity for p in ops]
    ys = [p.gflops for p in ops]
    lo_x = min(min(xs), roofs.ridge) / 4
    hi_x = max(max(xs), roofs.ridge) * 4
    lo_y = min(min(ys), lo_x * roofs.bandwidth_gbs) / 3
    hi_y = max(max(ys), roofs.peak_gflops) * 3.5
    ax.set_xscale("log")
    ax.set_yscale("log")
    mem, = ax.plot([lo_x, roofs.ridge], [lo_x * roofs.bandwidth_gbs, roofs.peak_gflops], color="#b2182b", linewidth=2)
    mem.set_gid("roof-memory")
    comp, = ax.plot([roofs.ridge, hi_x], [roofs.peak_gflops, roofs.peak_gflops], color="#2166ac", linewidth=2)
    comp.set_gid("roof-compute")
    types = sorted({p.op_type for p in ops})
    cmap = plt.get_cmap("tab10" if len(types) <= 10 else "tab20")
    colour = {t: cmap(i % cmap.N) for i, t in enumerate(types)}
    order = sorted(range(len(ops)), key=lambda k: -ops[k].seconds)
    total = sum(p.seconds for p in ops)
    for rank, k in enumerate(order):
        p = ops[k]
        size = 18 + 300 * p.seconds / total
        mark = ax.scatter([xs[k]], [ys[k]], s=size, zorder=3, linewidths=1.2,
                          facecolors=colour[p.op_type] if p.counted else "none", edgecolors=colour[p.op_type])
        mark.set_gid(f"op-{rank}")
    # labels for the costliest: stacked in a column at the right, joined to their points
    top = order[:labelled]
    slots = np.geomspace(hi_y / 1.6, lo_y * 1.6, max(len(top), 2))[: len(top)]
    for (k, y) in zip(sorted(top, key=lambda k: -ys[k]), slots):
        p = ops[k]
        ax.annotate(f"{p.function} ({p.seconds * 1e3:.2f} ms)", (xs[k], ys[k]), xytext=(hi_x * 1.15, y), textcoords="data",
                    fontsize=6.5, va="center", ha="left", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": "0.6", "linewidth": 0.5})
    ax.set_xlim(lo_x, hi_x)
    ax.set_ylim(lo_y, hi_y)
    ax.set_xlabel("arithmetic intensity (flop / byte moved)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.grid(True, which="major", linewidth=0.3, alpha=0.6)
    handles = [Line2D([], [], color="#2166ac", linewidth=2, label=f"compute roof: packed GEMM {roofs.peak_gflops:.1f} GFLOP/s"),
               Line2D([], [], color="#b2182b", linewidth=2, label=f"memory roof: triad {roofs.bandwidth_gbs:.1f} GB/s")]
    handles += [Line2D([], [], marker="o", linestyle="", color=colour[t], label=t, markersize=6) for t in types]
    handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", color="0.3", markersize=6,
                          label="no multiply-adds: 1 op per output element"))
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), frameon=False, ncol=3)
    ax.set_title(f"{title}\n{len(ops)} op functions (area ∝ time); {roofs.how}", fontsize=8, loc="left")
    return _extra.save(fig, path)
