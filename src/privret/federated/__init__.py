"""Federated dense retrieval for open-domain answer sentence selection (PDD-AS2) on Flower.

From W. Wang, *Distributed Open-Domain Answer Sentence Selection by Federated Learning* (thesis, chapters 3 and 4).

* :mod:`~privret.federated.config`: :class:`FedConfig`, every knob of a run.
* :mod:`~privret.federated.negatives`: BM25, static hard negatives (query hubness), Fed-Negative.
* :mod:`~privret.federated.local`: what a client computes (training, evaluation, eq. 3.7).
* :mod:`~privret.federated.strategy`: FedAvg weighted by data size (eq. 3.6), DP wrappers, ledger.
* :mod:`~privret.federated.client_app`, :mod:`~privret.federated.server_app`: the Flower ``ClientApp`` and
  ``ServerApp``; :mod:`~privret.federated.arrays`: the weights they exchange.
* :mod:`~privret.federated.runner`: in-process grid, baselines, Flower App writer.

Privacy model: raw questions, sentences and passages never leave a client. What leaves it: model
weights (stage 1; optionally with client-level DP), the query and sentence embeddings that
Fed-Negative exchanges (without DP only; not noised; the inversion check, :mod:`privret.audit.inversion`,
measures what they reveal), and evaluation metrics. Under DP nothing that a client's data size moves leaves
it (:class:`~privret.federated.config.FedConfig`, :mod:`~privret.federated.client_app`), and the run is a
release per client in the budget registry (:mod:`~privret.federated.server_app`).
"""

from privret.federated.config import FedConfig

__all__ = ["FedConfig"]
