"""Noise calibration and privacy accounting for Poisson-subsampled Gaussian mechanisms.

DP-SGD releases, at each of ``T`` steps, a sum of per-unit gradients clipped to norm ``C``
plus ``N(0, sigma^2 C^2 I)``, over a batch in which each of the ``n`` units is included
independently with probability ``q`` (Poisson sampling). The accountant (Opacus's PRV or RDP)
bounds the (epsilon, delta) of the T-fold composition of this subsampled Gaussian mechanism;
we calibrate sigma as the smallest noise that meets the target epsilon (Opacus's binary
search, tolerance 0.01 in epsilon).
"""

from __future__ import annotations

import math

from opacus.accountants import create_accountant
from opacus.accountants.utils import get_noise_multiplier

from privret.errors import InputError

ACCOUNTANTS = ("prv", "rdp")
MIN_EPSILON, MAX_EPSILON = 0.05, 50.0  # targets the noise calibration handles in bounded time
MAX_STEPS = 100_000


def default_delta(n_units: int) -> float:
    """Carranza et al.'s choice, delta = 1 / (2 n), with n the number of privacy units."""
    return 1.0 / (2 * n_units)


def check_budget(epsilon: float, delta: float, n_units: int) -> None:
    """Reject budgets that are meaningless or that do not protect a unit (delta >= 1/n)."""
    if math.isnan(epsilon) or epsilon <= 0:
        raise InputError(f"epsilon must be > 0 (or inf for no privacy), got {epsilon}", field="epsilon")
    if not math.isfinite(epsilon):
        return
    if not MIN_EPSILON <= epsilon <= MAX_EPSILON:
        # outside this range Opacus's noise search does not end in useful time; epsilon > 50 protects nothing in
        # practice, use inf for a non-private reference
        raise InputError(f"target epsilon must be in [{MIN_EPSILON}, {MAX_EPSILON}] (or inf), got {epsilon}",
                         field="epsilon")
    if not (0 < delta < 1.0 / n_units):
        raise InputError(f"delta must be in (0, 1/n) = (0, {1.0 / n_units:.3g}) for n={n_units} units, got {delta}",
                         field="delta")


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise InputError(f"unknown accountant '{accountant}' (choose from {', '.join(ACCOUNTANTS)})",
                         field="accountant")


def calibrate_noise(*, target_epsilon: float, delta: float, sample_rate: float, steps: int,
                    accountant: str = "prv") -> float:
    """Noise multiplier sigma such that ``steps`` subsampled Gaussian steps spend <= target_epsilon."""
    _check_accountant(accountant)
    if not 0 < sample_rate <= 1:
        raise InputError(f"sample rate must be in (0, 1], got {sample_rate}", field="batch_size")
    if steps > MAX_STEPS:
        raise InputError(f"{steps} steps is past what the accountant calibrates here (at most {MAX_STEPS}); "
                         "use fewer epochs or a larger batch", field="epochs")
    return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta,
                                      sample_rate=sample_rate, steps=steps, accountant=accountant))


def spent_epsilon(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  accountant: str = "prv") -> float:
    """Epsilon that ``steps`` steps at (sigma, q) cost at ``delta`` under ``accountant``."""
    _check_accountant(accountant)
    if steps == 0:
        return 0.0
    acc = create_accountant(mechanism=accountant)
    acc.history = [(noise_multiplier, sample_rate, steps)]
    return float(acc.get_epsilon(delta=delta))
