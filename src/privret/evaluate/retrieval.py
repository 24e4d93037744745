"""Exact dense retrieval with FAISS and the standard IR metrics (via pytrec_eval).

The corpus is encoded in chunks and added to an exact inner-product index (embeddings are
L2-normalised, so inner product = cosine). Metrics: NDCG@10, Recall@10, Recall@100, MRR@10
(reciprocal rank of the first relevant document within the top 10, 0 if none).
"""

from __future__ import annotations

import numpy as np
import torch

from privret.data.beir import Document, Qrels
from privret.models.encoder import features
from privret.progress import Progress

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")


@torch.no_grad()
def encode(model, texts: list[str], *, batch_size: int = 64, progress=None, bf16: bool = True) -> np.ndarray:
    """float32 array of L2-normalised embeddings; texts are sorted by length to cut padding."""
    order = np.argsort([-len(t) for t in texts])
    out = np.zeros((len(texts), model.get_embedding_dimension()), dtype=np.float32)
    for lo in range(0, len(texts), batch_size):
        idx = order[lo: lo + batch_size]
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
            emb = model(features(model, [texts[i] for i in idx]))["sentence_embedding"].float()
        out[idx] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        if progress is not None:
            progress(len(idx))
    return out


def search(model, corpus: dict[str, Document], queries: dict[str, str], *, k: int = 100,
           batch_size: int = 64, chunk: int = 50_000) -> dict[str, dict[str, float]]:
    """Top-``k`` documents per query by exact inner product; the run as {qid: {doc_id: score}}."""
    import faiss

    doc_ids = list(corpus)
    index = faiss.IndexFlatIP(model.get_embedding_dimension())
    model.eval()
    with Progress() as progress:
        task = progress.add_task("encoding corpus", total=len(doc_ids))
        for lo in range(0, len(doc_ids), chunk):
            texts = [corpus[d].full_text for d in doc_ids[lo: lo + chunk]]
            index.add(encode(model, texts, batch_size=batch_size, progress=lambda n: progress.advance(task, n)))
        qids = list(queries)
        task = progress.add_task("encoding queries", total=len(qids))
        q = encode(model, [queries[i] for i in qids], batch_size=batch_size,
                   progress=lambda n: progress.advance(task, n))
    scores, hits = index.search(q, min(k, len(doc_ids)))
    return {qid: {doc_ids[h]: float(s) for s, h in zip(scores[row], hits[row]) if h >= 0}
            for row, qid in enumerate(qids)}


def retrieval_metrics(run: dict[str, dict[str, float]], qrels: Qrels) -> dict[str, float]:
    """Mean NDCG@10, Recall@10/100 and MRR@10 over the judged queries (pytrec_eval)."""
    import pytrec_eval

    judged = {q: docs for q, docs in qrels.items() if q in run}
    if not judged:
        raise ValueError("no judged query in the run")
    evaluator = pytrec_eval.RelevanceEvaluator(judged, {"ndcg_cut.10", "recall.10,100"})
    per_query = evaluator.evaluate({q: run[q] for q in judged})
    top10 = {q: dict(sorted(run[q].items(), key=lambda kv: -kv[1])[:10]) for q in judged}
    mrr = pytrec_eval.RelevanceEvaluator(judged, {"recip_rank"}).evaluate(top10)
    n = len(judged)
    return {
        "ndcg@10": sum(v["ndcg_cut_10"] for v in per_query.values()) / n,
        "recall@10": sum(v["recall_10"] for v in per_query.values()) / n,
        "recall@100": sum(v["recall_100"] for v in per_query.values()) / n,
        "mrr@10": sum(v["recip_rank"] for v in mrr.values()) / n,
        "queries": n,
    }


def evaluate_retriever(model, corpus: dict[str, Document], queries: dict[str, str], qrels: Qrels,
                       *, batch_size: int = 64) -> dict[str, float]:
    judged_queries = {q: queries[q] for q in qrels if q in queries}
    run = search(model, corpus, judged_queries, k=100, batch_size=batch_size)
    return retrieval_metrics(run, qrels)
