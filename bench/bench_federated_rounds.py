"""What a FedAvg round of PDD-AS2 costs: seconds, bytes and MRR@10 per variant, side by side in one process.
docs/results.md, "Federated answer sentence selection" (round cost; results/federated_rounds_4r/, federated_rounds/).
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_federated_rounds.py --threads 1 --rounds 4 --remine-every 3 \\
        --variants bias-top3-fp16 top2-fp16-lr1e-4 before --out bench/results/federated_rounds_4r
2 CPU cores: about 30 min (4 rounds: 253 s for top2-fp16-lr1e-4, 641 s for before; then the evaluations)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench_federated import add_data_arguments, per_question, prepare

from privret.data.fed_squad import load_fed_squad
from privret.evaluate.statistics import paired_bootstrap_ci
from privret.federated import local
from privret.federated.arrays import load_arrays, load_weights, new_encoder
from privret.settings.federated import FedConfig
from privret.federated.runner import run_federated_local, save_result
VARIANTS = {
    "before": dict(trainable="all", wire_dtype="float32", remine_every=1),
    "layers-fp32": dict(trainable="layers", wire_dtype="float32"),
    "layers-fp16": dict(trainable="layers", wire_dtype="float16"),
    "layers-bf16": dict(trainable="layers", wire_dtype="bfloat16"),
    "top2-fp16": dict(trainable="top:2", wire_dtype="float16"),
    "top2-fp16-lr1e-4": dict(trainable="top:2", wire_dtype="float16", learning_rate=1e-4),
    "bias-top3-fp16": dict(trainable="bias-top:3", wire_dtype="float16", learning_rate=1e-3),
}


def run_variant(name: str, args, out: Path) -> dict:
    path = out / f"{name}.json"
    if path.is_file():
        print(f"[skip] {name} (done: {path})", flush=True)
        return json.loads(path.read_text())
    knobs = {"remine_every": args.remine_every, **VARIANTS[name]}
    cfg = FedConfig(model=args.model, rounds=args.rounds, warmup_rounds=args.warmup_rounds,
                    train_fraction=args.train_fraction, personalize=[], seed=args.seed, per_query_metrics=True,
                    **knobs)
    print(f"[run] {name}: {knobs}", flush=True)
    t0 = time.time()
    res = run_federated_local(cfg, args.data, args.work / name, resume=True)
    save_result(path, {"config": res["config"], "rounds": res["rounds"], **res["evaluations"]["pdd-as2"]},
                seconds=round(time.time() - t0, 1))
    return json.loads(path.read_text())


def validate(name: str, args, out: Path) -> dict:
    """Pooled metrics of the variant's final global model on every client's validation questions."""
    path = out / f"{name}.json"
    result = json.loads(path.read_text())
    if "validation" in result:
        return result
    cfg = FedConfig(**{**result["config"], "evaluation_split": "validation", "per_query_metrics": True})
    model = new_encoder(cfg)
    load_weights(model, load_arrays(args.work / name / "global.npz"))
    per_client = {}
    for c in load_fed_squad(args.data):
        questions = local.evaluation_questions(c, cfg)
        s = local.encode_texts(model, c.sentences, max_length=cfg.max_sentence_tokens)
        q = local.encode_texts(model, [x.text for x in questions], max_length=cfg.max_query_tokens)
        per_client[c.name] = local.evaluate_scores(q @ s.T, c, questions, per_query=True)
    result["validation"] = {"per_client": per_client, **local.pooled(per_client)}
    save_result(path, result)
    return result


def table(results: dict[str, dict]) -> str:
    lines = ["| variant | trainable | lr | wire | re-mine every | s/round bm25 | s/round hard (mining) | "
             "s/round hard-reuse | MB down+up per round | validation S MRR@10 | test S MRR@10 | test P MRR@10 |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def seconds(rounds: list[dict], stage: str) -> str:
        s = [x["seconds"] for x in rounds if x["stage"] == stage]
        return f"{sum(s) / len(s):.1f}" if s else "-"

    for name, r in results.items():
        cfg, rounds = r["config"], r["rounds"]
        mb = sum(x["bytes_down"] + x["bytes_up"] for x in rounds) / len(rounds) / 1e6
        lines.append(f"| {name} | {cfg['trainable']} | {cfg['learning_rate']:g} | {cfg['wire_dtype']} | "
                     f"{cfg['remine_every']} | {seconds(rounds, 'bm25')} | {seconds(rounds, 'hard')} | "
                     f"{seconds(rounds, 'hard-reuse')} | {mb:.1f} | "
                     f"{r['validation']['sentence']['mrr@10']:.4f} | "
                     f"{r['pooled']['sentence']['mrr@10']:.4f} | {r['pooled']['passage']['mrr@10']:.4f} |")
    return "\n".join(lines) + "\n" + paired_differences(results)


def paired_differences(results: dict[str, dict]) -> str:
    """Each variant's sentence MRR@10 minus the first variant's, with the paired bootstrap 95% CI over the same
    questions (validation and test); variants without per-question scores are left out."""
    scored = {name: r for name, r in results.items() if "per_client" in r and "per_client" in r["validation"]}
    if len(scored) < 2:
        return ""
    (base_name, base), *others = scored.items()
    lines = ["", f"Paired against {base_name} (sentence MRR@10; 95% bootstrap CI over the questions):", "",
             "| variant | validation delta [95% CI] | test delta [95% CI] |", "|---|---:|---:|"]
    for name, r in others:
        cells = []
        for split in ("validation", "test"):
            a = per_question(base["validation"] if split == "validation" else base)
            b = per_question(r["validation"] if split == "validation" else r)
            ids = sorted(a)
            x, y = [a[q] for q in ids], [b[q] for q in ids]
            lo, hi = paired_bootstrap_ci(x, y)
            cells.append(f"{(sum(y) - sum(x)) / len(ids):+.4f} [{lo:+.4f}, {hi:+.4f}]")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_data_arguments(ap, out="bench/results/federated_rounds", work="runs/bench-federated-rounds")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), help=(
        "each a full federated run, same data, rounds and seed, scored by its final global model on validation (the "
        "training questions it leaves out; test beside, never chosen on): before = every weight, float32 on the wire, "
        "re-mining in every hard round (the baseline; --remine-every applies to the others); layers-* = embeddings "
        "frozen, the wire in that dtype; top2-* = the top two layers train and travel, the frozen lower layers' "
        "outputs cached per text; bias-top3-fp16 = BitFit of the top three layers at lr 1e-3. OUT/<variant>.json "
        "is skipped when it exists; OUT/rounds.md holds the table with paired CIs against the first variant"))
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--remine-every", type=int, default=1)
    ap.add_argument("--train-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    prepare(args)
    for name in args.variants:
        run_variant(name, args, args.out)
    results = {name: validate(name, args, args.out) for name in args.variants}
    text = table(results)
    (args.out / "rounds.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
