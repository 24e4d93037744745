"""public-negatives with per-row hard public negatives: mining, drawing, the clipped sum against brute force,
the sensitivity, and the end-to-end run."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import WORDS
from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.models.trainable import make_trainable
from privret.privacy.clipping import NORM_MARGIN
from privret.privacy.ledger import PrivacyLedger
from privret.train.clipped_sums import (StepBatch, _encode, _grads, _norm, clipped_sum,
                                        false_negative_mask, public_negative_losses)
from privret.train.dp_retriever import build_batch, negative_pool, sensitivity, train_dp_retriever
from privret.train.hard_negatives import mine_candidates
from privret.settings.training import DPRetrieverConfig

torch.set_num_threads(1)
K = 2


def _cfg(tiny_bert_dir, **kw):
    base = dict(method="public-negatives", model=str(tiny_bert_dir), clip_norm=0.02, batch_size=4, epochs=1.0,
                max_query_tokens=32, max_doc_tokens=32, temperature=0.5, hard_negatives=K, trainable="all",
                learning_rate=2e-5, public_negatives=32, physical_batch=None)
    base.update(kw)
    return DPRetrieverConfig(**base)


@pytest.fixture(scope="module")
def model_params(tiny_bert_dir):
    from privret.models.encoder import load_encoder

    model = load_encoder(str(tiny_bert_dir), max_seq_length=32).eval()
    return model, list(make_trainable(model, "all").values())


def _batch(units: list[int]) -> StepBatch:
    """Rows of ``units`` (unit 3 has two rows), 3 shared public negatives, K hard negatives per row that
    depend on the row's unit only; unit 5's row has no candidate (masked placeholders)."""
    gen = torch.Generator().manual_seed(0)
    text = lambda k: " ".join(WORDS[int(i)] for i in torch.randint(len(WORDS), (k,), generator=gen))  # noqa: E731
    rows = {}
    for u in range(8):
        q = text(3 + u % 3)
        rows[u] = [(q, text(5 + u % 4), f"d{u}")] + ([(q, text(6), "d3b")] if u == 3 else [])
    shared = [Document(f"n{k}", "", text(6)) for k in range(3)]
    hard_texts = {u: [text(4 + k) for k in range(K)] for u in range(8)}
    chosen = [(k, r) for k, u in enumerate(units) for r in rows[u]]
    return StepBatch(queries=[r[0] for _, r in chosen], docs=[r[1] for _, r in chosen],
                     unit_of_row=torch.tensor([k for k, _ in chosen]), doc_ids=[r[2] for _, r in chosen],
                     n_units=len(units), negatives=shared,
                     hard=[hard_texts[units[k]] for k, _ in chosen],
                     hard_valid=torch.tensor([[units[k] != 5] * K for k, _ in chosen]))


def _per_unit_grads(model, params, batch, *, detach_hard: bool = False):
    e_q, e_d = _encode(model, batch.queries, 32), _encode(model, batch.docs, 32)
    with torch.no_grad():
        e_n = _encode(model, [n.full_text for n in batch.negatives], 32)
    e_h = _encode(model, [t for ts in batch.hard for t in ts], 32).view(len(batch.hard), K, -1)
    losses = public_negative_losses(e_q, e_d, e_n, 0.5, mask=false_negative_mask(batch),
                                    hard=e_h.detach() if detach_hard else e_h, hard_mask=~batch.hard_valid)
    return [_grads(losses[batch.unit_of_row == k].sum(), params, retain=True) for k in range(batch.n_units)]


@pytest.mark.parametrize("physical_batch", [None, 2])
def test_clipped_sum_with_hard_negatives_equals_brute_force(physical_batch, model_params, tiny_bert_dir):
    """The ghost-norm clipped sum with each row's hard negatives (slot "n", with gradient) equals the sum of
    materialised per-unit gradients, each clipped to C; dropping the hard negatives' gradient (what a tracker
    that missed slot "n" would compute) gives a different sum."""
    model, params = model_params
    batch = _batch([0, 3, 5, 6, 7])
    per_unit = _per_unit_grads(model, params, batch)
    norms = torch.stack([_norm(g) for g in per_unit])
    clip = float((norms.min() * norms.max()).sqrt())
    cfg = _cfg(tiny_bert_dir, clip_norm=clip, physical_batch=physical_batch)
    got, stats = clipped_sum("public-negatives", model, params, batch, cfg)
    assert 0 < stats["clipped"] < 1
    factors = (clip / (norms * (1 + NORM_MARGIN))).clamp(max=1.0).tolist()

    def combine(grads):
        return [sum(f * g[i] for f, g in zip(factors, grads)) for i in range(len(params))]

    def close(a, b):
        return all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(a, b))

    assert close(got, combine(per_unit))
    assert not close(got, combine(_per_unit_grads(model, params, batch, detach_hard=True)))


def test_without_public_negatives_the_clipped_sum_is_the_hard_negative_softmax_by_brute_force(model_params,
                                                                                            tiny_bert_dir):
    """``public_negatives = 0``: row i's loss is -log(e^{s_i} / (e^{s_i} + sum_k e^{h_ik})) over its own hard
    negatives alone, written out here by hand; the clipped sum equals the per-unit brute force, and the row
    with no candidate (unit 5: every hard negative masked) has loss 0 and adds nothing."""
    model, params = model_params
    batch = _batch([0, 3, 5, 6, 7])
    batch.negatives = []
    e_q, e_d = _encode(model, batch.queries, 32), _encode(model, batch.docs, 32)
    e_h = _encode(model, [t for ts in batch.hard for t in ts], 32).view(len(batch.hard), K, -1)
    own = torch.einsum("bd,bkd->bk", e_q, e_h).masked_fill(~batch.hard_valid, float("-inf"))
    logits = torch.cat([(e_q * e_d).sum(1, keepdim=True), own], dim=1) / 0.5
    losses = torch.logsumexp(logits, dim=1) - logits[:, 0]
    assert losses[batch.unit_of_row == 2].abs().max() < 1e-6  # unit 5 is the third unit of the batch
    per_unit = [_grads(losses[batch.unit_of_row == k].sum(), params, retain=True) for k in range(batch.n_units)]
    norms = torch.stack([_norm(g) for g in per_unit])
    assert norms[2] == 0 and (norms[[0, 1, 3, 4]] > 0).all()
    clip = float((norms[norms > 0].min() * norms.max()).sqrt())
    got, stats = clipped_sum("public-negatives", model, params, batch, _cfg(tiny_bert_dir, clip_norm=clip,
                                                                            public_negatives=0))
    assert 0 < stats["clipped"] < 1
    factors = (clip / (norms * (1 + NORM_MARGIN)).clamp_min(1e-12)).clamp(max=1.0).tolist()
    want = [sum(f * g[i] for f, g in zip(factors, per_unit)) for i in range(len(params))]
    assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(got, want))


def test_a_row_needs_a_negative():
    with pytest.raises(ValueError, match="needs a negative per row"):
        DPRetrieverConfig(method="public-negatives", public_negatives=0, hard_negatives=0)
    assert DPRetrieverConfig(method="public-negatives", public_negatives=0, hard_negatives=1).public_negatives == 0
    with pytest.raises(ValueError, match="public_negatives\n.*greater than or equal to 0"):
        DPRetrieverConfig(method="public-negatives", public_negatives=-1, hard_negatives=1)


def test_norms_and_clipped_sum_are_exact_under_dropout(tiny_bert_dir):
    """In training mode (dropout on, ``dropout=True``) the brute-force comparison above cannot redraw
    the same masks, so the ghost norms and the book-keeping sum are checked on the pass's own graph: each unit's
    norm against autograd of its rows' losses, and the clipped sum against autograd of sum_u f_u loss_u."""
    from privret.models.encoder import load_encoder
    from privret.privacy.ghost_norms import GhostNorms
    from privret.train.clipped_sums import public_negative_unit_norms

    torch.manual_seed(0)
    model = load_encoder(str(tiny_bert_dir), max_seq_length=32).train()
    params = list(make_trainable(model, "all").values())
    batch = _batch([0, 3, 5, 6, 7])
    assert not torch.equal(_encode(model, batch.docs, 32), _encode(model, batch.docs, 32))  # dropout is on
    cfg = _cfg(tiny_bert_dir)
    with torch.no_grad():
        e_n = _encode(model, [n.full_text for n in batch.negatives], 32)
    tracker = GhostNorms(model)
    try:
        norms, groups, losses = public_negative_unit_norms(tracker, model, batch, e_n, false_negative_mask(batch), cfg)
        per_unit = [_grads(losses[batch.unit_of_row == k].sum(), params, retain=True) for k in range(batch.n_units)]
        torch.testing.assert_close(norms, torch.stack([_norm(g) for g in per_unit]), rtol=1e-4, atol=1e-7)
        factors = torch.linspace(0.2, 1.0, batch.n_units)
        got = tracker.weighted_grads(params, {slot: factors[g] for slot, g in groups.items()})
    finally:
        tracker.remove()
    want = _grads((factors[batch.unit_of_row] * losses).sum(), params, retain=False)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)


