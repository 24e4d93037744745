"""The Flower ServerApp of PDD-AS2 (Wang's thesis, Algorithm 1, chapters 3 and 4): the rounds, the relay, the results.

Stage 1: FedAvg rounds (:func:`~privret.federated.strategy.make_strategy`, DP-FedAvg when configured), the global
model checkpointed each round (``global.npz``, ``state.json``) so that a killed server resumes. Then the global
model is evaluated on every client and each personalisation variant is trained and evaluated (the server relays
Fed-Negative, since Flower clients never talk to each other); ``results.json`` is rewritten after each.

A DP run is one release in the budget registry (unit ``client``): ``planned`` before its first noisy aggregate,
``final`` after its last, under a release id kept in ``state.json``; past the cap, or beside releases under another
unit on its dataset, it is refused before any round. Run config: the
:class:`~privret.settings.federated.FedConfig` fields (dashes) plus ``out-dir``, ``num-clients``, ``data-hash``,
``dataset-id``, ``budget-cap`` and ``allow-over-budget``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np

from privret.errors import InputError
from privret.federated import local, wire
from privret.federated.arrays import checkpoint_round, load_arrays, new_encoder, save_arrays, weights
from privret.settings.federated import RUNTIME_FIELDS, FedConfig, without_runtime
from privret.federated.negatives import ExchangeLog, select_clients
from privret.federated.strategy import WEIGHT_KEY, dp_ledger, make_strategy, record_bytes
from privret.io import write_json_atomic
from privret.privacy import budget as budget_registry
from privret.privacy.ledger import PrivacyLedger
from privret.runlock import RunLock

try:  # flwr is needed for the apps only; the rest of privret.federated works without it
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.serverapp import Grid, ServerApp
except ImportError:  # pragma: no cover - exercised only without flwr installed
    ServerApp = None


def _send(grid, messages: list, cfg: FedConfig) -> tuple[list, int, int]:
    """Send ``messages`` and wait up to ``cfg.round_timeout`` seconds for every reply (a missing or failed
    reply stops the server: resume the run once the client is back); returns ``(replies, bytes down, bytes up)``.

    A message's ``arrays`` (the float32 master weights) travel in the wire type ``cfg.wire_dtype``, a reply's
    ``arrays`` (a client's update) come back rebuilt as that client's float32 model: master + update
    (:mod:`privret.federated.wire`). Bytes are those of the arrays as they travel (no framing).
    """
    dtype = cfg.wire_dtype
    masters = {}
    encoded: dict[int, ArrayRecord] = {}
    for m in messages:
        if "arrays" in m.content.array_records:
            master = m.content["arrays"]
            if m.metadata.dst_node_id in masters:
                raise RuntimeError("two messages with weights to one node in one exchange")
            masters[m.metadata.dst_node_id] = master
            if id(master) not in encoded:
                encoded[id(master)] = wire.encode_weights(master, dtype)
            m.content = RecordDict({**dict(m.content.items()), "arrays": encoded[id(master)]})
    down = sum(record_bytes(m.content) for m in messages)
    replies = list(grid.send_and_receive(messages, timeout=cfg.round_timeout))
    errors = [r for r in replies if r.has_error()]
    if errors or len(replies) != len(messages):
        reason = errors[0].error.reason if errors else \
            f"{len(replies)} of {len(messages)} replies within round_timeout = {cfg.round_timeout:g} s"
        raise RuntimeError(f"client failure: {reason}; the finished rounds are saved, resume when the clients are back")
    up = sum(record_bytes(r.content) for r in replies)
    for r in replies:
        if "arrays" in r.content.array_records:
            r.content["arrays"] = wire.apply_update(masters[r.metadata.src_node_id], r.content["arrays"], dtype)
    return replies, down, up


def _check_one_reply_per_client(replies, rnd: int) -> None:
    """Two SuperNodes serving the same client would weigh it twice in FedAvg (and, under DP-FedAvg, give it
    twice the influence the noise is calibrated for): refuse the round."""
    names = [str(r.content["info"]["client"]) for r in replies]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise RuntimeError(f"round {rnd}: more than one node answered for {', '.join(twice)}; "
                           "each client must run on one SuperNode")


def _per_client_metrics(replies) -> dict[str, dict]:
    out = {}
    for r in replies:
        m = r.content["metrics"]
        name = str(r.content["info"]["client"])
        result = {}
        for level in local.LEVELS:
            result[level] = {k: float(m[f"{level}/{k}"]) for k in local.METRIC_NAMES}
            if WEIGHT_KEY in m:  # not for validation questions under DP (FedConfig.evaluation_counts_public)
                result[level]["queries"] = int(m[WEIGHT_KEY])
            if "per-query" in r.content.array_records:
                values = r.content["per-query"][level].numpy().tolist()
                result[level]["per_query"] = dict(zip(r.content["info"]["question-ids"], values))
        out[name] = result
    return dict(sorted(out.items()))


def _update_norms(master: ArrayRecord, replies) -> dict[str, float]:
    """Each client's L2 norm of ``Theta_i - Theta_global`` over the exchanged parameters (float64)."""
    out = {}
    for r in replies:
        model = r.content["arrays"]
        total = sum(float(((model[k].numpy().astype(np.float64) - master[k].numpy()) ** 2).sum()) for k in master)
        out[str(r.content["info"]["client"])] = total ** 0.5
    return dict(sorted(out.items()))


def _round_sizes(replies, started: float, norms: dict[str, float]) -> dict:
    """A round's figures that a client moves by its own data size, recorded without DP only: the clients' training
    questions, the round's seconds (a client's local epochs take longer the more questions it has) and each
    client's update norm (the figure a DP clip norm is chosen from)."""
    questions = sum(float(r.content["metrics"][WEIGHT_KEY]) for r in replies)
    return {"questions": int(questions), "seconds": round(time.time() - started, 1), "update_norms": norms}


def _hardness(replies) -> dict:
    """Per client and weighted by training questions: how hard the Fed-Negatives were
    (:func:`~privret.federated.negatives.negative_hardness`, reported in ``train.personalize`` replies)."""
    per_client = {}
    for r in replies:
        m = r.content["metrics"]
        per_client[str(r.content["info"]["client"])] = {
            **{k.split("/", 1)[1]: float(v) for k, v in m.items() if k.startswith("hardness/")},
            "questions": int(m[WEIGHT_KEY])}
    total = sum(c["questions"] for c in per_client.values())
    keys = [k for k in next(iter(per_client.values())) if k != "questions"]
    return {"per_client": dict(sorted(per_client.items())),
            "mean": {k: sum(c[k] * c["questions"] for c in per_client.values()) / total for k in keys}}


def _evaluate_all(grid, nodes, arrays, version: str, variant: str, cfg: FedConfig) -> dict:
    msgs = [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"variant": variant,
                                                                          "model-version": version})}),
                    dst_node_id=n, message_type="evaluate") for n in nodes]
    per_client = _per_client_metrics(_send(grid, msgs, cfg)[0])
    return {"per_client": per_client, "pooled": local.pooled(per_client)}


