"""The Flower ClientApp and ServerApp of PDD-AS2 (thesis Algorithm 1, chapters 3 and 4).

Messages (all through the Flower SuperLink; the ServerApp relays Fed-Negative traffic because Flower
clients never talk to each other directly):

* ``train`` (stage 1): global arrays + ``{stage: bm25|hard}``; the client trains ``local_epochs``
  epochs on its data and answers with its weights and ``num-examples = |D_i|``.
* ``query.embed``: the client's training-query embeddings under its client-customized query encoder
  of a variant (Fed-Negative, step 1: eq. 4.1's sending side).
* ``query.fednegative``: another client's query embeddings; the answer is the top-``n`` sentence
  embeddings and scores of this client's collection (eq. 4.2's inner ``N_{c_k}``).
* ``train.personalize`` (stage 2): one epoch of the client's own query encoder with the sentence
  encoder frozen; with Fed-Negative the message carries the answers for this client's queries and
  the client keeps the top ``n`` overall (eq. 4.2).
* ``evaluate``: sentence- and passage-level MRR@10 and Recall@1/20/100 on the client's test split.

Node config of a SuperNode: ``data-dir`` (a Fed-SQuAD directory) and ``client`` (``client_03``) or
``partition-id`` (3). Run config: the :class:`~privret.federated.config.FedConfig` fields (dashes)
plus ``out-dir``, where the ServerApp writes checkpoints and ``results.json``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from privret.data.fed_squad import ClientData, load_client
from privret.federated import local
from privret.federated.config import FedConfig
from privret.federated.negatives import (
    ExchangeLog,
    bm25_ranked,
    fed_negative_answer,
    fed_negative_merge,
    sample_excluding,
    select_clients,
    static_hard_negatives,
)
from privret.federated.strategy import DP_WEIGHT_KEY, WEIGHT_KEY, dp_ledger, make_strategy, record_bytes
from privret.io import atomic_path, write_json_atomic
from privret.runlock import RunLock

try:  # flwr is needed for the apps only; the rest of privret.federated works without it
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError:  # pragma: no cover - exercised only without flwr installed
    ClientApp = ServerApp = None

# ---------------------------------------------------------------------------------------------
# client side
# ---------------------------------------------------------------------------------------------

_CACHE: dict = {}


def _client_data(context) -> ClientData:
    data_dir = Path(str(context.node_config["data-dir"]))
    name = context.node_config.get("client")
    if name is None:
        name = f"client_{int(context.node_config['partition-id']):02d}"
    key = ("data", str(data_dir), str(name))
    if key not in _CACHE:
        _CACHE[key] = load_client(data_dir / str(name))
    return _CACHE[key]


def _model(cfg: FedConfig, slot: str = "main"):
    """One encoder object per process and slot, reloaded with whatever weights a message carries."""
    from privret.models.encoder import load_encoder

    key = ("model", cfg.model, slot, cfg.device)
    if key not in _CACHE:
        torch.manual_seed(cfg.seed)
        _CACHE[key] = load_encoder(cfg.model, max_seq_length=cfg.max_sentence_tokens, device=cfg.device)
    return _CACHE[key]


def _load(model, arrays) -> None:
    model.load_state_dict(arrays.to_torch_state_dict(), strict=True)


def _arrays(model) -> ArrayRecord:
    return ArrayRecord({k: Array(v.detach().cpu().numpy().copy()) for k, v in model.state_dict().items()})


def _ensure_sentence_embeddings(context, cfg: FedConfig, msg, client: ClientData) -> np.ndarray:
    """Embeddings of the collection under the global (frozen) sentence encoder, cached per model version.

    The message must carry the global arrays unless this version is already cached (Fed-Negative
    answers rely on the cache filled by ``query.embed``, so that no model weights ride along).
    """
    version = str(msg.content["config"]["model-version"])
    cached = context.state.config_records.get("sentence-emb-version")
    if cached is not None and cached["version"] == version and "sentence-emb" in context.state.array_records:
        return context.state.array_records["sentence-emb"]["emb"].numpy()
    if "arrays" not in msg.content.array_records:
        raise RuntimeError(f"no sentence embeddings cached for model version {version}")
    model = _model(cfg)
    _load(model, msg.content["arrays"])
    emb = local.encode_texts(model, client.sentences, max_length=cfg.max_sentence_tokens, bf16=cfg.bf16)
    context.state["sentence-emb"] = ArrayRecord({"emb": Array(emb)})
    context.state["sentence-emb-version"] = ConfigRecord({"version": version})
    return emb


def _query_encoder(context, cfg: FedConfig, msg, variant: str):
    """The client's own query encoder of ``variant`` (starts as a copy of the global model)."""
    model = _model(cfg, slot="query")
    key = f"query-encoder-{variant}"
    if key in context.state.array_records:
        _load(model, context.state.array_records[key])
    else:
        _load(model, msg.content["arrays"])
    return model


