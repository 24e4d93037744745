"""Process-level settings for long training runs on CPU."""

from __future__ import annotations

import ctypes
import os
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_"}


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of handing it back to the OS.

    A DP step frees and allocates the same large buffers every step (for the per-sample norms, the
    output gradients of every trainable layer stay alive until the clipping factors are known). With
    glibc's defaults, blocks above the mmap threshold (dynamic, at most 32 MiB) are mapped and
    unmapped on every allocation and the top of the heap is trimmed, so each step pays page faults to
    map and zero that memory again (docs/direct-dp.md, section "Speed and memory", has the measured effect).

    Sets M_MMAP_THRESHOLD to 1 GiB (32 MiB where glibc refuses more; blocks below it come from the heap) and M_TRIM_THRESHOLD to
    2 GiB - 1 (freed heap memory stays with the process), so the process keeps its peak heap until
    it exits. Returns True when both settings were accepted; False, changing nothing, on a C library
    other than glibc, when the environment sets ``PRIVRET_KEEP_FREED_MEMORY=0``, or when it already
    tunes malloc (``MALLOC_*_`` variables, ``GLIBC_TUNABLES=glibc.malloc...``).
    """
    if os.environ.get("PRIVRET_KEEP_FREED_MEMORY", "1") == "0" or platform.libc_ver()[0] != "glibc":
        return False
    if _USER_SETTINGS.intersection(os.environ) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False  # malloc was tuned on purpose; leave it so
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # glibc before 2.35 caps the threshold at 32 MiB
    mapped = libc.mallopt(_M_MMAP_THRESHOLD, 1 << 30) or libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)
    return bool(mapped and trimmed)
