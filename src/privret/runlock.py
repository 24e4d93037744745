"""One process per output directory, and recovery of what a killed process left behind.

:class:`RunLock` takes an exclusive, non-blocking ``fcntl.flock`` on ``<parent>/.<name>.lock``, *beside* the
directory: privret replaces whole directories by rename (:func:`privret.io.atomic_path`), and a lock inside the old
one would not exclude a process that opens the new one. A second process gets an :class:`~privret.errors.InputError`
at once and writes nothing. The kernel drops the lock when its holder dies (also on ``kill -9``); the lock file is
never unlinked, which would let two processes lock two inodes under one name. ``flock`` is reliable on local file
systems; on NFS it depends on the server (docs/reliability.md, section 1).

:func:`recover_directory` undoes the one non-atomic moment of :func:`privret.io.atomic_path` for directories
(``target`` renamed to ``.<name>.old``, the staged copy not yet renamed in) and removes stale staging directories
(``.<name>.*.tmp``). Call it only while holding the lock.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from pathlib import Path

from privret.errors import InputError

_HELD: dict[str, int] = {}  # lock path -> fd, for this process (nested use is an error, not a deadlock)


def lock_path(target: str | Path) -> Path:
    target = Path(target).absolute()
    return target.parent / f".{target.name}.lock"


class RunLock:
    """Context manager: exclusive ownership of ``target`` (a run or output directory) for this process."""

    def __init__(self, target: str | Path, *, what: str = "run directory"):
        self.target = Path(target)
        self.what = what
        self.path = lock_path(target)
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        key = str(self.path)
        if key in _HELD:
            raise InputError(f"this process already holds the lock of this {self.what}", path=self.target)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise InputError(f"another privret process{holder} is using this {self.what} (lock {self.path}); "
                             "wait for it to finish or choose another directory", path=self.target) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        _HELD[key] = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        _HELD.pop(str(self.path), None)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def recover_directory(target: str | Path) -> list[str]:
    """Finish what an interrupted :func:`privret.io.atomic_path` left; returns what was done.

    * ``target`` missing but ``.<name>.old`` present: the process died between the two renames
      of a directory swap; the old directory (complete) is moved back.
    * ``.<name>.old`` beside an existing ``target``: a finished swap whose clean-up was cut; removed.
    * ``.<name>.*.tmp`` staging directories: never renamed into place; removed (they may hold
      model weights, so leaving them would also leave private-data-derived bytes on disk).
    """
    target = Path(target)
    actions: list[str] = []
    parent = target.parent
    if not parent.is_dir():
        return actions
    old = parent / f".{target.name}.old"
    if old.exists():
        if not target.exists():
            os.replace(old, target)
            actions.append(f"restored {target.name} from an interrupted directory swap")
        else:
            shutil.rmtree(old, ignore_errors=True)
            actions.append(f"removed {old.name}")
    staging = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}\.tmp")  # tempfile.mkdtemp's names
    for stale in parent.iterdir():
        if not staging.fullmatch(stale.name):
            continue
        shutil.rmtree(stale, ignore_errors=True)
        actions.append(f"removed {stale.name}")
    return actions


def recover_tree(root: str | Path, *, depth: int = 3) -> list[str]:
    """:func:`recover_directory` for every interrupted swap or staging directory under ``root``
    (``depth`` levels), e.g. a whole pipeline run directory. Call it only while holding the lock."""
    root = Path(root)
    actions: list[str] = []
    if not root.is_dir():
        return actions
    pattern = re.compile(r"\.(.+?)(?:\.[a-z0-9_]{8}\.tmp|\.old)")
    targets = set()
    for entry in root.iterdir():
        match = pattern.fullmatch(entry.name)
        if match and entry.is_dir():
            targets.add(root / match.group(1))
    for target in sorted(targets):
        actions += recover_directory(target)
    if depth > 1:
        for sub in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            actions += recover_tree(sub, depth=depth - 1)
    return actions
