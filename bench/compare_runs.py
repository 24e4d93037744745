"""Paired comparisons of evaluations on one split: each run's mean and its difference from the first, with CI.

Each argument is ``NAME=DIR``, where ``DIR`` holds a ``per_query.json`` of ``privret evaluate --per-query`` (one
score per query and metric). The first run is the reference; every other line gives mean(other) - mean(reference)
over the queries with the 95% paired bootstrap interval of ``privret.evaluate.statistics.paired_bootstrap_ci``
(the interval every table of docs/benchmarks.md uses). Runs must cover the same queries. Used to pair regime
candidates on the validation split (docs/benchmarks.md, "Dropout off, at 45 steps"):

    .venv/bin/python bench/compare_runs.py nodrop=runs/s32/top3-b512-c1-e4-nodrop-validation \\
        clip3=bench/results/direct_regimes_c3/top3-b512-c3-e4-validation
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_argument(text: str) -> tuple[str, Path]:
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, Path(directory)


def scores(directory: Path, metric: str) -> dict[str, float]:
    path = directory / "per_query.json"
    try:
        per_query = json.loads(path.read_text())
        return {query: float(values[metric]) for query, values in per_query.items()}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"{path}: cannot read per-query {metric} ({type(error).__name__}: {error})") from None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=run_argument, metavar="NAME=DIR", help="the reference first")
    ap.add_argument("--metric", default="ndcg@10")
    args = ap.parse_args(argv)

    from privret.evaluate.statistics import paired_bootstrap_ci

    (ref_name, ref_dir), others = args.runs[0], args.runs[1:]
    reference = scores(ref_dir, args.metric)
    queries = sorted(reference)
    print(f"{ref_name}: {sum(reference.values()) / len(reference):.4f} ({len(queries)} queries, {args.metric})")
    for name, directory in others:
        other = scores(directory, args.metric)
        if set(other) != set(reference):
            raise SystemExit(f"{directory / 'per_query.json'}: {len(set(other) ^ set(reference))} queries differ "
                             f"from {ref_dir / 'per_query.json'}'s; compare evaluations of one split")
        a, b = [reference[q] for q in queries], [other[q] for q in queries]
        low, high = paired_bootstrap_ci(a, b)
        delta = (sum(b) - sum(a)) / len(a)
        print(f"{name}: {sum(b) / len(b):.4f}, {delta:+.4f} [{low:+.4f}, {high:+.4f}] against {ref_name}")


if __name__ == "__main__":
    main()