def _fed_negative_exchange(grid, nodes, arrays, version: str, variant: str, cfg: FedConfig, log: ExchangeLog,
                           rng: random.Random) -> dict[int, list]:
    """Eqs. 4.1-4.2 through the relay: returns, per node, the answers addressed to it."""
    cfg_rec = ConfigRecord({"variant": variant, "model-version": version})
    msgs = [Message(RecordDict({"arrays": arrays, "config": cfg_rec}), dst_node_id=n, message_type="query.embed")
            for n in nodes]
    replies = _send(grid, msgs, cfg)[0]
    queries = {r.metadata.src_node_id: r.content["queries"]["emb"].numpy() for r in replies}
    plan = []
    for i, node in enumerate(nodes):
        for j in select_clients(i, len(nodes), cfg.fed_select, rng):
            plan.append((node, nodes[j]))
    msgs = [Message(RecordDict({"queries": ArrayRecord({"emb": Array(queries[src])}),
                                "config": ConfigRecord({"n": cfg.fed_negatives, "model-version": version})}),
                    dst_node_id=dst, message_type="query.fednegative") for src, dst in plan]
    replies = _send(grid, msgs, cfg)[0]
    by_id = {m.metadata.message_id: (src, dst) for m, (src, dst) in zip(msgs, plan)}
    out: dict[int, list] = {n: [] for n in nodes}
    for r in replies:
        src, _ = by_id[r.metadata.reply_to_message_id]
        ans = r.content["answer"]
        log.add(str(src), queries[src], (ans["emb"].numpy(), ans["scores"].numpy()))
        out[src].append(ans)
    return out


