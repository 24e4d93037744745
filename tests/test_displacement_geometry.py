"""bench/displacement_geometry.py: norms, cosines, projections and the noise floor of a run's displacement."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import load_script


def _module():
    return load_script("bench/displacement_geometry.py")


def test_names_group_by_type_and_by_layer():
    m = _module()
    assert m.tensor_type("encoder.layer.4.attention.self.key.bias") == "attention.self.key.bias"
    assert m.layer_of("encoder.layer.4.attention.self.key.bias") == "layer 4"
    assert m.tensor_type("pooler.dense.bias") == m.layer_of("pooler.dense.bias") == "pooler.dense.bias"


def test_the_geometry_of_a_known_displacement():
    m = _module()
    names = ["encoder.layer.3.attention.self.key.bias", "encoder.layer.3.output.dense.bias",
             "encoder.layer.4.output.dense.bias"]
    base = {n: torch.zeros(4) for n in names}
    base["frozen"] = torch.ones(2)
    # floor (key bias) moves by 1 per coordinate; the output biases by 2 and 3 per coordinate
    changed = {names[0]: torch.tensor([1.0, -1, 1, -1]), names[1]: torch.full((4,), 2.0),
               names[2]: torch.tensor([3.0, 3, -3, -3])}
    reference = {names[0]: torch.zeros(4), names[1]: torch.ones(4), names[2]: torch.zeros(4)}
    g = m.displacement_geometry(changed, base, reference)
    assert g["norm"] == pytest.approx(math.sqrt(4 + 16 + 36))
    assert g["floor_power"] == pytest.approx(1.0)
    assert g["projection"] == pytest.approx(8 / 2)  # <Delta, ref> = 4 * 2, |ref| = 2
    assert g["cosine"] == pytest.approx(8 / (2 * math.sqrt(56)))
    out = g["by_type"]["output.dense.bias"]
    assert out["power"] == pytest.approx((4 * 4 + 4 * 9) / 8)
    assert out["power_over_floor"] == pytest.approx(6.5)
    assert out["cosine"] == pytest.approx(8 / (2 * math.sqrt(16 + 36)))
    assert g["by_type"]["attention.self.key.bias"]["cosine"] is None  # the reference does not move it
    assert g["by_layer"]["layer 4"]["power"] == pytest.approx(9.0)
    assert g["by_layer"]["layer 3"]["power"] == pytest.approx((4 + 16) / 8)


def test_a_reference_must_train_every_tensor_of_the_run():
    m = _module()
    base = {"a": torch.zeros(3), "b": torch.zeros(3)}
    with pytest.raises(ValueError, match="does not train b"):
        m.displacement_geometry({"a": torch.ones(3), "b": torch.ones(3)}, base, {"a": torch.ones(3)})
