"""bench/direct_regimes.sh's choice steps: the best mean validation NDCG@10 over a candidate's runs, in the public
encoder's number format, and the public encoder itself when no candidate beats it (nothing here reads test)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _evaluation(path: Path, ndcg: float, precision: str = "float32") -> None:
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps({"ndcg@10": ndcg, "precision": precision}))


def _choose_small(work: Path) -> str:
    done = subprocess.run(["bash", "bench/direct_regimes.sh", str(work), "choose-small"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return (work / "small" / "choice.txt").read_text().strip()


def test_choose_small_averages_a_schedules_runs(tmp_path):
    _evaluation(tmp_path / "zero-shot-validation", 0.70)
    small = tmp_path / "small"
    _evaluation(small / "r-t12-lr1e-3-validation", 0.74)  # one lucky run ...
    _evaluation(small / "r-t12-lr1e-3-seed1-validation", 0.71)  # ... and its second run: mean 0.725
    _evaluation(small / "r-t48-lr2e-3-validation", 0.73)
    assert _choose_small(tmp_path) == "r-t48-lr2e-3"
    _evaluation(small / "r-t48-lr2e-3-seed1-validation", 0.70)  # now mean 0.715: the 12-step schedule wins
    assert _choose_small(tmp_path) == "r-t12-lr1e-3"


def test_choose_small_keeps_the_public_encoder_and_skips_other_number_formats(tmp_path):
    _evaluation(tmp_path / "zero-shot-validation", 0.70)
    small = tmp_path / "small"
    _evaluation(small / "r-t12-lr1e-3-validation", 0.69)
    _evaluation(small / "r-t48-lr2e-3-validation", 0.75, precision="bf16-autocast")  # not comparable: skipped
    assert _choose_small(tmp_path) == "zero-shot"


def test_choose_proxy_compares_against_the_proxys_own_public_encoder(tmp_path):
    _evaluation(tmp_path / "zero-shot-validation", 0.50)  # SQuAD's public encoder: not the proxy's baseline
    _evaluation(tmp_path / "proxy-zero-shot-validation", 0.80)
    proxy = tmp_path / "proxy"
    _evaluation(proxy / "bias-b512-validation", 0.78)
    done = subprocess.run(["bash", "bench/direct_regimes.sh", str(tmp_path), "choose-proxy"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (proxy / "choice.txt").read_text().strip() == "zero-shot"  # below the proxy's 0.80, whatever SQuAD's
    _evaluation(proxy / "top3-b512-validation", 0.82)
    subprocess.run(["bash", "bench/direct_regimes.sh", str(tmp_path), "choose-proxy"], cwd=REPO, check=True,
                   capture_output=True)
    assert (proxy / "choice.txt").read_text().strip() == "top3-b512"
    assert not (tmp_path / "small").exists()
