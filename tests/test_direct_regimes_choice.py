"""bench/direct_regimes.sh's choose step: the best mean validation NDCG@10 over a regime's runs, in the public
encoder's number format, and the public encoder itself when no regime beats it (nothing here reads test)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = "top3-b512-c1-e4-nodrop-pn1"
OTHER = "top3-b512-c1-e4-nodrop"


def _evaluation(path: Path, ndcg: float, precision: str = "float32") -> None:
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps({"ndcg@10": ndcg, "precision": precision}))


def _choose(work: Path) -> str:
    done = subprocess.run(["bash", "bench/direct_regimes.sh", str(work), "choose"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (work / "choice.txt").read_text().strip()


def test_choose_averages_a_regimes_runs(tmp_path):
    _evaluation(tmp_path / "zero-shot-validation", 0.70)
    _evaluation(tmp_path / f"{OTHER}-validation", 0.74)  # one lucky run ...
    _evaluation(tmp_path / f"{OTHER}-seed1-validation", 0.71)  # ... and its second run: mean 0.725
    _evaluation(tmp_path / f"{DEFAULT}-validation", 0.73)
    assert _choose(tmp_path) == DEFAULT
    _evaluation(tmp_path / f"{DEFAULT}-seed1-validation", 0.70)  # now mean 0.715: the other regime wins
    assert _choose(tmp_path) == OTHER


def test_choose_keeps_the_public_encoder_and_skips_other_number_formats(tmp_path):
    _evaluation(tmp_path / "zero-shot-validation", 0.70)
    _evaluation(tmp_path / f"{OTHER}-validation", 0.69)
    _evaluation(tmp_path / f"{DEFAULT}-validation", 0.75, precision="bf16-autocast")  # not comparable: skipped
    assert _choose(tmp_path) == "zero-shot"


def test_an_unknown_step_is_refused(tmp_path):
    done = subprocess.run(["bash", "bench/direct_regimes.sh", str(tmp_path), "small:x:12:1e-3"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unknown step" in done.stderr
