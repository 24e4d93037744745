"""A federated DP run is a release per client in the budget registry (docs/reliability.md, section 2): recorded
before its first noise, once however often it resumes, refused past the cap or beside releases per another unit."""

from __future__ import annotations

import json
import shutil

import pytest

from privret.data.fed_squad import build_fed_squad, load_fed_squad
from privret.errors import InputError
from privret.settings.federated import FedConfig
from privret.privacy import budget

pytest.importorskip("flwr")


@pytest.fixture()
def fed_dir(tiny_squad, tmp_path):
    build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2, seed=0)
    return tmp_path / "fed"


def _dp_cfg(model, epsilon: float = 8.0, **kw) -> FedConfig:
    """A tiny DP run whose rounds spend ``epsilon`` (8: one release passes the default cap, two do not)."""
    from privret.federated.strategy import with_target_epsilon

    cfg = FedConfig(**{**dict(model=model, rounds=2, warmup_rounds=1, batch_size=2, n_negatives=1, hard_k=3,
                               bm25_k=3, personalize=[], bf16=False, dp="server", dp_clip_norm=0.5), **kw})
    return with_target_epsilon(cfg, epsilon)


def test_a_federated_dp_run_is_recorded_per_client_before_its_noise_and_once(fed_dir, tiny_encoder, tmp_path,
                                                                             monkeypatch):
    """Planned (every round) before the first aggregate is noised, so a server killed there still counts in full;
    a resumed run is the same release, and its final record counts what its ledger counts."""
    from privret.federated import server_app
    from privret.federated.runner import dataset_key, run_federated_local

    key = dataset_key(load_fed_squad(fed_dir))
    shutil.copytree(fed_dir, tmp_path / "copy")
    assert key.startswith("sha256-") and dataset_key(load_fed_squad(tmp_path / "copy")) == key  # content, not path
    make_strategy = server_app.make_strategy

    def killed_before_the_noise(cfg, n_clients):
        strategy = make_strategy(cfg, n_clients)

        def aggregate_train(rnd, replies):
            assert [r.status for r in budget.releases(key)] == ["planned"]  # already recorded
            raise KeyboardInterrupt("killed")

        strategy.aggregate_train = aggregate_train
        return strategy

    monkeypatch.setattr(server_app, "make_strategy", killed_before_the_noise)
    cfg, run = _dp_cfg(tiny_encoder), tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run_federated_local(cfg, fed_dir, run)
    (planned,) = budget.releases(key)
    assert planned.unit == "client" and planned.n_units == 2 and planned.steps == cfg.rounds
    assert planned.artefact == str(run.absolute()) and 0 < planned.epsilon <= 8
    monkeypatch.setattr(server_app, "make_strategy", make_strategy)
    res = run_federated_local(cfg, fed_dir, run)  # resumed: the same release
    (final,) = budget.releases(key)
    assert (final.release_id, final.status, final.steps) == (planned.release_id, "final", cfg.rounds)
    assert final.epsilon == pytest.approx(res["ledger"]["epsilon"])
    run_federated_local(cfg, fed_dir, run)  # finished: nothing trained, nothing recorded
    more = run_federated_local(cfg.model_copy(update={"rounds": 3}), fed_dir, run)  # one round more
    (grown,) = budget.releases(key)
    assert grown.release_id == planned.release_id and grown.steps == 3 == more["ledger"]["steps"]
    records = [json.loads(line)["status"] for line in (budget.budget_dir() / f"{key}.jsonl").read_text().splitlines()]
    assert records == ["planned", "planned", "final", "planned", "final"]  # start, resume, its end, one round more
    run_federated_local(FedConfig(model=tiny_encoder, rounds=1, batch_size=2, n_negatives=1, hard_k=3, bm25_k=3,
                                  personalize=[], bf16=False), fed_dir, tmp_path / "plain")
    assert len(budget.releases(key)) == 1  # a run without DP is no release


