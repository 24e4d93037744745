"""Seeded orders that do not depend on a file's order: every split and sample of privret's data builders.

An item with key ``k`` ranks by ``sha256("<seed>:<k>")`` (hex digest). The order is a pseudo-random shuffle fixed by
the seed alone, so reordering the input file, or adding items, never moves the others relative to each other; the
first ``n`` items of it are a seeded sample. Public and reproducible by design: nothing here is private randomness
(DP sampling and noise draw from :mod:`privret.privacy.secure_rng`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def seeded_digest(seed: int | str, key: str) -> str:
    """The rank key of ``key`` under ``seed``: the hex ``sha256("<seed>:<key>")``."""
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def seeded_unit(seed: int | str, key: str) -> float:
    """A number in [0, 1) fixed by ``seed`` and ``key``: the first 15 hex digits of :func:`seeded_digest`."""
    return int(seeded_digest(seed, key)[:15], 16) / 16 ** 15


def seeded_order(items: Iterable[T], seed: int | str, key: Callable[[T], str] = str) -> list[T]:
    """``items`` sorted by :func:`seeded_digest` of ``key(item)`` (the item itself as a string by default)."""
    return sorted(items, key=lambda item: seeded_digest(seed, key(item)))
