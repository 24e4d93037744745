"""One DP-SGD step over several processes (``torchrun``), with exactly the guarantee of one process.

The mechanism of a step (:mod:`privret.train.dp_run`) releases ``(s(B) + N(0, (sigma Delta)^2 I)) / (q N)``
where B is a Poisson sample of the N units at rate q and ``s`` the trainer's clipped sum. Across W
processes (:class:`privret.distributed.Group`) the same release is computed as follows:

1. **Sampling** (:mod:`privret.train.dp_run`): rank 0 draws B from the run's one random source (the OS
   CSPRNG with ``secure_rng``), exactly as a single process does, and sends the unit indices to every
   rank. The other ranks draw neither the sample nor the noise, so nothing the accountant analyses is
   drawn twice and no rank's stream can differ from the one it assumes; a rank draws only what belongs to
   its own shard's rows (the retriever's hard negatives), from the CSPRNG too with ``secure_rng``.
2. **Clipping** on the rank that owns the unit: rank r of W takes the units of B with index ``u mod W =
   r`` (:meth:`~privret.distributed.Group.shard`) and computes the clipped sum ``s_r`` of those units,
   per unit, with the trainer's own engine. The shards partition B, and clipping is per unit, so
   ``sum_r s_r = s(B)``: adding or removing one unit changes one rank's ``s_r`` by at most Delta and the
   sum by at most Delta, the sensitivity of one process.
3. **Noise once** (:func:`set_noisy_mean`): rank 0 alone adds ``N(0, (sigma Delta)^2 I)`` from its random
   source to ``s_0``; then one all-reduce (SUM) gives every rank ``s(B) + noise``, whose noise std is
   sigma Delta (not sigma Delta sqrt(W): the other ranks add none), divided by the expected batch q N as
   in one process. Every rank then applies the same update to the same parameters (all start from rank
   0's: :func:`sync_from_main`), so they stay identical.

Hence the accountant sees the same (q, sigma, T) and the ledger is that of one process.

**Why not Opacus's distributed classes.** Opacus (1.6, ``opacus/optimizers/ddpoptimizer.py``)
``DistributedDPOptimizer`` clips the per-sample gradients Opacus's hooks store in ``p.grad_sample`` (one
row = one sample), adds noise on rank 0 only (``add_noise`` is skipped on the other ranks) and then
all-reduces ``p.grad``; ``DifferentiallyPrivateDistributedDataParallel`` (``opacus/distributed.py``) only
broadcasts rank 0's parameters at the start. privret clips per privacy *unit* (all rows of a unit summed,
one joint norm over every parameter, :mod:`privret.privacy.clipping`) and, for the retriever, from ghost
norms without per-sample gradients (:mod:`privret.privacy.logit_dp`), which that optimizer cannot
express. So this module keeps privret's engines and implements the same design by hand: noise on rank 0
only, before one all-reduce of the clipped sums, and rank 0's parameters broadcast at the start.
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
