"""The Fed-SQuAD table: BM25, zero-shot, local-only, PDD-AS2, + CCQE, + Fed-Negative, central, DP-FedAvg rows.
Reproduces docs/results.md, "Federated answer sentence selection" (bench/results/federated_10_rounds/table.md).
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_federated.py --threads 1 --seeds 0 1 2 --rounds 10 \\
        --remine-every 3 --eval-every 3 --dp-epsilons 8 3 --out bench/results/federated_10_rounds --work runs/fed10
2 CPU cores, one thread: a seed's 10 FedAvg rounds about 45 min, each DP row about 17 min; hours in all."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from privret.data.fed_squad import build_fed_squad, load_fed_squad
from privret.evaluate.statistics import mean_sd, paired_bootstrap_ci
from privret.federated import local
from privret.settings.federated import FedConfig
from privret.federated.strategy import with_target_epsilon
from privret.privacy.budget import BudgetPolicy
from privret.federated.runner import (
    evaluate_bm25_all,
    evaluate_zero_shot,
    run_federated_local,
    save_result,
    train_central,
    train_local_only,
)

ROWS = [("BM25", "bm25"), ("zero-shot encoder", "zero-shot"), ("local-only", "local-only"),
        ("PDD-AS2", "pdd-as2"), ("+ client-customized query encoders", "+query-encoders"),
        ("+ Fed-Negative", "+query-encoders+fed-negative"), ("central (upper bound)", "central")]
ORDERING = ["local-only", "pdd-as2", "+query-encoders", "+query-encoders+fed-negative", "central"]
SEEDLESS = ("bm25", "zero-shot")
LABEL = dict((key, label) for label, key in ROWS)


# What the federated scripts share (bench/federated_dp_regime.py and bench/bench_federated_rounds.py import it)
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


RUN_MISSING = True  # False with --table-only: a step whose file is missing is left out, never run


def _step(path: Path, fn) -> dict | None:
    if path.is_file():
        print(f"[skip] {path} (done)", flush=True)
        return json.loads(path.read_text())
    if not RUN_MISSING:
        print(f"[missing] {path} (left out of the table)", flush=True)
        return None
    print(f"[run] {path}", flush=True)
    t0, c0 = time.time(), time.process_time()
    result = fn()
    save_result(path, result, seconds=round(time.time() - t0, 1), cpu_seconds=round(time.process_time() - c0, 1))
    print(f"[done] {path} in {time.time() - t0:.0f}s", flush=True)
    return json.loads(path.read_text())


def _local_only(cfg: FedConfig, clients, out: Path) -> dict:
    """Per-client checkpoints: a client already trained is not trained again."""
    part = out / "local-only"
    part.mkdir(parents=True, exist_ok=True)
    per_client, curves = {}, {}
    for c in clients:
        res = _step(part / f"{c.name}.json", lambda c=c: train_local_only(cfg, [c]))
        if res is None:
            return None
        per_client[c.name] = res["per_client"][c.name]
        curves[c.name] = res.get("curve", {})
    result = {"per_client": per_client, "pooled": local.pooled(per_client)}
    if cfg.eval_every:
        result["curve"] = {rnd: local.pooled({c: {lv: curves[c][rnd][lv] for lv in local.LEVELS} for c in curves})
                           for rnd in curves[clients[0].name]}
    return result


def run_seed(cfg: FedConfig, clients, args, out: Path) -> dict[str, dict] | None:
    """The seed's rows (None with --table-only when its federated run is not done)."""
    out.mkdir(parents=True, exist_ok=True)
    results = {"local-only": _local_only(cfg, clients, out)}
    fed = _step(out / "federated.json", lambda: run_federated_local(cfg, args.data, args.work / out.name))
    if fed is None:
        return None
    results.update(fed["evaluations"])
    results["federated"] = fed
    results["central"] = _step(out / "central.json", lambda: train_central(cfg, clients))
    for epsilon in args.dp_epsilons:  # DP-FedAvg rows: stage 1 only, its global model evaluated
        private = with_target_epsilon(cfg.model_copy(update={"dp": "server", "dp_clip_norm": args.dp_clip_norm,
                                                             "personalize": []}), epsilon)
        name = f"dp-eps{epsilon:g}"
        run = _step(out / f"{name}.json",  # the rows are alternatives to compare, not releases made together
                    lambda c=private, n=name: run_federated_local(c, args.data, args.work / f"{out.name}-{n}",
                                                                  budget=BudgetPolicy(allow_over=True)))
        if run is None:
            continue
        results[name] = {**run["evaluations"]["pdd-as2"], "ledger": run["ledger"]}
        LABEL.setdefault(name, f"PDD-AS2, DP-FedAvg ε = {epsilon:g} (ledger ε {run['ledger']['epsilon']:.2f})")
    return {key: value for key, value in results.items() if value is not None}


