"""Embedding inversion check (thesis 4.3.3): the metric, and the attack end to end on tiny models."""

from __future__ import annotations

import pytest

from privret.data.fed_squad import build_fed_squad, load_fed_squad
from privret.federated.inversion import InversionConfig, inversion_check, token_recall


def test_token_recall():
    assert token_recall("The red fox eats mice.", "the fox eats") == pytest.approx(3 / 5)
    assert token_recall("a a b", "a") == pytest.approx(1 / 3)  # multiplicity counts
    assert token_recall("a a b", "a a b b") == 1.0
    assert token_recall("", "anything") == 0.0


def test_inversion_check_runs_on_tiny_models(tiny_squad, tiny_encoder, tiny_llama_dir, tmp_path):
    build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2)
    clients = load_fed_squad(tmp_path / "fed")
    cfg = InversionConfig(generator=str(tiny_llama_dir), encoder=tiny_encoder, sentences=8, epochs=1,
                          batch_size=4, max_tokens=8, lora_rank=2)
    res = inversion_check(clients, cfg)
    assert res["train_sentences"] == 4 and res["test_sentences"] == 4
    for name in ("with_embedding", "without_embedding"):
        assert 0.0 <= res[name]["bleu"] <= 100.0 and 0.0 <= res[name]["token_recall"] <= 1.0
        assert len(res[name]["examples"]) == 4