def _seeded_rng(*parts) -> random.Random:
    """The handler's random stream, named by ``parts`` (seed, client, round...); torch is seeded from it."""
    rng = random.Random(":".join(str(p) for p in parts))
    torch.manual_seed(rng.randrange(2 ** 31))
    return rng


def _metric_record(values: dict) -> MetricRecord:
    return MetricRecord({k: float(v) for k, v in values.items()})


def _train(msg, context):
    cfg = FedConfig.from_run_config(context.run_config)
    config = msg.content["config"]
    client = _client_data(context)
    rng = _seeded_rng(cfg.seed, client.name, int(config["server-round"]))
    model = _model(cfg)
    _load(model, msg.content["arrays"])
    questions = local.train_questions(client, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
    gold = local.gold_indices(client, questions)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    stats = []
    for _ in range(cfg.local_epochs):
        if str(config["stage"]) == "bm25":
            key = ("bm25", client.name, cfg.bm25_k, cfg.max_train_questions, cfg.train_fraction, cfg.seed)
            if key not in _CACHE:
                _CACHE[key] = bm25_ranked(client.sentences, [q.text for q in questions], cfg.bm25_k + 8)
            negatives = [sample_excluding([i for i in r if i not in g][:cfg.bm25_k], set(), cfg.n_negatives, rng)
                         for r, g in zip(_CACHE[key], gold)]
        else:
            s = local.encode_texts(model, client.sentences, max_length=cfg.max_sentence_tokens, bf16=cfg.bf16)
            q = local.encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens, bf16=cfg.bf16)
            negatives = static_hard_negatives(q, s, gold, k=cfg.hard_k, n=cfg.n_negatives, rng=rng)
        stats.append(local.train_dual_encoder_epoch(
            model, client, questions, negatives, optimizer=optimizer, batch_size=cfg.batch_size,
            temperature=cfg.temperature, max_query_tokens=cfg.max_query_tokens,
            max_sentence_tokens=cfg.max_sentence_tokens, rng=rng, bf16=cfg.bf16))
    metrics = {WEIGHT_KEY: len(questions), DP_WEIGHT_KEY: 1.0, "steps": sum(s["steps"] for s in stats)}
    if cfg.dp == "none":  # under DP-FedAvg the local loss is not DP: it never leaves the client
        metrics["loss"] = stats[-1]["loss"]
    return Message(RecordDict({"arrays": _arrays(model), "metrics": _metric_record(metrics)}), reply_to=msg)


def _train_clipped(msg, context, call_next):
    """Flower's ``fixedclipping_mod`` when the server asks for client-side clipping, else a no-op."""
    from flwr.clientapp.mod import fixedclipping_mod
    from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

    config = next(iter(msg.content.config_records.values()), {})
    if KEY_CLIPPING_NORM in config:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


def _embed_queries(msg, context):
    cfg = FedConfig.from_run_config(context.run_config)
    client = _client_data(context)
    variant = str(msg.content["config"]["variant"])
    _ensure_sentence_embeddings(context, cfg, msg, client)  # needed when others' queries arrive
    model = _query_encoder(context, cfg, msg, variant)
    questions = local.train_questions(client, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
    q = local.encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens, bf16=cfg.bf16)
    return Message(RecordDict({"queries": ArrayRecord({"emb": Array(q)})}), reply_to=msg)


def _fed_negative(msg, context):
    cfg = FedConfig.from_run_config(context.run_config)
    client = _client_data(context)
    s = _ensure_sentence_embeddings(context, cfg, msg, client)
    q = msg.content["queries"]["emb"].numpy()
    emb, scores = fed_negative_answer(q, s, int(msg.content["config"]["n"]))
    return Message(RecordDict({"answer": ArrayRecord({"emb": Array(emb), "scores": Array(scores)})}), reply_to=msg)


def _personalize(msg, context):
    cfg = FedConfig.from_run_config(context.run_config)
    config = msg.content["config"]
    client = _client_data(context)
    variant = str(config["variant"])
    rng = _seeded_rng(cfg.seed, client.name, variant, int(config["epoch"]))
    s = _ensure_sentence_embeddings(context, cfg, msg, client)
    model = _query_encoder(context, cfg, msg, variant)
    questions = local.train_questions(client, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
    fed = None
    answers = [rec for key, rec in msg.content.array_records.items() if key.startswith("fedneg-")]
    if answers:
        fed = fed_negative_merge([(a["emb"].numpy(), a["scores"].numpy()) for a in answers], cfg.fed_negatives)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.personal_learning_rate)
    stats = local.train_query_encoder_epoch(
        model, client, questions, s, optimizer=optimizer, batch_size=cfg.personal_batch_size,
        temperature=cfg.temperature, max_query_tokens=cfg.max_query_tokens, n_negatives=cfg.personal_negatives,
        hard_k=cfg.personal_hard_k, rng=rng, fed_negatives=fed, bf16=cfg.bf16)
    context.state[f"query-encoder-{variant}"] = _arrays(model)
    metrics = {WEIGHT_KEY: len(questions), "loss": stats["loss"], "steps": stats["steps"],
               "fed-negatives-per-query": 0 if fed is None else fed.shape[1]}
    return Message(RecordDict({"metrics": _metric_record(metrics)}), reply_to=msg)


