"""The Flower ClientApp of PDD-AS2 (Wang's thesis, Algorithm 1, chapters 3 and 4): what a client does per message.

* ``train`` (stage 1): ``local_epochs`` on the client's data from the global arrays; the reply is its weights
  and ``num-examples = |D_i|``, or under DP ``dp-weight = 1`` only (:func:`_train_metrics`);
* ``query.embed`` / ``query.fednegative``: Fed-Negative's exchange, relayed by the ServerApp (eqs. 4.1, 4.2);
* ``train.personalize`` (stage 2): one epoch of the client's own query encoder, sentence encoder frozen; no
  metrics in the reply under DP;
* ``evaluate``: MRR@10 and Recall@1/20/100 at sentence and passage level on the test split (or the validation
  questions, ``evaluation_split``), with the count of questions (not for validation questions under DP).

Under DP-FedAvg nothing that a client's data size moves leaves it (no question count, steps, loss, or
Fed-Negative: :class:`~privret.settings.federated.FedConfig` refuses ``fed``); docs/privacy.md, section "What a
federated DP run writes". Node config: ``data-dir`` and ``client`` or ``partition-id``; run config: the
``FedConfig`` fields (dashes). State between messages lives in ``context.state`` (encoders, sentence embeddings)
and in the app's own :class:`FedClient` (data, encoders, BM25 rankings), so two apps in one process share nothing.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from privret.data.fed_squad import ClientData, load_client
from privret.federated import local, wire
from privret.federated.arrays import load_weights, new_encoder, trainable_parameters, weights
from privret.settings.federated import FedConfig
from privret.federated.negatives import fed_negative_answer, fed_negative_merge, negative_hardness
from privret.federated.strategy import DP_WEIGHT_KEY, WEIGHT_KEY

try:  # flwr is needed for the apps only; the rest of privret.federated works without it
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
except ImportError:  # pragma: no cover - exercised only without flwr installed
    ClientApp = None


def _seeded_rng(*parts) -> random.Random:
    """The handler's random stream, named by ``parts`` (seed, client, round...); torch is seeded from it."""
    rng = random.Random(":".join(str(p) for p in parts))
    torch.manual_seed(rng.randrange(2 ** 31))
    return rng


def _metric_record(values: dict) -> MetricRecord:
    return MetricRecord({k: float(v) for k, v in values.items()})


def _wire_codec(msg, context, call_next):
    """Every message's ``arrays`` arrive in the wire type (:mod:`privret.federated.wire`): the handlers (and
    Flower's clipping mod) see float32 weights; a reply's ``arrays`` leave as the update against them."""
    if "arrays" not in msg.content.array_records:
        return call_next(msg, context)
    dtype = FedConfig.from_run_config(context.run_config).wire_dtype
    received = wire.decode_weights(msg.content["arrays"], dtype)
    msg.content = RecordDict({**dict(msg.content.items()), "arrays": received})  # a copy: the sender's is kept
    reply = call_next(msg, context)
    if not reply.has_error() and "arrays" in reply.content.array_records:
        reply.content["arrays"] = wire.encode_update(reply.content["arrays"], received, dtype)
    return reply


def _train_clipped(msg, context, call_next):
    """Flower's ``fixedclipping_mod`` when the server asks for client-side clipping, else a no-op."""
    from flwr.clientapp.mod import fixedclipping_mod
    from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

    config = next(iter(msg.content.config_records.values()), {})
    if KEY_CLIPPING_NORM in config:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


def _train_metrics(cfg: FedConfig, questions: list, stats: list[dict]) -> dict:
    """What a ``train`` reply reports beside the update. Without DP: ``num-examples = |D_i|`` (eq. 3.6's weight),
    the steps and the last epoch's loss. Under DP-FedAvg the weights are uniform (``dp-weight = 1``) and nothing
    else leaves the client: its data size, the steps it moves and the loss are not covered by the noise."""
    if cfg.dp != "none":
        return {DP_WEIGHT_KEY: 1.0}
    return {WEIGHT_KEY: len(questions), "steps": sum(s["steps"] for s in stats), "loss": stats[-1]["loss"]}