# settings a run directory may change between runs: how long to wait, where to run, and stage 2 and the
# evaluations (which results.json redoes when they change); stage 1 may only get more rounds
STAGE2_FIELDS = {"personalize", "personal_epochs", "personal_learning_rate", "personal_batch_size",
                 "personal_negatives", "personal_hard_k", "fed_negatives", "fed_select", "per_query_metrics",
                 "evaluation_split"}


def _fingerprint(cfg: FedConfig) -> dict:
    """What a resumed stage 1 must share with the run it continues: every setting of stage 1 but ``rounds``."""
    return {k: v for k, v in cfg.model_dump(mode="json").items()
            if k != "rounds" and k not in RUNTIME_FIELDS | STAGE2_FIELDS}


def _finished_evaluations(results_path: Path, cfg: FedConfig) -> dict:
    """The evaluations of an earlier run of this directory with the same settings (else none: redo them)."""
    if not results_path.is_file():
        return {}
    earlier = json.loads(results_path.read_text())
    same = without_runtime(earlier.get("config", {})) == without_runtime(cfg.model_dump(mode="json"))
    return earlier.get("evaluations", {}) if same else {}


def _check_same_run(state: dict, cfg: FedConfig, state_path: Path) -> None:
    saved = state.get("config")
    if saved is None:
        return
    for key, value in _fingerprint(cfg).items():
        if saved.get(key) != value:
            raise InputError(f"this run directory was started with {key}={saved.get(key)!r}, not {value!r}; "
                             "use another directory or start over (resume off)", path=state_path, field=key)
    if int(state.get("rounds_done", 0)) > cfg.rounds:
        raise InputError(f"this run directory already has {state['rounds_done']} rounds, more than {cfg.rounds}",
                         path=state_path, field="rounds")


def _personalize(grid, nodes, arrays, version: str, variant: str, cfg: FedConfig) -> dict:
    """Stage 2 of one variant: ``personal_epochs`` epochs of every client's query encoder (with ``fed``, a
    Fed-Negative exchange before each), then its evaluation, exchanges and Fed-Negative hardness."""
    exchanges, hardness = [], []
    rng = random.Random(f"{cfg.seed}:fedneg")
    for epoch in range(cfg.personal_epochs):
        fed = {}
        if variant == "fed":
            log = ExchangeLog()
            fed = _fed_negative_exchange(grid, nodes, arrays, version, variant, cfg, log, rng)
            exchanges.append(log.as_dict())
        msgs = []
        for n in nodes:
            content = RecordDict({"arrays": arrays, "config": ConfigRecord(
                {"variant": variant, "epoch": epoch, "model-version": version})})
            for k, ans in enumerate(fed.get(n, [])):
                content[f"fedneg-{k}"] = ans
            msgs.append(Message(content, dst_node_id=n, message_type="train.personalize"))
        replies = _send(grid, msgs, cfg)[0]
        if variant == "fed":  # without DP only (FedConfig refuses Fed-Negative under DP)
            hardness.append(_hardness(replies))
    result = _evaluate_all(grid, nodes, arrays, version, variant, cfg)
    if exchanges:
        result["fed_negative_exchanges"] = exchanges
    if hardness:
        result["fed_negative_hardness"] = hardness
    return result


