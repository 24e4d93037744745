"""Dense retrieval with FAISS and the standard IR metrics (via pytrec_eval).

The corpus is encoded in chunks (:func:`corpus_embeddings`) and added to an inner-product index
(embeddings are L2-normalised, so inner product = cosine): exact by default, or approximate
(HNSW, IVF; :mod:`privret.evaluate.index`). Metrics: NDCG@10, Recall@10,
Recall@100, MRR@10 (reciprocal rank of the first relevant document within the top 10, 0 if none),
per query (:func:`per_query_metrics`, for paired statistics) and as means (:func:`mean_metrics`).

**Corpus-embedding cache.** Given a ``cache_dir``, :func:`corpus_embeddings` stores the corpus
matrix as ``<cache_dir>/<key>.npy`` and reuses it when the same model meets the same corpus again
(the pipeline's zero-shot evaluation and its round-trip filter, once per epsilon, all encode the
public corpus with the same public encoder). The key (:func:`corpus_cache_key`) is a SHA-256 over
the exact bytes of the model's parameters and buffers (so a model retrained into the same
directory never hits an old entry), its module stack (pooling) and ``max_seq_length``, the
device type, the bf16 flag, and every document id and full text in order. The batch size and chunk
are not in it: they change only which texts share a padded batch, hence float rounding. A
file that does not load as a float32 ``(documents, dimension)`` array of finite values is ignored
and rewritten. Files are written atomically (:func:`privret.io.atomic_path`).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import torch

from privret.data.beir import Document, Qrels
from privret.evaluate.index import SearchIndex, build_index, top_k
from privret.io import atomic_path
from privret.models.device import bf16_autocast, native_bf16
from privret.models.encoder import features
from privret.progress import Progress

CACHE_FORMAT = 1  # bump when what encode() computes changes, so older files are never read

METRICS = ("ndcg@10", "recall@10", "recall@100", "mrr@10")


@torch.no_grad()
def encode(model, texts: list[str], *, batch_size: int = 64, progress=None, bf16: bool = True) -> np.ndarray:
    """float32 array of L2-normalised embeddings; texts are sorted by length to cut padding.

    ``bf16``: autocast where the device runs bf16 natively (:func:`privret.models.device.native_bf16`)."""
    order = np.argsort([-len(t) for t in texts])
    out = np.zeros((len(texts), model.get_embedding_dimension()), dtype=np.float32)
    for lo in range(0, len(texts), batch_size):
        idx = order[lo: lo + batch_size]
        with bf16_autocast(model.device, bf16):
            emb = model(features(model, [texts[i] for i in idx]))["sentence_embedding"].float()
        out[idx] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        if progress is not None:
            progress(len(idx))
    return out


def model_digest(model) -> str:
    """SHA-256 of the exact bytes of ``model``'s state dict (parameters and buffers), in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        _update(digest, name, str(tensor.dtype), str(tuple(tensor.shape)))
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def corpus_cache_key(model, corpus: dict[str, Document], *, bf16: bool) -> str:
    """Name of the cache entry of ``model``'s embeddings of ``corpus`` (see the module docstring).

    ``bf16`` enters as the format the embeddings are computed in: requested and native on the device."""
    bf16 = bf16 and native_bf16(model.device)
    digest = hashlib.sha256()
    _update(digest, f"privret corpus embeddings {CACHE_FORMAT}", model_digest(model), repr(model),
            str(model.max_seq_length), model.device.type, f"bf16={bool(bf16)}", str(len(corpus)))
    for doc_id, doc in corpus.items():
        _update(digest, doc_id, doc.full_text)
    return digest.hexdigest()


def _update(digest, *fields: str) -> None:
    for text in fields:  # length-prefixed, so no two field sequences hash the same bytes
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)


