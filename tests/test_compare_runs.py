"""bench/compare_runs.py: paired differences between evaluations of one split, as the regime tables report them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "compare_runs.py"


def _eval(tmp_path: Path, name: str, scores: dict[str, float]) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "per_query.json").write_text(json.dumps({q: {"ndcg@10": s, "recall@10": 1.0} for q, s in scores.items()}))
    return f"{name}={d}"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_each_run_is_paired_with_the_first(tmp_path):
    base = {f"q{i}": 0.1 + 0.8 * (i % 9) / 9 for i in range(60)}
    ref = _eval(tmp_path, "ref", base)
    shifted = _eval(tmp_path, "shifted", {q: s + 0.05 for q, s in base.items()})  # the same shift on every query
    noisy = _eval(tmp_path, "noisy", {q: s + (0.1 if i % 2 else -0.1) for i, (q, s) in enumerate(base.items())})
    done = _run(ref, shifted, noisy)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ref: 0.4")
    assert "+0.0500 [+0.0500, +0.0500] against ref" in lines[1]  # no spread in the differences: a point interval
    delta, interval = lines[2].split(", ", 1)[1].split(" [")
    low, high = (float(x) for x in interval.split("]")[0].split(", "))
    assert float(delta) == 0.0 and low < 0 < high  # differences of +-0.1 in equal numbers: a CI around 0


def test_runs_over_different_queries_are_refused(tmp_path):
    ref = _eval(tmp_path, "ref", {"q1": 0.5, "q2": 0.4})
    other = _eval(tmp_path, "other", {"q1": 0.5, "q3": 0.4})
    done = _run(ref, other)
    assert done.returncode != 0
    assert "2 queries differ" in done.stderr and "per_query.json" in done.stderr