def run_server(grid, cfg: FedConfig, out_dir: str | Path, *, n_clients: int, data_hash: str = "",
               dataset_id: str = "", budget: budget_registry.BudgetPolicy | None = None, resume: bool = True) -> dict:
    """Stage 1 (FedAvg rounds, checkpointed each round), evaluation, stage 2 variants; ``results.json``.

    A DP run is recorded in the budget registry under ``dataset_id`` (else ``data_hash``) with ``budget`` (default:
    :class:`~privret.privacy.budget.BudgetPolicy`). One server per run directory: a second one pointed at
    ``out_dir`` fails at once (:class:`RunLock`).
    """
    out_dir = Path(out_dir)
    cfg = FedConfig.model_validate(cfg.model_dump())  # a copy made with model_copy(update=...) is checked too
    if cfg.dp != "none" and not cfg.dp_delta * n_clients < 1:  # as every DP run: delta < 1/n units
        raise InputError(f"dp_delta {cfg.dp_delta:g} must be below 1/n = {1.0 / n_clients:.3g} for {n_clients} "
                         "clients (the unit of DP-FedAvg)", field="dp_delta")
    if cfg.dp != "none" and (budget is None or budget.enabled) and not (dataset_id or data_hash):
        raise InputError("a DP run is recorded in the budget registry under its dataset: give its dataset id "
                         "(a dataset name)", field="dataset_id")
    with RunLock(out_dir, what="federated run directory"):
        return _run_server(grid, cfg, out_dir, n_clients=n_clients, data_hash=data_hash, dataset_id=dataset_id,
                           budget=budget, resume=resume)


def _release(ledger: PrivacyLedger, release_id: str, status: str, out_dir: Path) -> budget_registry.Release:
    """The run's record in the budget registry: one release per (release id, run directory)."""
    return budget_registry.Release.from_ledger(ledger, release_id=release_id, status=status,
                                               artefact=out_dir.absolute())


