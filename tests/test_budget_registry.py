"""The privacy-budget registry is hard to bypass: one key per dataset whatever its files, one privacy unit per
dataset, and a cap by default (docs/reliability.md, section 2)."""

from __future__ import annotations

import json
import unicodedata

import pytest

from helpers import TOY_DOCS, TOY_TRAIN
from privret.settings.pipeline import BudgetSettings, PipelineConfig
from privret.data.beir import load_beir
from privret.data.pairs import load_pairs_jsonl, pairs_from_beir
from privret.cli.common import as_flags
from privret.errors import InputError
from privret.privacy import budget
from privret.privacy.accounting import spent_epsilon


def _release(unit="query", dataset_id="sha256-toy", data_hash="files", steps=50, **kw) -> budget.Release:
    """A subsampled-Gaussian release of epsilon 8.4 (two of them compose to 12, past the default cap)."""
    values = dict(release_id=budget.new_release_id(), status="planned", data_hash=data_hash, dataset_id=dataset_id,
                  unit=unit, n_units=100, mechanism="dp-sgd", accountant="prv", noise_multiplier=0.65,
                  sample_rate=0.1, steps=steps, delta=1e-3,
                  epsilon=spent_epsilon(noise_multiplier=0.65, sample_rate=0.1, steps=steps, delta=1e-3))
    return budget.Release(**{**values, **kw})


def _pairs_file(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _toy_rows():
    """The toy BEIR training pairs as pairs-file rows, documents inline (their full text)."""
    docs = {i: f"{t}. {x}" for i, t, x in TOY_DOCS}
    return [{"query": q, "doc": docs[d]} for _, q, ds in TOY_TRAIN for d in ds]


def test_dataset_id_is_the_records_not_the_files(toy_beir, tmp_path):
    from_beir = budget.dataset_id(pairs_from_beir(load_beir(toy_beir, splits=["train"]), "train"))
    # the same records: reversed, one repeated, whitespace and unicode form changed, documents inline
    rows = _toy_rows()[::-1] + _toy_rows()[:1]
    rows[0] = {"query": "  " + rows[0]["query"].replace(" ", " \t "), "doc": rows[0]["doc"] + "\n"}
    inline = load_pairs_jsonl(_pairs_file(tmp_path / "inline.jsonl", rows))
    # documents by id, against the BEIR corpus, under other query ids
    corpus = load_beir(toy_beir, splits=["train"]).corpus
    by_id = load_pairs_jsonl(_pairs_file(tmp_path / "ids.jsonl", [
        {"query": q, "doc_id": d, "query_id": f"other-{k}"} for k, (_, q, ds) in enumerate(TOY_TRAIN) for d in ds]),
        corpus)
    assert from_beir.startswith("sha256-")
    assert budget.dataset_id(inline) == budget.dataset_id(by_id) == from_beir
    # another split name holding the same judgements is the same dataset
    (toy_beir / "qrels" / "train.tsv").rename(toy_beir / "qrels" / "private.tsv")
    assert budget.dataset_id(pairs_from_beir(load_beir(toy_beir, splits=["private"]), "private")) == from_beir
    # unicode: composed and decomposed forms are one text
    accented = [{"query": "caf\u00e9 cr\u00e8me", "doc": "na\u00efve r\u00e9sum\u00e9"}]
    decomposed = [{k: unicodedata.normalize("NFD", v) for k, v in row.items()} for row in accented]
    assert decomposed != accented
    assert (budget.dataset_id(load_pairs_jsonl(_pairs_file(tmp_path / "nfc.jsonl", accented)))
            == budget.dataset_id(load_pairs_jsonl(_pairs_file(tmp_path / "nfd.jsonl", decomposed))))
    # one row edited is another dataset by content; a name ties the two together
    edited = load_pairs_jsonl(_pairs_file(tmp_path / "edited.jsonl", [{**_toy_rows()[0], "query": "aspirin"}]
                                          + _toy_rows()[1:]))
    assert budget.dataset_id(edited) != from_beir
    assert budget.dataset_id(edited, " my  log ") == budget.dataset_id(inline, "my log") == "name-my log"


def test_a_release_at_another_privacy_unit_is_refused_or_warned_about():
    budget.check_and_record(_release(unit="query", steps=5))
    with pytest.raises(InputError) as refused:
        budget.check_and_record(_release(unit="pair", steps=5))
    message = str(refused.value)
    assert "already has DP releases per query" in message and "registry" in message and "\n" not in message
    assert refused.value.field == "unit" and len(budget.releases("sha256-toy")) == 1  # nothing recorded
    assert "`allow_over`" in message and "--" not in message  # fields here; the CLI shows its flags
    shown = as_flags(refused.value).one_line()
    assert shown.startswith("field '--unit'") and "set --allow-over-budget to run anyway" in shown
    with pytest.warns(budget.BudgetWarning, match="per query; a release per pair does not compose"):
        budget.check_and_record(_release(unit="pair", steps=5), budget.BudgetPolicy(allow_over=True))
    assert sorted(r.unit for r in budget.releases("sha256-toy")) == ["pair", "query"]


def test_the_default_cap_refuses_in_one_line_and_the_override_warns():
    first = _release()
    assert 8 < first.epsilon < budget.DEFAULT_CAP
    budget.check_and_record(first)  # no policy given: the default cap
    with pytest.raises(InputError) as refused:
        budget.check_and_record(_release())
    message = str(refused.value)
    assert f"past the budget cap {budget.DEFAULT_CAP:g}" in message and "\n" not in message
    # the library names the policy's fields; the CLI shows them as its flags
    assert "`allow_over`" in message and "`cap`" in message and "--" not in message and refused.value.field == "cap"
    shown = as_flags(refused.value).one_line()
    assert "set --allow-over-budget to run" in shown and "(--budget-cap changes it)" in shown
    assert shown.startswith("field '--budget-cap'")
    with pytest.warns(budget.BudgetWarning, match="past the budget cap"):
        budget.check_and_record(_release(), budget.BudgetPolicy(allow_over=True))
    assert len(budget.releases("sha256-toy")) == 2
    budget.check_and_record(_release(dataset_id="sha256-other"))  # another dataset has its own budget


def test_releases_recorded_under_the_files_hash_by_an_older_privret_still_count():
    budget.record(_release(dataset_id=""))  # an old ledger: keyed by its data_hash
    with pytest.raises(InputError, match="past the budget cap"):
        budget.check_and_record(_release(dataset_id="sha256-toy"))


def test_pipeline_budget_section():
    assert PipelineConfig(name="x", dataset="d", epsilons=[1.0]).budget.policy() == budget.BudgetPolicy()
    section = BudgetSettings(cap=20, allow_over=True, dataset_name="log")
    assert section.policy() == budget.BudgetPolicy(cap=20, allow_over=True)
    for cap in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="cap\n.*(greater than 0|finite number)"):
            BudgetSettings(cap=cap)


