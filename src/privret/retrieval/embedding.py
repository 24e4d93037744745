"""Dense embeddings of queries and documents: L2-normalised float32 vectors, so inner product = cosine.

:func:`encode` embeds a list of texts (sorted by length to cut padding); :func:`corpus_embeddings`
embeds a corpus ``chunk`` documents at a time and, given a ``cache_dir``, reuses the matrix from the
corpus-embedding cache (:mod:`privret.retrieval.embedding_cache`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from privret.data.beir import Document
from privret.models.device import bf16_autocast
from privret.models.encoder import features
from privret.retrieval.embedding_cache import corpus_cache_key, load_cached, store


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
    private data are never cached there. ``privret evaluate retrieval --cache-dir`` caches whatever model it
    evaluates: give it for a model trained on private data only where that model may be kept.
    """
    doc_ids = list(corpus)
    shape = (len(doc_ids), model.get_embedding_dimension())
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{corpus_cache_key(model, corpus, bf16=bf16)}.npy"
        cached = load_cached(path, shape)
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
        store(path, out)
    return out
