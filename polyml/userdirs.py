"""Where polyml keeps files between runs (a leaf module: the compile cache and the CUDA
emulator's libraries both live under :func:`cache_dir`)."""

from __future__ import annotations

from pathlib import Path

from polyml import options as settings

ENV_CACHE_DIR = "POLYML_CACHE_DIR"


def cache_dir() -> Path:
    """``$POLYML_CACHE_DIR``, else platformdirs' user cache folder for polyml."""
    env = settings.raw(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("polyml", appauthor=False))
