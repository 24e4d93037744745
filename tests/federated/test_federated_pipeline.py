"""The Flower apps end to end on an in-process grid (tiny encoder), evaluation maths, baselines."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from privret.data.fed_squad import build_fed_squad, load_fed_squad
from privret.federated import local
from privret.settings.federated import FedConfig


@pytest.fixture()
def fed_dir(tiny_squad, tmp_path):
    build_fed_squad(tiny_squad, tmp_path / "fed", n_clients=2, seed=0)
    return tmp_path / "fed"


def _cfg(model, **kw):
    base = dict(model=model, rounds=2, warmup_rounds=1, batch_size=2, n_negatives=1, hard_k=3, bm25_k=3,
                personal_batch_size=2, personal_negatives=1, personal_hard_k=3, fed_negatives=2, bf16=False)
    return FedConfig(**{**base, **kw})


def test_passage_score_is_the_max_over_its_sentences(fed_dir):
    client = load_fed_squad(fed_dir)[1]
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((3, len(client.sentences)))
    p_scores, pids = local.passage_scores(scores, client)
    for j, pid in enumerate(pids):
        members = [client.sentence_ids.index(s) for s in client.passages[pid]]
        np.testing.assert_allclose(p_scores[:, j], scores[:, members].max(axis=1))


def test_metrics_on_a_hand_made_ranking(fed_dir):
    client = load_fed_squad(fed_dir)[1]
    questions = client.split("test")[:1] + client.split("train")[:1]
    n = len(client.sentences)
    scores = np.zeros((2, n))
    gold0 = client.sentence_ids.index(questions[0].answer_sentences[0])
    gold1 = client.sentence_ids.index(questions[1].answer_sentences[0])
    scores[0, gold0] = 1.0  # rank 1
    scores[1] = np.linspace(1, 0.5, n)
    scores[1, gold1] = 0.0  # last: not in the top 1, found within 100 (n < 20)
    assert len(questions[0].answer_sentences) == 1 and n <= 20  # the figures below are computed for this case
    m = local.evaluate_scores(scores, client, questions)["sentence"]
    assert m["recall@1"] == pytest.approx(0.5) and m["recall@20"] == pytest.approx(1.0)
    expected_rr1 = 1.0 / n if n <= 10 else 0.0
    assert m["mrr@10"] == pytest.approx((1.0 + expected_rr1) / 2)


def test_federated_run_all_stages_bytes_and_resume(fed_dir, tiny_encoder, tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    from privret.federated import runner
    from privret.federated.arrays import load_arrays
    from privret.federated.server_app import _evaluate_all
    from privret.federated.runner import run_federated_local

    grids = []

    class RecordedGrid(runner.InProcessGrid):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            grids.append(self)

    monkeypatch.setattr(runner, "InProcessGrid", RecordedGrid)
    cfg = _cfg(tiny_encoder, personal_learning_rate=1e-2,  # personal encoders far enough from the global one
               eval_every=1, per_query_metrics=True)
    res = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    assert [r["stage"] for r in res["rounds"]] == ["bm25", "hard"]
    for r in res["rounds"]:  # without DP the server records each client's update norm (to choose a DP clip)
        assert set(r["update_norms"]) == {"client_00", "client_01"}
        assert all(0 < v < float("inf") for v in r["update_norms"].values())
    assert set(res["rounds"][0]["evaluation"]) == set(local.LEVELS) and "evaluation" not in res["rounds"][1]
    ev = res["evaluations"]
    assert set(ev) == {"pdd-as2", "+query-encoders", "+query-encoders+fed-negative"}
    clients = load_fed_squad(fed_dir)
    for name in ev:
        assert set(ev[name]["per_client"]) == {c.name for c in clients}
        total = sum(len(c.split("test")) for c in clients)
        assert ev[name]["pooled"]["sentence"]["queries"] == total
        for c in clients:  # each test question's reciprocal rank reaches the server; their mean is the metric
            for level, m in ev[name]["per_client"][c.name].items():
                assert set(m["per_query"]) == {q.id for q in c.split("test")}
                assert np.mean(list(m["per_query"].values())) == pytest.approx(m["mrr@10"])
    # bytes of one Fed-Negative exchange, by hand: each client sends its Q_i x 32 float32 query
    # embeddings to the other, which answers min(n, |S_j|) embeddings + scores per query
    (hardness,) = ev["+query-encoders+fed-negative"]["fed_negative_hardness"]  # one personalisation epoch
    assert set(hardness["per_client"]) == {c.name for c in clients}
    assert 0 <= hardness["mean"]["fed_above_local_nth"] <= 1 and "fed_negative_hardness" not in ev["+query-encoders"]
    ex = ev["+query-encoders+fed-negative"]["fed_negative_exchanges"][0]
    q = [len(local.train_questions(c, 0, 0)) for c in clients]
    s = [len(c.sentences) for c in clients]
    assert ex["query_bytes"] == (q[0] + q[1]) * 32 * 4
    assert ex["answer_bytes"] == q[0] * min(2, s[1]) * 33 * 4 + q[1] * min(2, s[0]) * 33 * 4
    # personalised query encoders differ from the global model; the global model, evaluated again on the
    # clients after personalisation, scores exactly as before it
    global_arrays = load_arrays(tmp_path / "run" / "global.npz")
    (grid,) = grids
    for context in grid.contexts.values():
        for variant in ("local", "fed"):
            personal = context.state.array_records[f"query-encoder-{variant}"]
            assert set(personal) == set(global_arrays)
            assert any(not np.array_equal(personal[k].numpy(), global_arrays[k].numpy()) for k in personal)
    again_global = _evaluate_all(grid, sorted(grid.contexts), global_arrays, f"round-{cfg.rounds}", "global", cfg)
    assert again_global == ev["pdd-as2"]
    ledger = json.loads((tmp_path / "run" / "privacy_ledger.json").read_text())
    assert ledger["mechanism"] == "none" and ledger["unit"] == "client"
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    again = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=True)  # nothing left to do
    assert json.loads((tmp_path / "run" / "state.json").read_text()) == state
    assert again["evaluations"]["pdd-as2"] == ev["pdd-as2"]


@pytest.mark.parametrize("side", ["server", "client"])
def test_dp_flag_records_a_finite_epsilon(side, fed_dir, tiny_encoder, tmp_path):
    pytest.importorskip("flwr")
    from privret.federated.runner import run_federated_local

    cfg = _cfg(tiny_encoder, rounds=1, warmup_rounds=1, personalize=[], dp=side, dp_noise_multiplier=1.0,
               dp_clip_norm=0.5)
    run_federated_local(cfg, fed_dir, tmp_path / "dp", resume=False)
    ledger = json.loads((tmp_path / "dp" / "privacy_ledger.json").read_text())
    assert ledger["unit"] == "client" and ledger["steps"] == 1 and ledger["clip_norm"] == 0.5
    assert 0 < float(ledger["epsilon"]) < float("inf") and side in ledger["mechanism"]
    # the clients' local losses are not DP: under DP-FedAvg they never leave the client, nor reach a file
    for path in (tmp_path / "dp" / "state.json", tmp_path / "dp" / "results.json"):
        rounds = json.loads(path.read_text()).get("history") or json.loads(path.read_text())["rounds"]
        assert [r["train_loss"] for r in rounds] == [None]
        assert "update_norms" not in rounds[0]  # nor do the sizes of their updates
        assert "questions" not in rounds[0]  # nor the clients' total question count (a client moves it by its size)
    from privret.errors import InputError

    with pytest.raises(InputError, match="must be below 1/n = 0.5 for 2 clients"):  # delta < 1/n, as for DP-SGD
        run_federated_local(cfg.model_copy(update={"dp_delta": 0.5}), fed_dir, tmp_path / "wide", resume=False)
    assert not (tmp_path / "wide").exists()


def test_bitfit_of_the_top_layer_trains_and_exchanges_only_its_biases(fed_dir, tiny_encoder, tmp_path):
    pytest.importorskip("flwr")
    from privret.federated.arrays import load_arrays, new_encoder, trainable_parameters, weights
    from privret.federated.runner import run_federated_local

    cfg = _cfg(tiny_encoder, rounds=1, personalize=[], trainable="bias-top:1", learning_rate=1e-2)
    res = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    start = weights(new_encoder(cfg))
    after = load_arrays(tmp_path / "run" / "global.npz")
    names = set(trainable_parameters(new_encoder(cfg)))
    assert set(after) == names and names and all(".layer.1." in n for n in names)
    assert all(n.endswith(".bias") or "LayerNorm" in n for n in names)
    assert any(not np.array_equal(after[k].numpy(), start[k].numpy()) for k in names)
    (r,) = res["rounds"]  # per client: 16-bit updates of the biases, a scale and an .npy header per tensor
    assert r["bytes_up"] <= 2 * sum(2 * start[k].numpy().size + 400 for k in names)


def _with_more_training_questions(fed_dir, out, client: str = "client_01", extra: int = 4):
    """A copy of ``fed_dir`` in which ``client`` has ``extra`` more training questions (copies of its own under new
    ids): the same clients, collections and test questions, one client's training size larger."""
    shutil.copytree(fed_dir, out)
    path = out / client / "questions.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    rows += [{**train[k % len(train)], "id": f"extra-{k}"} for k in range(extra)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _blank_evaluation_values(value):
    """``value`` (parsed JSON, a reply's metrics) with what two runs may differ in whatever their clients' sizes
    blanked: the evaluation metrics' values (outside the guarantee: the ledger lists them), the ledger's time
    stamp and its commitment to the data's content, the run's (random) release id."""
    if isinstance(value, dict):
        return {k: "-" if k.split("/")[-1] in (*local.METRIC_NAMES, "created_at", "dataset_id", "release_id")
                else _blank_evaluation_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank_evaluation_values(v) for v in value]
    return value


