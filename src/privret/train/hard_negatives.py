"""Hard public negatives of one privacy unit (``public-negatives`` with ``hard_negatives`` K > 0).

Before the first step the *initial*, public encoder ranks the public pool
(:func:`privret.train.dp_retriever.negative_pool`) for every training row's query; a row's candidates are the top
``depth`` documents, its unit's positive documents (same id or identical text) left out. Each step, a sampled row
draws K of its candidates uniformly with replacement as extra negatives *with* gradient
(:func:`privret.train.clipped_sums.public_negative_losses`).

Privacy: a row's candidates depend only on its own unit's pairs, the public pool and the public encoder, and the
draw on randomness independent of the data; their gradient is part of the unit's clipped term, so Delta = C still.
The candidates derive from private queries: computed in memory on every (re)start, never written. Only the public
encoder's embeddings of the public pool may be cached (``cache_dir``,
:func:`privret.retrieval.embedding.corpus_embeddings`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from privret.data.beir import Document
from privret.data.pairs import TrainingPairs
from privret.retrieval.embedding import corpus_embeddings, encode


def mine_candidates(model, pairs: TrainingPairs, units: list[list[int]], pool: list[Document], depth: int, *,
                    cache_dir: str | Path | None = None) -> list[list[int]]:
    """For every row of ``pairs``: positions in ``pool`` of the ``depth`` pool documents ``model`` ranks
    highest for the row's query, its unit's positive documents (ids and texts) left out, best first: exactly
    ``min(depth, len(pool) - excluded)`` of them, whatever the other units.
    ``cache_dir``: read or keep ``model``'s embeddings of ``pool`` there (``model`` must be the public initial
    encoder; see the module docstring)."""
    unit_of_row = {r: u for u, rows in enumerate(units) for r in rows}
    gold_ids = [{pairs.pairs[r].doc_id for r in rows} for rows in units]
    gold_texts = [{pairs.corpus[i].full_text for i in ids if i in pairs.corpus} for ids in gold_ids]
    by_id = {doc.id: j for j, doc in enumerate(pool)}  # the pool comes from a corpus dict: ids are unique
    by_text = {}
    for j, doc in enumerate(pool):
        by_text.setdefault(doc.full_text, []).append(j)
    # the pool positions each unit's positives occupy (its ids, and every copy of their texts): a function of the
    # unit alone, so each row ranks exactly as deep as its own exclusions need
    excluded = [{by_id[i] for i in ids if i in by_id} | {j for t in texts for j in by_text.get(t, ())}
                for ids, texts in zip(gold_ids, gold_texts)]
    was_training = model.training
    model.eval()
    docs = torch.from_numpy(corpus_embeddings(model, {d.id: d for d in pool}, bf16=False, cache_dir=cache_dir))
    queries = torch.from_numpy(encode(model, [p.query for p in pairs.pairs], bf16=False))
    model.train(was_training)
    scores = queries @ docs.T
    out = []
    for r in range(len(pairs.pairs)):
        u = unit_of_row[r]
        ranked = scores[r].topk(min(len(pool), depth + len(excluded[u]))).indices.tolist()
        out.append([j for j in ranked if j not in excluded[u]][:depth])
    return out