def _fmt(values: list[float]) -> str:
    mean, sd = mean_sd(values)
    return f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f} ± {sd:.3f}"


def table(seedless: dict[str, dict], seeds: dict[int, dict[str, dict]], clients) -> str:
    """The markdown report: pooled rows, the ordering's paired CIs, per-client MRR@10, the rounds' cost."""
    keys = [key for _, key in ROWS] + sorted({k for s in seeds.values() for k in s if k.startswith("dp-eps")})
    rows = {key: [seedless[key]] if key in seedless else [seeds[s][key] for s in seeds if key in seeds[s]]
            for key in keys}
    rows = {k: v for k, v in rows.items() if v}
    n_seeds = len(seeds)
    lines = [f"Pooled over {rows['bm25'][0]['pooled']['sentence']['queries']} test questions; trained rows: mean ± sd "
             f"over {n_seeds} seed(s) ({', '.join(map(str, seeds))}).", "",
             "| method | S MRR@10 | S R@1 | S R@20 | P MRR@10 | P R@1 |", "|---|---|---|---|---|---|"]
    for key, results in rows.items():
        cells = [_fmt([r["pooled"][lv][m] for r in results])
                 for lv, m in (("sentence", "mrr@10"), ("sentence", "recall@1"), ("sentence", "recall@20"),
                               ("passage", "mrr@10"), ("passage", "recall@1"))]
        fewer = "" if key in seedless or len(results) == n_seeds else \
            f" (seed {', '.join(str(s) for s in seeds if key in seeds[s])} only)"
        lines.append(f"| {LABEL[key]}{fewer} | " + " | ".join(cells) + " |")
    lines += ["", "Each step of the ordering: difference in sentence MRR@10 (seed means), with the paired 95% "
              "bootstrap CI over the test questions of the seed-averaged per-question reciprocal ranks:", "",
              "| step | Δ S MRR@10 | 95% CI |", "|---|---:|---|"]
    per_q = {k: seed_mean([per_question(r) for r in v]) for k, v in rows.items()}
    steps = [(a, b) for a, b in zip(ORDERING, ORDERING[1:]) if a in rows and b in rows]
    steps += [("local-only", "+query-encoders")] if "+query-encoders" in rows else []
    steps += [("zero-shot", key) for key in rows if key.startswith("dp-eps")]  # the DP goal: above zero-shot
    for a, b in steps:
        qs = sorted(per_q[a])
        lo, hi = paired_bootstrap_ci([per_q[a][q] for q in qs], [per_q[b][q] for q in qs])
        delta = np.mean([per_q[b][q] - per_q[a][q] for q in qs])
        lines.append(f"| {LABEL[a]} → {LABEL[b]} | {delta:+.4f} | [{lo:+.4f}, {hi:+.4f}] |")
    lines += ["", "Per client, sentence MRR@10 (seed means; train questions used; test questions):", "",
              "| client | train q | test q | " + " | ".join(LABEL[k] for k in rows) + " |",
              "|---|---|---|" + "---|" * len(rows)]
    cfg = FedConfig(**next(iter(seeds.values()))["federated"]["config"])
    for c in clients:
        n_train = len(local.train_questions(c, cfg.max_train_questions, cfg.seed, cfg.train_fraction))
        cells = [f"{np.mean([r['per_client'][c.name]['sentence']['mrr@10'] for r in rows[k]]):.3f}" for k in rows]
        lines.append(f"| {c.name} | {n_train} | {len(c.split('test'))} | " + " | ".join(cells) + " |")
    lines += ["", "Cost (seed 0's run unless said otherwise):", ""]
    fed = next(iter(seeds.values()))["federated"]
    for r in fed["rounds"]:
        lines.append(f"- FedAvg round {r['round']} ({r['stage']}): {r['bytes_down'] / 1e6:.1f} MB down + "
                     f"{r['bytes_up'] / 1e6:.1f} MB up, {r['seconds']:.0f} s")
    exchanges = fed["evaluations"].get("+query-encoders+fed-negative", {}).get("fed_negative_exchanges", [])
    for ex in exchanges:
        lines.append(f"- Fed-Negative exchange: {ex['query_bytes'] / 1e6:.2f} MB of query embeddings + "
                     f"{ex['answer_bytes'] / 1e6:.2f} MB of answers = {ex['total_bytes'] / 1e6:.2f} MB "
                     f"peer-to-peer ({ex['relayed_bytes'] / 1e6:.2f} MB through the SuperLink)")
    for h in fed["evaluations"].get("+query-encoders+fed-negative", {}).get("fed_negative_hardness", []):
        m = h["mean"]
        lines.append(f"- Fed-Negative hardness (clients weighted by training questions): mean score "
                     f"{m['fed_score']:.3f} against {m['local_score']:.3f} for the local top "
                     f"{cfg.personal_negatives}; {m['fed_above_local_nth']:.1%} of Fed-Negatives would enter it; "
                     f"the best Fed-Negative beats the best local negative for {m['fed_best_above_local_best']:.1%} "
                     f"of queries")
    if exchanges and "+query-encoders" in rows and "+query-encoders+fed-negative" in rows:
        gain = np.mean([r["pooled"]["sentence"]["mrr@10"] for r in rows["+query-encoders+fed-negative"]]) - \
            np.mean([r["pooled"]["sentence"]["mrr@10"] for r in rows["+query-encoders"]])
        mb = sum(ex["total_bytes"] for ex in exchanges) / 1e6
        lines.append(f"- Fed-Negative gains {gain:+.4f} sentence MRR@10 for {mb:.2f} MB: {gain / mb:+.5f} per MB")
    return "\n".join(lines) + "\n"