def _size_free(replies: list[dict]) -> list[str]:
    """The replies with their evaluation values blanked, in an order of their own (Flower samples the nodes of a
    round in a random order)."""
    return sorted(json.dumps(_blank_evaluation_values(r), sort_keys=True, default=str) for r in replies)


def test_dp_run_keeps_training_statistics_on_the_clients(fed_dir, tiny_encoder, tmp_path, monkeypatch):
    """Under DP-FedAvg nothing that a client's training questions move leaves the client beyond the clipped update,
    and nothing of it reaches a file: no loss, no Fed-Negative hardness, no count of training (or validation)
    questions, no steps, no per-client bytes, no seconds. Each run trains twice, on two copies of the data that
    differ only in one client's number of training questions: under DP every reply (metrics, arrays' shapes,
    info) and every file written (results.json, state.json, the ledger) are the same but for the evaluation
    metrics' values; without DP the same comparison sees the sizes, and the named keys are there."""
    pytest.importorskip("flwr")
    from privret.federated import runner
    from privret.federated.runner import run_federated_local

    larger = _with_more_training_questions(fed_dir, tmp_path / "larger")
    grid = runner.InProcessGrid

    def run(data, out, **settings):
        replies = []

        class RecordingGrid(grid):
            def pull_messages(self, message_ids):
                got = super().pull_messages(message_ids)
                replies.extend({"type": r.metadata.message_type,
                                "metrics": {k: dict(m) for k, m in r.content.metric_records.items()},
                                "configs": {k: dict(c) for k, c in r.content.config_records.items()},
                                "arrays": {k: {n: a.shape for n, a in rec.items()}
                                           for k, rec in r.content.array_records.items()}} for r in got)
                return got

        monkeypatch.setattr(runner, "InProcessGrid", RecordingGrid)
        res = run_federated_local(_cfg(tiny_encoder, rounds=1, **settings), data, out, resume=False)
        files = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
        return replies, files, res, sorted(p.name for p in out.iterdir())

    def private_keys(metrics):
        return {k for k in metrics if k == "loss" or k.startswith("hardness/")}

    validation = dict(train_fraction=0.5, evaluation_split="validation")
    plain, plain_files, res, _ = run(fed_dir, tmp_path / "plain", personalize=["local", "fed"], **validation)
    grown, grown_files, _, _ = run(larger, tmp_path / "plain-larger", personalize=["local", "fed"], **validation)
    assert {r["type"] for r in plain if private_keys(r["metrics"].get("metrics", {}))} == {"train",
                                                                                             "train.personalize"}
    assert "fed_negative_hardness" in res["evaluations"]["+query-encoders+fed-negative"]
    # without DP the sizes are there, and the comparison below sees them
    assert _size_free(plain) != _size_free(grown)
    assert _blank_evaluation_values(plain_files) != _blank_evaluation_values(grown_files)
    assert all({"num-examples", "steps"} <= set(r["metrics"]["metrics"]) for r in plain if r["type"] == "train")
    (entry,) = res["rounds"]
    assert {"questions", "seconds"} <= set(entry)
    assert "per_client" in res["evaluations"]["+query-encoders+fed-negative"]["fed_negative_exchanges"][0]
    assert "queries" in res["evaluations"]["pdd-as2"]["per_client"]["client_01"]["sentence"]
    for side, split in (("server", validation), ("client", {})):
        dp = dict(dp=side, dp_noise_multiplier=1.0, dp_clip_norm=0.5, **split)  # the default stage 2
        replies, files, res, names = run(fed_dir, tmp_path / side, **dp)
        replies_grown, files_grown, _, names_grown = run(larger, tmp_path / f"{side}-larger", **dp)
        assert {r["type"] for r in replies} >= {"train", "train.personalize", "evaluate"}
        assert _size_free(replies) == _size_free(replies_grown)
        assert _blank_evaluation_values(files) == _blank_evaluation_values(files_grown) and names == names_grown
        assert [r for r in replies if private_keys(r["metrics"].get("metrics", {}))] == []
        assert all(set(r["metrics"]["metrics"]) == {"dp-weight"} for r in replies if r["type"] == "train")
        (entry,) = res["rounds"]
        assert not {"questions", "seconds", "update_norms"} & set(entry)
        assert "fed_negative_hardness" not in json.dumps(files) and "fed_negative_exchanges" not in json.dumps(files)
        counted = "queries" in json.dumps(res["evaluations"])  # the test split's counts are public, validation's not
        assert counted == (split == {})


