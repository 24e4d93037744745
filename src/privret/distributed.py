"""The processes of one privret command under ``torchrun``: who each one is and what they exchange.

``torchrun --nproc_per_node P [--nnodes M ...] -m privret.cli ...`` starts P x M copies of the command with
``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set (``env://``). :func:`current`
reads them and, when ``WORLD_SIZE > 1``, joins the process group once: ``gloo`` without CUDA, else
``cpu:gloo,cuda:nccl``, each process on GPU ``LOCAL_RANK``. Without them it is the one-process :data:`SINGLE`,
whose collectives do nothing.

**Rank 0 is the run**: it alone writes (outputs, checkpoints, step logs, the budget registry); the others compute
and exchange tensors. :meth:`Group.from_main` runs a function on rank 0 and hands its result, or its error, to
every rank, so a refusal stops every rank with the same message instead of leaving them in a collective.

**Shards**: rank r of W owns every work item (privacy unit, prompt, pair) whose index i has ``i mod W = r``
(:meth:`Group.owns`), a partition every rank computes without communicating.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from privret.errors import InputError
from privret.runlock import RunLock

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class PeerFailed(RuntimeError):
    """Rank 0 failed with something other than bad input; the other ranks stop with this."""


@dataclass(frozen=True)
class Group:
    """This process's place among the ``world_size`` processes of one command (see the module docstring)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def owns(self, index: int) -> bool:
        return index % self.world_size == self.rank

    def shard(self, indices: Iterable[int]) -> list[int]:
        """The indices this rank owns, in their given order."""
        return [i for i in indices if self.owns(i)]

    def from_main(self, produce: Callable[[], T]) -> T:
        """``produce()`` on rank 0; its result (pickled) on every rank. An :class:`InputError` there is raised
        on every rank with the same message; any other exception there stops the others with
        :class:`PeerFailed` (and is re-raised on rank 0)."""
        if not self.distributed:
            return produce()
        box: list = [None]
        if self.main:
            try:
                box[0] = ("ok", produce())
            except InputError as err:
                box[0] = ("input", err.one_line())
                _dist().broadcast_object_list(box, src=0)
                raise
            except Exception as err:
                box[0] = ("failed", f"{type(err).__name__}: {err}")
                _dist().broadcast_object_list(box, src=0)
                raise
        _dist().broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "input":
            raise InputError(value)
        if kind == "failed":
            raise PeerFailed(f"rank 0 failed: {value}")
        return value

    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite ``tensors`` on every rank with rank 0's values (same shapes on every rank)."""
        if self.distributed:
            for t in tensors:
                _dist().broadcast(t, src=0)

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor by its sum over the ranks, in place (one all-reduce of the flattened tensors)."""
        if not self.distributed or not tensors:
            return
        import torch

        flat = torch.cat([t.reshape(-1) for t in tensors])
        _dist().all_reduce(flat, op=_dist().ReduceOp.SUM)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset: offset + t.numel()].view_as(t))
            offset += t.numel()

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value`` (pickled), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        out: list = [None] * self.world_size
        _dist().all_gather_object(out, value)
        return out

    def gather_rows(self, local: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """Every rank's rows of a 2-d tensor, in rank order (rank r holds ``sizes[r]`` rows): this rank's
        rows are ``local`` itself (gradients flow into them), the others' are constants."""
        if not self.distributed:
            return local
        import torch

        padded = local.new_zeros((max(sizes), *local.shape[1:]))
        padded[: len(local)] = local.detach()
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        _dist().all_gather(parts, padded)
        return torch.cat([local if r == self.rank else parts[r][: sizes[r]] for r in range(self.world_size)])

    def barrier(self) -> None:
        if self.distributed:
            _dist().barrier()


SINGLE = Group()


def main_lock(target: Path, *, what: str) -> contextlib.AbstractContextManager:
    """``target``'s :class:`~privret.runlock.RunLock`, taken by rank 0 only (the one process that writes)."""
    return RunLock(target, what=what) if launched().main else contextlib.nullcontext()


def launched() -> Group:
    """The group the launcher's environment describes (without joining it): :data:`SINGLE` outside torchrun."""
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size <= 1:
        return SINGLE
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if not 0 <= rank < world_size:
        raise InputError(f"RANK={rank} is not in 0..{world_size - 1}", field="RANK")
    return Group(rank=rank, world_size=world_size, local_rank=local_rank)


def current() -> Group:
    """This process's group, joined on first use (see the module docstring)."""
    group = launched()
    if group.distributed and not _dist().is_initialized():
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(group.local_rank)
            backend = "cpu:gloo,cuda:nccl"
        else:
            backend = "gloo"
        _dist().init_process_group(backend=backend, rank=group.rank, world_size=group.world_size)
    return group


def _dist():
    """``torch.distributed``, imported on first use (the CLI reads :func:`launched` before any torch import)."""
    import torch.distributed

    return torch.distributed


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"{name}={raw!r} is not an integer", field=name) from None
