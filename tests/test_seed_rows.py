"""bench/seed_rows.py: the script that writes the headline rows (bench/results/privacy_utility.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "seed_rows.py"
QUERIES = [f"q{i}" for i in range(40)]


def _eval(tmp_path: Path, name: str, scores: list[float]) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "per_query.json").write_text(json.dumps({q: {"ndcg@10": s} for q, s in zip(QUERIES, scores)}))
    return str(d)


def _ledger(tmp_path: Path, name: str, epsilon: float) -> str:
    d = tmp_path / f"{name}-ledger"
    d.mkdir()
    (d / "privacy_ledger.json").write_text(json.dumps({"epsilon": epsilon, "delta": 1e-5}))
    return str(d)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_rows_statistics_against_zero_shot_original_and_a_bar(tmp_path):
    base = [0.2 + 0.5 * (i % 7) / 7 for i in range(len(QUERIES))]

    def shifted(d: float) -> list[float]:
        return [b + d for b in base]

    zero = _eval(tmp_path, "zero", base)
    originals = [_eval(tmp_path, "orig0", shifted(0.09)), _eval(tmp_path, "orig1", shifted(0.11))]
    bar = [_eval(tmp_path, "bar", shifted(0.01))]
    dp = [_eval(tmp_path, "dp0", shifted(0.04)), _eval(tmp_path, "dp1", shifted(0.06))]
    out, utility = tmp_path / "rows.json", tmp_path / "utility.json"
    res = _run("--zero-shot", zero, "--original", *originals,
               "--row", "prompted", _ledger(tmp_path, "prompted", 0.0), *bar,
               "--row", "dp", _ledger(tmp_path, "dp", 8.0), *dp,
               "--bar", "prompted", "--json", str(out), "--utility-json", str(utility), "--dataset", "toy")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    dp_row = rows["dp"]
    # every query moves by the same amount, so each paired CI is that difference exactly
    assert dp_row["ndcg10_mean"] == pytest.approx(sum(base) / len(base) + 0.05)
    assert dp_row["ndcg10_sd"] == pytest.approx(0.01 * 2 ** 0.5)
    assert dp_row["seeds"] == 2 and dp_row["epsilon"] == 8.0
    assert dp_row["delta_ci95"] == pytest.approx([0.05, 0.05])
    assert dp_row["delta_vs_original_ci95"] == pytest.approx([-0.05, -0.05])
    assert dp_row["retention"] == pytest.approx(0.5)  # 0.05 of the original's 0.10
    assert dp_row["delta_vs_bar_ci95"] == {"prompted": pytest.approx([0.04, 0.04])}
    assert rows["prompted"]["delta_vs_bar_ci95"] == {}  # not against itself
    entry = json.loads(utility.read_text())["toy"]
    assert entry["original"]["ndcg10"] == pytest.approx(sum(base) / len(base) + 0.10)
    assert [r["name"] for r in entry["rows"]] == ["prompted", "dp"]

    # --append replaces the row of the same name and keeps the others
    res = _run("--zero-shot", zero, "--original", *originals,
               "--row", "dp", _ledger(tmp_path, "dp-again", 3.0), _eval(tmp_path, "dp2", shifted(0.02)),
               "--json", str(out), "--utility-json", str(utility), "--dataset", "toy", "--append")
    assert res.returncode == 0, res.stderr
    entry = json.loads(utility.read_text())["toy"]
    assert [(r["name"], r["epsilon"], r["seeds"]) for r in entry["rows"]] == [("prompted", 0.0, 1), ("dp", 3.0, 1)]
    assert entry["rows"][1]["retention"] == pytest.approx(0.2)


def test_refuses_a_bar_without_a_row_and_seeds_over_other_queries(tmp_path):
    zero = _eval(tmp_path, "zero", [0.5] * len(QUERIES))
    row = ["--row", "dp", _ledger(tmp_path, "dp", 8.0), _eval(tmp_path, "dp0", [0.6] * len(QUERIES))]
    res = _run("--zero-shot", zero, "--original-ndcg", "0.7", *row, "--bar", "prompted", "--json",
               str(tmp_path / "rows.json"))
    assert res.returncode != 0 and "no --row of that name" in res.stderr
    short = tmp_path / "short"
    short.mkdir()
    (short / "per_query.json").write_text(json.dumps({"q0": {"ndcg@10": 0.6}}))
    res = _run("--zero-shot", zero, "--original-ndcg", "0.7", *row, str(short), "--json", str(tmp_path / "rows.json"))
    assert res.returncode != 0 and "different queries" in res.stderr


def test_headline_file_from_results_one_object_per_dataset(tmp_path):
    zero = _eval(tmp_path, "zero", [0.5] * len(QUERIES))
    original = _eval(tmp_path, "orig", [0.7] * len(QUERIES))
    results = []
    for dataset in ("scifact", "squad"):
        out = tmp_path / f"{dataset}.json"
        res = _run("--zero-shot", zero, "--original", original, "--dataset", dataset, "--json", str(out),
                   "--row", "dp", _ledger(tmp_path, f"dp-{dataset}", 8.0), _eval(tmp_path, f"dp-{dataset}", [0.6] * 40))
        assert res.returncode == 0, res.stderr
        results.append(str(out))
    headline, script = tmp_path / "privacy_utility.json", SCRIPT.with_name("headline.py")
    res = subprocess.run([sys.executable, str(script), "--precision", "float32", "--out", str(headline), *results],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    entries = json.loads(headline.read_text())
    assert list(entries) == ["scifact", "squad"]
    entry = entries["squad"]
    assert entry["precision"] == "float32" and entry["sources"] == [results[1]]
    assert entry["zero_shot"] == {"ndcg10": pytest.approx(0.5)} and entry["original"] == {"ndcg10": pytest.approx(0.7)}
    (row,) = entry["rows"]
    assert set(row) == {"name", "epsilon", "ndcg10_mean", "ndcg10_sd", "seeds", "delta_ci95", "retention"}
    assert row["retention"] == pytest.approx(0.5) and row["delta_ci95"] == pytest.approx([0.1, 0.1])
    res = subprocess.run([sys.executable, str(script), "--precision", "float32", "--out", str(headline), results[0],
                          results[0]], capture_output=True, text=True)
    assert res.returncode != 0 and "rows ['dp'] are already in" in res.stderr  # one result given twice
