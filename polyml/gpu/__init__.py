"""GPU offload in the style of Polly-ACC: polyml's loop nests as NVPTX kernels.

* :mod:`polyml.gpu.builder` — a :class:`~polyml.codegen.builder.KernelBuilder` that outlines
  every top-level loop nest of an op into its own ``nvptx64-nvidia-cuda`` kernel, records the
  nest's iteration domain and access relations while the unchanged kernels' ``lower()`` runs,
  and, given a mapping, turns band loops into block/thread indices with bound guards;
* :mod:`polyml.gpu.mapping` — the polyhedral side with islpy: dependences of a nest, the
  coincident (parallel) dimensions of its outer band, the choice of grid dimensions and tile
  sizes, and the check that the grid executes every domain point exactly once;
* :mod:`polyml.gpu.lower` and :mod:`polyml.gpu.build` — graph → per-op PTX modules, the launch
  plan and the artifact (``--target cuda``);
* :mod:`polyml.gpu.runtime` — the host side through the CUDA driver API (``cuda-bindings``).
"""

from __future__ import annotations

DEFAULT_SM = "sm_90"
TRIPLE = "nvptx64-nvidia-cuda"
