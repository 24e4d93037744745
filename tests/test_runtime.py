"""privret.runtime.keep_freed_memory: freed blocks stay with the process (glibc only)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

# allocates and touches 256 MiB, frees it, prints whether the setting was applied and how much
# resident memory the free gave back to the OS
PROBE = """
import ctypes, os, sys
from privret.runtime import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "on" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
size = 256 << 20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
before = rss()
libc.free(block)
print(applied, before - rss())
"""


def _probe(mode: str, **env) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": SRC, **env}).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
def test_freed_memory_stays_with_the_process():
    applied, returned = _probe("on")
    assert applied == "True"
    assert returned < 16 << 20
    # the default allocator hands the block straight back: the probe can tell the difference
    assert _probe("off")[1] > 200 << 20


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
@pytest.mark.parametrize("env", [{"PRIVRET_KEEP_FREED_MEMORY": "0"}, {"MALLOC_MMAP_THRESHOLD_": "65536"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}])
def test_the_environment_turns_it_off_or_has_tuned_malloc_already(env):
    applied, returned = _probe("on", **env)
    assert applied == "False"
    assert returned > 200 << 20
