"""bench/iterate_average.py: how a regime run's trained tensors are kept in bench/results and rebuilt later."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from privret.models.encoder import load_encoder

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "iterate_average.py"
CHANGED = ("0.model.encoder.layer.1.output.dense.bias", "0.model.encoder.layer.1.output.LayerNorm.weight")


def _run(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done


def _parameters(directory: Path) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in load_encoder(str(directory)).named_parameters()}


def _trained_copy(base: Path, out: Path, shift: float) -> dict[str, torch.Tensor]:
    """``base`` with the CHANGED tensors moved by ``shift``, saved as a retriever in ``out``."""
    model = load_encoder(str(base))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in CHANGED:
            params[name].add_(shift)
    model.save(str(out), safe_serialization=True)
    return {name: params[name].detach().clone() for name in CHANGED}


def test_changed_tensors_are_kept_and_rebuild_the_model_bit_for_bit(tmp_path, tiny_bert_dir):
    _trained_copy(tiny_bert_dir, tmp_path / "final", 0.125)
    kept = tmp_path / "kept" / "parameters.safetensors"
    _run("--keep-changed", "--base", str(tiny_bert_dir), "--final-model", str(tmp_path / "final"), "--save-parameters", str(kept))
    assert sorted(load_file(str(kept))) == sorted(CHANGED)  # the untouched tensors are not kept

    _run("--from-parameters", str(kept), "--base", str(tiny_bert_dir), "--out", str(tmp_path / "rebuilt"))
    final, rebuilt = _parameters(tmp_path / "final"), _parameters(tmp_path / "rebuilt")
    assert sorted(final) == sorted(rebuilt)
    assert all(torch.equal(final[n], rebuilt[n]) for n in final)


def test_iterates_of_a_step_range_are_averaged(tmp_path, tiny_bert_dir):
    iterates = tmp_path / "iterates"
    iterates.mkdir()
    for step, shift in ((2, 0.5), (4, 1.0), (6, 8.0)):
        tensors = _trained_copy(tiny_bert_dir, tmp_path / f"m{step}", shift)
        save_file(tensors, str(iterates / f"step-{step}.safetensors"))
    _run("--iterates", str(iterates), "--steps", "2-4", "--base", str(tiny_bert_dir), "--out", str(tmp_path / "mean"))
    base, mean = _parameters(tiny_bert_dir), _parameters(tmp_path / "mean")
    for name in CHANGED:  # steps 2 and 4 only: the mean shift is 0.75, step 6 left out
        torch.testing.assert_close(mean[name], base[name] + 0.75)
    assert all(torch.equal(base[n], mean[n]) for n in base if n not in CHANGED)
