"""bench/park_run.py: an interrupted run carried to another directory (as to another machine) resumes exactly as
it would have in place: every announced step charged once, a non-private run bit for bit the uninterrupted one. A
live run cannot be parked, a changed parked file cannot be restored, and nothing is restored over a directory. The
runs are the toy trainer of test_dp_run.py (milliseconds each)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from helpers import load_script
from privret.errors import InputError
from privret.privacy import budget
from privret.runlock import RunLock
from privret.train.dp_run import run_training
from tests.test_dp_run import _killed_at_checkpoint, _run, _Toy

park_run = load_script("bench/park_run.py")


def _interrupted(tmp_path, *, epsilon=8.0, name="out"):
    """A toy run killed while writing its step-4 checkpoint (steps 1..4 announced, the step-2 checkpoint on disk)."""
    with _killed_at_checkpoint(4):
        run_training(_run(tmp_path, epsilon=epsilon, name=name), lambda: _Toy([]), resume=False)
    return tmp_path / name


def test_a_parked_private_run_resumes_elsewhere_charging_every_announced_step_once(tmp_path):
    run_dir = _interrupted(tmp_path)
    manifest = park_run.park(run_dir, tmp_path / "parked" / "out")
    assert manifest["checkpoint_step"] == 2 and "steps.jsonl" in manifest["files"]
    shutil.rmtree(run_dir)  # the first machine is gone
    park_run.restore(tmp_path / "parked" / "out", run_dir)
    ledger = run_training(_run(tmp_path), lambda: _Toy([]), resume=True)
    # as in place (test_dp_run): the killed branch announced 1..4, the resumed one 3..5
    assert ledger.steps == 7 and ledger.epsilon == _run(tmp_path).plan.spent(7)
    assert json.loads((run_dir / "toy.json").read_text())["resumed_at_step"] == 2
    assert [(r.status, r.steps) for r in budget.releases("toy")] == [("final", 7)]


def test_a_parked_non_private_run_resumes_to_the_uninterrupted_one(tmp_path):
    run_training(_run(tmp_path, epsilon=math.inf, name="plain"), lambda: _Toy([]), resume=False)
    run_dir = _interrupted(tmp_path, epsilon=math.inf)
    park_run.park(run_dir, tmp_path / "parked")
    shutil.rmtree(run_dir)
    park_run.restore(tmp_path / "parked", run_dir)
    run_training(_run(tmp_path, epsilon=math.inf), lambda: _Toy([]), resume=True)
    w = [json.loads((tmp_path / name / "toy.json").read_text())["w"] for name in ("plain", "out")]
    assert w[0] == w[1]


def test_a_live_run_is_not_parked(tmp_path):
    run_dir = _interrupted(tmp_path)
    with RunLock(run_dir):  # the run still trains (in another process: the tool runs in one)
        done = subprocess.run([sys.executable, park_run.__file__, "park", str(run_dir), str(tmp_path / "parked")],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and not (tmp_path / "parked").exists()


def test_finished_runs_changed_copies_and_occupied_targets_are_refused(tmp_path):
    run_dir = _interrupted(tmp_path)
    parked = tmp_path / "parked"
    park_run.park(run_dir, parked)
    with pytest.raises(InputError, match="already exists"):
        park_run.restore(parked, run_dir)
    with pytest.raises(InputError, match="already exists"):
        park_run.park(run_dir, parked)
    log = parked / "steps.jsonl"
    log.write_text(log.read_text().replace('"to": 4', '"to": 2'))  # an edit that would hide two noisy steps
    shutil.rmtree(run_dir)
    with pytest.raises(InputError, match="steps.jsonl first"):
        park_run.restore(parked, run_dir)
    assert not run_dir.exists()
    finished = tmp_path / "finished"
    run_training(_run(tmp_path, name="finished"), lambda: _Toy([]), resume=False)
    with pytest.raises(InputError, match="no interrupted run"):
        park_run.park(finished, tmp_path / "parked-finished")
