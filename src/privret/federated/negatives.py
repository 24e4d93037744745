"""Negatives for PDD-AS2: BM25 (warm-up), static hard negatives (query hubness), Fed-Negative.

* BM25 negatives (thesis 3.3): the top ``k`` sentences of the client's collection by BM25 (bm25s),
  excluding the gold answer sentences, ``n`` of them sampled uniformly.
* Static hard negatives (thesis 3.3, 3.4.6): the current model encodes the collection and the
  training queries; for each query the top ``k`` sentences by cosine (:func:`top_k_excluding`, gold
  excluded), and ``n`` sampled uniformly from them (``k >> n``): taking the very top ones would often
  take unlabelled correct answers ("query hubness"). When they are mined: :func:`privret.federated.local.round_stage`.
* Fed-Negative (thesis eqs. 4.1-4.2): client ``c`` sends its query embeddings to a selected set
  ``C_s`` of other clients (eq. 4.1); each answers with its top-``n`` sentence embeddings (and their
  scores) from its own collection; ``c`` keeps the top ``n`` of the union by score (eq. 4.2).
  Only embeddings and scores travel, never text or ids. Bytes are counted in :class:`ExchangeLog`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np


def sample_excluding(ranked: list[int], gold: set[int], n: int, rng: random.Random) -> list[int]:
    """``n`` items drawn uniformly without replacement from ``ranked`` minus ``gold`` (fewer if short)."""
    pool = [i for i in ranked if i not in gold]
    return pool if len(pool) <= n else rng.sample(pool, n)


def bm25_ranked(sentences: list[str], queries: list[str], k: int) -> list[list[int]]:
    """For each query the indices of its top-``k`` sentences by BM25 (bm25s, Lucene variant)."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(sentences, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize(queries, stopwords="en", show_progress=False, return_ids=False)
    k = min(k, len(sentences))
    out = []
    for toks in tokens:
        scores = retriever.get_scores(toks) if toks else np.zeros(len(sentences), dtype=np.float32)
        top = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
        out.append([int(i) for i in top[np.argsort(-scores[top], kind="stable")]])
    return out


def top_k_excluding(q: np.ndarray, s: np.ndarray, gold: list[set[int]], k: int) -> list[list[int]]:
    """Indices of the ``k`` most similar rows of ``s`` for each row of ``q`` (inner product), gold removed."""
    scores = q @ s.T
    kk = min(k + max((len(g) for g in gold), default=0), s.shape[0])
    out = []
    for row, g in zip(scores, gold):
        top = np.argpartition(-row, kk - 1)[:kk] if kk < len(row) else np.arange(len(row))
        ranked = [int(i) for i in top[np.argsort(-row[top], kind="stable")] if int(i) not in g]
        out.append(ranked[:k])
    return out


