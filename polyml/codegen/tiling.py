"""Cache parameters of the host and the tile sizes derived from them (``--tile-sizes``).

The tiled nest is the convolution's accumulation (:func:`polyml.kernels.conv._accumulate`):
its schedule ``[n, g, mB, o, owB, c, j...]`` re-reads the whole input plane set
``src[n, g*Cg : (g+1)*Cg, :, :]`` once per output-channel block ``mB``.  Strip-mining the
first output-row dimension ``o = rT*R + r`` and hoisting ``rT`` outside ``mB`` (legal: ``n, g,
mB, o, owB`` carry no dependence, so any permutation of them is) makes the reuse distance of a
source row one row tile: ``Cg * (R*s + (kh-1)*d) * row_bytes``, chosen to fit the budget (half
the L2 by default, the other half for the weights and the output block's rows).
"""

from __future__ import annotations

from dataclasses import dataclass

from polyml.driver.toolchain import parse_size, target_data_caches
from polyml.errors import PolymlError

FALLBACK = {1: 32 * 1024, 2: 1024 * 1024}


def cache_sizes() -> dict[int, int]:
    """Data/unified cache size per level of the target (:func:`target_data_caches`), with
    32K L1 / 1M L2 where it does not say."""
    return FALLBACK | {level: size for level, (size, _ways) in target_data_caches().items()}


@dataclass(frozen=True)
class TilePlan:
    """Resolved tiling: ``conv_bytes`` is the budget of a conv row tile's source slice (0: off)."""

    spec: str
    l1: int
    l2: int
    conv_bytes: int

    def to_json(self) -> dict:
        return {"spec": self.spec, "l1": self.l1, "l2": self.l2, "conv_bytes": self.conv_bytes}


def resolve(spec: str = "auto") -> TilePlan:
    """``spec``: ``auto`` (host caches), ``off``, or comma-separated ``l1=SIZE``, ``l2=SIZE``,
    ``conv=SIZE`` overriding the host's values (sizes like ``48K``, ``2M``)."""
    caches = cache_sizes()
    l1, l2 = caches.get(1, FALLBACK[1]), caches.get(2, FALLBACK[2])
    spec = (spec or "auto").strip()
    if spec == "off":
        return TilePlan(spec, l1, l2, 0)
    conv = None
    if spec != "auto":
        for item in spec.split(","):
            key, sep, val = item.partition("=")
            if not sep or key.strip() not in ("l1", "l2", "conv"):
                raise PolymlError(f"--tile-sizes {spec!r}: expected auto, off or l1=SIZE,l2=SIZE,conv=SIZE")
            try:
                n = parse_size(val)
            except ValueError as e:
                raise PolymlError(f"--tile-sizes {spec!r}: {e}") from None
            if key.strip() == "l1":
                l1 = n
            elif key.strip() == "l2":
                l2 = n
            else:
                conv = n
    return TilePlan(spec, l1, l2, l2 // 2 if conv is None else conv)
