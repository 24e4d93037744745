"""The model card privret writes for the retrievers it trains (privret.models.model_card)."""

from __future__ import annotations

import json
import math

import yaml

from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.models.model_card import (EVALUATIONS_FILE, guarantee_text, record_evaluation, render_model_card,
                                      write_model_card)
from privret.privacy.commitment import commit
from privret.privacy.ledger import PrivacyLedger
from privret.train.retriever import non_private_ledger, train_retriever
from privret.settings.training import RetrieverTrainConfig

METRICS = {"ndcg@10": 0.61234, "recall@10": 0.8, "recall@100": 0.93456, "mrr@10": 0.57891, "queries": 300}


def _dp_ledger(**changes) -> PrivacyLedger:
    fields = dict(mechanism="public-negatives", epsilon=7.9931, delta=6.2e-4, noise_multiplier=1.1, sample_rate=0.04,
                  steps=26, planned_steps=26, accountant="prv", unit="query", n_units=807, n_pairs=919, clip_norm=1.0,
                  model="minilm-l6", trainable="all", data_hash="ab" * 32, dataset_id="scifact-log",
                  unit_definition="all pairs with one distinct query text")
    return PrivacyLedger(**{**fields, **changes})


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_dp_card_states_the_guarantee_its_data_and_base_model(tmp_path):
    _dp_ledger().save(tmp_path)
    card = render_model_card(tmp_path)
    meta = _front_matter(card)
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and "differential-privacy" in meta["tags"]
    assert "(7.993, 0.00062)-differential privacy with respect to one privacy unit" in card
    assert "| epsilon | 7.993 |" in card and "| delta | 0.00062 |" in card and "| accountant | `prv` |" in card
    assert "| unit | `query` |" in card and "direct DP training (`public-negatives`)" in card
    # the data hash, pair count and registry id are exact functions of the private log: not on a DP card
    assert "ab" * 32 not in card and "scifact-log" not in card and "919" not in card
    assert "only by a keyed commitment" in card
    synthetic = render_model_card(_dp_ledger(mechanism="dp-sgd").save(tmp_path / "s").parent)
    assert "synthetic data from a DP generator (post-processing)" in synthetic
    # a composed ledger (documents chosen by DP, then a DP choice of retriever) names every part in words
    composed = _dp_ledger(mechanism="dp-sgd").compose(_dp_ledger(mechanism="laplace-partition-selection"),
                                                      _dp_ledger(mechanism="exponential-mechanism"))
    card = render_model_card(composed.save(tmp_path / "c").parent)
    assert ("synthetic data from a DP generator (post-processing), whose documents were chosen by a DP partition "
            "selection, then a DP choice among candidate models scored on the private log") in card
    assert "direct DP training" not in card


def test_non_private_and_public_cards_say_so(tmp_path):
    _dp_ledger(mechanism="none", epsilon=math.inf, delta=0.0).save(tmp_path / "np")
    card = render_model_card(tmp_path / "np")
    assert "**No privacy guarantee.**" in card and "| epsilon | inf |" in card
    assert f"`{commit('ab' * 32)}`" in card and f"`{commit('scifact-log')}`" in card and "| pairs | 919 |" in card
    assert "non-private" in _front_matter(card)["tags"]
    PrivacyLedger.public("public-pairs", model="minilm-l6", public_data_hash="cd" * 32, unit="query",
                         n_pairs=12).save(tmp_path / "pub")
    card = render_model_card(tmp_path / "pub")
    assert "No private data was used" in card and f"| public data sha256 | `{'cd' * 32}` |" in card
    assert "| pairs | 12 |" in card and "private log" not in card
    assert _front_matter(card)["tags"][-1] == "public-data"


def test_evaluations_are_added_replaced_per_split_and_never_written_for_public_models(tmp_path):
    _dp_ledger().save(tmp_path)
    write_model_card(tmp_path)
    assert "## Evaluation" not in (tmp_path / "README.md").read_text()
    record_evaluation(tmp_path, data="scifact", split="test", metrics=METRICS, precision="bf16-autocast")
    record_evaluation(tmp_path, data="scifact", split="test", metrics={**METRICS, "ndcg@10": 0.7}, precision="float32")
    record_evaluation(tmp_path, data="squad-beir", split="test", metrics=METRICS, precision="bf16-autocast")
    card = (tmp_path / "README.md").read_text()
    assert "| scifact | test | float32 | 300 | 0.7000 | 0.9346 | 0.5789 |" in card
    assert "0.6123 |" not in card.split("scifact")[-2]
    assert "| squad-beir | test | bf16-autocast | 300 | 0.6123 |" in card
    assert [e["precision"] for e in json.loads((tmp_path / EVALUATIONS_FILE).read_text())] == ["float32", "bf16-autocast"]
    public = tmp_path / "public-model"
    public.mkdir()
    record_evaluation(public, data="scifact", split="test", metrics=METRICS, precision="float32")
    assert list(public.iterdir()) == []