def test_documents_are_embedded_in_calls_of_similar_length(model_params, tiny_bert_dir, monkeypatch):
    """Positives and hard negatives go through the encoder longest first, in calls of as many documents as the
    part has rows, so a call pads to a length close to its documents' own (the speed-up of
    ``_encode_documents_by_length``); the brute-force test above proves the result is unchanged by it."""
    import privret.train.clipped_sums as cs

    model, params = model_params
    batch = _batch([0, 3, 5, 6, 7])
    calls = []
    real_encode = cs._encode
    monkeypatch.setattr(cs, "_encode", lambda m, texts, n: calls.append(list(texts)) or real_encode(m, texts, n))
    clipped_sum("public-negatives", model, params, batch, _cfg(tiny_bert_dir))
    expected = sorted(batch.docs + [t for ts in batch.hard for t in ts], key=len, reverse=True)
    document_calls = [c for c in calls if set(c) <= set(expected)]
    assert [len(c) for c in document_calls] == [len(batch.docs)] * (1 + K)
    documents = [t for c in document_calls for t in c]
    assert [len(t) for t in documents] == [len(t) for t in expected]
    assert sorted(documents) == sorted(expected)


def test_masked_hard_placeholders_change_nothing(model_params, tiny_bert_dir):
    """A row without candidates (all its hard negatives masked) has the loss it has without hard negatives."""
    model, _ = model_params
    batch = _batch([5])
    e_q, e_d = _encode(model, batch.queries, 32), _encode(model, batch.docs, 32)
    e_n = _encode(model, [n.full_text for n in batch.negatives], 32)
    e_h = _encode(model, [t for ts in batch.hard for t in ts], 32).view(1, K, -1)
    mask = false_negative_mask(batch)
    with_hard = public_negative_losses(e_q, e_d, e_n, 0.5, mask=mask, hard=e_h, hard_mask=~batch.hard_valid)
    assert torch.allclose(with_hard, public_negative_losses(e_q, e_d, e_n, 0.5, mask=mask))


