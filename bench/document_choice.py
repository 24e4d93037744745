"""SciFact: NDCG@10 of DP synthetic queries under each way of choosing the documents (issue 11).

Every step is a `privret` CLI call; a step whose output exists is skipped, so the script resumes
after a crash without spending budget twice (the generator and the selections are made once).

    OMP_NUM_THREADS=1 python bench/document_choice.py --generator runs/i11/gen-eps8 --work runs/i11 \
        --json bench/results/document_choice.json --utility-json bench/results/privacy_utility.json

The generator is `privret generator train --data ../shared/data/scifact --split train --epsilon 8
--out runs/i11/gen-eps8` (the settings of configs/scifact.yaml, which are the CLI defaults).
Rows: a seeded sample of 565 public documents (the size these rows were measured with), and DP
partition selections (`privret data select-documents`) at the given selection epsilons; each row
is trained over --seeds retriever seeds and reported as mean +- sd with the paired bootstrap CI
of its seed-averaged per-query NDCG@10 against zero-shot, and its retention against --original.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from privret.evaluate.statistics import mean_sd, paired_bootstrap_ci, retention

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "scifact"


def privret(*args: str) -> None:
    print("+ privret", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "privret.cli", *args], check=True)


def evaluate(model: str, out: Path, cache: Path | None = None) -> dict[str, float]:
    """Per-query NDCG@10 of ``model`` on the test split (computed once, then read back)."""
    path = out / "per_query.json"
    if not path.exists():
        args = ["evaluate", "--model", model, "--data", str(DATA), "--split", "test",
                "--json", str(out / "metrics.json"), "--per-query", str(path)]
        privret(*args, *(["--cache-dir", str(cache)] if cache else []))
    return {q: v["ndcg@10"] for q, v in json.loads(path.read_text()).items()}


def synthetic_row(name: str, documents: list[str], args, zero: dict[str, float]) -> dict:
    row_dir = args.work / name
    row_dir.mkdir(parents=True, exist_ok=True)
    synthetic = row_dir / "synthetic"
    if not (synthetic / "manifest.json").exists():
        privret("generate", "--generator", str(args.generator), "--data", str(DATA), "--out", str(synthetic),
                "--num-queries", "2", "--resume", *documents)
    scores, per_seed = [], []
    for seed in range(args.seeds):
        retriever = row_dir / f"retriever-seed{seed}"
        if not (retriever / "privacy_ledger.json").exists():
            privret("retriever", "train", "--data", str(synthetic), "--out", str(retriever), "--seed", str(seed))
        per_query = evaluate(str(retriever), row_dir / f"eval-seed{seed}")
        per_seed.append(per_query)
        scores.append(sum(per_query.values()) / len(per_query))
    queries = sorted(zero)
    averaged = [sum(p[q] for p in per_seed) / len(per_seed) for q in queries]
    lo, hi = paired_bootstrap_ci([zero[q] for q in queries], averaged)
    mean, sd = mean_sd(scores)
    ledger = json.loads((synthetic / "privacy_ledger.json").read_text())
    manifest = json.loads((synthetic / "manifest.json").read_text())
    zero_mean = sum(zero.values()) / len(zero)
    return {"name": name, "epsilon": ledger["epsilon"], "delta": ledger["delta"], "mechanism": ledger["mechanism"],
            "documents": manifest["documents"], "synthetic_queries": manifest["kept"], "ndcg10_seeds": scores,
            "ndcg10_mean": mean, "ndcg10_sd": sd, "seeds": len(scores), "delta_ci95": [lo, hi],
            "retention": retention(mean, zero_mean, args.original) if args.original is not None else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generator", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--sample", type=int, default=565)
    parser.add_argument("--selection-epsilons", default="8", help="comma-separated; empty for none")
    parser.add_argument("--original", type=float, default=None, help="NDCG@10 of the original-pairs row")
    parser.add_argument("--utility-json", type=Path, default=None,
                        help="also write the rows in the privacy-utility format of issue 12 "
                             "(bench/results/privacy_utility.json: one object per dataset)")
    args = parser.parse_args()
    zero = evaluate("minilm-l6", args.work / "zero-shot", cache=args.work / "cache")
    rows = [synthetic_row(f"corpus-sample-{args.sample}", ["--documents", "corpus", "--sample", str(args.sample)],
                          args, zero)]
    for eps in filter(None, args.selection_epsilons.split(",")):
        selection = args.work / f"select-e{eps}-m1"
        if not (selection / "documents.txt").exists():
            privret("data", "select-documents", "--data", str(DATA), "--split", "train", "--epsilon", eps,
                    "--max-docs-per-unit", "1", "--out", str(selection), "--allow-over-budget")
        if (selection / "documents.txt").read_text().split():
            rows.append(synthetic_row(f"dp-select-e{eps}", ["--documents", str(selection)], args, zero))
    result = {"dataset": "scifact", "zero_shot": {"ndcg10": sum(zero.values()) / len(zero)},
              "original": {"ndcg10": args.original}, "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.utility_json is not None:
        keys = ("name", "epsilon", "ndcg10_mean", "ndcg10_sd", "seeds", "delta_ci95", "retention")
        existing = json.loads(args.utility_json.read_text()) if args.utility_json.exists() else {}
        existing["scifact"] = {"zero_shot": result["zero_shot"], "original": result["original"],
                               "rows": [{k: row[k] for k in keys} for row in rows]}
        args.utility_json.write_text(json.dumps(existing, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