def test_pipeline_budget_flags_override_the_config(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from privret.pipeline import run as pipeline
    from privret.cli import app
    from privret.cli.demo import demo_config

    assert demo_config().budget.allow_over  # the demo's rows are alternatives on public data
    seen = []
    monkeypatch.setattr(pipeline, "run_pipeline", lambda cfg, run_dir: seen.append(cfg.budget) or [])
    config = tmp_path / "grid.yaml"
    config.write_text("name: x\ndataset: data\nepsilons: [8]\nbudget: {cap: 20, dataset_name: log}\n")
    run = ["pipeline", str(config), "--run-dir", str(tmp_path / "run")]
    assert CliRunner().invoke(app, run + ["--allow-over-budget"]).exit_code == 0
    assert CliRunner().invoke(app, run + ["--budget-cap", "5", "--dataset-name", "other"]).exit_code == 0
    # the flag turns a config's allow_over off too, and without it the config's stands
    config.write_text("name: x\ndataset: data\nepsilons: [8]\nbudget: {allow_over: true}\n")
    assert CliRunner().invoke(app, run + ["--no-allow-over-budget"]).exit_code == 0
    assert CliRunner().invoke(app, run).exit_code == 0
    assert seen == [BudgetSettings(cap=20, allow_over=True, dataset_name="log"),
                    BudgetSettings(cap=5, dataset_name="other"),
                    BudgetSettings(allow_over=False), BudgetSettings(allow_over=True)]
    refused = CliRunner().invoke(app, run + ["--budget-cap", "0"])
    assert isinstance(refused.exception, InputError) and refused.exception.field == "--budget-cap"


def test_cli_second_release_on_a_reformatted_copy_passes_the_default_cap(toy_beir, tiny_bert_dir, tmp_path):
    """BEIR split first, then the same records as a pairs file: one dataset, and the second run is refused."""
    from test_cli import run_cli
    from typer.testing import CliRunner

    from privret.cli import app

    def args(out, *data):
        return ["retriever", "train-dp", *data, "--out", str(tmp_path / out), "--model", str(tiny_bert_dir),
                "--method", "batch-clip", "--epsilon", "8", "--batch-size", "2", "--epochs", "1", "--trainable", "top:1"]

    copy = _pairs_file(tmp_path / "copy.jsonl", _toy_rows()[::-1])
    assert CliRunner().invoke(app, args("r1", "--data", str(toy_beir))).exit_code == 0
    refused = run_cli(*args("r2", "--pairs", copy))  # the real entry point: exit code and stderr
    (error,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]  # (and model loading)
    assert refused.returncode == 2 and "past the budget cap 10" in error and "--allow-over-budget" in error
    assert "(--budget-cap changes it)" in error and "`" not in error  # every field it names, shown as its flag
    assert not (tmp_path / "r2").exists()
    with pytest.warns(budget.BudgetWarning):
        assert CliRunner().invoke(app, args("r2", "--pairs", copy, "--allow-over-budget")).exit_code == 0