def test_baselines_run_per_client(fed_dir, tiny_encoder):
    """Each baseline scores every client; pooled = the per-client metrics weighted by test questions; the
    trained baselines score differently from the untrained encoder they start from."""
    from privret.federated.runner import evaluate_bm25_all, evaluate_zero_shot, train_central, train_local_only

    clients = load_fed_squad(fed_dir)
    cfg = _cfg(tiny_encoder, learning_rate=1e-2)  # large enough for 2 epochs to change a ranking
    questions = {c.name: len(c.split("test")) for c in clients}
    zero_shot = evaluate_zero_shot(cfg, clients)
    for result in (evaluate_bm25_all(cfg, clients), train_local_only(cfg, clients), train_central(cfg, clients)):
        assert set(result["per_client"]) == set(questions)
        for level in local.LEVELS:
            assert {c: m[level]["queries"] for c, m in result["per_client"].items()} == questions
            for metric in ("recall@1", "recall@100", "mrr@10"):
                weighted = sum(m[level][metric] * questions[c] for c, m in result["per_client"].items())
                assert result["pooled"][level][metric] == pytest.approx(weighted / sum(questions.values()))
            assert 0 <= result["pooled"][level]["recall@1"] <= result["pooled"][level]["recall@100"] <= 1
        assert result["per_client"] != zero_shot["per_client"]
    # with eval_every, local-only also has a learning curve, whose last point is its result
    curve = train_local_only(cfg.model_copy(update={"eval_every": 1}), clients)
    assert list(curve["curve"]) == [1, 2] and curve["curve"][2] == curve["pooled"]
    assert curve["curve"][1] != curve["curve"][2]
    # BM25 finds "Boats sail on the Nile." for "What sails on the Nile?" at rank 1
    bm25 = evaluate_bm25_all(cfg, clients)
    assert bm25["pooled"]["sentence"]["mrr@10"] > 0.3
    # like the other baselines, BM25 scores the questions the evaluation split names, per question when asked
    held_out = cfg.model_copy(update={"train_fraction": 0.5, "evaluation_split": "validation",
                                      "per_query_metrics": True})
    on_validation = evaluate_bm25_all(held_out, clients)
    for c in clients:
        validation = local.evaluation_questions(c, held_out)
        sentence = on_validation["per_client"][c.name]["sentence"]
        assert sentence["queries"] == len(validation) and all(q.split == "train" for q in validation)
        assert set(sentence["per_query"]) == {q.id for q in validation}  # not the test questions
    assert on_validation["pooled"]["sentence"]["queries"] > 0


