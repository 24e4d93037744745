"""bench/headline.py: the headline file bench/results/privacy_utility.json, from bench/seed_rows.py results; two
results for one dataset merge only on one scale (the same zero-shot and original figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "headline.py"


def _result(tmp_path: Path, name: str, dataset: str, rows: list[str], *, zero_shot: float = 0.6) -> Path:
    """A bench/seed_rows.py --json file with the fields headline.py reads (and one it must drop)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({
        "dataset": dataset, "zero_shot": {"ndcg10": zero_shot}, "original": {"ndcg10": 0.7, "ndcg10_sd": 0.01},
        "rows": [{"name": row, "epsilon": 8.0, "ndcg10_mean": 0.65, "ndcg10_sd": 0.002, "seeds": 3,
                  "delta_ci95": [0.01, 0.09], "retention": 0.5, "ndcg10_seeds": [0.64, 0.65, 0.66]}
                 for row in rows]}))
    return path


def _run(out: Path, *inputs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--precision", "float32", "--out", str(out), *map(str, inputs)],
                          capture_output=True, text=True)


def test_two_results_of_one_dataset_are_merged_in_order(tmp_path):
    old = _result(tmp_path, "old", "scifact", ["old rule, epsilon 8", "epsilon 0, prompted"])
    new = _result(tmp_path, "new", "scifact", ["new rule, epsilon 8"])
    squad = _result(tmp_path, "squad", "squad", ["default, epsilon 8"], zero_shot=0.8)
    out = tmp_path / "privacy_utility.json"
    done = _run(out, old, new, squad)
    assert done.returncode == 0, done.stderr
    headline = json.loads(out.read_text())
    scifact = headline["scifact"]
    assert [row["name"] for row in scifact["rows"]] == ["old rule, epsilon 8", "epsilon 0, prompted",
                                                        "new rule, epsilon 8"]
    assert scifact["sources"] == [old.as_posix(), new.as_posix()] and headline["squad"]["sources"] == [squad.as_posix()]
    assert scifact["original"] == {"ndcg10": 0.7} and scifact["precision"] == "float32"
    assert "ndcg10_seeds" not in scifact["rows"][0]


def test_a_result_on_another_scale_is_refused(tmp_path):
    """(A row name given twice is refused in tests/test_seed_rows.py, on seed_rows.py's own output.)"""
    out = tmp_path / "privacy_utility.json"
    old = _result(tmp_path, "old", "scifact", ["old rule, epsilon 8"])
    other = _result(tmp_path, "other", "scifact", ["new rule, epsilon 8"], zero_shot=0.61)
    done = _run(out, old, other)
    assert done.returncode != 0 and "zero_shot" in done.stderr and "other.json" in done.stderr
    assert not out.exists()
