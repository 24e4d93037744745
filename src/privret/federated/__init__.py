"""Federated dense retrieval for open-domain answer sentence selection (PDD-AS2) on Flower, after W. Wang,
*Distributed Open-Domain Answer Sentence Selection by Federated Learning* (thesis, chapters 3 and 4).

* :mod:`~privret.federated.negatives`: BM25, static hard negatives (query hubness), Fed-Negative.
* :mod:`~privret.federated.local`: what a client computes (training, evaluation, eq. 3.7).
* :mod:`~privret.federated.strategy`: FedAvg weighted by data size (eq. 3.6), DP wrappers, ledger.
* :mod:`~privret.federated.client_app`, :mod:`~privret.federated.server_app`: the Flower apps;
  :mod:`~privret.federated.arrays`: the weights they exchange; :mod:`~privret.federated.runner`: in-process runs.
  Settings: :class:`~privret.settings.federated.FedConfig`.

Privacy model: raw questions, sentences and passages never leave a client. What leaves it: model weights
(optionally with client-level DP), Fed-Negative's query and sentence embeddings (without DP only, not noised;
:mod:`privret.audit.inversion` measures what they reveal) and evaluation metrics. Under DP nothing that a client's
data size moves leaves it, and the run is one release per client in the budget registry.
"""

from privret.settings.federated import FedConfig

__all__ = ["FedConfig"]