def test_local_epochs_fit_the_training_questions(fed_dir, tiny_encoder):
    """The local objective is learnable: several epochs raise training-split recall@1 of a tiny encoder."""
    import random

    import torch

    from privret.models.encoder import load_encoder

    torch.manual_seed(0)
    client = load_fed_squad(fed_dir)[1]
    model = load_encoder(tiny_encoder)
    qs = client.split("train")
    kw = dict(max_query_tokens=32, max_sentence_tokens=64)
    before = local.evaluate_dense(model, model, client, client.split("train"), **kw)["sentence"]["mrr@10"]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for epoch in range(15):
        local.train_dual_encoder_epoch(model, client, qs, [[] for _ in qs], optimizer=opt, batch_size=4,
                                       temperature=0.05, rng=random.Random(epoch), **kw)
    after = local.evaluate_dense(model, model, client, client.split("train"), **kw)["sentence"]["mrr@10"]
    assert before < 0.95 and after > before and after >= 0.99


def test_second_server_on_the_same_run_directory_fails_at_once(tmp_path):
    import subprocess
    import sys
    import time

    from privret.errors import InputError
    from privret.federated.server_app import run_server

    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from privret.runlock import RunLock\n"
                               f"with RunLock({str(run)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.perf_counter()
        with pytest.raises(InputError, match="another privret process"):
            run_server(None, FedConfig(), run, n_clients=2)
        assert time.perf_counter() - started < 5 and not run.exists()  # at once, nothing written
    finally:
        holder.kill()
        holder.wait()


