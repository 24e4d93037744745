"""``privret retriever train`` / ``train-dp`` and ``privret evaluate retrieval``: the defaults of train-dp are the
measured regime (docs/results.md), their batch and epochs the rule of the number of units, ``--config`` under the
flags, and the old spellings end in a one-line error naming the new one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from helpers import run_cli
from privret.settings.pipeline import DirectDPGrid, PipelineConfig
from privret.settings.training import DPRetrieverConfig, DPRetrieverSettings, dp_schedule

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class _Ledger:
    def summary(self) -> str:
        return "captured"


@pytest.fixture()
def captured(monkeypatch) -> list[DPRetrieverConfig]:
    """The configs `retriever train-dp` hands to the trainer (which then does not run)."""
    import privret.train.dp_retriever as dp_retriever

    configs = []
    monkeypatch.setattr(dp_retriever, "train_dp_retriever", lambda pairs, out, cfg, **_: configs.append(cfg) or _Ledger())
    return configs


def _steps(n: int, batch: int, epochs: float) -> int:
    """T = ceil(epochs / q), as privret.train.dp_run.plan_run counts them."""
    return max(1, math.ceil(epochs / min(1.0, batch / n)))


@pytest.mark.parametrize("n, batch, epochs, steps", [(807, 807, 48, 48), (5747, 512, 4, 45)])
def test_the_rule_gives_the_two_measured_regimes(n, batch, epochs, steps):
    """SciFact (807 units): the whole log in each of 48 steps; SQuAD (5,747 units): 512 x 4 epochs, 45 steps."""
    assert dp_schedule(n) == (batch, epochs) and _steps(n, batch, epochs) == steps
    scheduled = DPRetrieverConfig().scheduled(n)
    assert (scheduled.batch_size, scheduled.epochs) == (batch, epochs)


@pytest.mark.parametrize("n, q, steps", [(807, 1.0, 48), (5747, 512 / 5747, 45)])
def test_the_trainer_plans_an_unset_schedule_by_the_rule(n, q, steps):
    """What a run over n units plans when neither batch nor epochs is given (train_dp_retriever schedules the
    same way, on the units it trains on)."""
    from privret.train.dp_retriever import plan

    assert plan(DPRetrieverConfig(), n)[:3] == (q, steps, 1 / (2 * n))


@pytest.mark.parametrize("n", [2, 100, 1024, 1025, 3000, 20_000, 60_000, 10**6])
def test_the_rule_takes_about_48_steps_at_any_size(n):
    batch, epochs = dp_schedule(n)
    assert batch == (n if n <= 1024 else 512)
    assert epochs == 48 * min(1, batch / n) or epochs == round(48 * batch / n) >= 1
    assert 24 <= _steps(n, batch, epochs) <= 64
    assert dp_schedule(n, batch_size=64)[0] == 64  # a given batch stays; the epochs follow it
    assert DPRetrieverConfig(batch_size=64, epochs=2.0).scheduled(n).epochs == 2.0


def test_train_dp_with_no_optional_flag_is_the_measured_regime(toy_beir, tmp_path, captured):
    result = run_cli("retriever", "train-dp", "--data", str(toy_beir), "--out", str(tmp_path / "o"))
    assert result.returncode == 0, result.stderr
    (cfg,) = captured
    regime = dict(method="public-negatives", trainable="bias-top:3", public_negatives=1, hard_negatives=2,
                  dropout=False, clip_norm=1.0, learning_rate=2e-3, max_doc_tokens=256, epsilon=8.0, model="minilm-l6",
                  batch_size=None, epochs=None, temperature=None, accountant="prv")
    assert {k: getattr(cfg, k) for k in regime} == regime
    assert cfg == DPRetrieverConfig()  # the settings model's defaults, which the Python API and the pipeline share
    scheduled = cfg.scheduled(5)  # the toy log's 5 query units: all of them in each of 48 steps
    assert (scheduled.batch_size, scheduled.epochs) == (5, 48.0)


def test_the_pipeline_direct_dp_defaults_are_the_same_regime():
    grid = DirectDPGrid(methods=["public-negatives"], epsilons=[8.0])
    assert grid.config("public-negatives", 8.0, DPRetrieverConfig().unit) == DPRetrieverConfig()
    # the defaults that depend on the method: the others take no hard negatives
    assert grid.model_copy(update={"methods": ["naive"]}).config("naive", 8.0, "query").hard_negatives == 0


def test_config_file_under_the_flags(toy_beir, tmp_path, captured):
    config = tmp_path / "dp.yaml"
    config.write_text("trainable: lora\nlora_rank: 4\nlearning_rate: 0.01\nhold_out: {salt: public-salt}\n")
    result = run_cli("retriever", "train-dp", "--data", str(toy_beir), "--out", str(tmp_path / "o"), "--config",
                     str(config), "--lr", "0.5", "--hold-out", "0.2", "--method", "naive")
    assert result.returncode == 0, result.stderr
    (cfg,) = captured
    assert (cfg.trainable, cfg.lora_rank, cfg.learning_rate, cfg.method) == ("lora", 4, 0.5, "naive")
    assert (cfg.hold_out.salt, cfg.hold_out.heldout_fraction) == ("public-salt", 0.2)


@pytest.mark.parametrize("text, args, expected", [
    ("lora_rnak: 4\n", [], "{config}, field 'lora_rnak': unknown field (not a setting of DPRetrieverConfig)"),
    ("clip_norm: -1\n", [], "{config}, field 'clip_norm': Input should be greater than 0"),
    ("lora_rank: 4\n", [], "{config}, field 'lora_rank': is not used by --method public-negatives"),
    ("trainable: lora\n", ["--lora-rank", "4"], "--lora-rank is now the field lora_rank of a --config FILE"),
    ("clip_norm: 2\n", ["--clip-norm", "-1"], "field '--clip-norm': Input should be greater than 0"),
    ("{}\n", ["--method", "naive", "--hard-negatives", "2"], "error: --hard-negatives applies to public-negatives only"),
    ("{}\n", ["--method", "bogus"], "Invalid value for '--method': 'bogus' is not one of"),
])
def test_a_bad_setting_is_one_line_naming_the_file_and_field_or_the_flag(toy_beir, tmp_path, captured, text, args,
                                                                           expected):
    config = tmp_path / "dp.yaml"
    config.write_text(text)
    result = run_cli("retriever", "train-dp", "--data", str(toy_beir), "--out", str(tmp_path / "o"), "--config",
                     str(config), *args)
    assert result.returncode == 2 and expected.format(config=config) in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not captured


def test_non_private_train_reads_its_config_file(toy_beir, tmp_path, monkeypatch):
    import privret.train.retriever as retriever

    seen = []
    monkeypatch.setattr(retriever, "train_retriever", lambda pairs, out, cfg, **_: seen.append(cfg))
    config = tmp_path / "plain.yaml"
    config.write_text("warmup_fraction: 0.2\nbatch_size: 8\n")
    result = run_cli("retriever", "train", "--data", str(toy_beir), "--out", str(tmp_path / "o"), "--config",
                     str(config), "--batch-size", "4")
    assert result.returncode == 0, result.stderr
    assert (seen[0].warmup_fraction, seen[0].batch_size, seen[0].learning_rate) == (0.2, 4, 2e-5)


@pytest.mark.parametrize("args, expected", [
    (["retriever", "train", "--dp", "logit-dp", "--out", "o"],
     "privret retriever train --dp is now the command privret retriever train-dp --method logit-dp"),
    (["evaluate", "--model", "m", "--data", "d"], "privret evaluate --model is now privret evaluate retrieval --model"),
    (["retriever", "train", "--out", "o", "--epsilon", "3"],
     "privret retriever train --epsilon is now privret retriever train-dp --epsilon (retriever train trains without DP)"),
    (["retriever", "train", "--hold-out-salt", "s"],
     "privret retriever train --hold-out-salt is now the field hold_out.salt of a --config FILE of privret retriever "
     "train-dp"),
])
def test_the_old_spellings_name_the_new_command(args, expected):
    result = run_cli(*args)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {expected}"


def test_evaluate_retrieval_scores_a_model(toy_beir, tiny_bert_dir, tmp_path):
    result = run_cli("evaluate", "retrieval", "--model", str(tiny_bert_dir), "--data", str(toy_beir), "--json",
                     str(tmp_path / "m.json"), "--per-query", str(tmp_path / "q.json"))
    assert result.returncode == 0, result.stderr
    import json

    assert json.loads((tmp_path / "m.json").read_text())["queries"] == 2
    assert set(json.loads((tmp_path / "q.json").read_text())) == {"t1", "t2"}
    result = run_cli("evaluate", "retrieval", "--model", "a", "--model", "b", "--data", str(toy_beir))
    assert result.returncode == 2 and "--data takes one --model" in result.stderr


def _repeated_defaults(model, raw: dict, where: str, over: dict | None = None) -> list[str]:
    """The fields of ``raw`` (a section of a YAML config) set to the value they would have without it: their field's
    default in ``model``, or the value in ``over`` (the section it is set over)."""
    import typing

    from pydantic import BaseModel

    found = []
    for name, value in raw.items():
        field = model.model_fields.get(name)
        if field is None:
            continue
        section = [a for a in (field.annotation, *typing.get_args(field.annotation))
                   if isinstance(a, type) and issubclass(a, BaseModel)]
        if isinstance(value, dict) and section:
            found += _repeated_defaults(section[0], value, f"{where}{name}.")
            continue
        default = (over or {}).get(name, field.get_default(call_default_factory=True))
        if isinstance(default, BaseModel) or value is None and default is None:
            continue
        try:
            validated = model.__pydantic_validator__.validate_assignment(model.model_construct(), name, value)
        except Exception:  # a value the field refuses alone (a whole-model check): not a default either
            continue
        if getattr(validated, name) == default:
            found.append(f"{where}{name}")
    return found


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_no_shipped_config_repeats_a_default(path):
    """A config sets what differs from the defaults (a method's own settings: from the shared ones), so that a
    default is stated in one place, the settings model."""
    from privret.io import read_yaml_mapping
    from privret.settings.federated import FedConfig

    raw = read_yaml_mapping(path)  # merge keys (<<: *anchor) resolved
    if path.name.startswith("fed-"):
        assert _repeated_defaults(FedConfig, raw, "") == []
        return
    found = _repeated_defaults(PipelineConfig, raw, "")
    shared = DPRetrieverSettings(**raw.get("direct_dp", {}).get("settings", {})).model_dump()
    for method, own in raw.get("direct_dp", {}).get("per_method", {}).items():
        found += _repeated_defaults(DPRetrieverSettings, own, f"direct_dp.per_method.{method}.", over=shared)
    assert found == []
