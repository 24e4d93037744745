"""Fed-Negative (eqs. 4.1-4.2) returns the true top-n across clients; static hard negatives; bytes."""

from __future__ import annotations

import random

import numpy as np
import pytest

from privret.federated.negatives import (
    ExchangeLog,
    fed_negative_answer,
    fed_negative_merge,
    select_clients,
    sample_excluding,
    top_k_excluding,
)


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("n", [1, 5, 12])
def test_fed_negative_is_the_true_top_n_across_clients(n):
    rng = np.random.default_rng(0)
    d = 16
    collections = [_unit(rng, size, d) for size in (3, 40, 7, 25)]  # client 0 asks, 1..3 answer
    queries = _unit(rng, 9, d)
    answers = [fed_negative_answer(queries, s, n) for s in collections[1:]]
    merged = fed_negative_merge(answers, n)
    pool = np.concatenate(collections[1:])  # brute force over every other client's sentences
    scores = queries @ pool.T
    for i in range(len(queries)):
        expected = np.sort(scores[i])[::-1][:n]
        got = merged[i] @ queries[i]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        # and the vectors themselves are rows of the pool (not made up)
        for row in merged[i]:
            assert np.isclose(np.abs(pool - row).sum(axis=1), 0, atol=1e-6).any()


def test_a_small_client_answers_what_it_has():
    rng = np.random.default_rng(1)
    q, s = _unit(rng, 4, 8), _unit(rng, 2, 8)
    emb, scores = fed_negative_answer(q, s, 5)
    assert emb.shape == (4, 2, 8) and scores.shape == (4, 2)
    assert (np.diff(scores, axis=1) <= 0).all()


def test_select_clients_never_selects_the_asker():
    rng = random.Random(0)
    assert select_clients(2, 5, 0, rng) == [0, 1, 3, 4]
    for _ in range(20):
        chosen = select_clients(2, 10, 3, rng)
        assert len(chosen) == 3 and 2 not in chosen


def test_exchange_bytes():
    log = ExchangeLog()
    q = np.zeros((10, 384), dtype=np.float32)
    emb, scores = np.zeros((10, 16, 384), dtype=np.float32), np.zeros((10, 16), dtype=np.float32)
    log.add("c0", q, (emb, scores))
    log.add("c0", q, (emb, scores))
    assert log.query_bytes == 2 * 10 * 384 * 4
    assert log.answer_bytes == 2 * (10 * 16 * 384 * 4 + 10 * 16 * 4)
    assert log.relayed_bytes == 2 * log.total_bytes and log.messages == 4


def test_static_hard_negatives_exclude_gold_and_come_from_the_top_k():
    rng = np.random.default_rng(2)
    s = _unit(rng, 50, 8)
    q = s[:5] + 0.01  # each query is closest to "its" sentence
    gold = [{i} for i in range(5)]
    top = top_k_excluding(q, s, gold, 10)
    negs = [sample_excluding(r, set(), 3, random.Random(0)) for r in top]
    for i in range(5):
        assert i not in top[i] and len(top[i]) == 10
        assert len(negs[i]) == 3 and set(negs[i]) <= set(top[i])
        best_other = max((j for j in range(50) if j != i), key=lambda j: float(q[i] @ s[j]))
        assert top[i][0] == best_other


def test_negative_hardness_on_hand_made_scores():
    """Two queries, four local sentences (gold 0 and 1), two Fed-Negatives each; n = 2 local negatives."""
    from privret.federated.negatives import negative_hardness

    e = np.eye(4, dtype=np.float32)
    s = e  # sentence j is the unit vector e_j
    q = np.array([[0.1, 0.0, 0.6, 0.8], [0.0, 0.2, 0.6, 0.3]], dtype=np.float32)
    gold = [{0}, {1}]
    # local top 2 (gold excluded): query 0 -> 0.8, 0.6; query 1 -> 0.6, 0.3
    fed = np.stack([np.stack([0.7 * e[3], 0.9 * e[3]]),  # scores 0.56 and 0.72: one above the local 2nd (0.6)
                    np.stack([1.0 * e[2], 0.5 * e[3]])])  # scores 0.6 and 0.15: 0.6 > 0.3, and ties the best
    h = negative_hardness(q, s, gold, fed, 2)
    assert h["local_score"] == pytest.approx((0.8 + 0.6 + 0.6 + 0.3) / 4)
    assert h["fed_score"] == pytest.approx((0.56 + 0.72 + 0.6 + 0.15) / 4)
    assert h["fed_above_local_nth"] == pytest.approx(2 / 4)
    assert h["fed_best_above_local_best"] == 0.0  # 0.72 < 0.8, and 0.6 is not above 0.6
