"""A model trained on private data never passes for a public one where its output would carry another ledger.

Wherever privret writes a model with a ledger it did not compute from that model's own history (training on a
synthetic set carries the set's ledger; an interpolation carries its source's; a DP choice composes only its
candidates'), the starting model must have read no private data: no ledger, or a public (epsilon 0) one
(``privret.privacy.ledger.require_public``). Otherwise a DP-trained encoder, fine-tuned on a public-prompted
synthetic set, would come out with an epsilon-0 ledger."""

from __future__ import annotations

import json
import shutil

import pytest

from privret.settings.pipeline import PipelineConfig
from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.io import file_sha256
from privret.privacy.ledger import LEDGER_FILE, PrivacyLedger
from privret.train.interpolated_release import save_interpolated
from privret.train.private_selection import select_retriever
from privret.train.retriever import non_private_ledger, train_retriever
from privret.settings.training import PrivateSelectionConfig, RetrieverTrainConfig

from helpers import run_cli

PRIVATE = PrivacyLedger(mechanism="direct-public-negatives", epsilon=8.0, delta=1e-3, noise_multiplier=1.0,
                        sample_rate=0.5, steps=2, planned_steps=2, accountant="prv", unit="query", n_units=6,
                        n_pairs=None, clip_norm=1.0, model="tiny", trainable="bias", data_hash="h")
PUBLIC = PrivacyLedger.public("public-prompted", model="gen", public_data_hash="p", unit="query")


def _pairs() -> TrainingPairs:
    corpus = {f"d{i}": Document(f"d{i}", "", f"document {i} about topic {i % 3}") for i in range(6)}
    rows = [QueryDocPair(f"query on topic {i % 3} number {i}", f"d{i}", f"q{i}", f"u{i}") for i in range(6)]
    return TrainingPairs(pairs=rows, corpus=corpus)


@pytest.fixture()
def private_encoder(tiny_bert_dir, tmp_path):
    """The tiny encoder's weights with a DP ledger: as if trained on the private log."""
    out = shutil.copytree(tiny_bert_dir, tmp_path / "dp-trained")
    PRIVATE.save(out)
    return out


def test_training_that_carries_a_guarantee_refuses_a_private_starting_model(private_encoder, tiny_bert_dir, tmp_path):
    cfg = RetrieverTrainConfig(model=str(private_encoder), epochs=1, batch_size=2, bf16=False)
    with pytest.raises(InputError, match="needs a public model") as err:  # a synthetic set's (public) ledger
        train_retriever(_pairs(), tmp_path / "r", cfg, ledger=PUBLIC)
    assert err.value.field == "model" and not (tmp_path / "r").exists()
    # without a guarantee to carry (non-private training: epsilon inf) any starting model is fine ...
    out = train_retriever(_pairs(), tmp_path / "plain", cfg, ledger=non_private_ledger(_pairs(), "m", "h", "query"))
    assert not PrivacyLedger.load(out).is_private
    # ... and a public starting model carries the set's ledger
    cfg = RetrieverTrainConfig(model=str(tiny_bert_dir), epochs=1, batch_size=2, bf16=False)
    carried = PrivacyLedger.load(train_retriever(_pairs(), tmp_path / "public", cfg, ledger=PUBLIC))
    assert carried.is_public and carried.mechanism == PUBLIC.mechanism


def test_interpolation_and_a_dp_choice_refuse_a_private_base(private_encoder, tiny_bert_dir, tmp_path):
    source = shutil.copytree(tiny_bert_dir, tmp_path / "source")
    PUBLIC.save(source)
    with pytest.raises(InputError, match="needs a public model") as err:
        save_interpolated(source, tmp_path / "mixed", base=str(private_encoder), weight=0.5)
    assert err.value.field == "base" and not (tmp_path / "mixed").exists()
    cfg = PrivateSelectionConfig(epsilon=1.0, base=str(private_encoder), candidates=[str(source)], weights=[0.5, 1],
                                 max_seq_length=32)
    with pytest.raises(InputError, match="needs a public model") as err:
        select_retriever(_pairs(), tmp_path / "chosen", cfg, data_hash="h", dataset_id="d")
    assert err.value.field == "base" and not (tmp_path / "chosen").exists()
    assert (private_encoder / LEDGER_FILE).is_file()  # refused for its ledger, not for a missing file


def _config_with(toy_beir, field: str, model) -> PipelineConfig:
    """A toy pipeline with every kind of row, whose config field ``field`` (dotted) names ``model``."""
    raw = {"name": "toy", "dataset": str(toy_beir), "epsilons": [8.0], "synthetic_filter": {},
           "direct_dp": {"methods": ["public-negatives"], "epsilons": [8.0], "settings": {}, "per_method": {}}}
    *parents, leaf = field.split(".")
    section = raw
    for key in parents:
        section = section.setdefault(key, {})
    section[leaf] = str(model)
    return PipelineConfig.model_validate(raw)


@pytest.mark.parametrize("field", ["retriever.model", "generator.model", "synthetic_filter.encoder",
                                   "direct_dp.settings.model", "direct_dp.per_method.public-negatives.model",
                                   "similarity.featurizer"])
def test_the_pipeline_refuses_a_private_starting_model_before_writing_anything(field, private_encoder, toy_beir,
                                                                              tmp_path):
    """Every model a row starts from is checked before the first stage, not when its stage starts hours later."""
    from privret.pipeline.run import run_pipeline

    with pytest.raises(InputError, match="needs a public model") as err:
        run_pipeline(_config_with(toy_beir, field, private_encoder), tmp_path / "run")
    assert err.value.field == field and not (tmp_path / "run").exists()