def test_a_dp_models_card_never_records_figures_of_its_own_training_data(tmp_path):
    """Figures of the private log a DP model was trained on carry no DP guarantee, and the card may be published:
    an evaluation of the split whose training identity is the ledger's data is not recorded; others are."""
    _dp_ledger().save(tmp_path / "dp")
    assert not record_evaluation(tmp_path / "dp", data="scifact", split="train", metrics=METRICS,
                                 precision="float32", data_ids=("ab" * 32,))
    assert not (tmp_path / "dp" / EVALUATIONS_FILE).exists()
    assert not record_evaluation(tmp_path / "dp", data="log-as-pairs", split="train", metrics=METRICS,
                                 precision="float32", data_ids=("cd" * 32, "scifact-log"))  # by its content key
    assert record_evaluation(tmp_path / "dp", data="scifact", split="test", metrics=METRICS, precision="float32",
                             data_ids=("cd" * 32,))
    assert [e["split"] for e in json.loads((tmp_path / "dp" / EVALUATIONS_FILE).read_text())] == ["test"]
    _dp_ledger(mechanism="none", epsilon=math.inf, delta=0.0).save(tmp_path / "np")  # no guarantee to keep
    assert record_evaluation(tmp_path / "np", data="scifact", split="train", metrics=METRICS, precision="float32",
                             data_ids=("ab" * 32,))


def test_a_trained_retriever_carries_privrets_card_not_the_base_models(tiny_bert_dir, tmp_path):
    words = ("risk", "drug", "sleep", "diet")
    pairs = TrainingPairs([QueryDocPair(f"gene {w}", f"d{i}") for i, w in enumerate(words)],
                          {f"d{i}": Document(f"d{i}", "", f"{w} study") for i, w in enumerate(words)})
    ledger = non_private_ledger(pairs, str(tiny_bert_dir), "h" * 64, "query")
    out = train_retriever(pairs, tmp_path / "r", RetrieverTrainConfig(model=str(tiny_bert_dir), batch_size=2),
                          ledger=ledger)
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and "# Dense retriever trained with privret" in card
    assert _front_matter(card)["base_model"] == str(tiny_bert_dir) and "| batch_size | `2` |" in card
    assert card == render_model_card(out)


def test_a_direct_dp_retriever_carries_its_guarantee_in_its_card(tiny_bert_dir, tmp_path):
    from privret.train.dp_retriever import train_dp_retriever
    from privret.settings.training import DPRetrieverConfig

    words = ("risk", "drug", "sleep", "diet", "gene", "virus")
    pairs = TrainingPairs([QueryDocPair(f"what {w}", f"d{i}") for i, w in enumerate(words)],
                          {f"d{i}": Document(f"d{i}", "", f"{w} study") for i, w in enumerate(words)})
    cfg = DPRetrieverConfig(method="batch-clip", model=str(tiny_bert_dir), epsilon=8.0, epochs=1.0, batch_size=3,
                            trainable="top:1")
    ledger = train_dp_retriever(pairs, tmp_path / "r", cfg, data_hash="h" * 64)
    card = (tmp_path / "r" / "README.md").read_text()
    assert f"({ledger.epsilon:.4g}, {ledger.delta:.3g})-differential privacy" in card
    assert "direct DP training (`direct-batch-clip`)" in card and "## DP mechanism" in card
    assert "| method | `batch-clip` |" in card and "| sensitivity | `2.0` |" in card
    assert card == render_model_card(tmp_path / "r")
    # how long the DP training took depends on the private batches: neither the card nor the directory says
    assert "seconds" not in card and "seconds" not in (tmp_path / "r" / "dp_mechanism.json").read_text()


def test_the_card_of_a_held_out_choice_says_its_parts_count_in_parallel(tmp_path):
    from privret.privacy.hold_out import FIT, HELDOUT, UnitPartition
    from privret.privacy.private_selection import selection_ledger

    split = UnitPartition(salt="s", heldout_fraction=0.2)
    run = PrivacyLedger(mechanism="direct-public-negatives", epsilon=8.0, delta=1e-4, noise_multiplier=3.5,
                        sample_rate=1.0, steps=48, planned_steps=48, accountant="prv", unit="query", n_units=640,
                        n_pairs=700, clip_norm=1.0, model="minilm-l6", trainable="bias-top:3", data_hash="h",
                        dataset_id="d", part=split.part(FIT))
    chosen = run.compose(selection_ledger(epsilon=8.0, n_units=160, unit="query", n_pairs=170, data_hash="h",
                                          dataset_id="d", part=split.part(HELDOUT)))
    text = guarantee_text(chosen)
    assert text.startswith("(8, 0.0001)-differential privacy") and "count in parallel" in text
    assert "parallel over the parts of partition (salt 's', held out 0.2)" in text
    assert "count in parallel" not in guarantee_text(run.model_copy(update={"part": None}))


def test_cli_evaluate_keeps_the_training_split_off_a_dp_models_card(toy_beir, tiny_bert_dir, tmp_path):
    from helpers import run_cli

    out = tmp_path / "r"
    trained = run_cli("retriever", "train-dp", "--data", str(toy_beir), "--split", "train", "--out", str(out),
                      "--model", str(tiny_bert_dir), "--method", "batch-clip", "--epsilon", "8", "--batch-size", "2",
                      "--epochs", "1", "--trainable", "top:1", "--allow-over-budget")
    assert trained.returncode == 0, trained.stderr
    on_train = run_cli("evaluate", "retrieval", "--model", str(out), "--data", str(toy_beir), "--split", "train")
    assert on_train.returncode == 0 and "not added to" in on_train.stdout
    assert not (out / EVALUATIONS_FILE).exists() and "## Evaluation" not in (out / "README.md").read_text()
    on_test = run_cli("evaluate", "retrieval", "--model", str(out), "--data", str(toy_beir), "--split", "test")
    assert on_test.returncode == 0 and "not added to" not in on_test.stdout
    assert [e["split"] for e in json.loads((out / EVALUATIONS_FILE).read_text())] == ["test"]
