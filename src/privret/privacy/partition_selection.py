"""DP choice of documents from a private log: Laplace partition selection (Korolova, Kenthapadi, Mishra and
Ntoulas 2009; Desfontaines, Voss, Gipson and Mandayam 2022, section 3).

Which documents carry private queries is private, so a synthetic set's documents come from the log only through
this mechanism:

1. each unit counts 1 for at most ``m = max_docs_per_unit`` of its distinct documents (a uniform random subset);
2. every document with count ``c_d >= 1`` gets ``c_d + Lap(b)``, ``b = m / epsilon``;
3. the documents whose noisy count exceeds ``tau = 1 + b ln(m / (2 delta))`` are released; counts are not.

Under add/remove of one unit the release is ``(epsilon + ln(1 / (1 - delta)), delta)``-DP, which the ledger
charges; proof: docs/privacy.md, section "Which documents get synthetic queries". The random subsets and the noise
come from the OS CSPRNG (:class:`~privret.privacy.secure_rng.SecureRandom`). The threshold grows like
``ln(1 / delta) / epsilon``, so only documents that many units share pass it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from privret.data.pairs import UNIT_DEFINITIONS, PrivacyUnit, TrainingPairs
from privret.errors import InputError
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.secure_rng import CSPRNG, SecureRandom

if TYPE_CHECKING:
    from privret.settings.partition_selection import PartitionSelectionConfig

MECHANISM = "laplace-partition-selection"


def selection_threshold(cfg: PartitionSelectionConfig, delta: float) -> float:
    """tau = 1 + b ln(m / (2 delta)), b = m / epsilon (never below 1)."""
    scale = cfg.max_docs_per_unit / cfg.epsilon
    return 1.0 + scale * max(0.0, math.log(cfg.max_docs_per_unit / (2.0 * delta)))


def selection_epsilon(cfg: PartitionSelectionConfig, delta: float) -> float:
    """What the ledger charges: epsilon + ln(1 / (1 - delta)) (docs/privacy.md, "Which documents get synthetic
    queries", has the argument)."""
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
