"""Poisson sampling of privacy units, the sampling scheme the accountants assume.

At every step each of the ``n`` units joins the batch independently with probability ``q``;
batch sizes therefore vary (mean ``q n``) and may be zero, in which case the step still
releases noise. Shuffling into fixed-size batches would *not* match the accountant.
"""

from __future__ import annotations

import torch


class PoissonUnitSampler:
    def __init__(self, n_units: int, sample_rate: float, generator: torch.Generator):
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.n_units = n_units
        self.sample_rate = sample_rate
        self.generator = generator

    def sample(self) -> list[int]:
        """Indices of the units in the next batch."""
        mask = torch.rand(self.n_units, generator=self.generator) < self.sample_rate
        return mask.nonzero().flatten().tolist()
