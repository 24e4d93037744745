"""Freeing what a finished pipeline stage left in memory (:func:`release_memory`), called between stages.

transformers and Opacus modules sit in reference cycles that only the cyclic garbage collector frees,
and glibc keeps freed heap unless trimmed.
"""

from __future__ import annotations

import ctypes
import gc
import sys


def release_memory() -> None:
    """Free what finished stages left: cyclic garbage (models, Opacus hooks), CUDA cache, glibc heap."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back to the OS (glibc only)
        except (OSError, AttributeError):
            pass