def _batch_with(units: list[int], public_negatives: int) -> StepBatch:
    batch = _batch(units)
    batch.negatives = batch.negatives[:public_negatives]
    return batch


@pytest.mark.parametrize("public_negatives", [3, 0])
def test_adding_a_unit_with_hard_negatives_changes_the_sum_by_at_most_c(model_params, tiny_bert_dir,
                                                                        public_negatives):
    model, params = model_params
    cfg = _cfg(tiny_bert_dir, public_negatives=public_negatives)
    assert sensitivity(cfg) == (cfg.clip_norm, None)
    worst = 0.0
    for base, extra in (([0, 3], 6), ([5], 7), ([0, 6, 7], 3)):
        a, _ = clipped_sum("public-negatives", model, params, _batch_with(base + [extra], public_negatives), cfg)
        b, _ = clipped_sum("public-negatives", model, params, _batch_with(base, public_negatives), cfg)
        worst = max(worst, _norm([x - y for x, y in zip(a, b)]).item())
    assert 0.5 * cfg.clip_norm < worst <= cfg.clip_norm * (1 + 1e-4)


def _pairs(queries: dict[str, str] | None = None) -> TrainingPairs:
    corpus = {f"d{i}": Document(f"d{i}", "", f"document about {w}") for i, w in enumerate(WORDS[:12])}
    corpus["copy"] = Document("copy", "", "document about " + WORDS[1])  # the same text as d1
    queries = queries or {}
    rows = [QueryDocPair(query=queries.get(f"q{i}", f"what {w}"), doc_id=f"d{i}", query_id=f"q{i}")
            for i, w in enumerate(WORDS[:6])]
    rows.append(QueryDocPair(query="what " + WORDS[3], doc_id="d9", query_id="q3"))  # unit q3 has two rows
    return TrainingPairs(pairs=rows, corpus=corpus)


