"""The frozen-prefix cache against the plain forward pass, side by side on one Fed-SQuAD client.

For ``trainable = top:K`` the lower layers are frozen. "plain" runs the whole encoder in every step
(:func:`privret.models.encoder.embed`, what a trainer does without the cache); "cached" keeps the
frozen layers' output per text (:mod:`privret.models.frozen_prefix`). Measured, in turns, on the same
model, client and batches: one epoch of the PDD-AS2 local training loop, and one encoding of the
client's collection (what mining and evaluation cost). The first cached epoch includes filling the
cache; later ones reuse it (as every round after the first does). Prints a markdown table, writes JSON:

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_frozen_prefix.py --threads 2 --client client_07 \\
        --json bench/results/frozen_prefix.json
"""

from __future__ import annotations

import argparse
import platform
import random
import time
from pathlib import Path

import torch

from privret.data.fed_squad import load_client
from privret.federated import local
from privret.federated.arrays import new_encoder
from privret.federated.config import FedConfig
from privret.io import write_json_atomic
from privret.models import frozen_prefix as fp


def _epoch(cfg: FedConfig, model, client, questions, negatives) -> float:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate)
    t0 = time.perf_counter()
    local.train_dual_encoder_epoch(model, client, questions, negatives, optimizer=optimizer,
                                   batch_size=cfg.batch_size, temperature=cfg.temperature,
                                   max_query_tokens=cfg.max_query_tokens, max_sentence_tokens=cfg.max_sentence_tokens,
                                   rng=random.Random(0), bf16=False)
    return time.perf_counter() - t0


def _encode(cfg: FedConfig, model, client) -> float:
    t0 = time.perf_counter()
    local.encode_texts(model, client.sentences, max_length=cfg.max_sentence_tokens)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path("runs/fed-squad"))
    ap.add_argument("--client", default="client_07")
    ap.add_argument("--trainable", default="top:2")
    ap.add_argument("--train-fraction", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per path (the first cached one fills the cache)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = FedConfig(trainable=args.trainable, train_fraction=args.train_fraction)
    client = load_client(args.data / args.client)
    questions = local.train_questions(client, 0, cfg.seed, cfg.train_fraction)
    gold = local.gold_indices(client, questions)
    negatives = local.epoch_negatives(None, client, questions, gold, "bm25", cfg, random.Random(0), {})
    plain, cached = new_encoder(cfg), new_encoder(cfg)
    fp.disable_frozen_prefix(plain)
    rows = {"plain": {"epoch_s": [], "encode_s": []}, "cached": {"epoch_s": [], "encode_s": []}}
    for _ in range(args.epochs):  # in turns, so that machine noise hits both paths alike
        for name, model in (("plain", plain), ("cached", cached)):
            rows[name]["epoch_s"].append(round(_epoch(cfg, model, client, questions, negatives), 2))
            rows[name]["encode_s"].append(round(_encode(cfg, model, client), 2))
    ratio_epoch = min(rows["plain"]["epoch_s"]) / min(rows["cached"]["epoch_s"][1:] or rows["cached"]["epoch_s"])
    ratio_encode = min(rows["plain"]["encode_s"]) / min(rows["cached"]["encode_s"])
    result = {"client": args.client, "trainable": args.trainable, "questions": len(questions),
              "sentences": len(client.sentences), "threads": args.threads, "machine": platform.processor() or
              platform.machine(), **rows, "speedup_epoch": round(ratio_epoch, 2), "speedup_encode": round(ratio_encode, 2)}
    print(f"| path | epoch s ({len(questions)} questions) | encode s ({len(client.sentences)} sentences) |")
    print("|---|---|---|")
    for name in rows:
        print(f"| {name} | {rows[name]['epoch_s']} | {rows[name]['encode_s']} |")
    print(f"speed-up (best plain / best cached after the fill): epoch {ratio_epoch:.2f}x, encode {ratio_encode:.2f}x")
    if args.json:
        write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()
