"""Loading any artifact folder: a CPU build, or a CUDA build on the device or on the emulator."""

from __future__ import annotations

import os

from polyml.errors import ModelFormatError
from polyml.gpu.emulate import EmulatedModel
from polyml.gpu.runtime import CudaModel, is_cuda_artifact
from polyml.runtime.model import CompiledModel


def load_artifact(directory: str | os.PathLike, target: str | None = None):  # noqa: ANN201 - CompiledModel | CudaModel
    """The runnable model for an artifact folder: :class:`CudaModel` for a CUDA build (on the
    device, or with ``target="cuda-emulated"`` on the emulator)."""
    if target == "cuda-emulated":
        if not is_cuda_artifact(directory):
            raise ModelFormatError(f"{directory}: --target cuda-emulated runs CUDA builds (polyml build --target cuda); "
                                   "this folder is not one")
        return EmulatedModel(directory)
    if is_cuda_artifact(directory):
        return CudaModel(directory)
    if target == "cuda":
        raise ModelFormatError(f"{directory}: --target cuda runs CUDA builds (polyml build --target cuda); this folder "
                               "is not one")
    return CompiledModel(directory)


__all__ = ["load_artifact"]
