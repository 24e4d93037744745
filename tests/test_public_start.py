"""Where DP fine-tuning of the generator starts (privret.train.public_start): the few-shot prompted model by default,
writing what the epsilon-0 prompted generator writes before any private step."""

from __future__ import annotations

import json
import math

import pytest

from helpers import GENERATOR_DOCS, generator_pairs, run_cli
from privret.errors import InputError
from privret.models.generator import load_trained_generator, saved_examples
from privret.privacy.ledger import PrivacyLedger
from privret.settings.training import GeneratorTrainConfig
from privret.train.generator import train_generator
from privret.train.public import write_prompted_generator
from privret.train.public_start import GENERIC_EXAMPLES, examples_hash, prompted_provenance

SHOTS = [("the library opens at nine on weekdays", "library opening hours"),
         ("reset a password from the sign-in page", "forgot password")]


def _cfg(model, **kw) -> GeneratorTrainConfig:
    return GeneratorTrainConfig(model=str(model), epsilon=8.0, batch_size=4, epochs=1, trained_layers=1, lora_rank=4,
                                bf16=False, max_doc_tokens=16, max_query_tokens=8, **kw)


def test_the_default_start_shows_the_generic_examples_and_the_ledger_records_them(tiny_llama_dir, tmp_path):
    ledger = train_generator(generator_pairs(), tmp_path / "dp", _cfg(tiny_llama_dir), data_hash="h")
    assert ledger.provenance == {"warm_start": prompted_provenance(str(tiny_llama_dir), list(GENERIC_EXAMPLES))}
    assert ledger.provenance["warm_start"]["public_data_hash"] == examples_hash(list(GENERIC_EXAMPLES))
    assert saved_examples(tmp_path / "dp") == list(GENERIC_EXAMPLES)
    assert load_trained_generator(tmp_path / "dp").examples == list(GENERIC_EXAMPLES)


def test_before_any_private_step_the_dp_generator_writes_what_the_prompted_bar_writes(tiny_llama_dir, tmp_path):
    """LoRA starts at zero: with a learning rate too small to move a float32 weight, the DP generator (its
    training prompts showing the examples) samples exactly the prompted generator's queries."""
    write_prompted_generator(str(tiny_llama_dir), SHOTS, tmp_path / "bar", unit="query", max_doc_tokens=16,
                             max_query_tokens=8)
    train_generator(generator_pairs(), tmp_path / "dp", _cfg(tiny_llama_dir, learning_rate=1e-30), data_hash="h",
                    public_examples=SHOTS)
    bar, dp = (load_trained_generator(tmp_path / name, bf16=False) for name in ("bar", "dp"))
    assert dp.examples == bar.examples == SHOTS
    assert dp.prompt(GENERATOR_DOCS[0]) == bar.prompt(GENERATOR_DOCS[0])
    sampled = [g.generate(GENERATOR_DOCS, num_queries=2, max_new_tokens=6, seed=3) for g in (bar, dp)]
    assert sampled[0] == sampled[1]


def test_the_pretrained_start_keeps_the_zero_shot_prompt(tiny_llama_dir, tmp_path):
    ledger = train_generator(generator_pairs(), tmp_path / "dp", _cfg(tiny_llama_dir, start="pretrained"),
                             data_hash="h")
    assert ledger.provenance == {} and saved_examples(tmp_path / "dp") == []


def test_public_pairs_training_starts_pretrained(tiny_llama_dir, tmp_path):
    cfg = _cfg(tiny_llama_dir).model_copy(update={"epsilon": math.inf})
    ledger = train_generator(generator_pairs(), tmp_path / "public", cfg, data_hash="h", public=True)
    assert "warm_start" not in ledger.provenance and saved_examples(tmp_path / "public") == []


@pytest.mark.parametrize("start", ["warm", "pretrained"])
def test_public_examples_without_a_prompted_start_are_refused(tiny_llama_dir, tmp_path, start):
    warm = {}
    if start == "warm":
        write_prompted_generator(str(tiny_llama_dir), SHOTS, tmp_path / "bar", unit="query")
        warm = {"warm_start": tmp_path / "bar"}
    cfg = _cfg(tiny_llama_dir, start="pretrained" if start == "pretrained" else "prompted")
    with pytest.raises(InputError) as err:
        train_generator(generator_pairs(), tmp_path / "dp", cfg, data_hash="h", public_examples=SHOTS, **warm)
    assert "public_examples" in str(err.value) and len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "dp").exists() or not any((tmp_path / "dp").iterdir())


def test_a_prompted_warm_start_keeps_its_examples(tiny_llama_dir, tmp_path):
    write_prompted_generator(str(tiny_llama_dir), SHOTS, tmp_path / "bar", unit="query")
    ledger = train_generator(generator_pairs(), tmp_path / "dp", _cfg(tiny_llama_dir), data_hash="h",
                             warm_start=tmp_path / "bar")
    assert ledger.provenance["warm_start"]["mechanism"] == "public-prompted"
    assert load_trained_generator(tmp_path / "dp").examples == SHOTS


def test_a_seq2seq_model_cannot_start_prompted(tiny_t5_dir, tmp_path):
    cfg = _cfg(tiny_t5_dir).model_copy(update={"trained_layers": None})
    with pytest.raises(InputError, match="causal LM") as err:
        train_generator(generator_pairs(), tmp_path / "dp", cfg, data_hash="h")
    assert "start" in str(err.value)


def test_train_dp_shows_the_public_examples_given_on_the_command_line(toy_beir, tiny_llama_dir, tmp_path):
    public = tmp_path / "public.jsonl"
    public.write_text("".join(json.dumps({"query": q, "doc": d}) + "\n" for d, q in SHOTS))
    settings = tmp_path / "settings.yaml"
    settings.write_text("trained_layers: 1\nlora_rank: 4\nbf16: false\nmax_doc_tokens: 16\n")
    common = ["generator", "train-dp", "--data", str(toy_beir), "--model", str(tiny_llama_dir), "--epochs", "1",
              "--batch-size", "2", "--config", str(settings), "--allow-over-budget"]
    done = run_cli(*common, "--out", str(tmp_path / "dp"), "--public-examples", str(public))
    assert done.returncode == 0, done.stderr
    assert saved_examples(tmp_path / "dp") == SHOTS
    ledger = PrivacyLedger.load(tmp_path / "dp")
    assert ledger.provenance["warm_start"]["public_data_hash"] == examples_hash(SHOTS)
    refused = run_cli(*common, "--out", str(tmp_path / "dp2"), "--public-examples", str(public),
                      "--warm-start", str(tmp_path / "dp"))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "public_examples" in refused.stderr and not (tmp_path / "dp2").exists()
