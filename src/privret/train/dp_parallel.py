"""One DP-SGD step over several processes (``torchrun``), with exactly the guarantee of one process.

A step of :mod:`privret.train.dp_run` releases ``(s(B) + N(0, (sigma Delta)^2 I)) / (q N)`` for a Poisson sample B
of the N units at rate q. Across W processes (:class:`privret.distributed.Group`):

1. rank 0 draws B from the run's one random source and sends the unit indices; no other rank draws the sample or
   the noise (a rank draws only its own rows' hard negatives);
2. rank r clips, per unit, the units of B with ``u mod W = r`` (:meth:`~privret.distributed.Group.shard`); the
   shards partition B, so ``sum_r s_r = s(B)`` and one unit moves the sum by at most Delta;
3. rank 0 alone adds the noise (:func:`set_noisy_mean`) before one all-reduce (SUM), so its std is sigma Delta,
   not sigma Delta sqrt(W); every rank applies the same update to rank 0's parameters (:func:`sync_from_main`).

The accountant sees the same (q, sigma, T): the ledger is that of one process (docs/scaling.md, section "What
changes in the guarantee: nothing"). Opacus's ``DistributedDPOptimizer`` orders noise and all-reduce the same way
but clips per sample; privret clips per privacy unit, from ghost norms for the retriever, so the step is written here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from privret.distributed import Group
from privret.privacy.secure_rng import noise_like


def set_noisy_mean(params: Sequence[torch.Tensor], sums: Sequence[torch.Tensor], *, std: float,
                   expected_batch: float, rng, group: Group) -> None:
    """``p.grad = (sum over ranks of s + N(0, std^2 I)) / expected_batch`` for each parameter p and this
    rank's clipped sum s; the noise is drawn once, on rank 0, from ``rng`` (unused on the other ranks)."""
    noisy = [s.float().clone() for s in sums]
    if group.main:
        for s in noisy:
            s += noise_like(s, std, rng)
    group.sum_(noisy)
    for p, s in zip(params, noisy):
        p.grad = (s / expected_batch).to(p.dtype)


def sum_gradients(params: Sequence[torch.Tensor], group: Group) -> None:
    """Replace each ``p.grad`` by its sum over the ranks. A parameter no rank has a gradient for keeps none (as
    in one process, so the optimizer skips it); a rank without one where another has contributes zeros."""
    if not group.distributed:
        return
    present = torch.tensor([float(p.grad is not None) for p in params])
    group.sum_([present])
    summed = [p for p, anywhere in zip(params, present.tolist()) if anywhere]
    for p in summed:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    group.sum_([p.grad for p in summed])


def sync_from_main(params: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer, group: Group) -> None:
    """Give every rank rank 0's trainable parameters and optimizer state (a fresh start, or the checkpoint
    rank 0 resumed from), so that every rank starts from the same point."""
    if not group.distributed:
        return
    with torch.no_grad():
        group.broadcast_([p.data for p in params.values()])
    state = group.from_main(lambda: optimizer.state_dict())
    if not group.main:
        optimizer.load_state_dict(state)
