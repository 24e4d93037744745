"""bench/tensor_coherence.py: the split-half signal, its shares and the Fisher shares on gradients built by hand."""

from __future__ import annotations

import pytest
import torch

from helpers import load_script


def _module():
    return load_script("bench/tensor_coherence.py")


def test_groups_cover_every_coordinate_by_type_and_by_layer():
    tc = _module()
    named = {"0.auto_model.encoder.layer.4.output.dense.bias": torch.zeros(3),
             "0.auto_model.encoder.layer.5.output.dense.bias": torch.zeros(3),
             "0.auto_model.encoder.layer.5.attention.self.query.bias": torch.zeros(2)}
    groups = tc.groups_of(named)
    assert groups["output.dense.bias"] == [(0, 3), (3, 3)]
    assert groups["attention.self.query.bias"] == [(6, 2)]
    assert groups["layer 4"] == [(0, 3)] and groups["layer 5"] == [(3, 3), (6, 2)]


def test_shared_signal_is_found_in_its_group_and_not_in_the_noise():
    """Group "a" (10 coordinates) holds a common mean of 0.1 per coordinate under unit noise; group "b" (300
    coordinates) holds only noise. Split-half: a's signal is ~ 10 * 0.01 = 0.1 and b's ~ 0 (sd sqrt(300) / 2000 =
    0.009), whereas the plain squared norm of b's mean would be about 300 / N = 0.075."""
    tc = _module()
    torch.manual_seed(0)
    n = 4000
    grads = torch.randn(n, 310)
    grads[:, :10] += 0.1
    groups = {"a": [(0, 10)], "b": [(10, 300)]}
    row = tc.coherence(grads, groups, clip=1e6)
    a, b = row["groups"]["a"], row["groups"]["b"]
    assert row["units_clipped"] == 0.0
    assert a["signal"] == pytest.approx(0.1, abs=0.015)
    assert abs(b["signal"]) < 0.03
    assert a["share"] + b["share"] == pytest.approx(1.0)
    assert a["per_coordinate"] == pytest.approx(31.0, rel=0.3)       # (0.1 / 10) / (0.1 / 310)
    # Fisher: E g^2 per coordinate is 1 + 0.01 in a, 1 in b
    assert a["fisher_share"] == pytest.approx(10 * 1.01 / (10 * 1.01 + 300), rel=0.03)
    assert a["per_fisher"] == pytest.approx(a["share"] / a["fisher_share"])


def test_clipping_is_per_unit_and_counted():
    tc = _module()
    grads = torch.tensor([[3.0, 4.0], [0.3, 0.4], [6.0, 8.0], [0.0, 0.1]])
    row = tc.coherence(grads, {"x": [(0, 1)], "y": [(1, 1)]}, clip=1.0)
    assert row["units_clipped"] == 0.5
    # clipped rows: (0.6, 0.8), (0.3, 0.4), (0.6, 0.8), (0, 0.1); Fisher per coordinate: mean of squares
    fx, fy = (0.36 + 0.09 + 0.36) / 4, (0.64 + 0.16 + 0.64 + 0.01) / 4
    assert row["groups"]["x"]["fisher_share"] == pytest.approx(fx / (fx + fy))


def test_lr_scales_are_signal_share_over_fisher_share_per_tensor():
    """Tensor "a" holds the common signal, "b" only noise (its split-half signal can come out negative: scale 0,
    never below), "c" has no gradient at all (like the key biases): scale 0."""
    tc = _module()
    torch.manual_seed(0)
    grads = torch.randn(4000, 40)
    grads[:, :10] += 0.1
    grads[:, 30:] = 0.0
    named = {"a": torch.zeros(10), "b": torch.zeros(20), "c": torch.zeros(10)}
    scales = tc.lr_scales(grads, named, clip=1e6)
    rows = tc.coherence(grads, {"a": [(0, 10)], "b": [(10, 20)], "c": [(30, 10)]}, 1e6)["groups"]
    assert scales["a"] == pytest.approx(rows["a"]["share"] / rows["a"]["fisher_share"]) and scales["a"] > 2
    assert 0.0 <= scales["b"] < 0.1 and scales["c"] == 0.0
