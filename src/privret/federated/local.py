"""What one client computes: local training of the dual encoder, of its own query encoder, evaluation.

Dual encoder (Wang's thesis, eqs. 3.2-3.3): one shared encoder for queries and sentences, scores
``<enc(q), enc(s)> / tau`` on L2-normalised embeddings; a batch's loss is the in-batch softmax
(:func:`~privret.models.encoder.in_batch_softmax_loss`) over every positive of the batch and the union of its
explicit negatives. No candidate is a gold answer of a batch query (batches are built so, and such negatives are
dropped), so no false negative is pushed away.

Client-customized query encoder (thesis 4.2.2): the sentence encoder (the global model) is frozen and embeds the
collection once without gradients; only the client's own copy for queries trains, so negatives are cheap.

Privacy assumption: everything here runs on the client's own data; nothing leaves the client except what the
caller sends (model weights to the server, embeddings in Fed-Negative).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from privret.data.fed_squad import ClientData, Question
from privret.settings.federated import FedConfig
from privret.federated.negatives import bm25_ranked, sample_excluding, top_k_excluding
from privret.retrieval.embedding import encode
from privret.retrieval.metrics import per_query_metrics
from privret.models.device import bf16_autocast
from privret.models.encoder import embed, in_batch_softmax_loss
from privret.models.frozen_prefix import frozen_prefix

LEVELS = ("sentence", "passage")
METRIC_NAMES = ("mrr@10", "recall@1", "recall@20", "recall@100")


def train_questions(client: ClientData, cap: int, seed: int, fraction: float = 1.0) -> list[Question]:
    """The client's training questions: a seeded share ``fraction`` (at least 2), then at most ``cap``.

    A fraction keeps the clients' unequal sizes (the data-scarcity setting); a cap evens them out.
    """
    qs = client.split("train")
    if fraction < 1.0:
        keep = max(2, round(fraction * len(qs)))
        qs = random.Random(f"{seed}:{client.name}").sample(qs, min(keep, len(qs)))
    if cap and len(qs) > cap:
        qs = random.Random(seed).sample(qs, cap)
    return qs


def evaluation_questions(client: ClientData, cfg: FedConfig) -> list[Question]:
    """What an evaluation scores (``cfg.evaluation_split``): the client's test questions, or its validation
    questions, the training questions :func:`train_questions` leaves out (``train_fraction`` < 1)."""
    if cfg.evaluation_split == "test":
        return client.split("test")
    used = {q.id for q in train_questions(client, cfg.max_train_questions, cfg.seed, cfg.train_fraction)}
    return [q for q in client.split("train") if q.id not in used]


def gold_indices(client: ClientData, questions: list[Question]) -> list[set[int]]:
    index = {sid: i for i, sid in enumerate(client.sentence_ids)}
    return [{index[s] for s in q.answer_sentences} for q in questions]


def disjoint_batches(gold: list[set[int]], batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffled batches in which no question's gold sentence is another question's gold sentence."""
    pending = list(range(len(gold)))
    rng.shuffle(pending)
    batches = []
    while pending:
        batch, taken, rest = [], set(), []
        for i in pending:
            if len(batch) < batch_size and not (gold[i] & taken):
                batch.append(i)
                taken |= gold[i]
            else:
                rest.append(i)
        batches.append(batch)
        pending = rest
    return [b for b in batches if len(b) > 1]


def _positive(client_index: dict[str, int], q: Question) -> int:
    return client_index[q.positive]


def round_stage(cfg: FedConfig, rnd: int) -> str:
    """The negatives of stage-1 round ``rnd`` (1-based): ``bm25`` in the warm-up rounds, then ``hard`` (mine with
    the current model) every ``remine_every``-th round, ``hard-reuse`` (sample again from the last mined
    rankings) in between."""
    if rnd <= cfg.warmup_rounds:
        return "bm25"
    return "hard" if (rnd - cfg.warmup_rounds - 1) % cfg.remine_every == 0 else "hard-reuse"


def epoch_negatives(model, client: ClientData, questions: list[Question], gold: list[set[int]], stage: str,
                    cfg: FedConfig, rng: random.Random, rankings: dict[tuple[str, str], list]) -> list[list[int]]:
    """Explicit negatives of one stage-1 epoch (:func:`round_stage`), ``n_negatives`` per question sampled from a
    ranking of the client's sentences, gold excluded:

    * ``bm25``: the BM25 top ``bm25_k`` (computed once, kept in ``rankings``);
    * ``hard``: the current model's top ``hard_k`` (static hard negatives, thesis 3.4.6): the collection and
      the questions are encoded again, and the ranking replaces the one in ``rankings``;
    * ``hard-reuse``: the last ``hard`` ranking kept in ``rankings`` (mined now if there is none, e.g. after the
      client restarted).
    """
    if stage == "bm25":
        key = ("bm25", client.name)
        if key not in rankings:
            ranked = bm25_ranked(client.sentences, [q.text for q in questions], cfg.bm25_k + 8)
            rankings[key] = [[i for i in r if i not in g][:cfg.bm25_k] for r, g in zip(ranked, gold)]
    else:
        key = ("hard", client.name)
        if stage == "hard" or key not in rankings:
            s = encode_texts(model, client.sentences, max_length=cfg.max_sentence_tokens, bf16=cfg.bf16)
            q = encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens, bf16=cfg.bf16)
            rankings[key] = top_k_excluding(q, s, gold, cfg.hard_k)
    return [sample_excluding(r, set(), cfg.n_negatives, rng) for r in rankings[key]]