def _evaluate(msg, context):
    cfg = FedConfig.from_run_config(context.run_config)
    client = _client_data(context)
    variant = str(msg.content["config"]["variant"])
    s = _ensure_sentence_embeddings(context, cfg, msg, client)
    if variant == "global":
        model = _model(cfg)
        _load(model, msg.content["arrays"])
    else:
        model = _query_encoder(context, cfg, msg, variant)
    questions = client.split("test")
    q = local.encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens, bf16=cfg.bf16)
    result = local.evaluate_scores(q @ s.T, client, questions)
    flat = {f"{level}/{k}": v for level, m in result.items() for k, v in m.items() if k != "queries"}
    flat[WEIGHT_KEY] = len(questions)
    return Message(RecordDict({"metrics": _metric_record(flat),
                               "info": ConfigRecord({"client": client.name})}), reply_to=msg)


def build_client_app():
    """A fresh ClientApp with the handlers above (module-level ``client_app`` is one of them)."""
    app = ClientApp()
    app.train(mods=[_train_clipped])(_train)
    app.train("personalize")(_personalize)
    app.query("embed")(_embed_queries)
    app.query("fednegative")(_fed_negative)
    app.evaluate()(_evaluate)
    return app


# ---------------------------------------------------------------------------------------------
# server side
# ---------------------------------------------------------------------------------------------


def _send(grid, messages: list, timeout: float = 24 * 3600) -> list:
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    errors = [r for r in replies if r.has_error()]
    if errors or len(replies) != len(messages):
        reason = errors[0].error.reason if errors else f"{len(replies)} of {len(messages)} replies"
        raise RuntimeError(f"client failure: {reason}")
    return replies


def _save_arrays(path: Path, arrays: ArrayRecord) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **{k: v.numpy() for k, v in arrays.items()})


def _load_arrays(path: Path) -> ArrayRecord:
    with np.load(path) as data:
        return ArrayRecord({k: Array(data[k]) for k in data.files})


def _initial_arrays(cfg: FedConfig) -> ArrayRecord:
    return _arrays(_model(cfg))


def _per_client_metrics(replies) -> dict[str, dict]:
    out = {}
    for r in replies:
        m = r.content["metrics"]
        name = str(r.content["info"]["client"])
        result = {}
        for level in local.LEVELS:
            result[level] = {k: float(m[f"{level}/{k}"]) for k in local.METRIC_NAMES}
            result[level]["queries"] = int(m[WEIGHT_KEY])
        out[name] = result
    return dict(sorted(out.items()))


def _evaluate_all(grid, nodes, arrays, version: str, variant: str) -> dict:
    msgs = [Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"variant": variant,
                                                                          "model-version": version})}),
                    dst_node_id=n, message_type="evaluate") for n in nodes]
    per_client = _per_client_metrics(_send(grid, msgs))
    return {"per_client": per_client, "pooled": local.pooled(per_client)}


def _fed_negative_exchange(grid, nodes, arrays, version: str, variant: str, cfg: FedConfig, log: ExchangeLog,
                           rng: random.Random) -> dict[int, list]:
    """Eqs. 4.1-4.2 through the relay: returns, per node, the answers addressed to it."""
    cfg_rec = ConfigRecord({"variant": variant, "model-version": version})
    msgs = [Message(RecordDict({"arrays": arrays, "config": cfg_rec}), dst_node_id=n, message_type="query.embed")
            for n in nodes]
    queries = {r.metadata.src_node_id: r.content["queries"]["emb"].numpy() for r in _send(grid, msgs)}
    plan = []
    for i, node in enumerate(nodes):
        for j in select_clients(i, len(nodes), cfg.fed_select, rng):
            plan.append((node, nodes[j]))
    msgs = [Message(RecordDict({"queries": ArrayRecord({"emb": Array(queries[src])}),
                                "config": ConfigRecord({"n": cfg.fed_negatives, "model-version": version})}),
                    dst_node_id=dst, message_type="query.fednegative") for src, dst in plan]
    replies = _send(grid, msgs)
    by_id = {m.metadata.message_id: (src, dst) for m, (src, dst) in zip(msgs, plan)}
    out: dict[int, list] = {n: [] for n in nodes}
    for r in replies:
        src, _ = by_id[r.metadata.reply_to_message_id]
        ans = r.content["answer"]
        log.add(str(src), queries[src], (ans["emb"].numpy(), ans["scores"].numpy()))
        out[src].append(ans)
    return out


