"""Per-tensor learning-rate scales (privret.train.lr_scales): each trained tensor steps at its own multiple of the
learning rate, the file is checked field by field, and the ledger records the scales as public provenance."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from helpers import record_updates, run_cli
from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.models.encoder import load_encoder
from privret.models.trainable import make_trainable
from privret.privacy.ledger import PrivacyLedger
from privret.train.dp_retriever import train_dp_retriever
from privret.train.lr_scales import read_lr_scales, scaled_param_groups
from privret.train.settings import DPRetrieverConfig

torch.set_num_threads(1)


def _pairs() -> TrainingPairs:
    corpus = {f"d{i}": Document(f"d{i}", "", f"document {i} about topic {i % 3}") for i in range(10)}
    return TrainingPairs(pairs=[QueryDocPair(f"query {i}", f"d{i}") for i in range(10)], corpus=corpus)


def _trained_names(tiny_bert_dir, spec: str) -> list[str]:
    return list(make_trainable(load_encoder(str(tiny_bert_dir), max_seq_length=32), spec))


def test_sgd_moves_each_tensor_by_its_scaled_learning_rate(tmp_path, tiny_bert_dir, monkeypatch):
    """Noise zero, batch fixed, plain SGD: every tensor moves by exactly -lr * scale * (the gradient the DP step set);
    a tensor at scale 0 does not move at all."""
    record_updates(monkeypatch, [1, 3, 5, 7, 8])
    names = _trained_names(tiny_bert_dir, "top:1")
    scales = {name: [0.0, 0.5, 2.0][i % 3] for i, name in enumerate(names)}
    seen = []
    sgd_step = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        groups = [(group["lr"], p, p.detach().clone(), p.grad.detach().clone())
                  for group in self.param_groups for p in group["params"]]
        result = sgd_step(self, *args, **kwargs)
        seen.append([(lr, before, grad, p.detach().clone()) for lr, p, before, grad in groups])
        return result

    monkeypatch.setattr(torch.optim.SGD, "step", step)
    cfg = DPRetrieverConfig(method="batch-clip", model=str(tiny_bert_dir), clip_norm=0.02, batch_size=4,
                            max_query_tokens=32, max_doc_tokens=32, temperature=0.5, epochs=1.0, trainable="top:1",
                            optimizer="sgd", learning_rate=0.5, lr_scales=scales)
    train_dp_retriever(_pairs(), tmp_path / "r", cfg, data_hash="h")
    assert len(seen) == 3
    for tensors in seen:
        assert [lr for lr, *_ in tensors] == [0.5 * scales[n] for n in names]
        assert max(g.abs().max().item() for _, _, g, _ in tensors) > 0
        for lr, before, grad, after in tensors:
            torch.testing.assert_close(after, before - lr * grad)
    frozen = [n for n in names if scales[n] == 0.0]
    trained = load_encoder(str(tmp_path / "r"), max_seq_length=32).state_dict()
    initial = load_encoder(str(tiny_bert_dir), max_seq_length=32).state_dict()
    for name in frozen:
        torch.testing.assert_close(trained[name], initial[name], rtol=0, atol=0)
    ledger = PrivacyLedger.model_validate_json((tmp_path / "r" / "privacy_ledger.json").read_text())
    assert ledger.provenance["lr_scales"]["tensors"] == len(names)
    assert len(ledger.provenance["lr_scales"]["sha256"]) == 64


def test_the_scales_must_name_exactly_the_trained_tensors(tiny_bert_dir):
    model = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    named = make_trainable(model, "bias-top:1")
    scales = {name: 1.0 for name in named}
    groups = scaled_param_groups(named, 1e-3, {**scales, next(iter(named)): 3.0})
    assert [g["lr"] for g in groups] == [3e-3] + [1e-3] * (len(named) - 1)
    assert scaled_param_groups(named, 1e-3, None) == [{"params": list(named.values()), "lr": 1e-3}]
    missing = dict(list(scales.items())[1:])
    with pytest.raises(InputError, match="no scale for the trained tensor"):
        scaled_param_groups(named, 1e-3, missing)
    with pytest.raises(InputError, match="which this run does not train"):
        scaled_param_groups(named, 1e-3, {**scales, "0.auto_model.embeddings.word_embeddings.weight": 1.0})


def test_config_rejects_negative_or_infinite_scales(tiny_bert_dir):
    for bad in (-0.1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="lr_scales"):
            DPRetrieverConfig(method="public-negatives", model=str(tiny_bert_dir), lr_scales={"x": bad})


@pytest.mark.parametrize("content, message", [
    (None, "not found"), ("{not json", "is not JSON"), ('{"scales": {}}', "non-empty object 'scales'"),
    ('[1, 2]', "non-empty object 'scales'"), ('{"scales": {"a": -1}}', "finite number >= 0"),
    ('{"scales": {"a": true}}', "finite number >= 0"), ('{"scales": {"a": "2"}}', "finite number >= 0")])
def test_read_lr_scales_names_the_file_and_field(tmp_path, content, message):
    path = tmp_path / "scales.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InputError, match=message) as err:
        read_lr_scales(path)
    assert str(path) in str(err.value)


def test_cli_lr_scales_fails_in_one_line_and_is_dp_only(tmp_path, toy_beir, tiny_bert_dir):
    bad = tmp_path / "scales.json"
    bad.write_text('{"scales": {"a": -1}}')
    base = ("retriever", "train", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "r"))
    result = run_cli(*base, "--dp", "public-negatives", "--lr-scales", str(bad))
    assert result.returncode == 2 and str(bad) in result.stderr and "scales" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_cli(*base, "--lr-scales", str(bad))
    assert result.returncode == 2 and "--lr-scales" in result.stderr and "--dp" in result.stderr
    assert not (tmp_path / "r").exists()
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"scales": {"a": 1.0}}))
    result = run_cli(*base, "--dp", "public-negatives", "--lr-scales", str(good))   # names no trained tensor
    assert result.returncode == 2 and "lr_scales" in result.stderr and "another trainable set" in result.stderr
    assert not (tmp_path / "r").exists()


def test_the_kept_scifact_scales_name_the_shipped_rules_tensors_of_the_default_encoder():
    """bench/regimes.sh's lrs regime reads this file: it must name exactly what bias-top:3 trains in the default
    encoder (a sentence-transformers rename of its modules would otherwise fail the 2-hour run at its start)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench/results/tensor_coherence/scifact_proxy_lr_scales.json"
    scales = read_lr_scales(path)
    named = make_trainable(load_encoder("minilm-l6"), "bias-top:3")
    groups = scaled_param_groups(named, 2e-3, scales)
    assert len(groups) == len(named) == 30
    assert all(scales[n] == 0.0 for n in named if n.endswith("attention.self.key.bias"))


