"""bench/clip_only.py: the direct DP trainer with its noise switched off is marked and announced as not DP (slow:
about 20 s, a subprocess that trains a tiny encoder), and every step the ledger counts went through the noise
switched off (std 0). The marker must be inside the staged directory when it is renamed into place (a kill
between the rename and a later marker would leave a noise-free directory that looks like a DP run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


# Runs bench/clip_only.py with the final rename watched: it records whether the marker was already staged.
WATCHED = """
import contextlib, runpy, sys
from pathlib import Path
import privret.train.dp_run as dp_run
real = dp_run.atomic_path
@contextlib.contextmanager
def watched(target):
    with real(target) as staged:
        yield staged
        if Path(target).name == "nonoise":
            Path(sys.argv[-1]).with_name("staged_marker").write_text(str((staged / "NOT_DP.txt").exists()))
dp_run.atomic_path = watched
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_noise_free_run_is_marked_and_never_announced_as_dp(toy_beir, tiny_bert_dir, tmp_path):
    out = tmp_path / "nonoise"
    args = ["retriever", "train", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--dp", "public-negatives",
            "--epsilon", "8", "--batch-size", "2", "--trainable", "top:1", "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", WATCHED, str(ROOT / "bench" / "clip_only.py"), *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "staged_marker").read_text() == "True"  # the marker came with the rename, not after it
    marker = (out / "NOT_DP.txt").read_text()
    assert "not DP" in marker
    steps = json.loads((out / "privacy_ledger.json").read_text())
    assert f"switched off in {steps['steps']} steps of this process" in marker and steps["steps"] > 0
    (closing,) = [line for line in done.stdout.splitlines() if line.startswith("retriever written to")]
    assert "NOT DP" in closing and "-DP" not in closing.replace("NOT DP", "")
    assert steps["mechanism"] == "direct-public-negatives with the noise switched off (bench/clip_only.py): NOT DP"
    # A run with the noise on, pointed at the diagnosis, refuses it: it would otherwise hand back (or, from a
    # checkpoint, continue) noise-free steps under a DP ledger
    noisy = subprocess.run([str(Path(sys.executable).with_name("privret")), *args, "--resume"], capture_output=True, text=True,
                           timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert noisy.returncode != 0 and "mechanism" in noisy.stderr, noisy.stderr[-3000:]
    # A finished directory without the marker (as a run with the noise on leaves it) is not vouched for: no step
    # of this process went through the switched-off noise, so the script fails instead of passing it off
    (out / "NOT_DP.txt").unlink()
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "clip_only.py"), *args, "--resume"],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode != 0 and "has no NOT_DP.txt" in again.stderr and not (out / "NOT_DP.txt").exists()