def run_server(grid, cfg: FedConfig, out_dir: str | Path, *, n_clients: int, data_hash: str = "",
               resume: bool = True) -> dict:
    """Stage 1 (FedAvg rounds, checkpointed each round), evaluation, stage 2 variants; ``results.json``.

    One server per run directory: a second one pointed at ``out_dir`` fails at once (:class:`RunLock`).
    """
    out_dir = Path(out_dir)
    with RunLock(out_dir, what="federated run directory"):
        return _run_server(grid, cfg, out_dir, n_clients=n_clients, data_hash=data_hash, resume=resume)


def _run_server(grid, cfg: FedConfig, out_dir: Path, *, n_clients: int, data_hash: str, resume: bool) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    state_path, ckpt = out_dir / "state.json", out_dir / "global.npz"
    state = json.loads(state_path.read_text()) if resume and state_path.is_file() else {}
    rounds_done = int(state.get("rounds_done", 0))
    arrays = _load_arrays(ckpt) if rounds_done and ckpt.is_file() else _initial_arrays(cfg)
    history = state.get("history", [])
    strategy = make_strategy(cfg, n_clients)
    from flwr.serverapp.strategy.strategy_utils import sample_nodes

    nodes, _ = sample_nodes(grid, n_clients, n_clients)
    nodes = sorted(nodes)
    for rnd in range(rounds_done + 1, cfg.rounds + 1):
        t0 = time.time()
        stage = "bm25" if rnd <= cfg.warmup_rounds else "hard"
        msgs = list(strategy.configure_train(rnd, arrays, ConfigRecord({"stage": stage}), grid))
        down = sum(record_bytes(m.content) for m in msgs)
        replies = _send(grid, msgs)
        up = sum(record_bytes(r.content) for r in replies)
        new_arrays, metrics = strategy.aggregate_train(rnd, replies)
        if new_arrays is None:
            raise RuntimeError(f"round {rnd}: aggregation failed")
        arrays = new_arrays
        n_questions = int(sum(float(next(iter(r.content.metric_records.values()))[WEIGHT_KEY]) for r in replies))
        history.append({"round": rnd, "stage": stage, "bytes_down": down, "bytes_up": up, "questions": n_questions,
                        "seconds": round(time.time() - t0, 1),
                        "train_loss": float(metrics["loss"]) if metrics is not None and "loss" in metrics else None})
        _save_arrays(ckpt, arrays)
        write_json_atomic(state_path, {"rounds_done": rnd, "history": history})
    ledger = dp_ledger(cfg, rounds_done=cfg.rounds, n_clients=n_clients, n_questions=int(history[-1]["questions"]) if history else 0,
                       data_hash=data_hash)
    ledger.save(out_dir)
    version = f"round-{cfg.rounds}"
    results = {"config": cfg.model_dump(mode="json"), "rounds": history, "ledger": json.loads(ledger.model_dump_json())}
    results_path = out_dir / "results.json"
    done = json.loads(results_path.read_text()).get("evaluations", {}) if resume and results_path.is_file() else {}
    evaluations = dict(done)
    if "pdd-as2" not in evaluations:
        evaluations["pdd-as2"] = _evaluate_all(grid, nodes, arrays, version, "global")
        write_json_atomic(results_path, {**results, "evaluations": evaluations})
    for variant in cfg.personalize:
        name = "+query-encoders" if variant == "local" else "+query-encoders+fed-negative"
        if name in evaluations:
            continue
        exchanges = []
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
            _send(grid, msgs)
        evaluations[name] = _evaluate_all(grid, nodes, arrays, version, variant)
        if exchanges:
            evaluations[name]["fed_negative_exchanges"] = exchanges
        write_json_atomic(results_path, {**results, "evaluations": evaluations})
    results["evaluations"] = evaluations
    write_json_atomic(results_path, results)
    return results


def build_server_app():
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        cfg = FedConfig.from_run_config(context.run_config)
        out_dir = str(context.run_config.get("out-dir", "")) or "runs/federated"
        n_clients = int(context.run_config.get("num-clients", 2))
        run_server(grid, cfg, out_dir, n_clients=n_clients, data_hash=str(context.run_config.get("data-hash", "")))

    return app


client_app = build_client_app() if ClientApp is not None else None
server_app = build_server_app() if ServerApp is not None else None