def test_mined_candidates_leave_out_the_units_positives_and_depend_on_the_unit_only(model_params):
    model, _ = model_params
    pairs = _pairs()
    units = pairs.units("query")
    pool = negative_pool(pairs, pairs.corpus)
    cands = mine_candidates(model, pairs, units, pool, depth=5)
    assert len(cands) == len(pairs.pairs) and all(len(c) == 5 for c in cands)
    for u, rows in enumerate(units):
        gold = {pairs.pairs[r].doc_id for r in rows}
        texts = {pairs.corpus[g].full_text for g in gold}
        for r in rows:
            assert not {pool[j].id for j in cands[r]} & gold
            assert not {pool[j].full_text for j in cands[r]} & texts
    row_d1 = next(r for r, p in enumerate(pairs.pairs) if p.doc_id == "d1")
    assert "copy" not in {pool[j].id for j in mine_candidates(model, pairs, units, pool, depth=12)[row_d1]}
    # another unit's query changes: this row's candidates do not
    other = mine_candidates(model, _pairs({"q4": "completely different words here"}), units, pool, depth=5)
    assert all(other[r] == cands[r] for r, p in enumerate(pairs.pairs) if p.query_id != "q4")
    assert other[[p.query_id for p in pairs.pairs].index("q4")] != cands[[p.query_id for p in pairs.pairs].index("q4")]
    # removing the unit with the most positives (q3: two) changes no other row's candidates, also for the row whose
    # positive's text has a copy in the pool (d1 and "copy": two exclusions for one positive)
    fewer = TrainingPairs(pairs=[p for p in pairs.pairs if p.query_id != "q3"], corpus=pairs.corpus)
    assert mine_candidates(model, fewer, fewer.units("query"), pool, depth=5) == [
        cands[r] for r, p in enumerate(pairs.pairs) if p.query_id != "q3"]


def test_mining_keeps_only_the_public_pools_embeddings_and_reads_them_back(model_params, tmp_path, monkeypatch):
    """With a cache the candidates are the same; the one entry kept is the pool's embeddings (no query, no inline
    document: one row per pool document), and a second mining (a later run, a resume) does not encode the pool."""
    import numpy as np

    import privret.retrieval.embedding as embedding

    model, _ = model_params
    pairs = _pairs()
    units = pairs.units("query")
    pool = negative_pool(pairs, pairs.corpus)
    fresh = mine_candidates(model, pairs, units, pool, depth=5)
    assert mine_candidates(model, pairs, units, pool, depth=5, cache_dir=tmp_path) == fresh
    [entry] = list(tmp_path.glob("*.npy"))
    expected = embedding.encode(model, [d.full_text for d in pool], bf16=False)
    assert np.array_equal(np.load(entry), expected)

    def no_pool_encoding(*args, **kwargs):
        raise AssertionError("the pool was encoded again")

    monkeypatch.setattr(embedding, "encode", no_pool_encoding)  # the queries' encoding is hard_negatives' own import
    assert mine_candidates(model, pairs, units, pool, depth=5, cache_dir=tmp_path) == fresh


def test_build_batch_draws_each_rows_hard_negatives_from_its_own_candidates(tiny_bert_dir):
    pairs = _pairs()
    units = pairs.units("query")
    pool = negative_pool(pairs, pairs.corpus)
    candidates = [[r % len(pool), (r + 1) % len(pool)] for r in range(len(pairs.pairs))]
    candidates[0] = []
    cfg = _cfg(tiny_bert_dir, hard_negatives=3)
    batch = build_batch(pairs, units, list(range(len(units))), cfg, torch.Generator().manual_seed(0), [], None,
                        hard=(pool, candidates))
    assert len(batch.hard) == len(batch.queries) and all(len(h) == 3 for h in batch.hard)
    row_of = {(p.query, p.doc_id): r for r, p in enumerate(pairs.pairs)}
    for q, d, texts, valid in zip(batch.queries, batch.doc_ids, batch.hard, batch.hard_valid.tolist()):
        r = row_of[(q, d)]
        assert valid == [bool(candidates[r])] * 3
        if candidates[r]:
            assert set(texts) <= {pool[j].full_text for j in candidates[r]}


