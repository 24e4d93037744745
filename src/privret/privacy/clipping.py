"""Per-unit clipping and Gaussian noise.

Given per-row gradients g_r (rows are training pairs) and the unit u(r) of each row, the
unit gradient is G_u = sum_{r in u} g_r, clipped to ``f_u G_u`` (:func:`clip_factors`) where the
norm runs over *all* trainable parameters jointly. The released sum is
``sum_u clip(G_u) + N(0, sigma^2 C^2 I)``: adding or removing one unit changes the clipped
sum by at most C in L2, which is the sensitivity the accountant is told.
"""

from __future__ import annotations

import torch

NORM_MARGIN = 1e-5


def clip_factors(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``f = min(1, C / ((1 + NORM_MARGIN) ||G||))`` for each norm ``||G||`` (a unit's, a pair's bound, a batch's).

    Every clip of a DP mechanism here goes through this function. The margin is for float rounding: a norm
    computed in float32 can fall short of the true one, and ``f G`` is rounded again, so with ``f = C / ||G||``
    a term at or just above C can come out a few ulps above C. The margin (far above float32's relative error,
    about 1e-7 per operation) keeps every clipped term's true norm within C, so the sensitivity holds exactly.
    """
    return (clip_norm / (norms * (1 + NORM_MARGIN)).clamp_min(1e-12)).clamp(max=1.0)


def clip_units(row_grads: list[torch.Tensor], row_to_unit: torch.Tensor, n_units: int,
               clip_norm: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Sum of clipped unit gradients, per parameter, and each unit's pre-clipping norm.

    ``row_grads[k]`` has shape ``(rows, *param_shape)``; ``row_to_unit`` maps rows to
    ``0..n_units-1``.
    """
    unit_grads = []
    for g in row_grads:
        summed = torch.zeros((n_units, *g.shape[1:]), dtype=torch.float32, device=g.device)
        summed.index_add_(0, row_to_unit.to(g.device), g.float())
        unit_grads.append(summed)
    sq_norms = torch.zeros(n_units, dtype=torch.float32, device=row_to_unit.device)
    for g in unit_grads:
        sq_norms += g.reshape(n_units, -1).pow(2).sum(dim=1).to(sq_norms.device)
    norms = sq_norms.sqrt()
    factors = clip_factors(norms, clip_norm)
    clipped_sums = [torch.einsum("u,u...->...", factors.to(g.device), g) for g in unit_grads]
    return clipped_sums, norms


def gaussian_noise_like(tensor: torch.Tensor, std: float, generator: torch.Generator) -> torch.Tensor:
    """N(0, std^2) noise of ``tensor``'s shape, drawn on CPU from ``generator`` (moved afterwards)."""
    noise = torch.normal(0.0, std, size=tensor.shape, generator=generator, dtype=torch.float32)
    return noise.to(tensor.device)
