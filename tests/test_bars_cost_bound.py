"""bench/bars_cost_bound.py: the epsilon-0 rows' share of an unfinished run, bounded by the stages timed so far."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bars_cost_bound.py"


def _row(run: Path, name: str, eval_seconds: float | None = None, **stages: float) -> None:
    (run / name).mkdir(parents=True)
    if stages:
        (run / name / "timing.json").write_text(json.dumps({f"{k}_seconds": v for k, v in stages.items()}))
    if eval_seconds is not None:
        (run / name / "metrics.json").write_text(json.dumps({"ndcg@10": 0.5, "eval_seconds": eval_seconds}))


def _run(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(run), "--epsilon", "8"], capture_output=True, text=True)


def test_the_bound_counts_every_timed_stage_of_the_route_and_only_the_route(tmp_path):
    run = tmp_path / "run"
    _row(run, "zero_shot", 60)
    _row(run, "original", 60, retriever=540)
    _row(run, "public-prompted", 60, generator=5, generate=300, retriever=535)  # 900 s
    _row(run, "eps-8", generator=1800, generate=600)  # in progress: no retriever, no evaluation yet
    _row(run, "eps-3", 60, generator=9999, generate=9999, retriever=9999)  # another epsilon: not in the route
    done = _run(run)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "eps-8: generator 30.0 min, generation 10.0 min; not timed yet: evaluation, retriever" in lines
    assert not any(line.startswith("eps-3") for line in lines)
    # 900 / (60 + 600 + 2400) = 29.4%
    assert lines[-1] == ("epsilon-0 rows 15.0 min over the 51.0 min of the synthetic route's stages timed so far: "
                         "at most +29.4%")


def test_no_bound_while_an_epsilon_0_row_is_unfinished(tmp_path):
    run = tmp_path / "run"
    _row(run, "zero_shot", 60)
    _row(run, "public-prompted", generator=5, generate=300)  # its retriever has no time yet: an under-count
    done = _run(run)
    assert done.returncode != 0 and "not fully timed: no bound" in done.stderr


def test_no_bound_before_the_route_has_a_timed_stage(tmp_path):
    run = tmp_path / "run"
    _row(run, "public-prompted", 60, generator=5, generate=300, retriever=535)
    done = _run(run)
    assert done.returncode != 0 and "no stage of the synthetic route is timed yet" in done.stderr
