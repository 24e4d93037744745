"""FedAvg aggregation (thesis eq. 3.6) through the Flower strategy equals the weighted mean."""

from __future__ import annotations

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict  # noqa: E402

from privret.settings.federated import FedConfig  # noqa: E402
from privret.federated.strategy import dp_ledger, make_strategy, weighted_mean  # noqa: E402


def _replies(arrays: list[dict], weights: list[float]):
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    replies = []
    for node, (arr, w) in enumerate(zip(arrays, weights), start=1):
        request = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=node, message_type="train")
        request.metadata.__dict__["_message_id"] = f"m{node}"
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arr.items()}),
                              "metrics": MetricRecord({"num-examples": w, "dp-weight": 1.0})})
        replies.append(Message(content, reply_to=request))
    return replies


CLIENTS = [{"w": np.array([1.0, 1.0]), "b": np.array([[2.0]])},
           {"w": np.array([4.0, 4.0]), "b": np.array([[0.0]])},
           {"w": np.array([10.0, -10.0]), "b": np.array([[5.0]])}]
WEIGHTS = [1, 2, 7]  # |D_i|


def test_dp_settings_without_dp_are_refused():
    """With dp none no noise is added and nothing is clipped: a noise multiplier, clip norm or delta given there
    would be ignored, so it is refused; the defaults (what a dump of such a config holds) pass."""
    from pydantic import ValidationError

    for name, value in (("dp_noise_multiplier", 0.8), ("dp_clip_norm", 0.5), ("dp_delta", 1e-5)):
        with pytest.raises(ValidationError, match=f"`{name}` applies with dp server or client"):
            FedConfig(**{name: value})
        assert getattr(FedConfig(dp="server", **{name: value}), name) == value
    assert FedConfig.from_run_config(FedConfig().to_run_config()) == FedConfig()


def test_dp_configs_send_nothing_that_a_client_size_moves(tmp_path):
    """Under DP stage 2 is client-customized query encoders only by default, and a setting that sends one item per
    training question of a client (Fed-Negative's query embeddings; per-question ranks of the validation questions
    held out of its training log) is refused, also in a copy made with model_copy when a server is given it."""
    from pydantic import ValidationError

    from privret.federated.server_app import run_server

    assert FedConfig().personalize == ["local", "fed"] and FedConfig(dp="server").personalize == ["local"]
    assert FedConfig.from_run_config(FedConfig(dp="client").to_run_config()) == FedConfig(dp="client")
    with pytest.raises(ValidationError, match="Fed-Negative.*gives away its data size"):
        FedConfig(dp="client", personalize=["local", "fed"])
    validation = dict(evaluation_split="validation", train_fraction=0.5, per_query_metrics=True)
    with pytest.raises(ValidationError, match="per_query_metrics .* gives away its data size"):
        FedConfig(dp="server", personalize=[], **validation)
    assert FedConfig(**validation).evaluation_counts_public  # without DP everything stands
    assert FedConfig(dp="server", per_query_metrics=True).evaluation_counts_public  # the test split's counts: public
    assert not FedConfig(dp="server", personalize=[], evaluation_split="validation",
                         train_fraction=0.5).evaluation_counts_public
    with pytest.raises(ValidationError, match="Fed-Negative"):
        run_server(None, FedConfig().model_copy(update={"dp": "server"}), tmp_path / "run", n_clients=2,
                   dataset_id="name-x")
    assert not (tmp_path / "run").exists()


def test_flower_fedavg_is_eq_3_6():
    strategy = make_strategy(FedConfig(), n_clients=3)
    arrays, _ = strategy.aggregate_train(1, _replies(CLIENTS, WEIGHTS))
    got = {k: v.numpy() for k, v in arrays.items()}
    # by hand: (1*1 + 2*4 + 7*10) / 10 = 7.9 ; (1 + 8 - 70) / 10 = -6.1 ; (2 + 0 + 35) / 10 = 3.7
    np.testing.assert_allclose(got["w"], [7.9, -6.1])
    np.testing.assert_allclose(got["b"], [[3.7]])
    ref = weighted_mean([[c["w"], c["b"]] for c in CLIENTS], WEIGHTS)
    np.testing.assert_allclose(got["w"], ref[0])
    np.testing.assert_allclose(got["b"], ref[1])


