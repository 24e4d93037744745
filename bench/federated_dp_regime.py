"""DP-FedAvg at client level on Fed-SQuAD, BitFit of the top 3 layers, its clip norm chosen on validation.
Reproduces docs/results.md, "Federated answer sentence selection" (the DP-FedAvg rows at epsilon 8 and 3).
    OMP_NUM_THREADS=1 .venv/bin/python bench/federated_dp_regime.py --clips 0.03 0.1 0.3 --seeds 0 1 2 \\
        --out bench/results/federated_dp --work runs/federated-dp    # epsilon 3: bench/README.md
2 CPU cores, one thread: 13 to 20 min a DP run of 10 rounds, about 1.5 h for the command."""

from __future__ import annotations

import argparse
import json

from bench_federated import add_data_arguments, add_recipe_arguments, per_question, prepare, recipe, seed_mean, step

from privret.data.fed_squad import load_fed_squad
from privret.evaluate.statistics import mean_sd, paired_bootstrap_ci
from privret.settings.federated import FedConfig
from privret.federated.runner import evaluate_zero_shot, run_federated_local
from privret.federated.strategy import with_target_epsilon
from privret.privacy.budget import BudgetPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap, out="bench/results/federated_dp", work="runs/federated-dp")
    ap.add_argument("--epsilon", type=float, default=8.0)
    ap.add_argument("--clips", type=float, nargs="+", required=True, help="candidate clip norms C")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="test runs of the chosen C")
    add_recipe_arguments(ap, trainable="bias-top:3", learning_rate=1e-3)
    args = ap.parse_args()
    prepare(args)
    clients = load_fed_squad(args.data)
    base = recipe(args, personalize=[], per_query_metrics=True, dp="server")

    def config(clip: float, seed: int, split: str) -> FedConfig:
        # per-question ranks on test only: under DP a validation split's would give away the clients' sizes
        return with_target_epsilon(base.model_copy(update={"dp_clip_norm": clip, "seed": seed,
                                                           "evaluation_split": split,
                                                           "per_query_metrics": split == "test"}), args.epsilon)

    def dp_run(clip: float, seed: int, split: str) -> dict:
        # the same run directory for both splits: the test evaluation resumes the finished rounds; the runs are
        # candidates and repeats to compare, not releases made together
        res = run_federated_local(config(clip, seed, split), args.data, args.work / f"clip{clip:g}-seed{seed}",
                                  budget=BudgetPolicy(allow_over=True))
        return {**res["evaluations"]["pdd-as2"], "ledger": res["ledger"], "rounds": res["rounds"]}

    zero = {split: step(args.out / f"zero-shot-{split}.json",
                        lambda s=split: evaluate_zero_shot(base.model_copy(update={"evaluation_split": s}), clients))
            for split in ("validation", "test")}
    validation = {clip: step(args.out / f"clip{clip:g}-seed0-validation.json",
                             lambda c=clip: dp_run(c, 0, "validation")) for clip in args.clips}
    score = {clip: r["pooled"]["sentence"]["mrr@10"] for clip, r in validation.items()}
    best = max(score, key=score.get)
    chosen = best if score[best] > zero["validation"]["pooled"]["sentence"]["mrr@10"] else None
    summary = {"epsilon": args.epsilon, "trainable": args.trainable, "learning_rate": args.learning_rate,
               "rounds": args.rounds, "zero_shot": {s: z["pooled"]["sentence"]["mrr@10"] for s, z in zero.items()},
               "validation": {f"{c:g}": v for c, v in score.items()}, "chosen_clip": chosen}
    if chosen is not None:
        tests = [step(args.out / f"clip{chosen:g}-seed{s}-test.json", lambda s=s: dp_run(chosen, s, "test"))
                 for s in args.seeds]
        zero_q = per_question(zero["test"])
        runs = seed_mean([per_question(t) for t in tests])
        ids = sorted(zero_q)
        mean_q = [runs[q] for q in ids]
        mean, sd = mean_sd([t["pooled"]["sentence"]["mrr@10"] for t in tests])
        lo, hi = paired_bootstrap_ci([zero_q[q] for q in ids], mean_q)
        summary["test"] = {"seeds": args.seeds, "mrr10_mean": mean, "mrr10_sd": sd,
                           "delta_vs_zero_shot": mean - summary["zero_shot"]["test"], "delta_ci95": [lo, hi],
                           "ledger_epsilon": [t["ledger"]["epsilon"] for t in tests],
                           "noise_multiplier": tests[0]["ledger"]["noise_multiplier"]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