def test_hard_negatives_are_refused_for_other_methods():
    with pytest.raises(ValueError, match="public-negatives only"):
        DPRetrieverConfig(method="logit-dp", hard_negatives=2)
    with pytest.raises(ValueError, match="hard_negatives\n.*greater than or equal to 0"):
        DPRetrieverConfig(method="public-negatives", hard_negatives=-1)


@pytest.mark.parametrize("public_negatives", [32, 0])
def test_train_with_hard_negatives_end_to_end(tmp_path, tiny_bert_dir, public_negatives):
    pairs = _pairs()
    cfg = _cfg(tiny_bert_dir, epsilon=8.0, batch_size=3, learning_rate=1e-3, trainable="top:1", hard_negative_depth=4,
               public_negatives=public_negatives)
    ledger = train_dp_retriever(pairs, tmp_path / "r", cfg, data_hash="h", public_corpus=pairs.corpus,
                                embedding_cache=tmp_path / "cache")
    assert ledger.mechanism == "direct-public-negatives" and ledger.epsilon <= 8.0 + 0.05
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1  # the pool's embeddings by the public model
    assert ledger.steps == math.ceil(1 / (3 / 6)) and PrivacyLedger.load(tmp_path / "r").n_units == 6


def test_clipped_sum_on_the_top_layers_biases_uses_the_frozen_prefix_and_equals_brute_force(tiny_bert_dir):
    """``bias-top:1`` trains only the top layer's biases and LayerNorms, so the DP step runs that layer alone on
    the kept output of the frozen prefix; its clipped sum still equals the materialised per-unit gradients of
    the *full* forward pass, each clipped to C."""
    import torch.nn.functional as F

    from privret.models.encoder import features, load_encoder
    from privret.models.frozen_prefix import frozen_prefix

    model = load_encoder(str(tiny_bert_dir), max_seq_length=32).eval()
    named = make_trainable(model, "bias-top:1")
    assert named and all(".bias" in n or "LayerNorm" in n for n in named)
    assert all(".layer.1." in n for n in named)  # the tiny model has two layers: only the top one trains
    params = list(named.values())

    def full(texts):  # the whole model, no cache
        return F.normalize(model(features(model, texts, max_length=32))["sentence_embedding"].float(), dim=-1)

    batch = _batch([0, 3, 6, 7])
    e_q, e_d = full(batch.queries), full(batch.docs)
    with torch.no_grad():
        e_n = full([n.full_text for n in batch.negatives])
    e_h = full([t for ts in batch.hard for t in ts]).view(len(batch.hard), K, -1)
    losses = public_negative_losses(e_q, e_d, e_n, 0.5, mask=false_negative_mask(batch), hard=e_h,
                                    hard_mask=~batch.hard_valid)
    per_unit = [_grads(losses[batch.unit_of_row == k].sum(), params, retain=True) for k in range(batch.n_units)]
    norms = torch.stack([_norm(g) for g in per_unit])
    clip = float((norms.min() * norms.max()).sqrt())
    got, stats = clipped_sum("public-negatives", model, params, batch, _cfg(tiny_bert_dir, clip_norm=clip))
    prefix = frozen_prefix(model)
    assert prefix is not None and prefix.n_frozen == 1 and prefix._states  # the cache was used
    assert 0 < stats["clipped"] < 1
    factors = (clip / (norms * (1 + NORM_MARGIN))).clamp(max=1.0).tolist()
    want = [sum(f * g[i] for f, g in zip(factors, per_unit)) for i in range(len(params))]
    assert all(torch.allclose(x, y, atol=1e-6, rtol=1e-4) for x, y in zip(got, want))