def test_dp_wrapper_uses_uniform_weights_and_records_epsilon():
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    cfg = FedConfig(dp="server", dp_noise_multiplier=0.0, dp_clip_norm=1e6)
    strategy = make_strategy(cfg, n_clients=3)
    assert isinstance(strategy, DifferentialPrivacyServerSideFixedClipping)
    current = ArrayRecord({"w": Array(np.zeros(2)), "b": Array(np.zeros((1, 1)))})
    strategy.current_arrays = current
    arrays, _ = strategy.aggregate_train(1, _replies(CLIENTS, WEIGHTS))
    # sigma = 0 and a huge clip norm: the plain *uniform* mean (sensitivity C/m needs uniform weights)
    np.testing.assert_allclose(arrays["w"].numpy(), [5.0, -5.0 / 3])
    ledger = dp_ledger(FedConfig(dp="server", dp_noise_multiplier=1.0, rounds=4), releases=4, n_clients=10,
                       n_questions=100, data_hash="x")
    assert ledger.unit == "client" and ledger.steps == 4 and 0 < ledger.epsilon < float("inf")
    assert ledger.trainable == "layers"  # what is trained and clipped (the default), not "full"
    assert dp_ledger(FedConfig(dp="server", trainable="top:2"), releases=1, n_clients=10, n_questions=100,
                     data_hash="x").trainable == "top:2"
    more = dp_ledger(FedConfig(dp="server", dp_noise_multiplier=1.0, rounds=8), releases=8, n_clients=10,
                     n_questions=100, data_hash="x")
    assert more.epsilon > ledger.epsilon
    assert not dp_ledger(FedConfig(), releases=4, n_clients=10, n_questions=100, data_hash="x").is_private


def test_dp_ledger_lists_what_the_run_releases_without_dp():
    def uncovered(**settings) -> list[str]:
        ledger = dp_ledger(FedConfig(dp="server", **settings), releases=2, n_clients=10, n_questions=100,
                           data_hash="x")
        return ledger.model_dump()["provenance"]["not_covered"]

    default = uncovered()  # PDD-AS2 + client-customized query encoders (stage 2 under DP), test metrics
    assert any("test questions" in item for item in default)
    assert default == [default[0], "the personalised query encoders (stage 2 trains without DP)"]
    (validation,) = uncovered(evaluation_split="validation", train_fraction=0.5, personalize=[])
    assert "validation questions (held out of the clients' training logs)" in validation
    assert "reciprocal rank" in uncovered(personalize=[], per_query_metrics=True)[1]
    assert "not_covered" not in dp_ledger(FedConfig(), releases=1, n_clients=10, n_questions=100,
                                          data_hash="x").model_dump()["provenance"]


def _flat(arrays) -> np.ndarray:
    return np.concatenate([arrays[k].numpy().ravel() for k in ("w", "b")])


def test_each_update_is_clipped_before_the_uniform_mean():
    """Without noise the DP aggregate is the uniform mean of the clients' updates, each clipped to norm C on its
    own (brute force here): clipping the mean instead, or weighting by |D_i|, gives another vector."""
    clip = 1.0
    strategy = make_strategy(FedConfig(dp="server", dp_noise_multiplier=0.0, dp_clip_norm=clip), n_clients=3)
    strategy.current_arrays = ArrayRecord({"w": Array(np.zeros(2)), "b": Array(np.zeros((1, 1)))})
    arrays, _ = strategy.aggregate_train(1, _replies(CLIENTS, WEIGHTS))
    updates = [np.concatenate([c["w"].ravel(), c["b"].ravel()]) for c in CLIENTS]
    expected = np.mean([u / max(1.0, np.linalg.norm(u) / clip) for u in updates], axis=0)
    np.testing.assert_allclose(_flat(arrays), expected, rtol=1e-6)


