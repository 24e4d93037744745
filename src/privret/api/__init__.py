"""The Python API: each stage of privret in one call, on data in memory or on paths (``docs/python-api.md``).

:func:`train_dp_retriever` (direct DP training of a SentenceTransformer), :func:`train_retriever` (without DP),
:func:`train_dp_generator` and :func:`generate_queries` (the synthetic-query route), :func:`evaluate_retrieval` (IR metrics).
They call the library functions the command line calls and validate settings with the same models
(:mod:`privret.settings`); they write nothing unless given an ``out_dir`` (the budget registry: only with a
``budget`` policy or a ``dataset_name``). Privacy assumption: corpora are public, the pairs are the private log.
"""

from privret.api.evaluation import evaluate_retrieval
from privret.api.retriever import train_dp_retriever, train_retriever
from privret.api.synthetic import SyntheticQueries, TrainedGenerator, generate_queries, train_dp_generator

__all__ = ["SyntheticQueries", "TrainedGenerator", "evaluate_retrieval", "generate_queries", "train_dp_generator",
           "train_dp_retriever", "train_retriever"]
