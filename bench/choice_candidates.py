"""What every candidate of a DP choice (``privret retriever select``) scores on a test split: reporting only.

The choice itself never sees the test split; this script shows, after the fact, which candidate it took
and what the others would have given. For each candidate of ``<selection>/private_selection.json`` it
materialises the model (interpolations included), evaluates it on the test split and writes
``<out>/<k>-<name>/per_query.json`` and ``metrics.json`` (``privret evaluate --per-query`` format, for
``bench/seed_rows.py``), then prints one line per candidate. Finished candidates are skipped.

    OMP_NUM_THREADS=1 python bench/choice_candidates.py runs/s20/sel-eps7-s0 --data ../shared/data/scifact \\
        --out runs/s20/sel-eps7-s0-candidates
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from privret.data.beir import load_beir
from privret.io import write_json_atomic
from privret.retrieval.metrics import evaluate_per_query, mean_metrics
from privret.train.private_selection import SELECTION_FILE, Candidate, materialise
from privret.train.settings import PrivateSelectionConfig


def candidate_of(name: str) -> Candidate:
    """The inverse of :attr:`Candidate.name`: "base", "<dir>" or "<dir>@<alpha>"."""
    if name == "base":
        return Candidate(None, 0.0)
    match = re.fullmatch(r"(.*)@([0-9.]+)", name)
    return Candidate(match[1], float(match[2])) if match else Candidate(name, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("selection", type=Path, help="output directory of privret retriever select")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base-eval", type=Path, default=None,
                        help="an evaluation directory of the base model on the same split (reused for it)")
    args = parser.parse_args()
    record = json.loads((args.selection / SELECTION_FILE).read_text())
    dataset = load_beir(args.data, splits=[args.split])
    cfg = PrivateSelectionConfig(base=record["base"])
    for k, name in enumerate(record["candidates"]):
        label = re.sub(r"[^A-Za-z0-9.@-]+", "_", name)[-60:]
        out = args.out / f"{k}-{label}"
        if name == "base" and args.base_eval is not None and not (out / "metrics.json").is_file():
            for file in ("per_query.json", "metrics.json"):
                write_json_atomic(out / file, json.loads((args.base_eval / file).read_text()))
        if not (out / "metrics.json").is_file():
            model = materialise(candidate_of(name), cfg)
            per_query = evaluate_per_query(model, dataset.corpus, dataset.queries, dataset.split(args.split))
            write_json_atomic(out / "per_query.json", per_query)
            write_json_atomic(out / "metrics.json", mean_metrics(per_query))
        ndcg = json.loads((out / "metrics.json").read_text())["ndcg@10"]
        chosen = " <- chosen" if name == record["chosen"] else ""
        print(f"{name}: NDCG@10 {ndcg:.4f} ({out}){chosen}")


if __name__ == "__main__":
    main()