def test_the_server_noise_has_the_standard_deviation_sigma_c_over_m():
    """Clients whose updates are all but zero leave only the noise: N(0, (sigma C / m)^2) per coordinate, m the
    clients of the round, as the accountant assumes (the 4-sigma band of a sample sd). (An update of exactly zero
    makes Flower's clipping divide by its norm, 0: each client moves one weight by 1e-9.)"""
    sigma, clip, m, size = 1.5, 0.5, 3, 100_000
    strategy = make_strategy(FedConfig(dp="server", dp_noise_multiplier=sigma, dp_clip_norm=clip), n_clients=m)
    strategy.current_arrays = ArrayRecord({"w": Array(np.zeros(size)), "b": Array(np.zeros((1, 1)))})
    almost_unchanged = {"w": np.zeros(size), "b": np.full((1, 1), 1e-9)}
    arrays, _ = strategy.aggregate_train(1, _replies([almost_unchanged] * m, [1] * m))
    noise = _flat(arrays)
    expected = sigma * clip / m
    assert abs(noise.mean()) < 4 * expected / np.sqrt(noise.size)
    assert noise.std() == pytest.approx(expected, rel=4 / np.sqrt(2 * noise.size))


@pytest.mark.parametrize("side", ["server", "client"])
def test_the_noise_comes_from_the_csprng_and_the_ledger_says_so(side, monkeypatch):
    """Flower's DP wrappers draw their noise with np.random.normal, numpy's global Mersenne Twister; privret's draw
    it from os.urandom through privret's own noise function (one draw per array, std sigma C / m), server- and
    client-side, and the ledger names that source."""
    from privret.privacy import secure_rng

    def mersenne_twister(*args, **kwargs):
        raise AssertionError("DP noise from numpy's global Mersenne Twister")

    monkeypatch.setattr(np.random, "normal", mersenne_twister)
    drawn, urandom = [], secure_rng.os.urandom
    monkeypatch.setattr(secure_rng.os, "urandom", lambda n: drawn.append(n) or urandom(n))
    sigma, clip, m = 1.5, 0.5, 3
    strategy = make_strategy(FedConfig(dp=side, dp_noise_multiplier=sigma, dp_clip_norm=clip), n_clients=m)
    strategy.current_arrays = ArrayRecord({"w": Array(np.zeros(2000)), "b": Array(np.zeros((1, 1)))})
    almost_unchanged = {"w": np.zeros(2000), "b": np.full((1, 1), 1e-9)}
    arrays, _ = strategy.aggregate_train(1, _replies([almost_unchanged] * m, [1] * m))
    assert sum(drawn) >= 8 * 2001  # 64 random bits per coordinate at least
    assert _flat(arrays).std() == pytest.approx(sigma * clip / m, rel=0.1)
    ledger = dp_ledger(FedConfig(dp=side), releases=2, n_clients=10, n_questions=100, data_hash="x")
    assert ledger.secure_rng and ledger.random_sources == {"noise": "os.urandom"}
    plain = dp_ledger(FedConfig(), releases=2, n_clients=10, n_questions=100, data_hash="x")
    assert not plain.secure_rng and plain.random_sources == {}


@pytest.mark.parametrize("epsilon", [3.0, 8.0])
def test_a_target_epsilon_sets_the_noise_that_spends_it_over_the_rounds(epsilon):
    """The ledger of the calibrated run spends at most the target, and a little less noise would spend more."""
    from privret.federated.strategy import with_target_epsilon
    from privret.privacy.accounting import spent_epsilon

    cfg = with_target_epsilon(FedConfig(dp="server", rounds=10), epsilon)
    ledger = dp_ledger(cfg, releases=10, n_clients=10, n_questions=100, data_hash="x")
    assert ledger.noise_multiplier == cfg.dp_noise_multiplier and ledger.epsilon <= epsilon
    assert ledger.epsilon > 0.97 * epsilon  # tight: not calibrated for other rounds or another accountant
    assert spent_epsilon(noise_multiplier=0.98 * cfg.dp_noise_multiplier, sample_rate=1.0, steps=10,
                         delta=cfg.dp_delta, accountant="rdp") > epsilon
    with pytest.raises(ValueError, match="dp = server or client"):
        with_target_epsilon(FedConfig(), epsilon)
