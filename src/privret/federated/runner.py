"""Running PDD-AS2 on one machine, the baselines, and writing the Flower App for a real deployment.

* :class:`InProcessGrid` is a Flower ``Grid`` that hands every message to the same ``ClientApp`` in
  this process, one ``Context`` per client (what Flower's simulation engine does, without Ray, which
  ``flwr[simulation]`` needs and privret does not depend on). The ServerApp code, the strategy and
  the ClientApp code are exactly those a SuperLink and its SuperNodes run.
* Baselines (thesis 3.4.3 / Table 4.1): BM25 per client; local-only (each client trains the same
  recipe on its own data, no aggregation); central (one model on the union of all clients' training
  questions, each question's negatives from its own client's collection: the upper bound).
* :func:`write_flower_app` writes a Flower App directory (``pyproject.toml`` with the components
  and every run-config key) for ``flwr run APP SUPERLINK``.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from privret.data.beir import Document
from privret.data.fed_squad import ClientData, load_fed_squad
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.federated import local
from privret.federated.arrays import new_encoder, trainable_parameters
from privret.settings.federated import FedConfig, without_runtime
from privret.io import file_sha256, write_json_atomic
from privret.privacy.budget import BudgetPolicy, dataset_id
from privret.privacy.commitment import commit


class InProcessGrid:
    """A Flower ``Grid`` whose nodes are ``ClientApp`` calls in this process (sequential, deterministic)."""

    def __init__(self, client_app, node_configs: list[dict], run_config: dict, run_id: int = 1):
        from flwr.app import Context, RecordDict
        from flwr.serverapp import Grid
        from flwr.supercore.run import Run

        from flwr.supercore.task_identity import TaskIdentity

        Grid.register(InProcessGrid)
        # the identity a ServerApp process gets from its SuperLink (messages are stamped with it)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 1
        self.client_app = client_app
        self._run = Run.create_empty(run_id)
        self.contexts = {i + 1: Context(run_id=run_id, node_id=i + 1, node_config=dict(nc), state=RecordDict(),
                                        run_config=dict(run_config)) for i, nc in enumerate(node_configs)}
        self._replies: dict[str, object] = {}

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        from flwr.app import Message

        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def get_nodes(self):
        from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=no-name-in-module

        return [NodeInfo(node_id=n) for n in self.contexts]

    def push_messages(self, messages) -> list[str]:
        from uuid import uuid4

        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            msg.metadata.__dict__["_src_node_id"] = 0
            reply = self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
            reply.metadata.__dict__["_src_node_id"] = msg.metadata.dst_node_id
            self._replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids) -> list:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages, *, timeout=None) -> list:
        return self.pull_messages(self.push_messages(list(messages)))


def _check_data(data_dir: Path) -> tuple[list[ClientData], dict]:
    clients = require_data(data_dir)
    manifest = json.loads((Path(data_dir) / "manifest.json").read_text(encoding="utf-8"))
    return clients, manifest


def run_federated_local(cfg: FedConfig, data_dir: str | Path, out_dir: str | Path, *, resume: bool = True,
                        budget: BudgetPolicy | None = None, dataset_name: str | None = None) -> dict:
    """PDD-AS2 + personalisation with the real Flower apps on an :class:`InProcessGrid`; a DP run is recorded in the
    budget registry under :func:`dataset_key` with ``budget`` (default: the default cap)."""
    from privret.federated.client_app import build_client_app
    from privret.federated.server_app import run_server

    data_dir = Path(data_dir)
    clients, manifest = _check_data(data_dir)
    run_config = {**cfg.to_run_config(), "out-dir": str(out_dir), "num-clients": len(clients)}
    grid = InProcessGrid(build_client_app(), [{"data-dir": str(data_dir), "client": c.name} for c in clients],
                         run_config)
    return run_server(grid, cfg, out_dir, n_clients=len(clients), data_hash=manifest.get("source_sha256", ""),
                      dataset_id=dataset_key(clients, dataset_name), budget=budget, resume=resume)


def dataset_key(clients: list[ClientData], name: str | None = None) -> str:
    """The budget registry's key of the clients' data, by the function that keys every DP release
    (:func:`privret.privacy.budget.dataset_id`): ``name``'s, or that of the records (training question, its answer
    sentence) of every client. A copy of the directory is the same dataset; the test questions, which no run trains
    on, are not part of it."""
    corpus, pairs = {}, []
    for c in clients:
        text = dict(zip(c.sentence_ids, c.sentences))
        for q in c.split("train"):
            doc = f"{c.name}/{q.positive}"
            corpus[doc] = Document(doc, "", text[q.positive])
            pairs.append(QueryDocPair(q.text, doc))
    return dataset_id(TrainingPairs(pairs, corpus), name)


def run_baseline(name: str, cfg: FedConfig, data_dir: str | Path, out_dir: str | Path, *, resume: bool = True) -> dict:
    """One baseline (:data:`BASELINES`) evaluated on every client and saved as ``out_dir/NAME.json`` with its
    settings and a commitment to every file of the Fed-SQuAD directory (:func:`privret.privacy.commitment.commit` of
    their sha256: the clients' questions are private, and a bare digest of them would confirm a guessed dataset).
    With ``resume`` a saved result of the same
    settings (but :data:`~privret.settings.federated.RUNTIME_FIELDS`) and data is returned without training again;
    any other is redone, like the evaluations of a PDD-AS2 run."""
    if name not in BASELINES:
        raise InputError(f"unknown baseline '{name}' ({', '.join(BASELINES)})", field="--baseline")
    clients = require_data(data_dir)
    data_hash = commit(file_sha256(*sorted(p for p in Path(data_dir).rglob("*") if p.is_file())))
    path = Path(out_dir) / f"{name}.json"
    settings = cfg.model_dump(mode="json")
    if resume and path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        same = without_runtime(saved.get("config", {})) == without_runtime(settings)
        if same and saved.get("data_hash") == data_hash:
            return {k: v for k, v in saved.items() if k not in ("config", "data_hash", "written_at")}
    result = BASELINES[name](cfg, clients)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_result(path, result, config=settings, data_hash=data_hash)
    return result


def evaluate_bm25_all(cfg: FedConfig, clients: list[ClientData]) -> dict:
    """BM25 per client on the questions ``cfg.evaluation_split`` names (per-question figures with
    ``per_query_metrics``); nothing else of ``cfg`` applies."""
    per_client = {c.name: local.evaluate_bm25(c, local.evaluation_questions(c, cfg), per_query=cfg.per_query_metrics)
                  for c in clients}
    return {"per_client": per_client, "pooled": local.pooled(per_client)}


def _stages(cfg: FedConfig) -> list[tuple[int, str]]:
    """``(round, stage)`` per epoch of a non-federated baseline with the budget of ``rounds x local_epochs``."""
    return [(r, local.round_stage(cfg, r)) for r in range(1, cfg.rounds + 1) for _ in range(cfg.local_epochs)]


def _evaluate(model, client: ClientData, cfg: FedConfig) -> dict:
    return local.evaluate_dense(model, model, client, local.evaluation_questions(client, cfg),
                                max_query_tokens=cfg.max_query_tokens,
                                max_sentence_tokens=cfg.max_sentence_tokens, bf16=cfg.bf16,
                                per_query=cfg.per_query_metrics)


def train_local_only(cfg: FedConfig, clients: list[ClientData], *, on_client=None) -> dict:
    """Local-only baseline: every client trains its own dual encoder on its own data; evaluated locally.

    The recipe is the federated one without aggregation: same trainable parameters, epochs and negative
    schedule. With ``eval_every`` each client is also evaluated after every ``eval_every``-th round's
    epochs (``curve``: round -> metrics), as the federated run evaluates its global model.
    """
    per_client, curves = {}, {}
    for c in clients:
        torch.manual_seed(cfg.seed)
        rng = random.Random(f"{cfg.seed}:{c.name}:local-only")
        model = new_encoder(cfg)
        optimizer = torch.optim.AdamW(trainable_parameters(model).values(), lr=cfg.learning_rate)
        questions = local.train_questions(c, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
        gold = local.gold_indices(c, questions)
        cache: dict = {}
        curve = {}
        stages = _stages(cfg)
        for k, (rnd, stage) in enumerate(stages):
            negatives = local.epoch_negatives(model, c, questions, gold, stage, cfg, rng, cache)
            local.train_dual_encoder_epoch(model, c, questions, negatives, optimizer=optimizer,
                                           batch_size=cfg.batch_size, temperature=cfg.temperature,
                                           max_query_tokens=cfg.max_query_tokens,
                                           max_sentence_tokens=cfg.max_sentence_tokens, rng=rng, bf16=cfg.bf16)
            round_ends = k + 1 == len(stages) or stages[k + 1][0] != rnd
            if round_ends and cfg.eval_every and rnd % cfg.eval_every == 0 and rnd < cfg.rounds:
                curve[rnd] = _evaluate(model, c, cfg)
        per_client[c.name] = _evaluate(model, c, cfg)
        curves[c.name] = {**curve, cfg.rounds: per_client[c.name]}
        if on_client is not None:
            on_client(c.name, per_client[c.name])
    out = {"per_client": per_client, "pooled": local.pooled(per_client)}
    if cfg.eval_every:
        out["curve"] = {rnd: local.pooled({c: curves[c][rnd] for c in curves}) for rnd in curves[clients[0].name]}
    return out


def train_central(cfg: FedConfig, clients: list[ClientData]) -> dict:
    """Central upper bound: one model, every client's training questions pooled, same epochs and negatives.

    Batches never mix clients (a question's in-batch candidates come from its own collection, as in
    the federated run), and client batches are interleaved in a seeded random order.
    """
    torch.manual_seed(cfg.seed)
    rng = random.Random(f"{cfg.seed}:central")
    model = new_encoder(cfg)
    optimizer = torch.optim.AdamW(trainable_parameters(model).values(), lr=cfg.learning_rate)
    data = []
    for c in clients:
        questions = local.train_questions(c, cfg.max_train_questions, cfg.seed, cfg.train_fraction)
        data.append((c, questions, local.gold_indices(c, questions), {}))
    for _, stage in _stages(cfg):
        jobs = []
        for c, questions, gold, cache in data:
            negatives = local.epoch_negatives(model, c, questions, gold, stage, cfg, rng, cache)
            for batch in local.disjoint_batches(gold, cfg.batch_size, rng):
                jobs.append((c, [questions[i] for i in batch], [negatives[i] for i in batch]))
        rng.shuffle(jobs)
        for c, qs, negs in jobs:
            local.train_dual_encoder_epoch(model, c, qs, negs, optimizer=optimizer, batch_size=len(qs) + 1,
                                           temperature=cfg.temperature, max_query_tokens=cfg.max_query_tokens,
                                           max_sentence_tokens=cfg.max_sentence_tokens, rng=random.Random(0),
                                           bf16=cfg.bf16)
    per_client = {c.name: _evaluate(model, c, cfg) for c in clients}
    return {"per_client": per_client, "pooled": local.pooled(per_client)}


def evaluate_zero_shot(cfg: FedConfig, clients: list[ClientData]) -> dict:
    from privret.models.encoder import load_encoder

    model = load_encoder(cfg.model, max_seq_length=cfg.max_sentence_tokens, device=cfg.device)
    per_client = {c.name: _evaluate(model, c, cfg) for c in clients}
    return {"per_client": per_client, "pooled": local.pooled(per_client)}


BASELINES = {"local-only": train_local_only, "central": train_central, "zero-shot": evaluate_zero_shot,
             "bm25": evaluate_bm25_all}


def write_flower_app(app_dir: str | Path, cfg: FedConfig, *, out_dir: str, num_clients: int, data_hash: str = "",
                     dataset_id: str = "", budget: BudgetPolicy | None = None) -> Path:
    """A Flower App directory for ``flwr run``: components point at :mod:`privret.federated.server_app` and
    :mod:`privret.federated.client_app`; ``dataset_id`` and ``budget`` are what the ServerApp records a DP run
    under in the budget registry of its host."""
    import tomli_w

    app_dir = Path(app_dir)
    app_dir.mkdir(parents=True, exist_ok=True)
    budget = budget or BudgetPolicy()
    run_config = {**cfg.to_run_config(), "out-dir": str(out_dir), "num-clients": int(num_clients),
                  "data-hash": data_hash, "dataset-id": dataset_id, "budget-cap": budget.cap,
                  "allow-over-budget": budget.allow_over}
    doc = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "privret-pdd-as2", "version": "0.1.0", "license": "Apache-2.0",
                    "description": "PDD-AS2 federated answer sentence selection (privret)",
                    "dependencies": ["flwr>=1.41.0", "privret"]},
        "tool": {"flwr": {"app": {"publisher": "privret",
                                  "components": {"serverapp": "privret.federated.server_app:server_app",
                                                 "clientapp": "privret.federated.client_app:client_app"},
                                  "config": run_config}}},
    }
    (app_dir / "pyproject.toml").write_text(tomli_w.dumps(doc), encoding="utf-8")
    (app_dir / "README.md").write_text("Flower App for privret PDD-AS2; see docs/federated.md.\n", encoding="utf-8")
    return app_dir


def save_result(path: Path, result: dict, **extra) -> None:
    write_json_atomic(path, {**result, **extra, "written_at": time.strftime("%Y-%m-%dT%H:%M:%S")})


def require_data(data_dir: str | Path) -> list[ClientData]:
    if not Path(data_dir).is_dir():
        raise InputError("Fed-SQuAD directory not found (run `privret data fed-squad`)", path=data_dir)
    return load_fed_squad(data_dir)


__all__ = ["InProcessGrid", "run_federated_local", "dataset_key", "run_baseline", "BASELINES", "evaluate_bm25_all",
           "train_local_only", "train_central", "evaluate_zero_shot", "write_flower_app"]
