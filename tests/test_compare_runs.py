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
    partly = _eval(tmp_path, "partly", {q: s + (0.05 if i >= 40 else 0.0) for i, (q, s) in enumerate(base.items())})
    done = _run(ref, shifted, noisy, partly)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ref: 0.4")
    assert "+0.0500 [+0.0500, +0.0500] against ref; better on 60, worse on 0, same on 0 queries" in lines[1]
    delta, interval = lines[2].split(", ", 1)[1].split(" [")
    low, high = (float(x) for x in interval.split("]")[0].split(", "))
    assert float(delta) == 0.0 and low < 0 < high  # differences of +-0.1 in equal numbers: a CI around 0
    assert lines[2].endswith("; better on 30, worse on 30, same on 0 queries")
    assert lines[3].endswith("; better on 20, worse on 0, same on 40 queries")  # an unchanged score is a tie


def test_runs_over_different_queries_are_refused(tmp_path):
    ref = _eval(tmp_path, "ref", {"q1": 0.5, "q2": 0.4})
    other = _eval(tmp_path, "other", {"q1": 0.5, "q3": 0.4})
    done = _run(ref, other)
    assert done.returncode != 0
    assert "2 queries differ" in done.stderr and "per_query.json" in done.stderr


def _beir(root: Path, title_of_query: dict[str, str]) -> Path:
    """A BEIR directory where each query's one relevant document carries the given title."""
    (root / "qrels").mkdir(parents=True)
    titles = sorted(set(title_of_query.values()))
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": t, "text": "x"}) + "\n"
                                               for i, t in enumerate(titles)))
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": "y"}) + "\n" for q in title_of_query))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\td{titles.index(t)}\t1\n" for q, t in title_of_query.items()))
    return root


def test_by_title_locates_a_gain_and_a_loss_that_cancel(tmp_path):
    base = {f"q{i}": 0.5 for i in range(40)}
    title = {q: ("Alpha" if i < 20 else "Beta") for i, q in enumerate(base)}
    moved = {q: s + (0.2 if title[q] == "Alpha" else -0.2) for q, s in base.items()}
    data = _beir(tmp_path / "data", title)
    done = _run(_eval(tmp_path, "ref", base), _eval(tmp_path, "moved", moved), "--by-title", str(data))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "\nmoved: 0.5000, +0.0000 [-0.0" in out  # overall the two groups cancel: a CI around 0
    assert "[Alpha] ref: 0.5000 (20 queries" in out and "[Beta] ref: 0.5000 (20 queries" in out
    assert "[Alpha] moved: 0.7000, +0.2000 [+0.2000, +0.2000] against ref; better on 20, worse on 0, same on 0" in out
    assert "[Beta] moved: 0.3000, -0.2000 [-0.2000, -0.2000] against ref" in out


def test_by_title_refuses_queries_the_dataset_does_not_judge(tmp_path):
    data = _beir(tmp_path / "data", {"q1": "Alpha"})
    done = _run(_eval(tmp_path, "ref", {"q1": 0.5, "q2": 0.4}), "--by-title", str(data))
    assert done.returncode != 0
    assert "no relevant document for 1 of the compared queries" in done.stderr and "'q2'" in done.stderr


def test_by_title_names_a_dataset_it_cannot_read_before_printing_anything(tmp_path):
    done = _run(_eval(tmp_path, "ref", {"q1": 0.5}), "--by-title", str(tmp_path / "absent"))
    assert done.returncode != 0 and done.stdout == ""
    assert "absent" in done.stderr and "dataset directory not found" in done.stderr
