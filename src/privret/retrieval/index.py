"""The FAISS index that retrieval searches: exact, or approximate (HNSW graph, IVF lists) for large corpora.

Embeddings are L2-normalised, so every index scores by inner product (= cosine).

* ``exact`` (default): ``IndexFlatIP``, a scan of all N documents, the true top k in O(N d) per query.
* ``hnsw``: ``IndexHNSWFlat`` (Malkov and Yashunin, 2018): ``hnsw_m`` links per node (memory about
  ``N (d + 2 M) 4`` bytes), ``hnsw_ef_construction`` candidates while inserting, ``hnsw_ef_search`` while searching
  (:func:`top_k` raises it to k, else FAISS could return fewer than k documents).
* ``ivf``: ``IndexIVFFlat``, seeded k-means into ``ivf_nlist`` cells (default ``4 sqrt(N)``, at most ``N / 39`` so
  every centroid has FAISS's 39 training points); a query scans the ``ivf_nprobe`` nearest cells.

An approximate index can miss some of the true top k, with no bound on how many (docs/scaling.md, section
"Approximate search"); metrics are comparable only between runs searched with the same index.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from privret.errors import InputError


class SearchIndex(BaseModel):
    """Which FAISS index to search and its parameters (only the chosen kind's are used)."""

    model_config = ConfigDict(extra="forbid")

    index: Literal["exact", "hnsw", "ivf"] = Field("exact", description="exact, hnsw or ivf")
    hnsw_m: int = Field(32, ge=2, le=512, description="HNSW: links per node")
    hnsw_ef_construction: int = Field(80, ge=1, description="HNSW: candidates kept while building")
    hnsw_ef_search: int = Field(128, ge=1, description="HNSW: candidates kept while searching (raised to k)")
    ivf_nlist: int | None = Field(None, ge=1, description="IVF: k-means cells (default 4 sqrt(N), at most N/39)")
    ivf_nprobe: int = Field(32, ge=1, description="IVF: cells scanned per query (at most nlist)")

    def nlist(self, n_docs: int) -> int:
        """The IVF cell count for ``n_docs`` documents: ``ivf_nlist``, or ``4 sqrt(N)`` capped at ``N / 39``."""
        if self.ivf_nlist is not None:
            if self.ivf_nlist > n_docs:
                raise InputError(f"{self.ivf_nlist} cells for {n_docs} documents: at most one cell per document",
                                 field="ivf_nlist")
            return self.ivf_nlist
        return max(1, min(round(4 * math.sqrt(n_docs)), n_docs // 39))


def build_index(embeddings: np.ndarray, spec: SearchIndex | None = None):
    """A FAISS inner-product index of ``spec``'s kind holding ``embeddings`` (float32, (N, d)), ready to search."""
    import faiss

    spec = spec or SearchIndex()
    n, dim = embeddings.shape
    if spec.index == "exact":
        index = faiss.IndexFlatIP(dim)
    elif spec.index == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec.hnsw_ef_construction
        index.hnsw.efSearch = spec.hnsw_ef_search
    else:
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, spec.nlist(n), faiss.METRIC_INNER_PRODUCT)
        index.train(embeddings)
        index.nprobe = min(spec.ivf_nprobe, index.nlist)
    index.add(embeddings)
    return index


def top_k(index, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, ids)`` of the ``k`` best documents per query row (id -1 where fewer were found);
    an HNSW index searches with ``max(efSearch, k)`` candidates."""
    import faiss

    if isinstance(index, faiss.IndexHNSW):
        return index.search(queries, k, params=faiss.SearchParametersHNSW(efSearch=max(index.hnsw.efSearch, k)))
    return index.search(queries, k)


def overlap_at_k(exact_hits: np.ndarray, approximate_hits: np.ndarray) -> float:
    """Recall of an approximate search against exact search: the fraction of each query's exact
    top-k ids (a row of ``exact_hits``) found in its approximate top k, averaged over queries."""
    k = exact_hits.shape[1]
    return float(np.mean([len(set(e.tolist()) & set(a.tolist())) / k
                          for e, a in zip(exact_hits, approximate_hits)]))