def _run_server(grid, cfg: FedConfig, out_dir: Path, *, n_clients: int, data_hash: str, dataset_id: str,
                budget: budget_registry.BudgetPolicy | None, resume: bool) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path, ckpt = out_dir / "state.json", out_dir / "global.npz"
    state = json.loads(state_path.read_text()) if resume and state_path.is_file() else {}
    _check_same_run(state, cfg, state_path)
    history = state.get("history", [])
    rounds_done = int(state.get("rounds_done", 0))
    on_disk = checkpoint_round(ckpt) if resume else None
    if on_disk is not None and on_disk > rounds_done:
        # killed after the round's weights were saved, before state.json: the round happened (and, with DP,
        # its noisy aggregate reached disk): count it, never train it again
        history.append({"round": on_disk, "stage": local.round_stage(cfg, on_disk), "recovered": True})
        rounds_done = on_disk
    arrays = load_arrays(ckpt) if rounds_done and ckpt.is_file() else weights(new_encoder(cfg))
    written = int(state.get("aggregates_written", rounds_done))  # global models that may have reached disk
    release_id = state.get("release_id") or budget_registry.new_release_id()

    def save_state(done: int) -> None:
        write_json_atomic(state_path, {"rounds_done": done, "aggregates_written": written, "history": history,
                                       "config": _fingerprint(cfg), "release_id": release_id})

    def ledger(releases: int, n_questions: int = 0) -> PrivacyLedger:
        return dp_ledger(cfg, releases=releases, n_clients=n_clients, n_questions=n_questions, data_hash=data_hash,
                         dataset_id=dataset_id)

    remaining = cfg.rounds - rounds_done
    planned = ledger(written + remaining)  # every aggregate counted so far and one per round left
    if remaining and planned.is_private:  # recorded before the first noise is drawn: a crash never under-counts
        save_state(rounds_done)  # the release id on disk first: a resumed run is this release, not a second
        budget_registry.check_and_record(_release(planned, release_id, "planned", out_dir), budget)
    strategy = make_strategy(cfg, n_clients)
    from flwr.serverapp.strategy.strategy_utils import sample_nodes

    nodes, _ = sample_nodes(grid, n_clients, n_clients)
    nodes = sorted(nodes)
    for rnd in range(rounds_done + 1, cfg.rounds + 1):
        t0 = time.time()
        stage = local.round_stage(cfg, rnd)
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord({"stage": stage}), grid))
        replies, down, up = _send(grid, msgs, cfg)
        _check_one_reply_per_client(replies, rnd)
        norms = _update_norms(arrays, replies) if cfg.dp == "none" else None
        new_arrays, metrics = strategy.aggregate_train(rnd, replies)
        if new_arrays is None:
            raise RuntimeError(f"round {rnd}: aggregation failed")
        arrays = new_arrays
        entry = {"round": rnd, "stage": stage, "bytes_down": down, "bytes_up": up,
                 "train_loss": float(metrics["loss"]) if metrics is not None and "loss" in metrics else None}
        if cfg.dp == "none":  # what a client moves by its own (unbounded) size: not released under DP
            entry.update(_round_sizes(replies, t0, norms))
        written += 1  # announced before the aggregate may reach disk: a kill while saving still counts it
        save_state(rnd - 1)
        save_arrays(ckpt, arrays, round_number=rnd)  # before the new weights leave the server (evaluation)
        history.append(entry)
        if cfg.eval_every and rnd % cfg.eval_every == 0 and rnd < cfg.rounds:
            entry["evaluation"] = _evaluate_all(grid, nodes, arrays, f"round-{rnd}", "global", cfg)["pooled"]
        save_state(rnd)
    questions = [r["questions"] for r in history if "questions" in r]
    final = ledger(written, int(questions[-1]) if questions else 0)
    final.save(out_dir)
    if remaining and final.is_private:
        budget_registry.record(_release(final, release_id, "final", out_dir), budget)
    version = f"round-{cfg.rounds}"
    results = {"config": cfg.model_dump(mode="json"), "rounds": history, "ledger": json.loads(final.model_dump_json())}
    results_path = out_dir / "results.json"
    done = _finished_evaluations(results_path, cfg) if resume else {}
    evaluations = dict(done)
    if "pdd-as2" not in evaluations:
        evaluations["pdd-as2"] = _evaluate_all(grid, nodes, arrays, version, "global", cfg)
        write_json_atomic(results_path, {**results, "evaluations": evaluations})
    for variant in cfg.personalize:
        name = "+query-encoders" if variant == "local" else "+query-encoders+fed-negative"
        if name not in evaluations:
            evaluations[name] = _personalize(grid, nodes, arrays, version, variant, cfg)
            write_json_atomic(results_path, {**results, "evaluations": evaluations})
    results["evaluations"] = evaluations
    write_json_atomic(results_path, results)
    return results


def build_server_app():
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_config = context.run_config
        cfg = FedConfig.from_run_config(run_config)
        out_dir = str(run_config.get("out-dir", "")) or "runs/federated"
        n_clients = int(run_config.get("num-clients", 2))
        policy = budget_registry.BudgetPolicy(cap=float(run_config.get("budget-cap", budget_registry.DEFAULT_CAP)),
                                              allow_over=bool(run_config.get("allow-over-budget", False)))
        run_server(grid, cfg, out_dir, n_clients=n_clients, data_hash=str(run_config.get("data-hash", "")),
                   dataset_id=str(run_config.get("dataset-id", "")), budget=policy)

    return app


server_app = build_server_app() if ServerApp is not None else None