def train_dual_encoder_epoch(model, client: ClientData, questions: list[Question], negatives: list[list[int]], *,
                             optimizer, batch_size: int, temperature: float, max_query_tokens: int,
                             max_sentence_tokens: int, rng: random.Random, bf16: bool = False, progress=None) -> dict:
    """One local epoch of the in-batch softmax with explicit negatives; returns mean loss and steps."""
    index = {sid: i for i, sid in enumerate(client.sentence_ids)}
    gold = gold_indices(client, questions)
    model.train()
    losses = []
    for batch in disjoint_batches(gold, batch_size, rng):
        taken = set().union(*(gold[i] for i in batch))
        positives = [_positive(index, questions[i]) for i in batch]
        extra = list(dict.fromkeys(n for i in batch for n in negatives[i] if n not in taken))
        with bf16_autocast(model.device, bf16):
            q = _embed(model, [questions[i].text for i in batch], max_length=max_query_tokens)
            d = _embed(model, [client.sentences[j] for j in positives + extra], max_length=max_sentence_tokens)
            loss = in_batch_softmax_loss(q.float(), d.float(), temperature)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if progress is not None:
            progress()
    model.eval()
    return {"loss": float(np.mean(losses)) if losses else float("nan"), "steps": len(losses)}


def train_query_encoder_epoch(query_model, client: ClientData, questions: list[Question], sentence_emb: np.ndarray, *,
                              optimizer, batch_size: int, temperature: float, max_query_tokens: int, n_negatives: int,
                              hard_k: int, rng: random.Random, fed_negatives: np.ndarray | None = None,
                              bf16: bool = False) -> dict:
    """One epoch of the client-customized query encoder against the frozen sentence embeddings.

    Candidates of a batch: the batch's positives, ``n_negatives`` dynamic hard negatives per query
    (sampled from the current top ``hard_k`` of the local collection, gold excluded; recomputed every
    step, cheap because the sentence side is fixed) and, with Fed-Negative, each query's
    ``fed_negatives[i]`` (``[Q, n, d]`` embeddings from other clients).
    """
    index = {sid: i for i, sid in enumerate(client.sentence_ids)}
    gold = gold_indices(client, questions)
    s_all = torch.from_numpy(sentence_emb).to(query_model.device)
    query_model.train()
    losses = []
    for batch in disjoint_batches(gold, batch_size, rng):
        taken = set().union(*(gold[i] for i in batch))
        positives = [_positive(index, questions[i]) for i in batch]
        with bf16_autocast(query_model.device, bf16):
            q = _embed(query_model, [questions[i].text for i in batch], max_length=max_query_tokens).float()
        extra: list[int] = []
        if n_negatives:
            ranked = top_k_excluding(q.detach().cpu().numpy(), sentence_emb, [gold[i] for i in batch], hard_k)
            extra = list(dict.fromkeys(n for r in ranked for n in sample_excluding(r, taken, n_negatives, rng)))
        cands = [s_all[positives + extra]]
        if fed_negatives is not None:
            cands.append(torch.from_numpy(fed_negatives[batch].reshape(-1, sentence_emb.shape[1])).to(q.device))
        loss = in_batch_softmax_loss(q, torch.cat(cands), temperature)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    query_model.eval()
    return {"loss": float(np.mean(losses)) if losses else float("nan"), "steps": len(losses)}


def _embed(model, texts: list[str], *, max_length: int):
    """Embeddings with gradients; through the kept frozen prefix when the lower layers are frozen."""
    prefix = frozen_prefix(model)
    return prefix.embed(texts, max_length=max_length) if prefix else embed(model, texts, max_length=max_length)


def encode_texts(model, texts: list[str], *, max_length: int, bf16: bool = False) -> np.ndarray:
    """float32 L2-normalised embeddings (the core :func:`~privret.retrieval.embedding.encode`; with frozen
    lower layers, only the trainable top runs: :mod:`privret.models.frozen_prefix`)."""
    prefix = frozen_prefix(model)
    if prefix:
        return prefix.encode(texts, max_length=max_length)
    model.eval()
    old = model.max_seq_length
    model.max_seq_length = max_length
    try:
        return encode(model, texts, batch_size=64, bf16=bf16)
    finally:
        model.max_seq_length = old


def passage_scores(scores: np.ndarray, client: ClientData) -> tuple[np.ndarray, list[str]]:
    """Eq. 3.7: ``f(p, q) = max_{s in p} <q, s>``; returns ``[Q, P]`` and the passage ids."""
    pids = list(client.passages)
    col = {p: i for i, p in enumerate(pids)}
    owner = np.array([col[p] for p in client.sentence_passage])
    out = np.full((scores.shape[0], len(pids)), -np.inf, dtype=np.float64)
    for j in range(len(pids)):
        members = owner == j
        if members.any():
            out[:, j] = scores[:, members].max(axis=1)
    return out, pids


