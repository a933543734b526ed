"""``--target cuda-emulated``: a CUDA build's kernels executed on an emulated grid on the CPU.

The kernels are the IR the GPU builder wrote for the NVPTX back end (``kernels/<op>.ll`` of the
artifact, the same modules that became ``ptx/<op>.ptx``), and the run follows the same plan as
on a device (:class:`polyml.gpu.runtime.CudaPlan`: slots, arena offsets, launch order, grid and
block dimensions).  Stages, one file each:

* :mod:`~polyml.gpu.emulate.rewrite` — NVPTX IR → host IR: special registers from the emulated
  thread's context, shared memory per block, barriers into the runtime, every load and store
  bounds-checked against the array it addresses;
* ``runtime.c`` — the grid: blocks one after another, a block's threads in a loop, or as fibres
  meeting at barriers when the kernel has any (a barrier not every thread reaches is an error);
* :mod:`~polyml.gpu.emulate.compile` — clang-19 ``-O2``, one cached shared object per artifact;
* :mod:`~polyml.gpu.emulate.launch` — :class:`EmulatedModel`: the plan on the emulator back end,
  faults reported as :class:`~polyml.errors.EmulationError` naming the kernel, thread, block and
  array.
"""

from __future__ import annotations

from polyml.gpu.emulate.launch import EmulatedModel, EmulatorBackend

__all__ = ["EmulatedModel", "EmulatorBackend"]