def _load_cached(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    """The cached matrix, or None when absent, unreadable, or not a finite float32 array of ``shape``."""
    try:
        emb = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if emb.dtype != np.float32 or emb.shape != shape or not np.isfinite(emb).all():
        return None
    return emb


def corpus_embeddings(model, corpus: dict[str, Document], *, batch_size: int = 64, chunk: int = 50_000,
                      bf16: bool = True, cache_dir: str | Path | None = None, progress=None) -> np.ndarray:
    """float32 ``(len(corpus), dim)`` L2-normalised embeddings of the documents' full texts, in
    ``list(corpus)`` order, encoded ``chunk`` documents at a time.

    With ``cache_dir``, the matrix is read from ``<cache_dir>/<key>.npy`` when a valid entry exists
    (the encoder is not called) and written there otherwise; a corrupt or wrong-shape file is
    replaced. ``progress(n)`` is called as documents are encoded (once with all of them on a hit).

    Privacy: a cache entry holds what ``model`` computes from the corpus, so it reveals what the
    model does. The pipeline caches only a *public* encoder's embeddings of the *public* corpus
    (its zero-shot encoder and the round-trip filter's); embeddings by retrievers trained on
    private data are never cached there. ``privret evaluate --cache-dir`` caches whatever model it
    evaluates: give it for a model trained on private data only where that model may be kept.
    """
    doc_ids = list(corpus)
    shape = (len(doc_ids), model.get_embedding_dimension())
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{corpus_cache_key(model, corpus, bf16=bf16)}.npy"
        cached = _load_cached(path, shape)
        if cached is not None:
            if progress is not None:
                progress(len(doc_ids))
            return cached
    model.eval()
    out = np.empty(shape, dtype=np.float32)
    for lo in range(0, len(doc_ids), chunk):
        texts = [corpus[d].full_text for d in doc_ids[lo: lo + chunk]]
        out[lo: lo + len(texts)] = encode(model, texts, batch_size=batch_size, progress=progress, bf16=bf16)
    if path is not None:
        with atomic_path(path) as staged, open(staged, "wb") as f:
            np.save(f, out, allow_pickle=False)
    return out


def search(model, corpus: dict[str, Document], queries: dict[str, str], *, k: int = 100,
           batch_size: int = 64, chunk: int = 50_000, cache_dir: str | Path | None = None,
           index: SearchIndex | None = None) -> dict[str, dict[str, float]]:
    """Top-``k`` documents per query by inner product; the run as {qid: {doc_id: score}}.

    ``index``: the FAISS index searched (default exact; :class:`privret.evaluate.index.SearchIndex`).
    ``cache_dir``: reuse or store the corpus embeddings there (:func:`corpus_embeddings`). Peak
    memory beyond the model: the embedding matrix and the index's copy of it (2 N d 4 bytes; an
    HNSW graph adds N 2 M 4 bytes).
    """
    doc_ids = list(corpus)
    model.eval()
    with Progress() as progress:
        task = progress.add_task("encoding corpus", total=len(doc_ids))
        searched = build_index(corpus_embeddings(model, corpus, batch_size=batch_size, chunk=chunk,
                                                 cache_dir=cache_dir, progress=lambda n: progress.advance(task, n)),
                               index)
        qids = list(queries)
        task = progress.add_task("encoding queries", total=len(qids))
        q = encode(model, [queries[i] for i in qids], batch_size=batch_size,
                   progress=lambda n: progress.advance(task, n))
    scores, hits = top_k(searched, q, min(k, len(doc_ids)))
    return {qid: {doc_ids[h]: float(s) for s, h in zip(scores[row], hits[row]) if h >= 0}
            for row, qid in enumerate(qids)}


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


def retrieval_metrics(run: dict[str, dict[str, float]], qrels: Qrels) -> dict[str, float]:
    """Mean NDCG@10, Recall@10/100 and MRR@10 over the judged queries (pytrec_eval)."""
    return mean_metrics(per_query_metrics(run, qrels))


def evaluate_per_query(model, corpus: dict[str, Document], queries: dict[str, str], qrels: Qrels,
                       *, batch_size: int = 64, cache_dir: str | Path | None = None,
                       index: SearchIndex | None = None) -> dict[str, dict[str, float]]:
    """:func:`per_query_metrics` of the top 100 per judged query; ``cache_dir`` and ``index`` as in :func:`search`."""
    judged_queries = {q: queries[q] for q in qrels if q in queries}
    run = search(model, corpus, judged_queries, k=100, batch_size=batch_size, cache_dir=cache_dir, index=index)
    return per_query_metrics(run, qrels)


def evaluate_retriever(model, corpus: dict[str, Document], queries: dict[str, str], qrels: Qrels,
                       *, batch_size: int = 64, cache_dir: str | Path | None = None,
                       index: SearchIndex | None = None) -> dict[str, float]:
    """:func:`retrieval_metrics` of the top 100 per judged query; ``cache_dir`` and ``index`` as in :func:`search`."""
    return mean_metrics(evaluate_per_query(model, corpus, queries, qrels, batch_size=batch_size,
                                           cache_dir=cache_dir, index=index))