def _run(scores: np.ndarray, qids: list[str], ids: list[str], k: int = 100) -> dict[str, dict[str, float]]:
    k = min(k, scores.shape[1])
    run = {}
    for row, qid in zip(scores, qids):
        top = np.argpartition(-row, k - 1)[:k] if k < len(row) else np.arange(len(row))
        top = top[np.isfinite(row[top])]
        run[qid] = {ids[i]: float(row[i]) for i in top}
    return run


def as2_metrics(run: dict[str, dict[str, float]], qrels: dict[str, dict[str, int]], *,
                per_query: bool = False) -> dict:
    """MRR@10 and Recall@1/20/100 (the thesis's Table 4.1 columns), via the core pytrec_eval wrapper; with
    ``per_query`` also each question's reciprocal rank (``per_query``: qid -> MRR@10), for paired statistics."""
    import pytrec_eval

    core = per_query_metrics(run, qrels)
    judged = {q: d for q, d in qrels.items() if q in run}
    recall = pytrec_eval.RelevanceEvaluator(judged, {"recall.1,20"}).evaluate({q: run[q] for q in judged})
    n = len(judged)
    out = {"mrr@10": sum(v["mrr@10"] for v in core.values()) / n,
           "recall@1": sum(v["recall_1"] for v in recall.values()) / n,
           "recall@20": sum(v["recall_20"] for v in recall.values()) / n,
           "recall@100": sum(v["recall@100"] for v in core.values()) / n, "queries": n}
    if per_query:
        out["per_query"] = {q: core[q]["mrr@10"] for q in sorted(core)}
    return out


def evaluate_scores(scores: np.ndarray, client: ClientData, questions: list[Question], *,
                    per_query: bool = False) -> dict[str, dict]:
    """Sentence- and passage-level metrics of a ``[Q, N]`` query x sentence score matrix (a client with no question
    to score, e.g. no validation question left, counts 0 queries and weighs nothing in :func:`pooled`)."""
    if not questions:
        empty = {**{k: 0.0 for k in METRIC_NAMES}, "queries": 0, **({"per_query": {}} if per_query else {})}
        return {level: dict(empty) for level in LEVELS}
    qids = [q.id for q in questions]
    sentence_qrels = {q.id: {s: 1 for s in q.answer_sentences} for q in questions}
    passage_qrels = {q.id: {q.passage_id: 1} for q in questions}
    p_scores, pids = passage_scores(scores, client)
    return {"sentence": as2_metrics(_run(scores, qids, client.sentence_ids), sentence_qrels, per_query=per_query),
            "passage": as2_metrics(_run(p_scores, qids, pids), passage_qrels, per_query=per_query)}


def evaluate_dense(query_model, sentence_model, client: ClientData, questions: list[Question], *,
                   max_query_tokens: int, max_sentence_tokens: int, bf16: bool = False,
                   sentence_emb: np.ndarray | None = None, per_query: bool = False) -> dict:
    if sentence_emb is None:
        sentence_emb = encode_texts(sentence_model, client.sentences, max_length=max_sentence_tokens, bf16=bf16)
    q = encode_texts(query_model, [x.text for x in questions], max_length=max_query_tokens, bf16=bf16)
    return evaluate_scores(q @ sentence_emb.T, client, questions, per_query=per_query)


def evaluate_bm25(client: ClientData, questions: list[Question], *, per_query: bool = False) -> dict:
    import bm25s

    if not questions:  # no question to score (no validation question left): counts 0 queries
        return evaluate_scores(np.zeros((0, len(client.sentences))), client, questions, per_query=per_query)
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(client.sentences, stopwords="en", show_progress=False), show_progress=False)
    tokens = bm25s.tokenize([q.text for q in questions], stopwords="en", show_progress=False, return_ids=False)
    scores = np.stack([retriever.get_scores(t) if t else np.zeros(len(client.sentences)) for t in tokens])
    # sentences with score 0 still rank (ties broken by index), as in any BM25 engine returning top-k
    return evaluate_scores(scores.astype(np.float64), client, questions, per_query=per_query)


def pooled(per_client: dict[str, dict]) -> dict[str, dict]:
    """Micro average over all evaluated questions of all clients (each client weighted by its question count); when
    the clients report no count (validation questions under DP, :attr:`FedConfig.evaluation_counts_public`), the
    mean over clients, each weighing one."""
    counted = all("queries" in m[level] for m in per_client.values() for level in LEVELS)
    out = {}
    for level in LEVELS:
        weight = {c: m[level]["queries"] if counted else 1 for c, m in per_client.items()}
        total = sum(weight.values())
        out[level] = {k: sum(per_client[c][level][k] * w for c, w in weight.items()) / total for k in METRIC_NAMES}
        if counted:
            out[level]["queries"] = total
    return out
