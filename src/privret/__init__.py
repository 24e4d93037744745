"""privret: dense retrieval trained on private query logs with differential privacy.

The Python API (:mod:`privret.api`) is reachable from here (``privret.train_dp_retriever(...)``); it is imported
on first use, so that importing a torch-free module such as :mod:`privret.settings` loads no model stack.
"""

import importlib

__version__ = "0.1.0"
__all__ = ["SyntheticQueries", "TrainedGenerator", "evaluate_retrieval", "generate_queries", "train_dp_generator",
           "train_dp_retriever", "train_retriever"]


def __getattr__(name: str):
    """The API's names (:data:`__all__`), from :mod:`privret.api` when first asked for."""
    if name in __all__:
        return getattr(importlib.import_module("privret.api"), name)
    raise AttributeError(f"module 'privret' has no attribute '{name}'")
