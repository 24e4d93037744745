"""Embedding inversion check (thesis 4.3.3): the metric, and the attack end to end on tiny models."""

from __future__ import annotations

import pytest

from privret.data.fed_squad import build_fed_squad, load_fed_squad
from privret.audit.inversion import InversionConfig, inversion_check, token_recall
from privret.io import PRIVATE_DATA_KEY, write_json_atomic


def test_token_recall():
    assert token_recall("The red fox eats mice.", "the fox eats") == pytest.approx(3 / 5)
    assert token_recall("a a b", "a") == pytest.approx(1 / 3)  # multiplicity counts
    assert token_recall("a a b", "a a b b") == 1.0
    assert token_recall("", "anything") == 0.0


def test_inversion_check_on_tiny_models(tiny_squad, tiny_encoder, tiny_llama_dir, tmp_path, monkeypatch):
    """The attack trains on one half of the sampled sentences and is scored on the other half: each generation
    is compared with the sentence whose embedding it was given. The tiny generator's own output shares no
    word with the sentences, so what it writes is replaced (after it ran) by a known partial inversion: the
    first two words of the sentence the embedding came from."""
    import numpy as np
    import sacrebleu

    from privret.retrieval.embedding import encode
    from privret.audit import inversion
    from privret.models.encoder import load_encoder

    build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2)
    clients = load_fed_squad(tmp_path / "fed")
    pool = sorted({s for c in clients for s in c.sentences})
    pool_emb = encode(load_encoder(tiny_encoder), pool, bf16=False)
    calls, real = [], inversion._train_and_generate

    def partial_inversion(cfg, train_e, train_text, test_e, *, use_embedding):
        generated = real(cfg, train_e, train_text, test_e, use_embedding=use_embedding)
        sources = [pool[int(np.argmax(pool_emb @ e))] for e in test_e]  # the sentence each embedding encodes
        calls.append((list(train_text), sources, use_embedding))
        assert len(generated) == len(test_e) and all(isinstance(g, str) for g in generated)
        return [" ".join(s.split()[:2]) if use_embedding else "" for s in sources]

    monkeypatch.setattr(inversion, "_train_and_generate", partial_inversion)
    cfg = InversionConfig(generator=str(tiny_llama_dir), encoder=tiny_encoder, sentences=8, epochs=1,
                          batch_size=4, max_tokens=8, lora_rank=2)
    res = inversion_check(clients, cfg)
    assert res["train_sentences"] == 4 and res["test_sentences"] == 4
    # it holds sentences of the clients: its first key says so, also in the file written from it
    write_json_atomic(tmp_path / "inversion.json", res)
    assert (tmp_path / "inversion.json").read_text().splitlines()[1].startswith(f'  "{PRIVATE_DATA_KEY}": "PRIVATE')
    assert [use for _, _, use in calls] == [True, False]
    for (train_text, sources, _), name in zip(calls, ("with_embedding", "without_embedding")):
        examples = res[name]["examples"]
        references = [e["sentence"] for e in examples]
        assert references == sources and len(set(references)) == 4 and not set(references) & set(train_text)
        expected = [token_recall(r, e["generated"]) for r, e in zip(references, examples)]
        assert res[name]["token_recall"] == pytest.approx(sum(expected) / 4)
        assert res[name]["bleu"] == pytest.approx(
            sacrebleu.corpus_bleu([e["generated"] for e in examples], [references]).score)
    with_embedding = res["with_embedding"]
    assert all(e["generated"] == " ".join(e["sentence"].split()[:2]) for e in with_embedding["examples"])
    assert 0.2 < with_embedding["token_recall"] < 0.8 and res["without_embedding"]["token_recall"] == 0.0
