"""Non-private training of the dual encoder with the in-batch softmax loss (Carranza et al., eq. 1).

Trains on original pairs (the non-private reference) or on a synthetic dataset, whose DP guarantee carries over by
post-processing (its ledger is copied beside the model).

Under ``torchrun`` (:mod:`privret.distributed`) every rank draws the same batches and embeds its share of each
(positions ``p mod W = r``); the embeddings are all-gathered, so each rank computes the whole batch's loss with
gradient only into its own rows, and the summed gradients over the ranks are the whole batch's gradient. Every rank
takes the same AdamW step from rank 0's parameters, so the result is one process's up to float rounding (without
dropout; with it, each rank draws its own masks). ``DistributedDataParallel`` is not used: a step makes two module
calls (queries, documents) whose outputs meet in the loss. Only rank 0 writes the model; recipe selection runs in
one process. See docs/scaling.md, section "Several processes (torchrun)".
"""

from __future__ import annotations

import math
import random
from pathlib import Path


import torch

from privret import distributed
from privret.data.pairs import UNIT_DEFINITIONS, PrivacyUnit, TrainingPairs
from privret.errors import InputError
from privret.io import atomic_path, write_json_atomic
from privret.models.device import bf16_autocast, precision_label
from privret.models.encoder import embed, in_batch_softmax_loss, load_encoder
from privret.models.model_card import write_model_card
from privret.privacy.ledger import PrivacyLedger, require_public
from privret.progress import Progress
from privret.runlock import RunLock
from privret.train.dp_parallel import sum_gradients
from privret.train.recipe import select_recipe
from privret.settings.training import RetrieverTrainConfig


def non_private_ledger(pairs: TrainingPairs, model: str, data_hash: str, unit: str) -> PrivacyLedger:
    """The ledger of a retriever trained on ``pairs`` without DP: epsilon = inf, no guarantee."""
    return PrivacyLedger(mechanism="none", epsilon=math.inf, delta=0.0, noise_multiplier=0.0, sample_rate=1.0, steps=0,
                         planned_steps=0, accountant="none", unit=unit, n_units=len(pairs.units(unit)),
                         n_pairs=len(pairs.pairs), clip_norm=math.inf, model=model, trainable="all",
                         data_hash=data_hash, unit_definition=UNIT_DEFINITIONS[PrivacyUnit(unit)])


def public_pairs_ledger(pairs: TrainingPairs, model: str, data_hash: str, unit: str) -> PrivacyLedger:
    """The ledger of a retriever trained without DP on pairs its user declares public: epsilon = delta = 0.

    The model is a function of public data only (the public pretrained ``model`` and the pairs), so it is 0-DP for
    any private log; the pairs' sha256 (``data_hash``) is its provenance. The guarantee rests on the declaration:
    a private query in ``pairs`` would be released without any."""
    return PrivacyLedger.public("public-pairs", model=model, public_data_hash=data_hash, unit=unit,
                                n_units=len(pairs.units(unit)), n_pairs=len(pairs.pairs), trainable="all")


def train_non_private(pairs: TrainingPairs, out_dir: str | Path, cfg: RetrieverTrainConfig, *, data_hash: str,
                      synthetic: PrivacyLedger | None = None, public: bool = False) -> PrivacyLedger:
    """:func:`train_retriever` into ``out_dir`` under its :class:`~privret.runlock.RunLock`, with the ledger of what
    ``pairs`` are: ``synthetic``, the ledger of the synthetic set they are (training on it is post-processing); with
    ``public``, a public epsilon-0 one (the caller's statement that no private query is among them); else a
    non-private one (no guarantee). Returns that ledger."""
    if synthetic is not None and public:
        raise InputError("the pairs are a synthetic set with its own privacy ledger, which already says what they are",
                         field="public")
    if synthetic is not None:
        ledger = synthetic
    elif public:
        ledger = public_pairs_ledger(pairs, cfg.model, data_hash, "query")
    else:
        ledger = non_private_ledger(pairs, cfg.model, data_hash, "query")
    with RunLock(out_dir, what="retriever directory"):
        train_retriever(pairs, out_dir, cfg, ledger=ledger)
    return ledger


def batches_without_collisions(pairs, batch_size: int, rng: random.Random) -> list[list[int]]:
    """Shuffle rows into batches; a row whose document is already in the batch waits for the next one."""
    order = list(range(len(pairs)))
    rng.shuffle(order)
    batches, pending = [], order
    while pending:
        batch, seen, rest = [], set(), []
        for i in pending:
            if len(batch) < batch_size and pairs[i].doc_id not in seen:
                batch.append(i)
                seen.add(pairs[i].doc_id)
            else:
                rest.append(i)
        batches.append(batch)
        pending = rest
    return [b for b in batches if len(b) > 1]