def test_hard_negatives_are_mined_every_remine_every_rounds_and_reused_between(fed_dir, tiny_encoder, monkeypatch):
    import random

    from privret.federated.arrays import new_encoder

    cfg = _cfg(tiny_encoder, rounds=6, warmup_rounds=1, remine_every=2)
    assert [local.round_stage(cfg, r) for r in range(1, 7)] == ["bm25", "hard", "hard-reuse", "hard",
                                                                 "hard-reuse", "hard"]
    assert [local.round_stage(_cfg(tiny_encoder, rounds=3), r) for r in (1, 2, 3)] == ["bm25", "hard", "hard"]
    encoded = []
    real = local.encode_texts
    monkeypatch.setattr(local, "encode_texts", lambda *a, **k: encoded.append(len(a[1])) or real(*a, **k))
    client = load_fed_squad(fed_dir)[1]
    questions = local.train_questions(client, 0, 0)
    gold = local.gold_indices(client, questions)
    model, rng, rankings = new_encoder(cfg), random.Random(0), {}
    negatives = local.epoch_negatives(model, client, questions, gold, "hard", cfg, rng, rankings)
    assert encoded == [len(client.sentences), len(questions)]  # mined: collection and questions encoded
    mined = rankings["hard", client.name]
    assert all(set(n) <= set(r) and not set(n) & g for n, r, g in zip(negatives, mined, gold))
    local.epoch_negatives(model, client, questions, gold, "hard-reuse", cfg, rng, rankings)
    assert len(encoded) == 2 and rankings["hard", client.name] is mined  # reused: nothing encoded
    local.epoch_negatives(model, client, questions, gold, "hard", cfg, rng, rankings)
    assert len(encoded) == 4 and rankings["hard", client.name] is not mined
    local.epoch_negatives(model, client, questions, gold, "hard-reuse", cfg, rng, {})  # after a restart: mined
    assert len(encoded) == 6


def test_a_server_killed_between_saving_a_round_and_its_state_counts_the_round_once(fed_dir, tiny_encoder, tmp_path,
                                                                                     monkeypatch):
    """The weights carry their round: a kill after ``global.npz`` of round 2 but before ``state.json`` must
    neither train round 2 again (an extra noisy aggregate the ledger would not count) nor lose it."""
    pytest.importorskip("flwr")
    from privret.federated import server_app
    from privret.federated.arrays import load_arrays
    from privret.federated.runner import run_federated_local

    cfg = _cfg(tiny_encoder, rounds=3, personalize=[], learning_rate=1e-2)
    reference = run_federated_local(cfg, fed_dir, tmp_path / "ref", resume=False)
    real = server_app.write_json_atomic

    def killed_at_round_2(path, obj):
        if path.name == "state.json" and obj["rounds_done"] == 2:
            raise KeyboardInterrupt("SIGKILL stand-in")
        real(path, obj)

    monkeypatch.setattr(server_app, "write_json_atomic", killed_at_round_2)
    with pytest.raises(KeyboardInterrupt):
        run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    monkeypatch.setattr(server_app, "write_json_atomic", real)
    assert json.loads((tmp_path / "run" / "state.json").read_text())["rounds_done"] == 1
    trained = []
    monkeypatch.setattr(local, "train_dual_encoder_epoch",
                        lambda *a, _real=local.train_dual_encoder_epoch, **k: trained.append(1) or _real(*a, **k))
    resumed = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=True)
    assert len(trained) == 2  # round 3 only, on 2 clients
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3] and resumed["rounds"][1]["recovered"]
    assert resumed["ledger"]["steps"] == reference["ledger"]["steps"] == 3
    ref, got = load_arrays(tmp_path / "ref" / "global.npz"), load_arrays(tmp_path / "run" / "global.npz")
    for k in ref:
        np.testing.assert_array_equal(got[k].numpy(), ref[k].numpy())


