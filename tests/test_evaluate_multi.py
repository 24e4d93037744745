"""`privret evaluate --datasets a,b`: one table in the Table 5 layout of Carranza et al.; `--data` still works."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import TOY_DOCS, run_cli, write_beir_dir
from typer.testing import CliRunner

from privret.cli import app
from privret.data.beir import load_beir
from privret.evaluate.multi import markdown_tables
from privret.retrieval.metrics import evaluate_retriever
from privret.models.encoder import load_encoder
from privret.privacy.ledger import PrivacyLedger


@pytest.fixture()
def root(tmp_path):
    corpus = [{"_id": i, "title": t, "text": x} for i, t, x in TOY_DOCS]
    write_beir_dir(tmp_path / "alpha", corpus,
                   [{"_id": "a1", "text": "aspirin heart risk"}, {"_id": "a2", "text": "memory gene mice"},
                    {"_id": "a3", "text": "vitamin blood children"}],
                   {"test": [("a1", "d1", 1), ("a2", "d2", 1), ("a3", "d3", 1)]})
    write_beir_dir(tmp_path / "beta", corpus[2:],
                   [{"_id": "b1", "text": "sleep exercise immune virus"}, {"_id": "b2", "text": "cancer drug trial"}],
                   {"test": [("b1", "d4", 1), ("b2", "d5", 2), ("b2", "d6", 1)]})
    # CQADupStack-style: a folder of BEIR sub-datasets, scored as their mean
    shutil.copytree(tmp_path / "alpha", tmp_path / "gamma" / "one")
    shutil.copytree(tmp_path / "beta", tmp_path / "gamma" / "two")
    return tmp_path


def test_table5_over_two_datasets_matches_single_evaluations(root, tiny_bert_dir, tmp_path):
    out_json = tmp_path / "zs.json"
    result = CliRunner().invoke(app, ["evaluate", "retrieval", "--model", str(tiny_bert_dir), "--datasets", "alpha,beta,gamma",
                                      "--data-root", str(root), "--label", "tiny", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out_json.read_text())
    assert list(saved["datasets"]) == ["alpha", "beta", "gamma"]
    row = saved["rows"][0]
    assert row["source"] == "tiny" and row["epsilon"] is None
    model = load_encoder(str(tiny_bert_dir))
    single = {}
    for name in ("alpha", "beta"):
        ds = load_beir(root / name, splits=["test"])
        single[name] = evaluate_retriever(model, ds.corpus, ds.queries, ds.split("test"))
        for metric in ("ndcg@10", "recall@10", "recall@100", "mrr@10"):
            assert row["metrics"][name][metric] == pytest.approx(single[name][metric], abs=1e-6)
    for metric in ("ndcg@10", "recall@10"):
        mean = (single["alpha"][metric] + single["beta"][metric]) / 2
        assert row["metrics"]["gamma"][metric] == pytest.approx(mean, abs=1e-6)
    assert row["metrics"]["gamma"]["sub_datasets"] == 2
    # the printed layout: two tables (NDCG@10, Recall@10), the datasets as columns, the row label
    assert "NDCG@10" in result.output and "RECALL@10" in result.output
    assert all(name in result.output for name in ("alpha", "beta", "gamma", "tiny"))
    md = markdown_tables(saved)
    assert md.count("| Source | ε | alpha | beta | gamma |") == 2
    assert f"| tiny | - | {row['metrics']['alpha']['ndcg@10']:.4f} |" in md


def test_two_models_and_epsilon_from_the_ledger(root, tiny_bert_dir, tmp_path):
    private = tmp_path / "retriever"
    shutil.copytree(tiny_bert_dir, private)
    PrivacyLedger(mechanism="dp-sgd", epsilon=16.0, delta=1e-5, noise_multiplier=0.6, sample_rate=0.01, steps=10,
                  planned_steps=10, accountant="prv", unit="query", n_units=100, n_pairs=100, clip_norm=1.0,
                  model="tiny", trainable="full", data_hash="x").save(private)
    out_json = tmp_path / "zs.json"
    result = CliRunner().invoke(app, ["evaluate", "retrieval", "--model", str(tiny_bert_dir), "--model", str(private),
                                      "--datasets", f"{root / 'alpha'},{root / 'beta'}", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out_json.read_text())["rows"]
    assert [r["epsilon"] for r in rows] == [None, 16.0]
    assert rows[0]["metrics"]["alpha"]["ndcg@10"] == pytest.approx(rows[1]["metrics"]["alpha"]["ndcg@10"])


@pytest.mark.parametrize("args, message", [
    (["--datasets", "alpha,nowhere"], "dataset 'nowhere' not found"),
    (["--datasets", "alpha", "--data", "x"], "exactly one of --data"),
    (["--datasets", "alpha", "--label", "a", "--label", "b"], "field '--label': give one label per model"),
    # a flag of the other mode would be ignored
    (["--data", "x"], "field '--data-root': applies with --datasets only"),
    (["--datasets", "alpha", "--per-query", "p.json"], "field '--per-query': applies with --data only"),
])
def test_bad_input_exits_2(root, tiny_bert_dir, args, message):
    proc = run_cli("evaluate", "retrieval", "--model", str(tiny_bert_dir), "--data-root", str(root), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