def fit_retriever(pairs: TrainingPairs, cfg: RetrieverTrainConfig, *, after_epoch=None):
    """Train a SentenceTransformer on ``pairs`` in memory and return it (in eval mode).

    Steps: ``ceil(epochs)`` shuffles of collision-free batches, cut at ``round(epochs * per_epoch)``
    steps; AdamW with linear warm-up and linear decay over all steps. ``after_epoch(epoch, model)``,
    if given, is called (model in eval mode, no gradient) at the end of every whole epoch; the
    recipe selection (:mod:`privret.train.recipe`) scores each epoch count on validation with it.
    """
    group = distributed.current()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model = load_encoder(cfg.model)
    with torch.no_grad():
        group.broadcast_([p.data for p in model.parameters()])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    epoch_batches = [batches_without_collisions(pairs.pairs, cfg.batch_size, rng)
                     for _ in range(math.ceil(cfg.epochs))]
    per_epoch = len(epoch_batches[0])
    schedule = [b for e in epoch_batches for b in e][: max(1, round(cfg.epochs * per_epoch))]
    warmup = max(1, int(cfg.warmup_fraction * len(schedule)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (len(schedule) - s) / max(1, len(schedule) - warmup))))
    model.train()
    with Progress() as progress:
        task = progress.add_task("training retriever", total=len(schedule))
        for step, batch in enumerate(schedule, start=1):
            shares = [[batch[k] for k in range(r, len(batch), group.world_size)] for r in range(group.world_size)]
            rows = [pairs.pairs[i] for i in shares[group.rank]]
            queries = [pairs.pairs[i].query for share in shares for i in share]  # the gathered order
            same_query = torch.tensor([[a == b for b in queries] for a in queries])
            sizes = [len(share) for share in shares]
            with bf16_autocast(model.device, cfg.bf16):
                q = _embed_rows(model, [r.query for r in rows], cfg.max_query_tokens)
                d = _embed_rows(model, [pairs.corpus[r.doc_id].full_text for r in rows], cfg.max_doc_tokens)
                q, d = group.gather_rows(q, sizes), group.gather_rows(d, sizes)
                loss = in_batch_softmax_loss(q, d, cfg.temperature, same_query.to(q.device))
            loss.backward()
            sum_gradients(list(model.parameters()), group)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            progress.update(task, advance=1, description=f"training retriever loss={loss.item():.3f}")
            if after_epoch is not None and step % per_epoch == 0:
                model.eval()
                with torch.no_grad():
                    after_epoch(step // per_epoch, model)
                model.train()
    model.eval()
    return model


def _embed_rows(model, texts: list[str], max_length: int) -> torch.Tensor:
    """:func:`embed` in float32; a rank with no rows of a batch (more ranks than rows) gets a 0-row tensor."""
    if not texts:
        return torch.zeros(0, model.get_sentence_embedding_dimension(), device=model.device)
    return embed(model, texts, max_length=max_length).float()


def train_retriever(pairs: TrainingPairs, out_dir: str | Path, cfg: RetrieverTrainConfig, *,
                    ledger: PrivacyLedger) -> Path:
    """Train and save a SentenceTransformer to ``out_dir`` (atomic), with ``ledger`` beside it.

    A ``ledger`` with a guarantee (finite epsilon: a synthetic set's, carried by post-processing, or a public
    one) holds only when ``cfg.model`` read no private data: a starting model with a private ledger is refused
    (:func:`~privret.privacy.ledger.require_public`). A non-private ledger (epsilon inf) claims nothing.

    With ``cfg.selection`` the recipe is first chosen on a validation split carved from ``pairs``
    (:func:`privret.train.recipe.select_recipe`; its record, ``recipe_selection.json``, is saved
    beside the model) and the chosen recipe is then trained on all of ``pairs``.
    """
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    if ledger.is_private:  # it claims a guarantee (a synthetic set's, by post-processing): only if cfg.model read
        require_public(cfg.model, field="model", use="training that carries its data's ledger")  # no private data
    selection = None
    if cfg.selection is not None and distributed.launched().distributed:
        raise InputError("recipe selection runs in one process; run it without torchrun",
                         field="selection")
    if cfg.selection is not None:
        selection = select_recipe(pairs, cfg, work_dir=out_dir.with_name(out_dir.name + ".selection"),
                                  fit=fit_retriever)
        cfg = RetrieverTrainConfig.model_validate({**cfg.model_dump(), **selection["chosen"], "selection": None})
    model = fit_retriever(pairs, cfg)
    if not distributed.launched().main:  # rank 0 writes the model
        return out_dir
    with atomic_path(out_dir) as staged:
        model.save(str(staged), safe_serialization=True)
        ledger.save(staged)
        write_json_atomic(staged / "train_config.json",  # with the format bf16 resolved to on this machine
                          {**cfg.model_dump(mode="json"), "precision": precision_label(model.device, cfg.bf16)})
        if selection is not None:
            write_json_atomic(staged / "recipe_selection.json", selection)
        write_model_card(staged)
    return out_dir