def test_resuming_with_other_settings_is_refused(fed_dir, tiny_encoder, tmp_path):
    pytest.importorskip("flwr")
    from privret.errors import InputError
    from privret.federated.runner import run_federated_local

    cfg = _cfg(tiny_encoder, rounds=1, personalize=[])
    run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    with pytest.raises(InputError) as err:
        run_federated_local(cfg.model_copy(update={"learning_rate": 1e-3}), fed_dir, tmp_path / "run", resume=True)
    assert err.value.field == "learning_rate" and "state.json" in str(err.value)
    more = run_federated_local(cfg.model_copy(update={"rounds": 2}), fed_dir, tmp_path / "run", resume=True)
    assert [r["round"] for r in more["rounds"]] == [1, 2]  # more rounds continue the same run


def test_a_dp_server_killed_while_saving_a_round_counts_that_aggregate_too(fed_dir, tiny_encoder, tmp_path,
                                                                            monkeypatch):
    """A kill during the save of round 2 may leave its noisy aggregate on disk (a partial temp file): the
    round is trained again, and the ledger composes 4 releases for 3 rounds, never 3."""
    pytest.importorskip("flwr")
    from privret.federated import server_app
    from privret.federated.runner import run_federated_local
    from privret.federated.strategy import dp_ledger

    cfg = _cfg(tiny_encoder, rounds=3, personalize=[], dp="server", dp_noise_multiplier=1.0, dp_clip_norm=0.5)
    real = server_app.save_arrays

    def killed_while_saving_round_2(path, arrays, *, round_number=None):
        if round_number == 2:
            raise KeyboardInterrupt("SIGKILL stand-in")
        real(path, arrays, round_number=round_number)

    monkeypatch.setattr(server_app, "save_arrays", killed_while_saving_round_2)
    with pytest.raises(KeyboardInterrupt):
        run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    monkeypatch.setattr(server_app, "save_arrays", real)
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["rounds_done"] == 1 and state["aggregates_written"] == 2  # announced before the save began
    resumed = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=True)
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3]
    assert resumed["ledger"]["steps"] == 4
    four = dp_ledger(cfg, releases=4, n_clients=2, n_questions=0, data_hash="x")
    assert resumed["ledger"]["epsilon"] == pytest.approx(four.epsilon)


def test_a_missing_reply_stops_the_server_after_round_timeout(fed_dir, tiny_encoder, tmp_path, monkeypatch):
    """A client that never answers (killed SuperNode): the server waits ``round_timeout``, then stops with an
    error that says so, and a resume with every client back finishes the run."""
    pytest.importorskip("flwr")
    from privret.federated import runner

    waited = []

    class LosingGrid(runner.InProcessGrid):
        def send_and_receive(self, messages, *, timeout=None):
            waited.append(timeout)
            replies = super().send_and_receive(messages, timeout=timeout)
            return replies[:-1] if len(waited) == 2 else replies  # round 2: the last client's reply is lost

    cfg = _cfg(tiny_encoder, rounds=2, personalize=[], round_timeout=7.5)
    real = runner.InProcessGrid
    monkeypatch.setattr(runner, "InProcessGrid", LosingGrid)
    with pytest.raises(RuntimeError, match=r"client failure: 1 of 2 replies within round_timeout = 7.5 s"):
        runner.run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    monkeypatch.setattr(runner, "InProcessGrid", real)
    assert waited == [7.5, 7.5]
    assert json.loads((tmp_path / "run" / "state.json").read_text())["rounds_done"] == 1
    done = runner.run_federated_local(cfg, fed_dir, tmp_path / "run", resume=True)
    assert [r["round"] for r in done["rounds"]] == [1, 2]


