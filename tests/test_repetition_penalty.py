"""The CTRL repetition penalty of synthetic-query sampling (``GenerateConfig.repetition_penalty``): transformers'
``RepetitionPenaltyLogitsProcessor`` on the sampled tokens only, a planted case in the decoding loop, and the
setting's path from a config file, a pipeline config and the Python API to the loop, a value below 1 refused, and
the record that pins an interrupted generation (the penalty in it only when on)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

import privret
from helpers import TOY_DOCS, run_cli
from privret.cli.common import build_config
from privret.data.sources import as_corpus
from privret.errors import InputError
from privret.models import causal_generator
from privret.models.decoding import penalise_repeats, sample_rows
from privret.settings.pipeline import load_config
from privret.settings.synthesis import GenerateConfig
from privret.synth.generate import generate_synthetic
from privret.train.public import write_prompted_generator


def test_the_penalty_divides_positive_and_multiplies_negative_logits_of_tokens_seen():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5], [2.0, -2.0, 1.0, 0.5]])
    seen = torch.tensor([[0, 1, 0], [3, 3, 3]])  # a token seen again is penalised once
    assert torch.equal(penalise_repeats(logits, seen, 2.0), torch.tensor([[1.0, -4.0, 1.0, 0.5],
                                                                          [2.0, -2.0, 1.0, 0.25]]))


@pytest.mark.parametrize("penalty", [1.1, 1.3, 2.0])
def test_the_penalty_is_transformers_repetition_penalty_processor(penalty):
    generator = torch.Generator().manual_seed(int(penalty * 10))
    logits = torch.randn(5, 50, generator=generator) * 4
    seen = torch.randint(0, 50, (5, 12), generator=generator)
    expected = RepetitionPenaltyLogitsProcessor(penalty)(seen, logits.clone())
    assert torch.equal(penalise_repeats(logits, seen, penalty), expected)


PEAKED = torch.tensor([0.0, 0.0, 3.0, -1.0, 2.5])  # token 2 first, token 4 close behind


def _peaked_model(input_ids, **_):
    """A stand-in causal LM whose next-token logits are always :data:`PEAKED`."""
    return SimpleNamespace(logits=PEAKED.expand(input_ids.shape[0], 1, -1))


def test_the_loop_penalises_the_rows_own_tokens_and_not_the_prompt():
    """Near-greedy draws (temperature 0.01): without a penalty token 2 every step; with penalty 2 the prompt's
    token 2 leaves the first draw alone, then 3 / 2 = 1.5 loses once to 2.5 and beats 2.5 / 2 = 1.25 after."""
    prompt = torch.tensor([[2, 2, 2]])

    def sampled(penalty: float) -> list[int]:
        torch.manual_seed(0)
        return sample_rows(_peaked_model, prompt, torch.ones_like(prompt), torch.arange(3)[None],
                           SimpleNamespace(batch_select_indices=lambda keep: None), eos_token_ids={99},
                           max_new_tokens=5, top_p=1.0, temperature=0.01, settled=lambda ids: False,
                           repetition_penalty=penalty)[0]

    assert sampled(1.0) == [2, 2, 2, 2, 2]
    assert sampled(2.0) == [2, 4, 2, 2, 2]


@pytest.mark.parametrize("value", ["0.9", "0", ".nan", ".inf"])
def test_a_penalty_below_one_or_not_finite_is_refused_naming_the_field(tmp_path, value):
    config = tmp_path / "generate.yaml"
    config.write_text(f"repetition_penalty: {value}\n")
    with pytest.raises(InputError) as caught:
        build_config(GenerateConfig, config_file=config)
    assert caught.value.field == "repetition_penalty" and len(caught.value.one_line().splitlines()) == 1
    pipeline = tmp_path / "run.yaml"
    pipeline.write_text(f"name: p\ndataset: d\nepsilons: [8]\ngenerate: {{repetition_penalty: {value}}}\n")
    with pytest.raises(InputError) as caught:
        load_config(pipeline)
    assert caught.value.field == "generate.repetition_penalty"


def test_synth_generate_refuses_a_penalty_below_one_in_one_line(toy_beir, tmp_path):
    config = tmp_path / "generate.yaml"
    config.write_text("repetition_penalty: 0.5\n")
    done = run_cli("synth", "generate", "--model", str(tmp_path / "none"), "--data", str(toy_beir), "--out",
                   str(tmp_path / "synthetic"), "--config", str(config))
    assert done.returncode == 2 and "repetition_penalty" in done.stderr and str(config) in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "synthetic").exists()


def _prompted(tiny_llama_dir, tmp_path):
    write_prompted_generator(str(tiny_llama_dir), [(TOY_DOCS[0][2], "aspirin heart risk")], tmp_path / "gen",
                             unit="query")
    return tmp_path / "gen"


def test_the_api_setting_reaches_the_decoding_loop(tiny_llama_dir, tmp_path, monkeypatch):
    """``privret.generate_queries(..., repetition_penalty=r)`` samples every batch with r (the synthetic set's
    manifest records it); without it, with the default."""
    generator = _prompted(tiny_llama_dir, tmp_path)
    used: list[float] = []

    def recording(*args, repetition_penalty, **kwargs):
        used.append(repetition_penalty)
        return sample_rows(*args, repetition_penalty=repetition_penalty, **kwargs)

    monkeypatch.setattr(causal_generator, "sample_rows", recording)
    corpus = {doc_id: {"title": title, "text": text} for doc_id, title, text in TOY_DOCS[:3]}
    synthetic = privret.generate_queries(generator, corpus, repetition_penalty=1.7, max_new_tokens=4,
                                         batch_size=2)
    assert used == [1.7, 1.7] and synthetic.manifest["config"]["repetition_penalty"] == 1.7
    used.clear()
    privret.generate_queries(generator, corpus, max_new_tokens=4)
    assert used == [GenerateConfig().repetition_penalty]


def test_an_interrupted_generation_without_a_penalty_resumes_only_without_one(tiny_llama_dir, tmp_path, monkeypatch):
    """The partial generation's record holds the penalty only when it is on: a record without it (penalty off)
    resumes with penalty 1 and is refused with another."""
    generator = _prompted(tiny_llama_dir, tmp_path)
    docs = list(as_corpus({doc_id: {"title": title, "text": text} for doc_id, title, text in TOY_DOCS[:4]}).values())
    batches: list[int] = []

    def killed_after_one_batch(self, texts, **_):
        if batches:
            raise RuntimeError("killed")
        batches.append(len(texts))
        return [["a query"] for _ in texts]

    monkeypatch.setattr(causal_generator.CausalQueryGenerator, "generate", killed_after_one_batch)
    off = GenerateConfig(repetition_penalty=1.0, batch_size=2)
    with pytest.raises(RuntimeError, match="killed"):
        generate_synthetic(generator, docs, tmp_path / "syn", off)
    record = json.loads((tmp_path / "syn.partial" / "meta.json").read_text())["config"]
    assert "repetition_penalty" not in record and record["batch_size"] == 2
    with pytest.raises(InputError) as refused:
        generate_synthetic(generator, docs, tmp_path / "syn", off.model_copy(update={"repetition_penalty": 1.3}),
                           resume=True)
    assert refused.value.field == "config"
    monkeypatch.setattr(causal_generator.CausalQueryGenerator, "generate",
                        lambda self, texts, **_: [["a query"] for _ in texts])
    assert generate_synthetic(generator, docs, tmp_path / "syn", off, resume=True)["generated"] == 4
