"""Client-customized query encoders (CCQE, thesis 4.2.2) with their fine-tune chosen on validation.

After 10 FedAvg rounds the shipped CCQE step (1 epoch at lr 1e-5: one or two Adam steps on a client's 13 to 103
training questions) left the global model where it was (+0.0002 [-0.0010, +0.0013] sentence MRR@10). Here the
personalisation's epochs and learning rate are chosen on validation (each client's training questions that
``--train-fraction`` leaves out), from the same stage-1 global model, never on test:

1. ``stage1``: the FedAvg rounds (``--trainable``, ``--learning-rate``, no personalisation), the global model
   scored on validation;
2. ``ccqe:<epochs>x<lr>`` for each ``--candidates``: every client fine-tunes its own query encoder from that global
   model, scored on validation beside the global model;
3. the candidate with the best validation MRR@10 (none, when none beats the global model), then test: PDD-AS2,
   + CCQE and + Fed-Negative with that fine-tune, and the paired 95% bootstrap CI of each step over the test
   questions (seed-averaged per-question scores when ``--seeds`` has several).

Each step writes ``OUT/<step>.json`` and is skipped when it exists; the stage-1 rounds resume from
``WORK/seed-S``:

    OMP_NUM_THREADS=1 .venv/bin/python bench/federated_personalization.py --candidates 1x1e-5 3x3e-5 5x1e-4 \\
        --out bench/results/federated_ccqe --work runs/federated-ccqe
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from fed_steps import add_data_arguments, add_recipe_arguments, per_question, prepare, recipe, seed_mean, step

from privret.evaluate.statistics import mean_sd, paired_bootstrap_ci
from privret.federated.runner import run_federated_local

ORDER = ["pdd-as2", "+query-encoders", "+query-encoders+fed-negative"]


def candidate(text: str) -> tuple[int, float]:
    epochs, lr = text.split("x")
    return int(epochs), float(lr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap, out="bench/results/federated_ccqe", work="runs/federated-ccqe")
    ap.add_argument("--candidates", nargs="+", required=True, help="personal fine-tunes as EPOCHSxLR, e.g. 3x3e-5")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="test runs (seed 0 is also the validation run)")
    add_recipe_arguments(ap, trainable="layers", learning_rate=3e-5)
    args = ap.parse_args()
    prepare(args)
    base = recipe(args, per_query_metrics=True)

    def run(seed: int, split: str, personalize: list[str], epochs: int = 1, lr: float = 1e-5) -> dict:
        cfg = base.model_copy(update={"seed": seed, "evaluation_split": split, "personalize": personalize,
                                      "personal_epochs": epochs, "personal_learning_rate": lr})
        res = run_federated_local(cfg, args.data, args.work / f"seed-{seed}")  # stage 1 resumes, never repeats
        return {"evaluations": res["evaluations"], "rounds": res["rounds"], "config": res["config"]}

    stage1 = step(args.out / "stage1-seed0-validation.json", lambda: run(0, "validation", []))
    global_score = stage1["evaluations"]["pdd-as2"]["pooled"]["sentence"]["mrr@10"]
    scores = {}
    for text in args.candidates:
        epochs, lr = candidate(text)
        res = step(args.out / f"ccqe-{text}-validation.json",
                   lambda e=epochs, r=lr: run(0, "validation", ["local"], e, r))
        scores[text] = res["evaluations"]["+query-encoders"]["pooled"]["sentence"]["mrr@10"]
    best = max(scores, key=scores.get)
    chosen = best if scores[best] > global_score else None
    summary = {"recipe": {"trainable": args.trainable, "learning_rate": args.learning_rate, "rounds": args.rounds,
                          "train_fraction": args.train_fraction},
               "validation": {"pdd-as2": global_score, **{f"ccqe {k}": v for k, v in scores.items()}},
               "chosen": chosen}
    if chosen is not None:
        epochs, lr = candidate(chosen)
        tests = [step(args.out / f"test-seed{s}.json", lambda s=s: run(s, "test", ["local", "fed"], epochs, lr))
                 for s in args.seeds]
        per_seed = {name: [per_question(t["evaluations"][name]) for t in tests] for name in ORDER}
        ids = sorted(per_seed["pdd-as2"][0])
        means = {name: [seed_mean(runs)[q] for q in ids] for name, runs in per_seed.items()}
        summary["test"] = {name: dict(zip(("mean", "sd"), mean_sd(
            [t["evaluations"][name]["pooled"]["sentence"]["mrr@10"] for t in tests]))) for name in ORDER}
        summary["test_steps"] = {f"{a} -> {b}": {"delta": float(np.mean(means[b]) - np.mean(means[a])),
                                                 "ci95": list(paired_bootstrap_ci(means[a], means[b]))}
                                 for a, b in zip(ORDER, ORDER[1:])}
        summary["seeds"] = args.seeds
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
