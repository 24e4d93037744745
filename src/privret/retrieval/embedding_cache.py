"""The corpus-embedding cache: an encoder's embeddings of a corpus, stored once and reused.

Given a ``cache_dir``, :func:`privret.retrieval.embedding.corpus_embeddings` stores the corpus matrix as
``<cache_dir>/<key>.npy`` and reuses it when the same model meets the same corpus again
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

from privret.data.beir import Document
from privret.io import atomic_path
from privret.models.device import uses_bf16

CACHE_FORMAT = 1  # bump when what encode() computes changes, so older files are never read


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
    bf16 = uses_bf16(model.device, bf16)
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


def load_cached(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
    """The cached matrix, or None when absent, unreadable, or not a finite float32 array of ``shape``."""
    try:
        emb = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if emb.dtype != np.float32 or emb.shape != shape or not np.isfinite(emb).all():
        return None
    return emb


def store(path: Path, embeddings: np.ndarray) -> None:
    """Write ``embeddings`` to ``path`` atomically, as a ``.npy`` file without pickles."""
    with atomic_path(path) as staged, open(staged, "wb") as f:
        np.save(f, embeddings, allow_pickle=False)
