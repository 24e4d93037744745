"""Top-k dense retrieval of an in-memory corpus: embed (:mod:`privret.retrieval.embedding`), index
(:mod:`privret.retrieval.index`: exact by default, or approximate HNSW/IVF), search by inner product.
"""

from __future__ import annotations

from pathlib import Path

from privret.data.beir import Document
from privret.progress import Progress
from privret.retrieval import embedding
from privret.retrieval.index import SearchIndex, build_index, top_k


def search(model, corpus: dict[str, Document], queries: dict[str, str], *, k: int = 100,
           batch_size: int = 64, chunk: int = 50_000, cache_dir: str | Path | None = None,
           index: SearchIndex | None = None, bf16: bool = True) -> dict[str, dict[str, float]]:
    """Top-``k`` documents per query by inner product; the run as {qid: {doc_id: score}}.

    ``bf16``: encode under bf16 autocast where the device runs it natively (a bf16-native GPU's figures then
    differ from float32 ones in the third decimal); ``False`` encodes in float32 everywhere.

    ``index``: the FAISS index searched (default exact; :class:`privret.retrieval.index.SearchIndex`).
    ``cache_dir``: reuse or store the corpus embeddings there
    (:func:`privret.retrieval.embedding.corpus_embeddings`). Peak
    memory beyond the model: the embedding matrix and the index's copy of it (2 N d 4 bytes; an
    HNSW graph adds N 2 M 4 bytes).
    """
    doc_ids = list(corpus)
    model.eval()
    with Progress() as progress:
        task = progress.add_task("encoding corpus", total=len(doc_ids))
        searched = build_index(embedding.corpus_embeddings(model, corpus, batch_size=batch_size, chunk=chunk,
                                                           bf16=bf16, cache_dir=cache_dir,
                                                           progress=lambda n: progress.advance(task, n)),
                               index)
        qids = list(queries)
        task = progress.add_task("encoding queries", total=len(qids))
        q = embedding.encode(model, [queries[i] for i in qids], batch_size=batch_size, bf16=bf16,
                             progress=lambda n: progress.advance(task, n))
    scores, hits = top_k(searched, q, min(k, len(doc_ids)))
    return {qid: {doc_ids[h]: float(s) for s, h in zip(scores[row], hits[row]) if h >= 0}
            for row, qid in enumerate(qids)}
