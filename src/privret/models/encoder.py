"""The dual encoder: one shared transformer for queries and documents, mean pooling, cosine.

It is a ``sentence_transformers.SentenceTransformer`` so that what privret saves loads anywhere
sentence-transformers does. Scores are ``cos(q, d) / temperature`` (Carranza et al., eq. 1).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from privret.models.device import resolve_device
from privret.models.loading import load_pretrained


def load_encoder(name: str, *, max_seq_length: int = 256, device: str | None = None):
    """A SentenceTransformer from a registry name, a saved retriever, a local HF dir or a hub id.

    A plain HF encoder (no ``modules.json``) gets mean pooling + L2 normalisation. ``device``: where
    it runs (:func:`privret.models.device.resolve_device`; None: the command's ``--device``).
    """
    from sentence_transformers import SentenceTransformer, models

    device = str(resolve_device(device))

    def build(location: str):
        if Path(location).is_dir() and (Path(location) / "modules.json").is_file():
            model = SentenceTransformer(location, device=device, trust_remote_code=False)
        else:
            word = models.Transformer(location, max_seq_length=max_seq_length)
            pooling = models.Pooling(word.get_word_embedding_dimension(), pooling_mode="mean")
            model = SentenceTransformer(modules=[word, pooling, models.Normalize()], device=device)
        model.max_seq_length = max_seq_length
        return model

    return load_pretrained(name, build)


def features(model, texts: list[str], *, max_length: int | None = None) -> dict:
    """Tokenised inputs on the model's device; ``max_length`` truncates further."""
    feats = model.preprocess(texts)
    out = {}
    for k, v in feats.items():
        if isinstance(v, torch.Tensor):
            v = (v[:, :max_length] if max_length is not None and v.dim() == 2 else v).to(model.device)
        out[k] = v
    return out


def embed(model, texts: list[str], *, max_length: int | None = None) -> torch.Tensor:
    """L2-normalised embeddings with gradients (for training)."""
    return F.normalize(model(features(model, texts, max_length=max_length))["sentence_embedding"], dim=-1)


def in_batch_softmax_loss(q: torch.Tensor, d: torch.Tensor, temperature: float,
                          same_target: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over i of -log softmax_j(cos(q_i, d_j) / temperature)[i] (Carranza et al., eq. 1).

    ``same_target[i, j]`` (bool) marks off-diagonal pairs that are not true negatives (the same
    document, or the same query, appearing twice in the batch); they are masked out.
    """
    logits = q @ d.T / temperature
    if same_target is not None:
        off_diagonal = same_target & ~torch.eye(len(q), dtype=torch.bool, device=q.device)
        logits = logits.masked_fill(off_diagonal, float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(q), device=q.device))
