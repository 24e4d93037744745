"""Non-private training of the dual encoder with the in-batch softmax loss (seed eq. 1).

Trains on original pairs (the non-private reference) or on a synthetic dataset (whose DP
guarantee carries over by post-processing; its ledger is copied beside the model).
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from privret.data.pairs import TrainingPairs
from privret.errors import InputError
from privret.io import atomic_path, write_json_atomic
from privret.models.device import bf16_autocast
from privret.models.encoder import embed, in_batch_softmax_loss, load_encoder
from privret.models.registry import DEFAULT_ENCODER
from privret.privacy.ledger import PrivacyLedger
from privret.progress import Progress


class RetrieverTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_ENCODER
    epochs: float = Field(1.0, gt=0, allow_inf_nan=False)
    batch_size: int = Field(32, gt=1)
    learning_rate: float = Field(2e-5, gt=0, allow_inf_nan=False)
    temperature: float = Field(0.05, gt=0, allow_inf_nan=False)
    warmup_fraction: float = Field(0.1, ge=0, lt=1)
    max_query_tokens: int = Field(64, gt=0)
    max_doc_tokens: int = Field(128, gt=0, description="truncation of documents during training only")
    bf16: bool = True
    seed: int = 0


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


def train_retriever(pairs: TrainingPairs, out_dir: str | Path, cfg: RetrieverTrainConfig, *,
                    ledger: PrivacyLedger) -> Path:
    """Train and save a SentenceTransformer to ``out_dir`` (atomic), with ``ledger`` beside it."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    model = load_encoder(cfg.model)
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
        for batch in schedule:
            rows = [pairs.pairs[i] for i in batch]
            queries = [r.query for r in rows]
            same_query = torch.tensor([[a == b for b in queries] for a in queries])
            with bf16_autocast(model.device, cfg.bf16):
                q = embed(model, queries, max_length=cfg.max_query_tokens)
                d = embed(model, [pairs.corpus[r.doc_id].full_text for r in rows], max_length=cfg.max_doc_tokens)
                loss = in_batch_softmax_loss(q.float(), d.float(), cfg.temperature, same_query.to(q.device))
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            progress.update(task, advance=1, description=f"training retriever loss={loss.item():.3f}")
    model.eval()
    with atomic_path(out_dir) as staged:
        model.save(str(staged), safe_serialization=True)
        ledger.save(staged)
        write_json_atomic(staged / "train_config.json", cfg.model_dump(mode="json"))
    return out_dir