@pytest.mark.parametrize("field", ["retriever.model", "generator.model", "synthetic_filter.encoder",
                                   "direct_dp.settings.model", "direct_dp.per_method.public-negatives.model",
                                   "similarity.featurizer"])
def test_the_pipeline_refuses_a_missing_starting_model_before_writing_anything(field, toy_beir, tmp_path):
    """A starting model that is not there is named by its config field before the first stage (not only
    when its stage starts, after the references)."""
    from privret.pipeline.run import run_pipeline

    with pytest.raises(InputError, match="model directory not found") as err:
        run_pipeline(_config_with(toy_beir, field, tmp_path / "no-such-model"), tmp_path / "run")
    assert err.value.field == field and not (tmp_path / "run").exists()


def test_a_warm_start_needs_a_public_ledger_of_the_same_base_model(tmp_path):
    """A DP generator's warm start must say which public data and which base model made it: no ledger, a private
    one, or another base model is refused; a matching public ledger gives the provenance the DP ledger records."""
    from privret.train.generator import warm_start_provenance

    start = tmp_path / "warm"
    start.mkdir()
    with pytest.raises(InputError, match="no privacy ledger"):
        warm_start_provenance(start, "gen")
    PRIVATE.save(start)
    with pytest.raises(InputError, match="needs a public model") as err:
        warm_start_provenance(start, "tiny")
    assert err.value.field == "warm_start"
    PUBLIC.save(start)
    with pytest.raises(InputError, match="made from gen") as err:
        warm_start_provenance(start, "another-model")
    assert err.value.field == "warm_start"
    assert warm_start_provenance(start, "gen") == {"mechanism": "public-prompted", "model": "gen",
                                                    "trainable": "none", "public_data_hash": "p"}


def test_generator_training_refuses_a_private_base_model(tmp_path, tiny_llama_dir):
    from privret.train.generator import train_generator
    from privret.settings.training import GeneratorTrainConfig

    base = shutil.copytree(tiny_llama_dir, tmp_path / "dp-generator")
    PRIVATE.save(base)
    with pytest.raises(InputError, match="needs a public model") as err:
        train_generator(_pairs(), tmp_path / "g", GeneratorTrainConfig(model=str(base), epsilon=8.0), data_hash="h")
    assert err.value.field == "model" and not (tmp_path / "g").exists()


def _write_pairs(path):
    rows = [{"query": f"query on topic {i % 3} number {i}", "doc": f"document {i} about topic {i % 3}"}
            for i in range(6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_retriever_trained_on_declared_public_pairs_is_public_and_adds_nothing_to_a_dp_choice(tiny_bert_dir,
                                                                                                   tmp_path):
    """`retriever train --public`: an epsilon-0 ledger with the pairs file's sha256, usable as a public base; a DP
    choice among it and the base spends its own epsilon and nothing more (no inf from the training pairs)."""
    pairs = _write_pairs(tmp_path / "public.jsonl")
    result = run_cli("retriever", "train", "--pairs", str(pairs), "--model", str(tiny_bert_dir), "--out",
                     str(tmp_path / "r"), "--batch-size", "2", "--public")
    assert result.returncode == 0, result.stderr
    ledger = PrivacyLedger.load(tmp_path / "r")
    assert ledger.is_public and ledger.mechanism == "public-pairs" and ledger.n_pairs == 6
    assert ledger.provenance == {"public_data_hash": file_sha256(pairs)}
    save_interpolated(tmp_path / "r", tmp_path / "mixed", base=str(tmp_path / "r"), weight=0.5)  # a public base
    cfg = PrivateSelectionConfig(epsilon=0.5, base=str(tiny_bert_dir), candidates=[str(tmp_path / "r")],
                                 weights=[1], max_seq_length=32)
    select_retriever(_pairs(), tmp_path / "chosen", cfg, data_hash="h", dataset_id="public-pairs-test")
    chosen = PrivacyLedger.load(tmp_path / "chosen")
    assert chosen.epsilon == 0.5 and chosen.mechanism == "exponential-mechanism" and not chosen.parts


def test_public_training_refuses_dp_and_a_private_starting_model(private_encoder, tmp_path):
    pairs = _write_pairs(tmp_path / "public.jsonl")
    # retriever train-dp takes no --public (DP training is for private data), and the start must be public
    import typer.main

    from privret.cli import app

    train_dp = typer.main.get_command(app).commands["retriever"].commands["train-dp"]
    assert "public" not in {p.name for p in train_dp.params} and "public_negatives" in {p.name for p in train_dp.params}
    for extra, field in ((["--model", str(private_encoder)], "model"),):
        result = run_cli("retriever", "train", "--pairs", str(pairs), "--out", str(tmp_path / "r"), "--batch-size",
                         "2", "--public", *extra)
        assert result.returncode == 2 and field in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_a_ledger_with_a_field_of_the_wrong_type_names_the_field(tmp_path):
    PRIVATE.save(tmp_path)
    path = tmp_path / LEDGER_FILE
    path.write_text(path.read_text().replace('"epsilon": 8.0', '"epsilon": "eight"'))
    with pytest.raises(InputError, match="unreadable ledger") as err:
        PrivacyLedger.load(tmp_path)
    assert (err.value.path, err.value.field) == (str(path), "epsilon")
