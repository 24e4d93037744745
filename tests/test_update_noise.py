"""bench/update_noise.py: the share of a DP update that independent runs agree on."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from helpers import load_script

update_noise = load_script("bench/update_noise.py")


def test_the_signal_share_recovers_a_known_mixture():
    g = torch.Generator().manual_seed(0)
    d = 40_000
    signal = torch.randn(d, generator=g)  # |s|^2 ~ d
    runs = []
    for _ in range(3):
        runs.append({
            "enc.layer.0.mixed.bias": signal + 2.0 * torch.randn(d, generator=g),  # noise energy 4d: share 1/5
            "enc.layer.1.mixed.bias": signal + 2.0 * torch.randn(d, generator=g),
            "enc.layer.0.self.key.bias": torch.randn(d, generator=g),  # no common part: share 0
            "enc.layer.0.same.weight": signal.clone(),  # identical in every run: share 1
        })
    share = update_noise.signal_share(runs)
    assert share["mixed.bias"]["values"] == 2 * d  # the same kind of tensor pooled over layers
    assert share["mixed.bias"]["signal_share"] == pytest.approx(0.2, abs=0.02)
    assert share["self.key.bias"]["signal_share"] == pytest.approx(0.0, abs=0.02)
    assert share["same.weight"]["signal_share"] == pytest.approx(1.0, abs=1e-9)
    assert share["mixed.bias"]["rms"] == pytest.approx(5 ** 0.5, rel=0.02)
    # overall: (2 * d * 1 + d * 0 + d * 1) signal energy over (2 * d * 5 + d * 1 + d * 1)
    assert share["all"]["signal_share"] == pytest.approx(3 / 12, abs=0.02)


def test_runs_of_different_regimes_and_single_runs_are_refused():
    a = {"layer.0.x.bias": torch.ones(3)}
    with pytest.raises(ValueError, match="at least two"):
        update_noise.signal_share([a])
    with pytest.raises(ValueError, match="different tensors"):
        update_noise.signal_share([a, {"layer.0.y.bias": torch.ones(3)}])


def test_a_missing_run_file_is_one_line_naming_it(tmp_path):
    done = subprocess.run([sys.executable, update_noise.__file__, str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")],
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [f"{tmp_path / 'a.safetensors'}: no such file (a run's kept parameters.safetensors)"]
