"""DP choice of documents (Laplace partition selection): threshold, sampler, contribution bound,
ledger and its composition into the synthetic set, from the library and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from privret.data.pairs import PrivacyUnit, QueryDocPair, TrainingPairs
from privret.privacy.partition_selection import (
    _laplace,
    select_documents,
    selection_ledger,
    selection_threshold,
)
from privret.settings.partition_selection import PartitionSelectionConfig
from privret.privacy.secure_rng import SecureRandom


def _log(counts: dict[str, int]) -> TrainingPairs:
    """A log in which document d has counts[d] distinct query units."""
    pairs = [QueryDocPair(f"query {d} {k}", d) for d, c in counts.items() for k in range(c)]
    return TrainingPairs(pairs=pairs, corpus={})


def test_threshold_bounds_the_release_of_a_unit_only_document_by_delta():
    for eps, m, delta in [(1.0, 1, 1e-4), (0.5, 3, 1e-5), (4.0, 2, 6e-4)]:
        cfg = PartitionSelectionConfig(epsilon=eps, max_docs_per_unit=m)
        tau, b = selection_threshold(cfg, delta), m / eps
        # P[1 + Lap(b) > tau] for each of u's (at most m) own documents, union bound
        assert m * 0.5 * math.exp(-(tau - 1) / b) == pytest.approx(delta, rel=1e-9)


def test_laplace_sampler_has_the_laplace_distribution():
    draws = np.array(_laplace(SecureRandom(), 200_000, 2.0))
    assert abs(draws.mean()) < 0.03
    assert draws.var() == pytest.approx(2 * 2.0 ** 2, rel=0.03)  # Var Lap(b) = 2 b^2
    assert np.mean(draws > 3.0) == pytest.approx(0.5 * math.exp(-3.0 / 2.0), rel=0.05)  # the tail the proof uses


def test_selection_keeps_popular_documents_and_drops_rare_ones():
    pairs = _log({"popular": 40, "rare": 1, "also-rare": 2})
    cfg = PartitionSelectionConfig(epsilon=1.0)
    ledger = selection_ledger(pairs, PrivacyUnit.query, cfg, data_hash="h", dataset_id="d")
    assert selection_threshold(cfg, ledger.delta) > 3  # 1 + ln(1/(2 delta)) with delta = 1/(10 n)
    kept = [select_documents(pairs, PrivacyUnit.query, cfg, ledger) for _ in range(200)]
    assert all("popular" in k for k in kept)
    assert sum("rare" in k for k in kept) <= 5 and sum("also-rare" in k for k in kept) <= 10


def test_each_unit_counts_for_at_most_m_documents():
    """One unit with 30 documents (all rows of one query text) must not lift them over the threshold."""
    pairs = TrainingPairs(pairs=[QueryDocPair("the same query", f"d{k}") for k in range(30)], corpus={})
    cfg = PartitionSelectionConfig(epsilon=50.0, max_docs_per_unit=2)  # tiny noise: counts decide
    ledger = selection_ledger(pairs, PrivacyUnit.query, cfg, data_hash="h", dataset_id="d")
    for _ in range(20):
        assert len(select_documents(pairs, PrivacyUnit.query, cfg, ledger)) <= 2
    # the same rows as 30 units: every document is counted
    per_pair = selection_ledger(pairs, PrivacyUnit.pair, cfg, data_hash="h", dataset_id="d")
    assert per_pair.n_units == 30


def test_selection_ledger_charges_epsilon_plus_the_removal_term():
    pairs = _log({"a": 5, "b": 5})
    ledger = selection_ledger(pairs, PrivacyUnit.query, PartitionSelectionConfig(epsilon=1.0), data_hash="h", dataset_id="d")
    assert ledger.n_units == 10 and ledger.delta == pytest.approx(1 / 100)
    assert ledger.epsilon == pytest.approx(1.0 + math.log(1 / (1 - 0.01)))
    from privret.errors import InputError

    with pytest.raises(InputError, match="below 1/n"):
        selection_ledger(pairs, PrivacyUnit.query, PartitionSelectionConfig(delta=0.2), data_hash="h", dataset_id="d")


def test_cli_selection_is_recorded_and_composed_into_the_synthetic_ledger(tmp_path, toy_beir, tiny_llama_dir):
    from typer.testing import CliRunner

    from privret.cli import app
    from privret.privacy import budget

    rows = [{"query": f"question {k} about aspirin", "doc_id": "d1"} for k in range(12)]
    rows += [{"query": "a lone question", "doc_id": "d2"}]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    result = runner.invoke(app, ["data", "select-documents", "--data", str(toy_beir), "--pairs", str(pairs),
                                 "--epsilon", "2", "--out", str(tmp_path / "sel")])
    assert result.exit_code == 0, result.output
    selection = json.loads((tmp_path / "sel" / "privacy_ledger.json").read_text())
    assert selection["mechanism"] == "laplace-partition-selection"
    assert "d1" in (tmp_path / "sel" / "documents.txt").read_text().split()  # 12 units: far above the threshold
    config = tmp_path / "generator.yaml"
    config.write_text("trained_layers: 1\nlora_rank: 4\n")
    gen = runner.invoke(app, ["generator", "train-dp", "--data", str(toy_beir), "--pairs", str(pairs),
                              "--out", str(tmp_path / "g"), "--model", str(tiny_llama_dir), "--epsilon", "4",
                              "--batch-size", "2", "--epochs", "1", "--config", str(config)])
    assert gen.exit_code == 0, gen.output
    result = runner.invoke(app, ["synth", "generate", "--model", str(tmp_path / "g"), "--data", str(toy_beir),
                                 "--out", str(tmp_path / "syn"), "--documents", str(tmp_path / "sel")])
    assert result.exit_code == 0, result.output
    generator = json.loads((tmp_path / "g" / "privacy_ledger.json").read_text())
    synthetic = json.loads((tmp_path / "syn" / "privacy_ledger.json").read_text())
    assert synthetic["epsilon"] == pytest.approx(generator["epsilon"] + selection["epsilon"])
    assert synthetic["delta"] == pytest.approx(generator["delta"] + selection["delta"])
    assert [p["mechanism"] for p in synthetic["parts"]] == ["dp-sgd", "laplace-partition-selection"]
    recorded = {r.mechanism for r in budget.releases(selection["dataset_id"])}
    assert "laplace-partition-selection" in recorded


def test_cli_refuses_a_delta_above_one_over_n_naming_the_flag(tmp_path, toy_beir):
    """delta must be below 1/n; the error names --delta (the library raises on the field ``delta``), the exit is
    2, nothing is written and nothing is charged."""
    from helpers import run_cli
    from privret.privacy import budget

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"query": f"question {k}", "doc_id": "d1"}) + "\n" for k in range(4)))
    result = run_cli("data", "select-documents", "--data", str(toy_beir), "--pairs", str(pairs), "--epsilon", "2",
                     "--delta", "0.3", "--out", str(tmp_path / "sel"), "--dataset-name", "four")
    assert result.returncode == 2
    assert "field '--delta': delta 0.3 must be below 1/n = 0.25" in result.stderr
    assert not (tmp_path / "sel" / "documents.txt").exists() and not budget.releases("four")


class _NoNoise:
    """An rng whose Laplace draws are all 0 (equal exponentials) and whose m-subsets keep the first m."""

    secure = False

    def uniform(self, n: int):
        import torch

        return torch.full((n,), 0.5, dtype=torch.float64)


def test_the_selection_does_not_carry_the_order_of_the_log():
    """A unit added ahead of the others changes which document appears first in the log; the released list
    (and so any seeded sample of it by position) must not change with it: ids come out sorted."""
    cfg = PartitionSelectionConfig(epsilon=5.0, delta=1e-4)
    log = _log({"B": 200, "A": 200, "C": 1})
    first_b = TrainingPairs(pairs=[QueryDocPair("one more", "B")] + log.pairs, corpus={})
    first_a = TrainingPairs(pairs=[QueryDocPair("one more", "A")] + list(reversed(log.pairs)), corpus={})
    ledger = selection_ledger(log, PrivacyUnit.query, cfg, data_hash="h", dataset_id="d")
    for pairs in (log, first_b, first_a):
        assert select_documents(pairs, PrivacyUnit.query, cfg, ledger, rng=_NoNoise()) == ["A", "B"]