def curve_plot(seeds: dict[int, dict[str, dict]], path: Path) -> None:
    """Sentence MRR@10 per round, PDD-AS2's global model against local-only (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def points(curves: list[dict]) -> tuple[list[int], list[float]]:
        rounds = sorted(set.intersection(*(set(map(int, c)) for c in curves)))
        return rounds, [float(np.mean([c[str(r)]["sentence"]["mrr@10"] for c in curves])) for r in rounds]

    fed = [{**{str(r["round"]): r["evaluation"] for r in s["federated"]["rounds"] if "evaluation" in r},
            str(s["federated"]["config"]["rounds"]): s["pdd-as2"]["pooled"]} for s in seeds.values()]
    lo = [{str(k): v for k, v in s["local-only"]["curve"].items()} for s in seeds.values()]
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curves in (("PDD-AS2 (global model)", fed), ("local-only", lo)):
        x, y = points(curves)
        ax.plot(x, y, marker="o", label=label)
    ax.set_xlabel("round (local-only: epochs)")
    ax.set_ylabel("sentence MRR@10, pooled")
    ax.set_title(f"Fed-SQuAD, mean over {len(seeds)} seed(s)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap, out="bench/results/federated", work="runs/bench-federated")
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--train-fraction", type=float, default=0.1)
    ap.add_argument("--remine-every", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--trainable", default="layers")
    ap.add_argument("--wire-dtype", default="float16")
    ap.add_argument("--personal-epochs", type=int, default=1)
    ap.add_argument("--dp-epsilons", type=float, nargs="*", default=[],
                    help="also DP-FedAvg rows (server-side clipping) at these client-level epsilons over the rounds")
    ap.add_argument("--dp-clip-norm", type=float, default=1e-3, help="C of the DP-FedAvg rows (chosen a priori)")
    ap.add_argument("--inversion", action="store_true", help="also run the (tiny) embedding inversion check")
    ap.add_argument("--table-only", action="store_true",
                    help="run nothing: write table.md and curve.png from the steps already done (a seed whose "
                         "federated run is missing is left out, and so is any missing row)")
    args = ap.parse_args()
    global RUN_MISSING
    RUN_MISSING = not args.table_only
    prepare(args)
    clients = load_fed_squad(args.data)

    def config(seed: int) -> FedConfig:
        return FedConfig(model=args.model, rounds=args.rounds, warmup_rounds=args.warmup_rounds,
                         local_epochs=args.local_epochs, train_fraction=args.train_fraction,
                         remine_every=args.remine_every, eval_every=args.eval_every, trainable=args.trainable,
                         wire_dtype=args.wire_dtype, personal_epochs=args.personal_epochs, seed=seed,
                         per_query_metrics=True)

    if not args.table_only:
        (args.out / "config.json").write_text(json.dumps(config(args.seeds[0]).model_dump(mode="json"), indent=2)
                                              + "\n")
    seedless = {"bm25": _step(args.out / "bm25.json", lambda: evaluate_bm25_all(config(args.seeds[0]), clients)),
                "zero-shot": _step(args.out / "zero-shot.json",
                                   lambda: evaluate_zero_shot(config(args.seeds[0]), clients))}
    seeds = {s: run_seed(config(s), clients, args, args.out / f"seed-{s}") for s in args.seeds}
    seeds = {s: rows for s, rows in seeds.items() if rows is not None}
    if args.inversion:
        from privret.audit.inversion import InversionConfig, inversion_check

        _step(args.out / "inversion.json", lambda: inversion_check(clients, InversionConfig(encoder=args.model)))
    text = table(seedless, seeds, clients)
    (args.out / "table.md").write_text(text)
    if args.eval_every:
        curve_plot(seeds, args.out / "curve.png")
    print(text)


if __name__ == "__main__":
    main()