def test_stage_2_settings_may_change_on_a_finished_stage_1_and_its_evaluations_are_redone(fed_dir, tiny_encoder,
                                                                                          tmp_path, monkeypatch):
    pytest.importorskip("flwr")
    from privret.federated import local as local_mod
    from privret.federated.runner import run_federated_local

    cfg = _cfg(tiny_encoder, rounds=1, personalize=["fed"])
    first = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    trained = []
    monkeypatch.setattr(local_mod, "train_dual_encoder_epoch", lambda *a, **k: trained.append(1))
    same = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=True)
    assert same["evaluations"] == first["evaluations"] and not trained
    more = run_federated_local(cfg.model_copy(update={"fed_negatives": 1}), fed_dir, tmp_path / "run", resume=True)
    assert not trained  # stage 1 is not trained again
    (exchange,) = more["evaluations"]["+query-encoders+fed-negative"]["fed_negative_exchanges"]
    (before,) = first["evaluations"]["+query-encoders+fed-negative"]["fed_negative_exchanges"]
    assert exchange["answer_bytes"] < before["answer_bytes"]  # redone with 1 Fed-Negative per query, not reused


def test_two_nodes_serving_one_client_are_refused(fed_dir, tiny_encoder, tmp_path):
    """A client answering twice would count twice in FedAvg and exceed the DP-FedAvg sensitivity."""
    pytest.importorskip("flwr")
    from privret.federated.client_app import build_client_app
    from privret.federated.runner import InProcessGrid
    from privret.federated.server_app import run_server

    cfg = _cfg(tiny_encoder, rounds=1, personalize=[], dp="server", dp_noise_multiplier=1.0)
    nodes = [{"data-dir": str(fed_dir), "client": "client_00"}, {"data-dir": str(fed_dir), "client": "client_00"}]
    grid = InProcessGrid(build_client_app(), nodes, {**cfg.to_run_config(), "num-clients": 2})
    with pytest.raises(RuntimeError, match="more than one node answered for client_00"):
        run_server(grid, cfg, tmp_path / "run", n_clients=2, dataset_id="name-fed")
    assert not (tmp_path / "run" / "global.npz").exists()  # nothing aggregated, nothing released


def test_validation_evaluation_scores_the_training_questions_the_run_left_out(fed_dir, tiny_encoder, tmp_path):
    pytest.importorskip("flwr")
    from privret.federated.runner import run_federated_local

    cfg = _cfg(tiny_encoder, rounds=1, personalize=["local"], train_fraction=0.5, evaluation_split="validation",
               per_query_metrics=True)
    res = run_federated_local(cfg, fed_dir, tmp_path / "run", resume=False)
    for c in load_fed_squad(fed_dir):
        trained = {q.id for q in local.train_questions(c, 0, cfg.seed, 0.5)}
        held_out = {q.id for q in c.split("train")} - trained
        assert trained
        for name in ("pdd-as2", "+query-encoders"):
            assert set(res["evaluations"][name]["per_client"][c.name]["sentence"]["per_query"]) == held_out
    assert res["evaluations"]["pdd-as2"]["pooled"]["sentence"]["queries"] > 0
    with pytest.raises(ValueError, match="train_fraction < 1"):
        FedConfig(evaluation_split="validation")
    with pytest.raises(ValueError, match="train_fraction < 1"):
        FedConfig(evaluation_split="validation", train_fraction=0.5, max_train_questions=3)


def test_a_client_with_no_question_to_score_weighs_nothing_in_the_pooled_metrics(fed_dir):
    clients = load_fed_squad(fed_dir)
    c = clients[0]
    questions = c.split("test")
    scores = np.random.default_rng(0).normal(size=(len(questions), len(c.sentences)))
    full = local.evaluate_scores(scores, c, questions, per_query=True)
    empty = local.evaluate_scores(np.zeros((0, len(c.sentences))), c, [], per_query=True)
    assert all(empty[level]["queries"] == 0 and empty[level]["per_query"] == {} for level in local.LEVELS)
    assert local.pooled({"a": full, "b": empty}) == local.pooled({"a": full})
