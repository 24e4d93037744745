"""The standard IR metrics of a retrieval run (via pytrec_eval): NDCG@10, Recall@10, Recall@100 and
MRR@10 (reciprocal rank of the first relevant document within the top 10, 0 if none), per query
(:func:`per_query_metrics`, for paired statistics) and as means (:func:`mean_metrics`); and the
metrics of a model's top 100 on a judged dataset (:func:`evaluate_retriever`).
"""

from __future__ import annotations

from pathlib import Path

from privret.data.beir import Document, Qrels
from privret.retrieval import search as searching
from privret.retrieval.index import SearchIndex

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")


def per_query_metrics(run: dict[str, dict[str, float]], qrels: Qrels) -> dict[str, dict[str, float]]:
    """NDCG@10, Recall@10/100 and MRR@10 of each judged query in ``run`` (pytrec_eval): {qid: {metric: value}}."""
    import pytrec_eval

    judged = {q: docs for q, docs in qrels.items() if q in run}
    if not judged:
        raise ValueError("no judged query in the run")
    evaluator = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10", "recall.10,100"})
    scores = evaluator.evaluate({q: run[q] for q in judged})
    top10 = {q: dict(sorted(run[q].items(), key=lambda kv: -kv[1])[:10]) for q in judged}
    mrr = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top10)
    return {q: {"ndcg@10": v["ndcg_cut_10"], "recall@10": v["recall_10"], "recall@100": v["recall_100"],
                "mrr@10": mrr[q]["recip_rank"]} for q, v in scores.items()}


def mean_metrics(per_query: dict[str, dict[str, float]]) -> dict[str, float]:
    """The mean of each metric over the queries of :func:`per_query_metrics`, and their number."""
    n = len(per_query)
    return {**{m: sum(v[m] for v in per_query.values()) / n for m in METRICS}, "queries": n}


def evaluate_per_query(model, corpus: dict[str, Document], queries: dict[str, str], qrels: Qrels,
                       *, batch_size: int = 64, cache_dir: str | Path | None = None,
                       index: SearchIndex | None = None, bf16: bool = True) -> dict[str, dict[str, float]]:
    """:func:`per_query_metrics` of the top 100 per judged query; ``cache_dir``, ``index`` and ``bf16`` as in
    :func:`privret.retrieval.search.search`."""
    judged_queries = {q: queries[q] for q in qrels if q in queries}
    run = searching.search(model, corpus, judged_queries, k=100, batch_size=batch_size, cache_dir=cache_dir,
                           index=index, bf16=bf16)
    return per_query_metrics(run, qrels)


def evaluate_retriever(model, corpus: dict[str, Document], queries: dict[str, str], qrels: Qrels,
                       *, batch_size: int = 64, cache_dir: str | Path | None = None,
                       index: SearchIndex | None = None, bf16: bool = True) -> dict[str, float]:
    """:func:`mean_metrics` of the top 100 per judged query; ``cache_dir``, ``index`` and ``bf16`` as in
    :func:`privret.retrieval.search.search`."""
    return mean_metrics(evaluate_per_query(model, corpus, queries, qrels, batch_size=batch_size,
                                           cache_dir=cache_dir, index=index, bf16=bf16))
