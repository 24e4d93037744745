"""bench/displacement_placebo.py: the placebo keeps every coordinate's step size and redraws its sign."""

from __future__ import annotations

import torch

from helpers import load_script


def _module():
    return load_script("bench/displacement_placebo.py")


def test_the_placebo_keeps_each_step_size_and_redraws_its_sign():
    placebo = _module().sign_placebo
    gen = torch.Generator().manual_seed(5)
    base = {"a": torch.randn(4000, generator=gen), "b": torch.randn(20, 30, generator=gen), "frozen": torch.ones(3)}
    changed = {n: base[n] + torch.randn(base[n].shape, generator=gen) * 0.01 for n in ("a", "b")}
    out = placebo(changed, base, seed=0)
    assert set(out) == {"a", "b"}
    run = torch.cat([(changed[n] - base[n]).flatten() for n in ("a", "b")])
    moved = torch.cat([(out[n] - base[n]).flatten() for n in ("a", "b")])
    torch.testing.assert_close(moved.abs(), run.abs(), rtol=0, atol=1e-6)
    kept = float((torch.sign(moved) == torch.sign(run)).float().mean())
    assert abs(kept - 0.5) < 0.03  # 6,000 fair coins: sd 0.0065
    assert abs(float(moved @ run / (moved.norm() * run.norm()))) < 0.05
    again, other = placebo(changed, base, seed=0), placebo(changed, base, seed=1)
    assert all(torch.equal(again[n], out[n]) for n in out)
    assert not torch.equal(other["a"], out["a"])


def test_the_scale_multiplies_every_step_size():
    placebo = _module().sign_placebo
    base = {"a": torch.zeros(50)}
    changed = {"a": torch.linspace(-1, 1, 50)}
    torch.testing.assert_close(placebo(changed, base, seed=3, scale=1.5)["a"], 1.5 * placebo(changed, base, seed=3)["a"])
