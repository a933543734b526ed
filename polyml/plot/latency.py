"""Per-runner latency distributions of ``polyml bench``: a box (quartiles, whiskers at 1.5 IQR)
and every timed call as a dot beside it, so the noise of a shared host is visible next to
the medians the table reports (same timings: :func:`polyml.benchmark.measure`'s blocks)."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from polyml.errors import PolymlError


def draw(times: Mapping[str, Sequence[float]], path: str | Path, title: str = "") -> Path:
    """``times``: seconds per timed call, per runner.  SVG ids: ``runner-NAME`` (one box per
    runner), ``calls-NAME`` (its calls, one mark each), ``median-NAME``."""
    from polyml.plot import _extra

    plt = _extra.pyplot("--plot latency.svg")
    runners = [k for k, v in times.items() if len(v)]
    if not runners:
        raise PolymlError("no timed calls to draw")
    fig, ax = plt.subplots(figsize=(max(4.5, 1.6 * len(runners) + 2.5), 4.8))
    data = [np.asarray(times[k]) * 1e3 for k in runners]
    parts = ax.boxplot(data, positions=range(len(runners)), widths=0.45, showfliers=False, patch_artist=True,
                       medianprops={"color": "black", "linewidth": 1.5})
    cmap = plt.get_cmap("tab10")
    rng = np.random.default_rng(0)
    for i, (k, d) in enumerate(zip(runners, data)):
        box = parts["boxes"][i]
        box.set_facecolor((*cmap(i % 10)[:3], 0.35))
        box.set_gid(f"runner-{k}")
        parts["medians"][i].set_gid(f"median-{k}")
        jitter = 0.3 + rng.uniform(-0.04, 0.04, len(d))
        pts = ax.scatter(i + jitter, d, s=9, color=cmap(i % 10), alpha=0.8, zorder=3, linewidths=0)
        pts.set_gid(f"calls-{k}")
        med = statistics.median(d)
        ax.text(i - 0.25, med, f"{med:.3f} ms", ha="right", va="center", fontsize=7.5)
    ax.set_xticks(range(len(runners)), [f"{k}\n(n={len(d)})" for k, d in zip(runners, data)])
    ax.set_xlim(-0.9, len(runners) - 0.3)
    ax.set_ylabel("latency per call (ms)")
    ax.grid(True, axis="y", linewidth=0.3, alpha=0.6)
    ax.set_title(textwrap.fill(title, 70), fontsize=8, loc="left")
    return _extra.save(fig, path)
