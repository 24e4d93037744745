"""Scoring a retriever from Python: NDCG@10, Recall@10, Recall@100 and MRR@10 (pytrec_eval) of its top 100.

The search and the metrics are :func:`privret.retrieval.metrics.evaluate_retriever`'s, the ones ``privret evaluate``
reports. Privacy assumption: the evaluation data is not released; a score computed on a private log is itself
private (no DP mechanism is applied here).
"""

from __future__ import annotations

from pathlib import Path

from privret.api.workspace import settings_model
from privret.data.beir import load_beir
from privret.data.sources import as_corpus, as_qrels, as_queries
from privret.errors import InputError
from privret.models.encoder import load_encoder
from privret.retrieval.index import SearchIndex
from privret.retrieval.metrics import evaluate_retriever


def evaluate_retrieval(model, queries, corpus=None, qrels=None, *, split: str = "test", bf16: bool = True,
             cache_dir: str | Path | None = None, **search) -> dict[str, float]:
    """The mean metrics of ``model`` on judged queries: ``{"ndcg@10", "recall@10", "recall@100", "mrr@10",
    "queries"}``.

    Parameters
    ----------
    model : SentenceTransformer or str
        An instance, a registry name, a Hugging Face id or a saved retriever.
    queries : path or dict
        A BEIR directory (with its corpus and the qrels of ``split``), or a mapping query id -> text.
    corpus, qrels : optional
        With a mapping of queries: the corpus searched (as in :func:`privret.data.sources.as_corpus`) and the
        judgements (query id -> {doc id: relevance}, or (query id, doc id[, relevance]) tuples).
    bf16, cache_dir
        bf16 autocast where the device runs it natively; where corpus embeddings are kept (nothing by default).
    **search
        Fields of :class:`~privret.retrieval.index.SearchIndex` (``index="hnsw"``, ...); exact search by default.

    Privacy: none; the figures describe the evaluation data.
    """
    if isinstance(queries, (str, Path)):
        if corpus is not None or qrels is not None:
            raise InputError("a BEIR directory brings its own corpus and qrels; give one or the other",
                             field="corpus" if corpus is not None else "qrels")
        dataset = load_beir(queries, splits=[split])
        searched, texts, judged = dataset.corpus, dataset.queries, dataset.split(split)
    else:
        if corpus is None or qrels is None:
            raise InputError("queries given in memory need their corpus and qrels",
                             field="corpus" if corpus is None else "qrels")
        searched, texts = as_corpus(corpus), as_queries(queries)
        judged = as_qrels(qrels, texts, searched)
    encoder = load_encoder(str(model)) if isinstance(model, (str, Path)) else model
    return evaluate_retriever(encoder, searched, texts, judged, cache_dir=cache_dir,
                              index=settings_model(SearchIndex, **search), bf16=bf16)
