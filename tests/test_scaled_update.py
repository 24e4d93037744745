"""bench/scaled_update.py: a kept run's update scaled by w, theta_0 + w (theta_run - theta_0), with the run's ledger."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from privret.models.encoder import load_encoder

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "scaled_update.py"
CHANGED = ("0.model.encoder.layer.1.output.dense.bias", "0.model.encoder.layer.0.attention.self.query.bias")


def _parameters(directory: Path) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in load_encoder(str(directory)).named_parameters()}


def _kept_run(base: Path, run_dir: Path) -> dict[str, torch.Tensor]:
    """A run that moved the CHANGED tensors by known random steps, kept as its changed tensors and a ledger."""
    params = _parameters(base)
    generator = torch.Generator().manual_seed(0)
    moved = {n: params[n] + torch.randn(params[n].shape, generator=generator) for n in CHANGED}
    run_dir.mkdir()
    save_file(moved, str(run_dir / "parameters.safetensors"))
    (run_dir / "privacy_ledger.json").write_text('{"epsilon": 8}\n')
    return moved


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


@pytest.mark.parametrize("weight", [1.0, 2.0, 0.5])
def test_the_update_is_scaled_and_nothing_else_moves(tmp_path, tiny_bert_dir, weight):
    moved = _kept_run(tiny_bert_dir, tmp_path / "run")
    out = tmp_path / "scaled"
    done = _run("--parameters", str(tmp_path / "run" / "parameters.safetensors"), "--weight", str(weight),
                "--base", str(tiny_bert_dir), "--ledger-from", str(tmp_path / "run"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    base, scaled = _parameters(tiny_bert_dir), _parameters(out)
    for name, value in scaled.items():
        expected = base[name] + weight * (moved[name] - base[name]) if name in CHANGED else base[name]
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-6)
    assert not torch.equal(scaled[CHANGED[0]], base[CHANGED[0]])
    assert (out / "privacy_ledger.json").read_text() == '{"epsilon": 8}\n'  # the run's ledger: the same release


@pytest.mark.parametrize("weight", ["0", "-1", "nan"])
def test_a_weight_that_is_not_positive_is_refused_before_anything_is_written(tmp_path, tiny_bert_dir, weight):
    _kept_run(tiny_bert_dir, tmp_path / "run")
    done = _run("--parameters", str(tmp_path / "run" / "parameters.safetensors"), "--weight", weight,
                "--base", str(tiny_bert_dir), "--out", str(tmp_path / "scaled"))
    assert done.returncode == 2 and "--weight" in done.stderr
    assert not (tmp_path / "scaled").exists()