def fed_negative_answer(query_emb: np.ndarray, sentence_emb: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """What a client in ``C_s`` answers: for each query its top-``n`` sentence embeddings and scores.

    Returns ``(embeddings [Q, n', d], scores [Q, n'])`` with ``n' = min(n, |S|)``, best first.
    """
    n = min(n, sentence_emb.shape[0])
    scores = query_emb @ sentence_emb.T
    top = np.argpartition(-scores, n - 1, axis=1)[:, :n] if n < scores.shape[1] else \
        np.tile(np.arange(scores.shape[1]), (scores.shape[0], 1))
    top_scores = np.take_along_axis(scores, top, axis=1)
    order = np.argsort(-top_scores, axis=1, kind="stable")
    top = np.take_along_axis(top, order, axis=1)
    return sentence_emb[top].astype(np.float32), np.take_along_axis(top_scores, order, axis=1).astype(np.float32)


def fed_negative_merge(answers: list[tuple[np.ndarray, np.ndarray]], n: int) -> np.ndarray:
    """Eq. 4.2: the top ``n`` (by score) of the union of the answers, per query; ``[Q, n, d]``."""
    embs = np.concatenate([a[0] for a in answers], axis=1)
    scores = np.concatenate([a[1] for a in answers], axis=1)
    n = min(n, scores.shape[1])
    order = np.argsort(-scores, axis=1, kind="stable")[:, :n]
    return np.take_along_axis(embs, order[:, :, None], axis=1)


def negative_hardness(query_emb: np.ndarray, sentence_emb: np.ndarray, gold: list[set[int]],
                      fed_negatives: np.ndarray, n: int) -> dict[str, float]:
    """How hard each query's Fed-Negatives are next to the hardest negatives of its own collection.

    For query ``i`` (inner products of L2-normalised embeddings): ``local_i``, its ``n`` best scores in its
    own collection, gold excluded; ``fed_i``, its scores against ``fed_negatives[i]`` (``[Q, m, d]``).
    Returns ``fed_score`` and ``local_score`` (the mean of all ``fed_i`` and of all ``local_i`` scores),
    ``fed_above_local_nth`` (the share of Fed-Negatives scoring above ``min(local_i)``: they would enter the
    local top ``n``; every one when the collection has no local negative) and ``fed_best_above_local_best``
    (the share of queries whose best Fed-Negative beats its best local negative). A Fed-Negative scoring
    below every local hard negative adds little to the loss.
    """
    scores = query_emb @ sentence_emb.T
    fed = np.einsum("qd,qmd->qm", query_emb, fed_negatives)
    local = [scores[i, r] for i, r in enumerate(top_k_excluding(query_emb, sentence_emb, gold, n))]
    has_local = np.array([len(x) > 0 for x in local])  # a collection of gold sentences only has no local negative
    nth = np.array([x.min() if len(x) else -np.inf for x in local])
    best = np.array([x.max() if len(x) else -np.inf for x in local])
    return {"fed_score": float(fed.mean()), "local_score": float(np.concatenate(local).mean()) if has_local.any()
            else float("nan"),
            "fed_above_local_nth": float((fed > nth[:, None]).mean()),
            "fed_best_above_local_best": float((fed.max(axis=1) > best).mean())}


def select_clients(me: int, n_clients: int, how_many: int, rng: random.Random) -> list[int]:
    """Eq. 4.1: ``C_s``, a subset of the other clients (all others when ``how_many`` is 0)."""
    others = [c for c in range(n_clients) if c != me]
    return others if how_many <= 0 or how_many >= len(others) else sorted(rng.sample(others, how_many))


@dataclass
class ExchangeLog:
    """Bytes of one Fed-Negative exchange, peer-to-peer view (what the thesis would send).

    ``query_bytes``: query embeddings sent to every selected client; ``answer_bytes``: the sentence
    embeddings and scores they send back. Through a Flower SuperLink every payload crosses the relay
    twice (client -> SuperLink -> client); ``relayed_bytes`` counts that.
    """

    query_bytes: int = 0
    answer_bytes: int = 0
    messages: int = 0
    per_client: dict[str, int] = field(default_factory=dict)

    def add(self, client: str, query: np.ndarray, answer: tuple[np.ndarray, np.ndarray]) -> None:
        self.query_bytes += query.nbytes
        self.answer_bytes += answer[0].nbytes + answer[1].nbytes
        self.messages += 2
        self.per_client[client] = self.per_client.get(client, 0) + query.nbytes + answer[0].nbytes + answer[1].nbytes

    @property
    def total_bytes(self) -> int:
        return self.query_bytes + self.answer_bytes

    @property
    def relayed_bytes(self) -> int:
        return 2 * self.total_bytes

    def as_dict(self) -> dict:
        return {"query_bytes": self.query_bytes, "answer_bytes": self.answer_bytes, "total_bytes": self.total_bytes,
                "relayed_bytes": self.relayed_bytes, "messages": self.messages, "per_client": self.per_client}
