"""Exact top-k dense retrieval over a corpus that never sits in memory at once.

:func:`privret.retrieval.search.search` holds every document embedding (N d 4 bytes) and the corpus. Here
:func:`stream_search` reads ``(doc_id, text)`` pairs from any iterable, encodes ``chunk`` documents at a time and
merges them into a running top-k:

    S_c = Q E_c^T                                                  (cosines of the chunk)
    top_k(all documents) = top_k(top_k(chunks 1..c-1) ++ S_c)      (exact: max is associative)

so the peak memory beyond the model is bounded by the chunk, not by N:

    chunk * (d + |Q| + k) * 4 bytes + the chunk's texts + |Q| k * (4 + 8) bytes

plus the ids in someone's current top-k (at most |Q| k). Ties at the k-th score are broken arbitrarily, as FAISS
does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from privret.retrieval.embedding import encode

DEFAULT_CHUNK = 16_384


def _chunks(documents: Iterable[tuple[str, str]], size: int) -> Iterator[tuple[list[str], list[str]]]:
    ids, texts = [], []
    for doc_id, text in documents:
        ids.append(doc_id)
        texts.append(text)
        if len(ids) == size:
            yield ids, texts
            ids, texts = [], []
    if ids:
        yield ids, texts


@torch.no_grad()
def stream_search(model, documents: Iterable[tuple[str, str]], queries: dict[str, str], *, k: int = 100,
                  chunk: int = DEFAULT_CHUNK, batch_size: int = 256, bf16: bool = False,
                  progress=None) -> dict[str, dict[str, float]]:
    """Top-``k`` documents per query by exact inner product, as {qid: {doc_id: score}}."""
    if chunk <= 0 or k <= 0:
        raise ValueError("chunk and k must be positive")
    model.eval()
    qids = list(queries)
    q = torch.from_numpy(encode(model, [queries[i] for i in qids], batch_size=batch_size, bf16=bf16))
    best_scores = torch.empty((len(qids), 0), dtype=torch.float32)
    best_pos = torch.empty((len(qids), 0), dtype=torch.int64)
    names: dict[int, str] = {}  # global position -> doc id, only for positions in some top-k
    seen = 0
    for ids, texts in _chunks(documents, chunk):
        emb = torch.from_numpy(encode(model, texts, batch_size=batch_size, bf16=bf16))
        scores = torch.cat([best_scores, q @ emb.T], dim=1)
        positions = torch.cat([best_pos, torch.arange(seen, seen + len(ids)).expand(len(qids), -1)], dim=1)
        keep = min(k, scores.shape[1])
        best_scores, index = torch.topk(scores, keep, dim=1)
        best_pos = positions.gather(1, index)
        alive = best_pos.unique().tolist()
        names = {p: names[p] if p < seen else ids[p - seen] for p in alive}
        seen += len(ids)
        del emb, scores, positions, texts
        if progress is not None:
            progress(len(ids))
    return {qid: {names[p]: float(s) for s, p in zip(best_scores[row].tolist(), best_pos[row].tolist())}
            for row, qid in enumerate(qids)}


def iter_corpus_jsonl(path) -> Iterator[tuple[str, str]]:
    """``(doc_id, title. text)`` from a BEIR ``corpus.jsonl``, one line at a time (strictly validated)."""
    from privret.data.beir import Document
    from privret.io import read_jsonl, require_text

    for line, obj in read_jsonl(path):
        doc_id = require_text(obj, "_id", path=path, line=line)
        title = require_text(obj, "title", path=path, line=line, allow_empty=True) if "title" in obj else ""
        yield doc_id, Document(doc_id, title, require_text(obj, "text", path=path, line=line)).full_text
