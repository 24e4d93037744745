"""bench/plain_finetune.py: the plain sentence-transformers fine-tune that privret's trainer is compared with."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import TOY_DOCS, TOY_TRAIN, load_script


def _module():
    return load_script("bench/plain_finetune.py")


def test_training_columns_are_the_splits_pairs_with_the_documents_full_text(toy_beir):
    from privret.data.beir import load_beir
    from privret.data.pairs import pairs_from_beir

    columns = _module().training_columns(pairs_from_beir(load_beir(toy_beir, ["train"]), "train"))
    text = {d: f"{title}. {body}" for d, title, body in TOY_DOCS}
    expected = [(query, text[d]) for _, query, docs in TOY_TRAIN for d in docs]
    assert sorted(zip(columns["anchor"], columns["positive"])) == sorted(expected)
    assert len(columns["anchor"]) == 6  # q3 has two relevant documents: two rows


@pytest.mark.parametrize("trainer", ["sentence-transformers", "privret"])
def test_each_trainer_trains_and_writes_a_retriever_privret_reads(trainer, toy_beir, tiny_bert_dir, tmp_path):
    from privret.models.encoder import load_encoder
    from privret.privacy.ledger import PrivacyLedger

    plain = _module()
    out = plain.plain_finetune(toy_beir, tmp_path / "models" / "plain", model=str(tiny_bert_dir), seed=0, epochs=2,
                               batch_size=3, learning_rate=1e-3, trainer=trainer)
    ledger = PrivacyLedger.load(out)
    assert math.isinf(ledger.epsilon) and ledger.mechanism == "none" and ledger.n_pairs == 6
    record = json.loads((out / "plain_finetune.json").read_text())
    assert record["trainer"] == trainer and record["pairs"] == 6 and record["train_seconds"] > 0
    base, trained = load_encoder(str(tiny_bert_dir)), load_encoder(str(out))
    texts = ["aspirin heart risk", "gene memory mice"]
    with torch.no_grad():
        moved = (base.encode(texts, convert_to_tensor=True) - trained.encode(texts, convert_to_tensor=True)).abs()
    assert moved.max() > 1e-3  # the trainer stepped; an untouched copy would give the same embeddings
    assert sorted(p.name for p in out.parent.iterdir()) == ["plain"]  # written atomically: no staging left beside it


def test_an_unknown_trainer_is_refused_before_anything_is_read_or_written(tiny_bert_dir, tmp_path):
    with pytest.raises(ValueError, match="expected sentence-transformers or privret"):  # no dataset there at all
        _module().plain_finetune(tmp_path / "nowhere", tmp_path / "out", model=str(tiny_bert_dir), trainer="keras")
    assert not (tmp_path / "out").exists()


def test_a_missing_dataset_is_one_line_naming_it_and_writes_nothing(tmp_path, monkeypatch):
    missing, out = tmp_path / "nowhere", tmp_path / "out"
    monkeypatch.setattr("sys.argv", ["plain_finetune.py", "--data", str(missing), "--out", str(out)])
    with pytest.raises(SystemExit) as exit_:
        _module().main()
    message = str(exit_.value.code)
    assert message.startswith(f"error: {missing}") and "\n" not in message
    assert not out.exists()
