"""The round's wire format: 16-bit casts, updates that never outgrow a clip norm, bytes of a real run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privret.data.fed_squad import build_fed_squad
from privret.federated import wire
from privret.settings.federated import FedConfig

pytest.importorskip("flwr")
from flwr.app import Array, ArrayRecord  # noqa: E402


def _random(seed: int, n: int = 4096, scale: float = 1e-3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * scale * np.exp(rng.uniform(-8, 8, n))).astype(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_toward_zero_is_never_larger_and_nearest_is_within_half_a_spacing(dtype):
    x = _random(0)
    x = x[np.abs(x) < 6e4]  # inside the fp16 range
    zero = wire.uncast(wire.cast(x, dtype, toward_zero=True), dtype)
    near = wire.uncast(wire.cast(x, dtype, toward_zero=False), dtype)
    assert np.all(np.abs(zero) <= np.abs(x)) and np.all(np.sign(zero) * np.sign(x) >= 0)
    # the next representable value away from zero is beyond x: toward-zero is the largest that is not
    bits = wire.cast(x, dtype, toward_zero=True)
    if dtype == "float16":
        up = np.nextafter(bits, (np.sign(x) * np.inf).astype(np.float16)).astype(np.float32)
    else:  # sign and magnitude: one more unit in the last place is one step away from zero
        up = wire.uncast(bits + np.uint16(1), dtype)
    assert np.all((np.abs(up) > np.abs(x)) | (zero == x))
    assert np.all(np.abs(near - x) <= np.abs(up - zero) / 2 + 1e-30)
    mantissa = 10 if dtype == "float16" else 7
    normal = np.abs(x) > (6.2e-5 if dtype == "float16" else 1e-37)
    assert np.all(np.abs(near - x)[normal] <= np.abs(x)[normal] * 2.0 ** -(mantissa + 1))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_clipped_update_stays_within_its_clip_norm_on_the_wire(dtype):
    """DP-FedAvg's sensitivity: an update clipped to C on the client must reach the server with norm <= C."""
    clip = 0.5
    for seed in range(20):
        u = _random(seed, 2000, 1e-4)
        u = (u * (clip / np.linalg.norm(u.astype(np.float64)))).astype(np.float32)
        while np.linalg.norm(u.astype(np.float64)) > clip:  # the float32 clipping itself rounds
            u = np.nextafter(u, 0).astype(np.float32)
        sent = wire.uncast(wire.cast(u, dtype, toward_zero=True), dtype)
        assert np.linalg.norm(sent.astype(np.float64)) <= clip


def _record(**arrays) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v, dtype=np.float32)) for k, v in arrays.items()})


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_server_rebuilds_the_client_model_from_the_master_and_the_update(dtype):
    master = _record(a=np.linspace(-0.1, 0.1, 50), b=np.full(3, 0.05))
    received = wire.decode_weights(wire.encode_weights(master, dtype), dtype)
    delta = {"a": np.linspace(1e-4, -2e-4, 50), "b": np.array([3e-5, -1e-4, 0.0])}
    trained = _record(**{k: received[k].numpy() + delta[k] for k in delta})
    rebuilt = wire.apply_update(master, wire.encode_update(trained, received, dtype), dtype)
    for k in delta:  # the update the strategy sees is the client's update, to 16-bit precision of the update
        seen = rebuilt[k].numpy() - master[k].numpy()
        tol = {"float32": 1e-9, "float16": 2e-7, "bfloat16": 2e-6}[dtype]
        np.testing.assert_allclose(seen, delta[k], atol=tol, rtol=2.0 ** -7)
    with pytest.raises(ValueError, match="different names"):
        wire.encode_update(_record(a=[1.0]), _record(b=[1.0]), dtype)
    with pytest.raises(ValueError, match="non-finite"):
        wire.cast(np.array([np.nan], dtype=np.float32), dtype, toward_zero=True)


def test_rounding_trained_weights_would_lose_what_an_update_keeps():
    """Why updates travel, not weights: fp16 weights near 0.05 cannot hold a 1e-5 step; the update can."""
    master = _record(w=np.full(100, 0.05))
    received = wire.decode_weights(wire.encode_weights(master, "float16"), "float16")
    trained = _record(w=received["w"].numpy() + 1e-5)
    as_weights = wire.uncast(wire.cast(trained["w"].numpy(), "float16", toward_zero=False), "float16")
    assert np.all(as_weights == received["w"].numpy())  # the step vanished
    rebuilt = wire.apply_update(master, wire.encode_update(trained, received, "float16"), "float16")
    np.testing.assert_allclose(rebuilt["w"].numpy() - 0.05, 1e-5, rtol=1e-3)


def _fed_cfg(model, **kw) -> FedConfig:
    base = dict(model=model, rounds=1, warmup_rounds=1, batch_size=2, n_negatives=1, bm25_k=3,
                personalize=[], bf16=False)
    return FedConfig(**{**base, **kw})


def test_a_round_moves_only_the_trainable_parameters_in_the_wire_type(tiny_squad, tiny_encoder, tmp_path):
    from privret.federated.arrays import new_encoder, trainable_parameters
    from privret.federated.runner import run_federated_local

    fed = build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2, seed=0) and tmp_path / "fed"
    runs = {}
    for name, kw in {"full": dict(trainable="all", wire_dtype="float32"),
                     "cheap": dict(trainable="layers", wire_dtype="float16"),
                     "top": dict(trainable="top:1", wire_dtype="bfloat16")}.items():
        cfg = _fed_cfg(tiny_encoder, **kw)
        params = trainable_parameters(new_encoder(cfg))
        n_params = sum(p.numel() for p in params.values())
        (r,) = run_federated_local(cfg, fed, tmp_path / name, resume=False)["rounds"]
        payload = 2 * n_params * (4 if cfg.wire_dtype == "float32" else 2)  # 2 clients
        framing = 2 * len(params) * 200  # a .npy header per array (and a 4-byte scale per fp16 update)
        assert payload <= r["bytes_down"] <= payload + framing
        assert payload <= r["bytes_up"] <= payload + 2 * framing
        runs[name] = (n_params, r)
    assert runs["top"][0] < runs["cheap"][0] < runs["full"][0]  # the embeddings (and lower layers) stay home
    state = json.loads((tmp_path / "cheap" / "state.json").read_text())
    assert state["rounds_done"] == 1


def test_client_side_clipping_survives_the_16_bit_wire(tiny_squad, tiny_encoder, tmp_path, monkeypatch):
    """With ``dp=client`` the updates the server rebuilds (what it averages and noises) have norm <= C."""
    from privret.federated import server_app
    from privret.federated.runner import run_federated_local

    fed = build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2, seed=0) and tmp_path / "fed"
    norms = []
    real = wire.apply_update

    def recording(master, update, dtype):
        rebuilt = real(master, update, dtype)
        norms.append(float(np.sqrt(sum(np.sum((rebuilt[k].numpy().astype(np.float64) - master[k].numpy()) ** 2)
                                       for k in master))))
        return rebuilt

    monkeypatch.setattr(server_app.wire, "apply_update", recording)
    cfg = _fed_cfg(tiny_encoder, rounds=2, learning_rate=1e-2, dp="client", dp_clip_norm=0.05,
                   dp_noise_multiplier=0.0, wire_dtype="float16")
    run_federated_local(cfg, fed, tmp_path / "dp", resume=False)
    assert len(norms) == 4
    assert max(norms) <= 0.05 and max(norms) > 0.045  # clipping was active, and held after the cast