def test_the_scales_change_neither_the_guarantee_nor_the_released_update(tmp_path, tiny_bert_dir, monkeypatch):
    """Real noise calibration and sampling, with and without scales: the ledgers agree on everything but the scales'
    provenance (sigma, q, T, epsilon, delta), and with the same entropy the first step's noisy clipped update, the one
    release that precedes any scaled move, is bit for bit the same. Only what the optimizer does with it differs."""
    from privret.train import dp_run

    # a private run seeds its sampler, noise and dropout from os.urandom; give both twins the same entropy
    monkeypatch.setattr(dp_run, "os", SimpleNamespace(urandom=lambda n: bytes(range(n))))
    first_updates, adam_step = {}, torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        if run not in first_updates:
            first_updates[run] = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    names = _trained_names(tiny_bert_dir, "bias-top:1")
    runs, ledgers = [None, {name: [0.0, 3.0][i % 2] for i, name in enumerate(names)}], []
    for run, scales in enumerate(runs):
        monkeypatch.setenv("PRIVRET_BUDGET_DIR", str(tmp_path / f"budget{run}"))   # two twins, not two releases
        cfg = DPRetrieverConfig(method="batch-clip", model=str(tiny_bert_dir), clip_norm=0.1, batch_size=4,
                                max_query_tokens=32, max_doc_tokens=32, epochs=1.0, trainable="bias-top:1",
                                epsilon=8.0, seed=3, lr_scales=scales)
        train_dp_retriever(_pairs(), tmp_path / f"r{run}", cfg, data_hash="h")
        ledgers.append(json.loads((tmp_path / f"r{run}" / "privacy_ledger.json").read_text()))
    plain, scaled = ledgers
    assert "lr_scales" not in plain["provenance"] and scaled["provenance"].pop("lr_scales")["tensors"] == len(names)
    assert plain["noise_multiplier"] > 0 and plain["steps"] > 1
    assert plain.pop("created_at") and scaled.pop("created_at")
    assert plain == scaled
    assert sorted(first_updates) == [0, 1]
    for a, b in zip(first_updates[0], first_updates[1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert max(t.abs().max().item() for t in first_updates[0]) > 0
