"""The server side of PDD-AS2: FedAvg weighted by client data size (Wang's thesis, eq. 3.6), DP wrappers, bytes.

``Theta_global = sum_i |D_i| / sum_j |D_j| Theta_i``: Flower's message-based ``FedAvg`` computes it from each
reply's ``num-examples``; :func:`weighted_mean` is the numpy reference.

Client-level DP (DP-FedAvg, McMahan et al. 2018, as Flower implements it): each update
``Theta_i - Theta_global`` is clipped to L2 norm ``C`` (on the server, or on the client), the updates are averaged
*uniformly* (``dp-weight = 1``: the sensitivity ``C / m`` holds only for a uniform average of ``m`` clients), and
Gaussian noise of std ``sigma C / m`` is added, drawn from the OS CSPRNG (:class:`_NoiseFromOs`, in place of
Flower's numpy draw). Every client takes part in every round, so :func:`dp_ledger` composes ``rounds`` Gaussian
mechanisms at sampling rate 1. The guarantee covers the model updates only: evaluation metrics and personalised
query encoders are not noised (docs/federated.md, section "Differential privacy (optional)").
"""

from __future__ import annotations

import numpy as np

from privret.settings.federated import FedConfig
from privret.privacy.accounting import spent_epsilon
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.secure_rng import CSPRNG, SecureRandom, noise_like

WEIGHT_KEY = "num-examples"
DP_WEIGHT_KEY = "dp-weight"


def weighted_mean(arrays: list[list[np.ndarray]], weights: list[float]) -> list[np.ndarray]:
    """Eq. 3.6 on lists of arrays: ``sum_i w_i / sum_j w_j * arrays_i``."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must sum to a positive number")
    return [sum(w / total * a[k].astype(np.float64) for a, w in zip(arrays, weights)) for k in range(len(arrays[0]))]


class _NoiseFromOs:
    """Put before one of Flower's DP wrappers (a base class): the aggregate's noise, N(0, (sigma C / m)^2) per
    coordinate as Flower's, drawn from the OS CSPRNG by privret's noise function
    (:func:`~privret.privacy.secure_rng.noise_like`) instead of Flower's ``np.random.normal``, numpy's global
    Mersenne Twister (whose state enough of its outputs reveal)."""

    def _add_noise_to_aggregated_arrays(self, aggregated_arrays):
        import torch
        from flwr.app import Array, ArrayRecord

        std, rng = self.noise_multiplier * self.clipping_norm / self.num_sampled_clients, SecureRandom()
        noised = {}
        for key, array in aggregated_arrays.items():
            values = array.numpy()
            noised[key] = Array(values + noise_like(torch.empty(values.shape), std, rng).numpy().astype(values.dtype))
        return ArrayRecord(noised)


def make_strategy(cfg: FedConfig, n_clients: int):
    """Flower ``FedAvg`` (eq. 3.6 weights), wrapped by a DP strategy when ``cfg.dp`` asks for one (its noise from
    the CSPRNG: :class:`_NoiseFromOs`)."""
    from flwr.serverapp.strategy import (
        DifferentialPrivacyClientSideFixedClipping,
        DifferentialPrivacyServerSideFixedClipping,
        FedAvg,
    )

    base = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n_clients, min_evaluate_nodes=0,
                  min_available_nodes=n_clients, weighted_by_key=WEIGHT_KEY if cfg.dp == "none" else DP_WEIGHT_KEY)
    if cfg.dp == "none":
        return base
    wrapper = {"server": DifferentialPrivacyServerSideFixedClipping,
               "client": DifferentialPrivacyClientSideFixedClipping}[cfg.dp]
    noised_from_os = type(wrapper.__name__, (_NoiseFromOs, wrapper), {})
    return noised_from_os(base, cfg.dp_noise_multiplier, cfg.dp_clip_norm, n_clients)


def with_target_epsilon(cfg: FedConfig, epsilon: float) -> FedConfig:
    """``cfg`` with the smallest ``dp_noise_multiplier`` whose ``rounds`` releases (every client in every round:
    sampling rate 1) spend at most ``epsilon`` at ``dp_delta`` under the RDP accountant of :func:`dp_ledger`."""
    from privret.privacy.accounting import calibrate_noise

    if cfg.dp == "none":
        raise ValueError("a target epsilon needs dp = server or client")
    sigma = calibrate_noise(target_epsilon=epsilon, delta=cfg.dp_delta, sample_rate=1.0, steps=cfg.rounds,
                            accountant="rdp")
    return cfg.model_copy(update={"dp_noise_multiplier": sigma})


def not_covered(cfg: FedConfig) -> list[str]:
    """What a DP run of ``cfg`` releases outside the guarantee on the updates: the ledger lists it
    (``provenance.not_covered``), so that a reader of the ledger alone sees what it does not protect."""
    where = " (held out of the clients' training logs)" if cfg.evaluation_split == "validation" else ""
    items = [f"evaluation metrics of the clients' {cfg.evaluation_split} questions{where}"]
    if cfg.per_query_metrics:
        items.append("each evaluated question's reciprocal rank (per_query_metrics)")
    if cfg.personalize:
        items.append("the personalised query encoders (stage 2 trains without DP)")
    return items


def dp_ledger(cfg: FedConfig, *, releases: int, n_clients: int, n_questions: int, data_hash: str,
              dataset_id: str = "") -> PrivacyLedger:
    """The client-level ledger of the FedAvg updates (epsilon = inf without DP): ``releases`` noisy global
    models, each a Gaussian mechanism at sampling rate 1; the server counts every one that may have
    reached disk, so a kill while saving one makes ``releases`` exceed the rounds (conservative). A DP
    ledger lists what the run releases without DP (:func:`not_covered`) and names its one random draw, the
    noise, from the CSPRNG."""
    private = cfg.dp != "none" and cfg.dp_noise_multiplier > 0
    epsilon = float("inf")
    if private and releases > 0:
        epsilon = spent_epsilon(noise_multiplier=cfg.dp_noise_multiplier, sample_rate=1.0, steps=releases,
                                delta=cfg.dp_delta, accountant="rdp")
    elif private:
        epsilon = 0.0
    return PrivacyLedger(
        mechanism=f"dp-fedavg-{cfg.dp}-side-fixed-clipping (model updates only)" if private else "none",
        epsilon=epsilon, delta=cfg.dp_delta if private else 0.0,
        noise_multiplier=cfg.dp_noise_multiplier if private else 0.0, sample_rate=1.0, steps=releases,
        planned_steps=cfg.rounds, accountant="rdp" if private else "none", unit="client", n_units=n_clients,
        n_pairs=n_questions, clip_norm=cfg.dp_clip_norm if private else 0.0, model=cfg.model, trainable=cfg.trainable,
        data_hash=data_hash, dataset_id=dataset_id,
        secure_rng=private, random_sources={"noise": CSPRNG} if private else {},
        provenance={"not_covered": not_covered(cfg)} if private else {})


def record_bytes(content) -> int:
    """Bytes of the arrays a Flower RecordDict carries (what a round moves over the wire, w/o framing)."""
    return int(sum(len(arr.data) for rec in content.array_records.values() for arr in rec.values()))