class FedClient:
    """The message handlers of one ClientApp and what they keep in this process between messages."""

    def __init__(self):
        self._data: dict[tuple[str, str], ClientData] = {}
        self._encoders: dict[tuple, object] = {}  # (model, trainable, slot, device) -> encoder, weights per message
        self._rankings: dict[tuple, dict] = {}  # questions' settings -> (kind, client) -> negatives' rankings

    def client_data(self, context) -> ClientData:
        data_dir = Path(str(context.node_config["data-dir"]))
        name = context.node_config.get("client")
        if name is None:
            name = f"client_{int(context.node_config['partition-id']):02d}"
        key = (str(data_dir), str(name))
        if key not in self._data:
            self._data[key] = load_client(data_dir / str(name))
        return self._data[key]

    def encoder(self, cfg: FedConfig, slot: str = "main"):
        """One encoder object per slot, reloaded with whatever weights a message carries."""
        key = (cfg.model, cfg.trainable, cfg.lora_rank, slot, cfg.device)
        if key not in self._encoders:
            self._encoders[key] = new_encoder(cfg)
        return self._encoders[key]

    def global_model(self, cfg: FedConfig, msg):
        model = self.encoder(cfg)
        load_weights(model, msg.content["arrays"])
        return model

    def sentence_embeddings(self, context, cfg: FedConfig, msg, client: ClientData) -> np.ndarray:
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
        emb = local.encode_texts(self.global_model(cfg, msg), client.sentences, max_length=cfg.max_sentence_tokens,
                                 bf16=cfg.bf16)
        context.state["sentence-emb"] = ArrayRecord({"emb": Array(emb)})
        context.state["sentence-emb-version"] = ConfigRecord({"version": version})
        return emb

    def query_encoder(self, context, cfg: FedConfig, msg, variant: str):
        """The client's own query encoder of ``variant`` (starts as a copy of the global model)."""
        model = self.encoder(cfg, slot="query")
        key = f"query-encoder-{variant}"
        load_weights(model, context.state.array_records[key] if key in context.state.array_records
                     else msg.content["arrays"])
        return model

    def train(self, msg, context):
        cfg = FedConfig.from_run_config(context.run_config)
        config = msg.content["config"]
        client = self.client_data(context)
        rng = _seeded_rng(cfg.seed, client.name, int(config["server-round"]))
        model = self.global_model(cfg, msg)
        questions = local.train_questions(client, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
        gold = local.gold_indices(client, questions)
        optimizer = torch.optim.AdamW(trainable_parameters(model).values(), lr=cfg.learning_rate)
        rankings = self._rankings.setdefault(
            (cfg.bm25_k, cfg.hard_k, cfg.max_train_questions, cfg.train_fraction, cfg.seed), {})
        stats = []
        for _ in range(cfg.local_epochs):
            negatives = local.epoch_negatives(model, client, questions, gold, str(config["stage"]), cfg, rng,
                                              rankings)
            stats.append(local.train_dual_encoder_epoch(
                model, client, questions, negatives, optimizer=optimizer, batch_size=cfg.batch_size,
                temperature=cfg.temperature, max_query_tokens=cfg.max_query_tokens,
                max_sentence_tokens=cfg.max_sentence_tokens, rng=rng, bf16=cfg.bf16))
        metrics = _metric_record(_train_metrics(cfg, questions, stats))
        return Message(RecordDict({"arrays": weights(model), "metrics": metrics,
                                   "info": ConfigRecord({"client": client.name})}), reply_to=msg)

    def embed_queries(self, msg, context):
        cfg = FedConfig.from_run_config(context.run_config)
        client = self.client_data(context)
        variant = str(msg.content["config"]["variant"])
        self.sentence_embeddings(context, cfg, msg, client)  # needed when others' queries arrive
        model = self.query_encoder(context, cfg, msg, variant)
        questions = local.train_questions(client, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
        q = local.encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens, bf16=cfg.bf16)
        return Message(RecordDict({"queries": ArrayRecord({"emb": Array(q)})}), reply_to=msg)

    def fed_negative(self, msg, context):
        cfg = FedConfig.from_run_config(context.run_config)
        s = self.sentence_embeddings(context, cfg, msg, self.client_data(context))
        q = msg.content["queries"]["emb"].numpy()
        emb, scores = fed_negative_answer(q, s, int(msg.content["config"]["n"]))
        return Message(RecordDict({"answer": ArrayRecord({"emb": Array(emb), "scores": Array(scores)})}),
                       reply_to=msg)

    def personalize(self, msg, context):
        cfg = FedConfig.from_run_config(context.run_config)
        config = msg.content["config"]
        client = self.client_data(context)
        variant = str(config["variant"])
        rng = _seeded_rng(cfg.seed, client.name, variant, int(config["epoch"]))
        s = self.sentence_embeddings(context, cfg, msg, client)
        model = self.query_encoder(context, cfg, msg, variant)
        questions = local.train_questions(client, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
        fed = None
        answers = [rec for key, rec in msg.content.array_records.items() if key.startswith("fedneg-")]
        metrics = {}
        if answers:  # Fed-Negative runs without DP only (FedConfig refuses it under DP)
            fed = fed_negative_merge([(a["emb"].numpy(), a["scores"].numpy()) for a in answers], cfg.fed_negatives)
            # measured before this epoch's training, on the encoder that trains
            q = local.encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens, bf16=cfg.bf16)
            hardness = negative_hardness(q, s, local.gold_indices(client, questions), fed, cfg.personal_negatives)
            metrics = {"fed-negatives-per-query": fed.shape[1], **{f"hardness/{k}": v for k, v in hardness.items()}}
        optimizer = torch.optim.AdamW(trainable_parameters(model).values(), lr=cfg.personal_learning_rate)
        stats = local.train_query_encoder_epoch(
            model, client, questions, s, optimizer=optimizer, batch_size=cfg.personal_batch_size,
            temperature=cfg.temperature, max_query_tokens=cfg.max_query_tokens, n_negatives=cfg.personal_negatives,
            hard_k=cfg.personal_hard_k, rng=rng, fed_negatives=fed, bf16=cfg.bf16)
        context.state[f"query-encoder-{variant}"] = weights(model)
        content = RecordDict({"info": ConfigRecord({"client": client.name})})
        if cfg.dp == "none":  # under DP-FedAvg what the client's training questions move stays here
            content["metrics"] = _metric_record({WEIGHT_KEY: len(questions), "steps": stats["steps"],
                                                 "loss": stats["loss"], **metrics})
        return Message(content, reply_to=msg)

    def evaluate(self, msg, context):
        cfg = FedConfig.from_run_config(context.run_config)
        client = self.client_data(context)
        variant = str(msg.content["config"]["variant"])
        s = self.sentence_embeddings(context, cfg, msg, client)
        if variant == "global":
            model = self.global_model(cfg, msg)
        else:
            model = self.query_encoder(context, cfg, msg, variant)
        questions = local.evaluation_questions(client, cfg)
        q = local.encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens, bf16=cfg.bf16)
        result = local.evaluate_scores(q @ s.T, client, questions, per_query=cfg.per_query_metrics)
        flat = {f"{level}/{k}": m[k] for level, m in result.items() for k in local.METRIC_NAMES}
        if cfg.evaluation_counts_public:  # a validation count under DP would give away the client's training size
            flat[WEIGHT_KEY] = len(questions)
        content = RecordDict({"metrics": _metric_record(flat), "info": ConfigRecord({"client": client.name})})
        if cfg.per_query_metrics:  # each test question's reciprocal rank, in the order of its id
            ids = sorted(q.id for q in questions)
            content["info"]["question-ids"] = ids
            content["per-query"] = ArrayRecord({level: Array(np.array([m["per_query"][i] for i in ids]))
                                                for level, m in result.items()})
        return Message(content, reply_to=msg)


def build_client_app():
    """A fresh ClientApp with the handlers of its own :class:`FedClient` (module-level ``client_app`` is one)."""
    client = FedClient()
    app = ClientApp(mods=[_wire_codec])
    app.train(mods=[_train_clipped])(client.train)
    app.train("personalize")(client.personalize)
    app.query("embed")(client.embed_queries)
    app.query("fednegative")(client.fed_negative)
    app.evaluate()(client.evaluate)
    return app


client_app = build_client_app() if ClientApp is not None else None
