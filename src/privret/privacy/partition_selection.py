"""DP choice of documents from a private log: Laplace partition selection.

Which documents carry private queries is private: a document with a single private query reveals
that query's unit. Writing synthetic queries only for "the documents of the log" therefore
releases the log outside the generator's mechanism. This module offers a DP alternative to a
public document list (Korolova, Kenthapadi, Mishra and Ntoulas 2009; the thresholded-Laplace
partition selection of Desfontaines, Voss, Gipson and Mandayam 2022, section 3):

1. **Bounded contribution.** Each unit keeps at most ``m = max_docs_per_unit`` of its distinct
   documents (a uniform random subset when it has more), and counts 1 for each.
2. **Noisy counts.** ``c_d + Lap(b)`` with ``b = m / epsilon`` for every document with c_d >= 1.
3. **Threshold.** Release the set of documents whose noisy count exceeds
   ``tau = 1 + b ln(m / (2 delta))``; counts are not released.

Guarantee (add/remove one unit u, which touches at most m documents). On the documents that
other units also carry, the count vectors differ by at most m in L1, so their noisy counts are
epsilon-DP (Laplace mechanism) and thresholding them is post-processing. A document that only u
carries has count 1 with u and is absent without it; it is released with probability
``P[1 + Lap(b) > tau] = exp(-(tau - 1) / b) / 2``, so one of at most m such documents with
probability at most ``m exp(-(tau - 1) / b) / 2 = delta``. Hence, with u present,
``P[S in E] <= e^epsilon P'[S in E] + delta``. With u removed, the event "none of u's own
documents is released" has probability >= 1 - delta under the larger log and is independent of
the shared documents' noise, so ``P'[S in E] <= e^epsilon P[S in E] / (1 - delta)``. The ledger
therefore charges ``epsilon + ln(1 / (1 - delta))`` (at delta = 1e-4 that adds 1e-4), and the
release is (that, delta)-DP. Randomness (the subset of step 1 and the noise) comes from the OS
CSPRNG (:class:`~privret.privacy.secure_rng.SecureRandom`); floating-point attacks on the Laplace
sampler are out of scope, as for the Gaussian noise of DP-SGD.

The threshold grows like ``ln(1/delta) / epsilon``: on a log where most documents have one or
two queries (SciFact: 919 pairs over 565 documents) almost nothing passes it. The selection
pays only where many units share a document.
"""

from __future__ import annotations

import math
from collections import Counter


from privret.data.pairs import UNIT_DEFINITIONS, PrivacyUnit, TrainingPairs
from privret.errors import InputError
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.partition_selection_config import PartitionSelectionConfig
from privret.privacy.secure_rng import CSPRNG, SecureRandom

MECHANISM = "laplace-partition-selection"


def selection_threshold(cfg: PartitionSelectionConfig, delta: float) -> float:
    """tau = 1 + b ln(m / (2 delta)), b = m / epsilon (never below 1)."""
    scale = cfg.max_docs_per_unit / cfg.epsilon
    return 1.0 + scale * max(0.0, math.log(cfg.max_docs_per_unit / (2.0 * delta)))


def selection_epsilon(cfg: PartitionSelectionConfig, delta: float) -> float:
    """What the ledger charges: epsilon + ln(1 / (1 - delta)) (module docstring)."""
    return cfg.epsilon - math.log1p(-delta)


def _laplace(rng: SecureRandom, n: int, scale: float) -> list[float]:
    """``n`` draws of Lap(scale) as the difference of two Exp(1) draws, -ln(u) with u in (0, 1]."""
    u = rng.uniform(2 * n)
    exp = -u.log()
    return (scale * (exp[:n] - exp[n:])).tolist()


def selection_ledger(pairs: TrainingPairs, unit: PrivacyUnit, cfg: PartitionSelectionConfig, *,
                     data_hash: str, dataset_id: str) -> PrivacyLedger:
    """What :func:`select_documents` will cost; it depends on the log only through n (public).
    ``dataset_id``: the dataset it is charged to in the budget registry."""
    n = len(pairs.units(unit))
    delta = cfg.delta if cfg.delta is not None else 1.0 / (10 * n)
    if delta >= 1.0 / n:
        raise InputError(f"delta {delta:g} must be below 1/n = {1.0 / n:g}", field="delta")
    m = cfg.max_docs_per_unit
    return PrivacyLedger(mechanism=MECHANISM, epsilon=selection_epsilon(cfg, delta), delta=delta,
                         noise_multiplier=m / cfg.epsilon, sample_rate=1.0, steps=1, planned_steps=1,
                         accountant="laplace", unit=unit.value, n_units=n, n_pairs=len(pairs.pairs),
                         clip_norm=float(m), model="", trainable="", data_hash=data_hash, dataset_id=dataset_id,
                         secure_rng=True, random_sources={"unit subsets": CSPRNG, "noise": CSPRNG},
                         unit_definition=UNIT_DEFINITIONS[unit])


def select_documents(pairs: TrainingPairs, unit: PrivacyUnit, cfg: PartitionSelectionConfig, ledger: PrivacyLedger,
                     *, rng: SecureRandom | None = None) -> list[str]:
    """The DP-selected document ids, sorted.

    The mechanism protects the *set* of documents that pass; the order must carry nothing more. In the order of
    first appearance in the log, one unit added ahead of the others could swap two documents that both pass, and
    a seeded sample by position (:func:`privret.synth.documents.sampled`) would then keep other documents: the
    output would tell the neighbours apart with certainty. The noise is drawn for the candidates in sorted order
    too, so the output is a function of the counts and the noise alone.

    ``ledger`` is :func:`selection_ledger`'s; record it in the budget registry *before* calling
    this (the noise is drawn here, and a crash after it must still count).
    """
    rng = rng or SecureRandom()
    units = pairs.units(unit)
    m = cfg.max_docs_per_unit
    counts: Counter[str] = Counter()
    for rows in units:
        docs = list(dict.fromkeys(pairs.pairs[i].doc_id for i in rows))
        if len(docs) > m:  # a uniform random m-subset (independent of every other unit)
            keys = rng.uniform(len(docs)).tolist()
            docs = [d for _, d in sorted(zip(keys, docs))[:m]]
        counts.update(docs)
    candidates = sorted(counts)  # not the log's order: see above
    noise = _laplace(rng, len(candidates), m / cfg.epsilon)
    tau = selection_threshold(cfg, ledger.delta)
    return [d for d, z in zip(candidates, noise) if counts[d] + z > tau]
