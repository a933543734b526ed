"""Timing several runners side by side in one process: block alternation.

Every peer comparison (``polyml bench``, ``scripts/bench_*.py``, ``scripts/demo.py``) times its
runners with :func:`measure`; :func:`summarize` turns the times into median/min/max.

Why blocks and not call-by-call alternation
-------------------------------------------
The peers' thread pools busy-wait after each call: OpenBLAS spins for ~0.1-0.2 s, onnxruntime's
intra-op threads spin by default, TensorFlow's pool likewise, and polyml's libgomp for
``GOMP_SPINCOUNT`` iterations. When runners alternate call by call, the spinning threads of the
runner that just finished steal a core from the next one. Measured on a 1024³ fp32 MatMul with 2
threads on a 2-core host: polyml alone 183 GFLOP/s; alternating call by call with numpy's OpenBLAS
polyml fell to 86 GFLOP/s (OpenBLAS, whose calls follow polyml's short spin, stayed at 277). In
blocks of 6 calls per runner with a 0.3 s sleep before each block and the first call of each block
discarded, polyml measured 183 and OpenBLAS 282, both as when run alone.

So :func:`measure` runs rounds; in each round every runner, in turn, sleeps ``settle_s`` (the
previous runner's threads go idle), makes one untimed call (the warm-up of the block: caches,
page mappings, its own pool waking up), then ``block - 1`` timed calls, until ``repeat`` timed
calls per runner are collected. Rounds still spread slow drift of a shared host over all runners.
``block=1`` gives the old call-by-call alternation (every call timed), with ``settle_s=0`` the
spinning effect above can be reproduced.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

BLOCK = 6
"""Default calls per runner and block (the first one untimed)."""
SETTLE_S = 0.3
"""Default sleep before each block, seconds: longer than OpenBLAS's busy-wait after a call."""

Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: ``phase`` is "warm-up" or "timing"; counts are calls."""


def measure(runners: dict[str, Callable[[], object]], warmup: int = 3, repeat: int = 20, *, block: int = BLOCK,
            settle_s: float = SETTLE_S, progress: Progress | None = None,
            clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
            ) -> dict[str, list[float]]:
    """Seconds per call of each runner: ``repeat`` timed calls each, in alternating blocks.

    ``warmup`` untimed calls per runner come first (runner after runner). Then rounds: each
    runner in ``runners`` order sleeps ``settle_s`` and runs one block of ``block`` consecutive
    calls of which the first is untimed, so ``block - 1`` are timed (the last round's blocks are
    shorter when ``repeat`` is not a multiple). ``block=1`` times every call (call-by-call
    alternation, see the module docstring for why that is not the default). ``clock`` and
    ``sleep`` are for tests.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if repeat < 1 or warmup < 0 or settle_s < 0:
        raise ValueError(f"need repeat >= 1, warmup >= 0, settle_s >= 0 (got {repeat}, {warmup}, {settle_s})")
    timed_per_block = block - 1 if block > 1 else 1
    discard = 1 if block > 1 else 0
    blocks = -(-repeat // timed_per_block)
    total = len(runners) * (warmup + repeat + blocks * discard)
    done = 0

    def tick(phase: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(phase, done, total)

    if progress is not None:
        progress("warm-up", 0, total)
    for f in runners.values():
        for _ in range(warmup):
            f()
            tick("warm-up")
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(blocks):
        for k, f in runners.items():
            n = min(timed_per_block, repeat - len(times[k]))
            if settle_s:
                sleep(settle_s)
            for _ in range(discard):
                f()
                tick("timing")
            for _ in range(n):
                t = clock()
                f()
                times[k].append(clock() - t)
                tick("timing")
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per runner: ``median_ms``, ``min_ms``, ``max_ms`` and ``n`` (timed calls)."""
    return {k: {"median_ms": statistics.median(v) * 1e3, "min_ms": min(v) * 1e3, "max_ms": max(v) * 1e3, "n": len(v)}
            for k, v in times.items()}


def describe(repeat: int, block: int, settle_s: float) -> str:
    """One line for table titles and logs: how the medians were measured."""
    if block == 1:
        return f"{repeat} runs per runner, alternating call by call, settle {settle_s:g} s"
    return f"{repeat} timed runs per runner in alternating blocks of {block} (first untimed), settle {settle_s:g} s"


def add_options(p: argparse.ArgumentParser) -> None:
    """``--block`` and ``--settle`` for command lines that call :func:`measure`."""
    p.add_argument("--block", type=int, default=BLOCK,
                   help=f"calls per runner and block, the first untimed (default {BLOCK}; 1: call-by-call alternation)")
    p.add_argument("--settle", type=float, default=SETTLE_S, metavar="SECONDS",
                   help=f"sleep before each block so the previous runner's spinning threads go idle (default {SETTLE_S})")


@contextlib.contextmanager
def rich_progress(console=None, label: str = "") -> Iterator[Progress]:
    """A transient rich progress bar as a :data:`Progress` callback (for long runs), on stderr by default."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as RichProgress

    if console is None:
        console = Console(stderr=True)
    prefix = f"{label}: " if label else ""
    with RichProgress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task(f"{prefix}warm-up", total=None)

        def update(phase: str, done: int, total: int) -> None:
            bar.update(task, description=f"{prefix}{'timing (blocks)' if phase == 'timing' else phase}",
                       completed=done, total=total)

        yield update
