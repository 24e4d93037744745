"""Rows of retrievers trained and evaluated over several seeds: mean +- sd, paired bootstrap CIs, retention.
Writes the row files of docs/results.md, "Direct DP training of the retriever" and "DP synthetic queries".
    .venv/bin/python bench/seed_rows.py --dataset squad --zero-shot Z --original O... --row NAME LEDGER_DIR EVAL... \\
        --bar NAME --json bench/results/direct_regimes_squad_pn1_fp32.json     # the full commands: bench/README.md
Seconds on 2 CPU cores."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from privret.evaluate.statistics import mean_sd, paired_bootstrap_ci, retention


def per_query(eval_dir: Path) -> dict[str, float]:
    return {q: v["ndcg@10"] for q, v in json.loads((eval_dir / "per_query.json").read_text()).items()}


def seeds(eval_dirs: list[Path]) -> tuple[list[float], dict[str, float]]:
    """(NDCG@10 of each seed, per-query NDCG@10 averaged over the seeds)."""
    runs = [per_query(d) for d in eval_dirs]
    if any(set(r) != set(runs[0]) for r in runs):
        raise SystemExit(f"{eval_dirs}: the evaluations cover different queries")
    return [sum(r.values()) / len(r) for r in runs], {q: sum(r[q] for r in runs) / len(runs) for q in runs[0]}


def ci(base: dict[str, float], other: dict[str, float]) -> list[float]:
    queries = sorted(base)
    return list(paired_bootstrap_ci([base[q] for q in queries], [other[q] for q in queries]))


UTILITY_ROW_KEYS = ("name", "epsilon", "ndcg10_mean", "ndcg10_sd", "seeds", "delta_ci95", "retention")


def utility_entry(result: dict) -> dict:
    """A dataset's object of bench/results/privacy_utility.json (zero-shot, original, rows) from this script's ``--json``
    output: zero-shot, the original's mean and every row, in order."""
    return {"zero_shot": result["zero_shot"], "original": {"ndcg10": result["original"]["ndcg10"]},
            "rows": [{k: row[k] for k in UTILITY_ROW_KEYS} for row in result["rows"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zero-shot", type=Path, required=True, help="evaluation directory of the zero-shot model")
    original = parser.add_mutually_exclusive_group(required=True)
    original.add_argument("--original", type=Path, nargs="+", help="evaluation directories, one per seed")
    original.add_argument("--original-ndcg", type=float, default=None,
                          help="only the original row's mean NDCG@10 is known (measured earlier, its per-query figures "
                               "gone): retention against it, no CI against the original")
    parser.add_argument("--row", nargs="+", action="append", default=[], metavar="NAME LEDGER_DIR EVAL_DIR",
                        help="a row: its name, the directory of its ledger, then one evaluation directory per seed")
    parser.add_argument("--bar", action="append", default=[], metavar="NAME",
                        help="a row's name: every other row also gets a paired CI against it (repeatable)")
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--utility-json", type=Path, default=None,
                        help="also set this dataset's entry of bench/results/privacy_utility.json")
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--append", action="store_true",
                        help="add these rows to the dataset's entry of --utility-json (a row of the same name is "
                             "replaced) instead of replacing the entry; its zero-shot and original stay")
    args = parser.parse_args()
    zero = per_query(args.zero_shot)
    zero_mean = sum(zero.values()) / len(zero)
    if args.original:
        original_scores, original = seeds(args.original)
        original_mean, original_sd = mean_sd(original_scores)
    else:
        original_scores, original, original_mean, original_sd = [args.original_ndcg], None, args.original_ndcg, None
    rows, averaged_of = [], {}
    for name, ledger_dir, *eval_dirs in args.row:
        scores, averaged = seeds([Path(d) for d in eval_dirs])
        mean, sd = mean_sd(scores)
        averaged_of[name] = averaged
        ledger = json.loads((Path(ledger_dir) / "privacy_ledger.json").read_text())
        rows.append({"name": name, "epsilon": ledger["epsilon"], "delta": ledger["delta"],
                     "ndcg10_seeds": scores, "ndcg10_mean": mean, "ndcg10_sd": sd, "seeds": len(scores),
                     "delta_ci95": ci(zero, averaged),
                     "delta_vs_original_ci95": ci(original, averaged) if original else None,
                     "retention": retention(mean, zero_mean, original_mean)})
    unknown = set(args.bar) - set(averaged_of)
    if unknown:
        raise SystemExit(f"--bar {sorted(unknown)}: no --row of that name")
    for row in rows:
        row["delta_vs_bar_ci95"] = {bar: ci(averaged_of[bar], averaged_of[row["name"]])
                                    for bar in args.bar if bar != row["name"]}
    result = {"dataset": args.dataset, "zero_shot": {"ndcg10": zero_mean},
              "original": {"ndcg10": original_mean, "ndcg10_sd": original_sd, "ndcg10_seeds": original_scores,
                           "seeds": len(original_scores) if args.original else None,
                           "delta_ci95": ci(zero, original) if original else None},
              "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.utility_json is not None:
        existing = json.loads(args.utility_json.read_text()) if args.utility_json.exists() else {}
        fresh = utility_entry(result)
        entry = existing.get(args.dataset) if args.append else None
        if entry is None:
            entry = fresh
        else:
            names = {row["name"] for row in fresh["rows"]}
            entry["rows"] = [row for row in entry["rows"] if row["name"] not in names] + fresh["rows"]
        existing[args.dataset] = entry
        args.utility_json.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