def test_a_second_federated_release_past_the_cap_is_refused(fed_dir, tiny_encoder, tmp_path):
    from privret.federated.runner import dataset_key, run_federated_local

    cfg = _dp_cfg(tiny_encoder, rounds=1)
    run_federated_local(cfg, fed_dir, tmp_path / "first")
    with pytest.raises(InputError, match="past the budget cap 10") as refused:
        run_federated_local(cfg, fed_dir, tmp_path / "second")
    assert refused.value.field == "cap" and "unit 'client'" in str(refused.value)
    assert not (tmp_path / "second" / "global.npz").exists()  # refused before any round
    assert len(budget.releases(dataset_key(load_fed_squad(fed_dir)))) == 1
    with pytest.warns(budget.BudgetWarning, match="past the budget cap"):
        run_federated_local(cfg, fed_dir, tmp_path / "second", budget=budget.BudgetPolicy(allow_over=True))
    assert len(budget.releases(dataset_key(load_fed_squad(fed_dir)))) == 2


def test_a_federated_release_beside_a_query_unit_release_on_its_dataset_is_refused(fed_dir, tiny_encoder, tmp_path):
    """One privacy unit per dataset: a run per client beside a release per query on the same (named) dataset is
    refused, and so is the other order."""
    from privret.federated.runner import run_federated_local

    query_release = budget.Release(release_id=budget.new_release_id(), status="final", data_hash="", unit="query",
                                   dataset_id="name-squad", n_units=10, mechanism="dp-sgd", accountant="rdp",
                                   noise_multiplier=2.0, sample_rate=0.1, steps=10, delta=1e-5, epsilon=1.0)
    budget.check_and_record(query_release)
    cfg = _dp_cfg(tiny_encoder, epsilon=1.0, rounds=1)
    with pytest.raises(InputError, match="already has DP releases per query; a release per client") as refused:
        run_federated_local(cfg, fed_dir, tmp_path / "run", dataset_name="squad")
    assert refused.value.field == "unit" and not (tmp_path / "run" / "global.npz").exists()
    run_federated_local(cfg, fed_dir, tmp_path / "other", dataset_name="another log")
    with pytest.raises(InputError, match="already has DP releases per client"):
        budget.check_and_record(query_release.model_copy(update={"release_id": budget.new_release_id(),
                                                                 "dataset_id": "name-another log"}))


def test_cli_records_federated_dp_runs_and_refuses_budget_flags_without_dp(fed_dir, tiny_encoder, tmp_path):
    from typer.testing import CliRunner

    from privret.cli import app

    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(dict(model=tiny_encoder, rounds=1, batch_size=2, n_negatives=1, hard_k=3, bm25_k=3,
                                      personalize=[], bf16=False)))

    def train(out, *flags):
        return CliRunner().invoke(app, ["federated", "train", "--data", str(fed_dir), "--out", str(tmp_path / out),
                                        "--config", str(config), *flags])

    dp = ["--dp", "server", "--epsilon", "8", "--clip-norm", "0.5", "--dataset-name", "squad"]
    assert train("first", *dp).exit_code == 0
    (release,) = budget.releases("name-squad")
    assert release.unit == "client" and release.status == "final"
    refused = train("second", *dp)
    assert isinstance(refused.exception, InputError) and "past the budget cap 10" in str(refused.exception)
    with pytest.warns(budget.BudgetWarning):
        assert train("second", *dp, "--allow-over-budget").exit_code == 0
    assert train("capped", *dp, "--budget-cap", "100").exit_code == 0 and len(budget.releases("name-squad")) == 3
    for flag in (["--budget-cap", "20"], ["--allow-over-budget"], ["--dataset-name", "squad"]):
        plain = train("plain", *flag)
        assert isinstance(plain.exception, InputError) and plain.exception.field == flag[0]
    # across machines the server never sees the data: a DP Flower App names its dataset, and carries the policy
    app_dir = tmp_path / "app"
    dp_config = tmp_path / "dp.yaml"
    dp_config.write_text(json.dumps(dict(model=tiny_encoder, dp="server")))
    flower = ["federated", "flower-app", "--app", str(app_dir), "--out", "run", "--config", str(dp_config)]
    unnamed = CliRunner().invoke(app, flower)
    assert isinstance(unnamed.exception, InputError) and unnamed.exception.field == "--dataset-name"
    assert CliRunner().invoke(app, [*flower, "--dataset-name", "squad", "--budget-cap", "12"]).exit_code == 0
    import tomllib

    run_config = tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert (run_config["dataset-id"], run_config["budget-cap"], run_config["allow-over-budget"]) == (
        "name-squad", 12.0, False)
