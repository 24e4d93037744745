"""What the federated benchmark scripts share: Fed-SQuAD arguments, resumable steps, per-question scores."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from privret.data.fed_squad import build_fed_squad
from privret.federated.config import FedConfig
from privret.federated.runner import save_result

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "squad-v1.1-dev-40.json"


def add_data_arguments(ap: argparse.ArgumentParser, *, out: str, work: str) -> None:
    ap.add_argument("--squad", type=Path, default=SQUAD)
    ap.add_argument("--data", type=Path, default=Path("runs/fed-squad"), help="Fed-SQuAD dir (built if missing)")
    ap.add_argument("--out", type=Path, default=Path(out), help="results (small JSON)")
    ap.add_argument("--work", type=Path, default=Path(work), help="checkpoints (large)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")


def add_recipe_arguments(ap: argparse.ArgumentParser, *, trainable: str, learning_rate: float) -> None:
    """Stage 1's recipe: 10 rounds, 10% of each client's training questions, re-mining every 3rd hard round."""
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--trainable", default=trainable)
    ap.add_argument("--learning-rate", type=float, default=learning_rate)
    ap.add_argument("--train-fraction", type=float, default=0.1)
    ap.add_argument("--remine-every", type=int, default=3)


def recipe(args: argparse.Namespace, **fields) -> FedConfig:
    """The FedConfig of :func:`add_recipe_arguments`' options, with ``fields`` on top."""
    return FedConfig(rounds=args.rounds, trainable=args.trainable, learning_rate=args.learning_rate,
                     train_fraction=args.train_fraction, remine_every=args.remine_every, **fields)


def prepare(args: argparse.Namespace) -> None:
    """Threads set, Fed-SQuAD built when missing, the output directory made."""
    torch.set_num_threads(args.threads)
    if not args.data.is_dir():
        build_fed_squad(args.squad, args.data)
    args.out.mkdir(parents=True, exist_ok=True)


def step(path: Path, fn) -> dict:
    """``fn()`` saved to ``path`` with its seconds, or what ``path`` already holds (so a rerun resumes)."""
    if path.is_file():
        print(f"[skip] {path}", flush=True)
        return json.loads(path.read_text())
    print(f"[run] {path}", flush=True)
    t0 = time.time()
    save_result(path, fn(), seconds=round(time.time() - t0, 1))
    return json.loads(path.read_text())


def per_question(result: dict, level: str = "sentence") -> dict[str, float]:
    """Question id -> reciprocal rank over every client of an evaluation (``per_query_metrics`` on)."""
    return {q: v for m in result["per_client"].values() for q, v in m[level]["per_query"].items()}


def seed_mean(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Question id -> its score averaged over seeds (the paired CIs are over these)."""
    return {q: float(np.mean([r[q] for r in per_seed])) for q in per_seed[0]}
