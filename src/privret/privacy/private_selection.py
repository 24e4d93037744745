"""DP choice of one candidate model by its quality on the private log: the exponential mechanism (McSherry and
Talwar 2007; Dwork and Roth 2014, section 3.4).

The ``k`` candidates are fixed before scoring: public models, or models derived from the log only through DP
releases composed with this one. Each privacy unit ``u`` gives candidate ``j`` a score ``s_uj`` in [0, 1] that depends
only on ``u``'s rows, ``j`` and public data (:mod:`privret.train.private_selection`), so ``U_j = sum_u s_uj`` moves by
at most ``Delta = 1`` when a unit is added, removed or replaced. Candidate ``j`` is released with probability
proportional to ``exp(epsilon U_j / (2 Delta))``: epsilon-DP, delta = 0, sampled exactly as the Gumbel-max
``argmax_j epsilon U_j / (2 Delta) + G_j``, ``G_j = -ln(-ln v)`` with v uniform in (0, 1) from the OS CSPRNG
(:class:`~privret.privacy.secure_rng.SecureRandom`). Only the index is released; the utilities are never written.

With probability at least 1 - beta the chosen candidate's mean score is within
``2 Delta (ln k + ln(1 / beta)) / (epsilon n)`` of the best one's (n units). Composition with the candidates' own
releases: docs/privacy.md, section "Choosing a retriever with the private log".
"""

from __future__ import annotations

import math

import numpy as np

from privret.data.pairs import UNIT_DEFINITIONS, PrivacyUnit
from privret.errors import InputError
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.hold_out import LogPart
from privret.privacy.secure_rng import CSPRNG, SecureRandom

MECHANISM = "exponential-mechanism"
SENSITIVITY = 1.0  # each unit's score lies in [0, 1]


def selection_ledger(*, epsilon: float, n_units: int, unit: str, n_pairs: int, data_hash: str,
                     dataset_id: str, part: LogPart | None = None) -> PrivacyLedger:
    """What one choice costs: (epsilon, 0)-DP per ``unit``; it depends on the log only through n (public).
    ``noise_multiplier`` records the Gumbel scale 2 Delta / epsilon, ``clip_norm`` the score bound Delta.
    ``part``: the part of the log the scores read, when they read one part only."""
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise InputError(f"must be a positive finite number, not {epsilon:g}", field="epsilon")
    return PrivacyLedger(mechanism=MECHANISM, epsilon=epsilon, delta=0.0, noise_multiplier=2 * SENSITIVITY / epsilon,
                         sample_rate=1.0, steps=1, planned_steps=1, accountant="exponential", unit=unit,
                         n_units=n_units, n_pairs=n_pairs, clip_norm=SENSITIVITY, model="", trainable="",
                         data_hash=data_hash, dataset_id=dataset_id, secure_rng=True,
                         random_sources={"noise": CSPRNG},
                         unit_definition=UNIT_DEFINITIONS[PrivacyUnit(unit)], part=part)


def choose(scores: np.ndarray, epsilon: float, *, rng: SecureRandom | None = None) -> int:
    """The exponential mechanism over candidates: ``scores`` is (units x candidates), each entry in [0, 1].

    Record the release in the budget registry *before* calling this (the noise is drawn here).
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] == 0:
        raise ValueError(f"scores must be units x candidates, got shape {scores.shape}")
    if scores.size and (not np.isfinite(scores).all() or scores.min() < 0 or scores.max() > SENSITIVITY):
        raise ValueError("every unit's score must lie in [0, 1]: the sensitivity bound depends on it")
    utility = scores.sum(axis=0)
    v = (rng or SecureRandom()).uniform(scores.shape[1]).numpy()
    # v lies in (0, 1]; v = 1 gives -ln(0) = +inf, a Gumbel draw of +inf with probability 2^-53: cap it
    gumbel = -np.log(np.maximum(-np.log(v), np.finfo(np.float64).tiny))
    return int(np.argmax(epsilon * utility / (2 * SENSITIVITY) + gumbel))


def selection_probabilities(scores: np.ndarray, epsilon: float) -> np.ndarray:
    """The exact distribution :func:`choose` samples from (for tests and for reasoning about a budget)."""
    logits = epsilon * np.asarray(scores, dtype=np.float64).sum(axis=0) / (2 * SENSITIVITY)
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()
