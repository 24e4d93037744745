"""The plain non-private fine-tune by sentence-transformers' own trainer, beside privret's (--trainer privret).
Reproduces docs/results.md, "Direct DP training of the retriever" (privret's trainer against a plain fine-tune).
    OMP_NUM_THREADS=2 .venv/bin/python bench/plain_finetune.py --data ../shared/data/scifact --out runs/plain/st-s0
    (then privret evaluate retrieval --per-query and bench/seed_rows.py: bench/README.md)
2 CPU cores: about 10 min of training a run (privret's trainer 583 s, sentence-transformers' about 1.1 times that)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from privret.data.beir import dataset_hash, load_beir
from privret.data.pairs import TrainingPairs, pairs_from_beir
from privret.errors import InputError
from privret.io import atomic_path
from privret.models.encoder import load_encoder
from privret.train.retriever import fit_retriever, non_private_ledger
from privret.settings.training import RetrieverTrainConfig


def training_columns(pairs: TrainingPairs) -> dict[str, list[str]]:
    """The (query, document text) pairs as the trainer's two columns, one row a pair, in their order."""
    return {"anchor": [p.query for p in pairs.pairs],
            "positive": [pairs.corpus[p.doc_id].full_text for p in pairs.pairs]}


def plain_finetune(data: Path, out: Path, *, model: str = "minilm-l6", split: str = "train", seed: int = 0,
                   epochs: float = 3, batch_size: int = 32, learning_rate: float = 2e-5, scale: float = 20.0,
                   max_seq_length: int = 256, trainer: str = "sentence-transformers") -> Path:
    """Fine-tune ``model`` on ``split``'s pairs of the BEIR directory ``data``; save it to ``out`` (atomic).

    ``trainer``: ``sentence-transformers`` (the plain fine-tune of the module docstring) or ``privret``
    (:func:`privret.train.retriever.fit_retriever` with the same settings in float32: temperature 1 / ``scale``,
    documents cut at ``max_seq_length``), so that one script times both sides on one machine. Either way the
    record ``plain_finetune.json`` beside the model holds the settings and the training's wall seconds."""
    if trainer not in ("sentence-transformers", "privret"):
        raise ValueError(f"trainer {trainer!r}: expected sentence-transformers or privret")
    dataset = load_beir(data, [split])
    pairs = pairs_from_beir(dataset, split)
    started = time.perf_counter()
    if trainer == "sentence-transformers":
        encoder = _sentence_transformers_fit(pairs, model=model, seed=seed, epochs=epochs, batch_size=batch_size,
                                             learning_rate=learning_rate, scale=scale, max_seq_length=max_seq_length)
    else:
        encoder = fit_retriever(pairs, RetrieverTrainConfig(
            model=model, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate, temperature=1 / scale,
            max_doc_tokens=max_seq_length, bf16=False, seed=seed))
    seconds = time.perf_counter() - started
    ledger = non_private_ledger(pairs, model, dataset_hash(dataset, split), "query")
    with atomic_path(out) as staged:
        encoder.save(str(staged), safe_serialization=True)
        ledger.save(staged)
        (staged / "plain_finetune.json").write_text(json.dumps(
            {"trainer": trainer, "model": model, "data": str(data), "split": split, "seed": seed, "epochs": epochs,
             "batch_size": batch_size, "learning_rate": learning_rate, "scale": scale,
             "max_seq_length": max_seq_length, "pairs": len(pairs.pairs), "precision": "float32",
             "train_seconds": round(seconds, 1), "threads": torch.get_num_threads()}, indent=2) + "\n")
    return out


def _sentence_transformers_fit(pairs: TrainingPairs, *, model: str, seed: int, epochs: float, batch_size: int,
                               learning_rate: float, scale: float, max_seq_length: int):
    """sentence-transformers' trainer, MultipleNegativesRankingLoss and NO_DUPLICATES batches; the fitted encoder."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    encoder = load_encoder(model, max_seq_length=max_seq_length)
    train = Dataset.from_dict(training_columns(pairs))
    with tempfile.TemporaryDirectory(prefix="plain-finetune-") as scratch:
        arguments = SentenceTransformerTrainingArguments(
            output_dir=scratch, num_train_epochs=epochs, per_device_train_batch_size=batch_size,
            learning_rate=learning_rate, seed=seed, data_seed=seed, batch_sampler=BatchSamplers.NO_DUPLICATES,
            bf16=False, fp16=False, save_strategy="no", report_to="none", logging_steps=10)
        SentenceTransformerTrainer(model=encoder, args=arguments, train_dataset=train,
                                   loss=MultipleNegativesRankingLoss(encoder, scale=scale)).train()
    encoder.eval()
    return encoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="BEIR directory; its --split qrels are the pairs")
    parser.add_argument("--out", type=Path, required=True, help="where the retriever is written (must not exist)")
    parser.add_argument("--model", default="minilm-l6")
    parser.add_argument("--split", default="train")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--scale", type=float, default=20.0, help="1 / temperature")
    parser.add_argument("--max-seq-length", type=int, default=256)
    parser.add_argument("--trainer", choices=["sentence-transformers", "privret"], default="sentence-transformers",
                        help="privret: privret's own trainer with the same settings, timed the same way")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out}: already exists (remove it or choose another output)")
    try:
        plain_finetune(args.data, args.out, model=args.model, split=args.split, seed=args.seed, epochs=args.epochs,
                       batch_size=args.batch_size, learning_rate=args.lr, scale=args.scale,
                       max_seq_length=args.max_seq_length, trainer=args.trainer)
    except InputError as error:
        raise SystemExit(f"error: {error.one_line()}") from None
    print(args.out)


if __name__ == "__main__":
    main()
