"""DP randomness from the operating system's CSPRNG (``--secure-rng``).

DP-SGD's proof assumes that its noise and its Poisson sampling are secret. A ``torch.Generator`` (Mersenne Twister)
is not cryptographic: whoever sees enough of its outputs can predict the rest. This module draws every random bit
from ``os.urandom`` (``getrandom(2)`` on Linux) and shapes it in float64:

* uniforms ``u = ((b >> 11) + 1) 2^-53`` in (0, 1] from 64 random bits ``b`` (53 significant bits);
* Gaussians by Box-Muller, ``z1, z2 = sqrt(-2 ln u1) (cos, sin)(2 pi u2)``, independent N(0, 1) for independent
  uniforms u1, u2, then scaled by ``std`` and cast to float32;
* Poisson sampling: unit i joins the batch iff ``u_i < q``.

Not covered: float noise is not exactly Gaussian and its low-order bits can leak (Mironov, CCS 2012; Jin et al.,
S&P 2022); a CSPRNG removes the seed-prediction attack, not that one.
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

from privret.privacy.clipping import gaussian_noise_like

_BLOCK = 1 << 20  # values per os.urandom call (bounds the float64 working memory to ~24 MiB)
# The sources a ledger's ``random_sources`` names: this module, and a torch generator (Mersenne Twister on a CPU,
# Philox for CUDA tensors) seeded with 64 bits of os.urandom when its run starts, each process its own.
CSPRNG = "os.urandom"
SEEDED_FROM_OS = "torch generator seeded from os.urandom"


class SecureRandom:
    """Uniforms and Gaussians from ``os.urandom``; has no state to seed, save or replay."""

    secure = True

    def uniform(self, n: int) -> torch.Tensor:
        """``n`` float64 uniforms in (0, 1]."""
        bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        return torch.from_numpy(((bits >> np.uint64(11)).astype(np.float64) + 1.0) * 2.0 ** -53)

    def standard_normal(self, n: int) -> torch.Tensor:
        """``n`` float64 N(0, 1) draws by Box-Muller."""
        out = torch.empty(n, dtype=torch.float64)
        for lo in range(0, n, 2 * _BLOCK):
            m = min(2 * _BLOCK, n - lo)
            half = (m + 1) // 2
            u1, u2 = self.uniform(half), self.uniform(half)
            radius = torch.sqrt(-2.0 * torch.log(u1))
            angle = (2.0 * math.pi) * u2
            out[lo: lo + m] = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:m]
        return out

    def normal_like(self, tensor: torch.Tensor, std: float) -> torch.Tensor:
        noise = (self.standard_normal(tensor.numel()) * std).to(torch.float32).reshape(tensor.shape)
        return noise.to(tensor.device)


class SecurePoissonUnitSampler:
    """Poisson sampling of units (each joins with probability q) from the CSPRNG."""

    def __init__(self, n_units: int, sample_rate: float, rng: SecureRandom | None = None):
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.n_units = n_units
        self.sample_rate = sample_rate
        self.rng = rng or SecureRandom()

    def sample(self) -> list[int]:
        return (self.rng.uniform(self.n_units) < self.sample_rate).nonzero().flatten().tolist()


def noise_like(tensor: torch.Tensor, std: float, rng) -> torch.Tensor:
    """N(0, std^2) noise of ``tensor``'s shape from ``rng`` (a :class:`SecureRandom` or a torch.Generator)."""
    if isinstance(rng, SecureRandom):
        return rng.normal_like(tensor, std)
    return gaussian_noise_like(tensor, std, rng)
