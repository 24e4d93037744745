"""Paired comparisons of evaluations on one split: each run's mean and its difference from the first, with CI.

Each argument is ``NAME=DIR``, where ``DIR`` holds a ``per_query.json`` of ``privret evaluate --per-query`` (one
score per query). The first run is the reference; every other line gives mean(other) - mean(reference)
of NDCG@10 over the queries with the 95% paired bootstrap interval that ``bench/seed_rows.py`` reports (its
``per_query`` and ``ci``, the interval every table of docs/benchmarks.md uses). Runs must cover the same queries. Used to pair regime
candidates on the validation split (docs/benchmarks.md, "Dropout off, at 45 steps"):

    .venv/bin/python bench/compare_runs.py nodrop=runs/s32/top3-b512-c1-e4-nodrop-validation \\
        clip3=bench/results/direct_regimes_c3/top3-b512-c3-e4-validation
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seed_rows import ci, per_query  # bench/ is the script's directory, so first on sys.path


def run_argument(text: str) -> tuple[str, Path]:
    name, sep, directory = text.partition("=")
    if not sep or not name or not directory:
        raise argparse.ArgumentTypeError(f"expected NAME=DIR, got {text!r}")
    return name, Path(directory)


def scores(directory: Path) -> dict[str, float]:
    """Per-query NDCG@10 (``seed_rows.per_query``), with the file named when it cannot be read."""
    try:
        return per_query(directory)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"{directory / 'per_query.json'}: cannot read per-query ndcg@10 "
                         f"({type(error).__name__}: {error})") from None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=run_argument, metavar="NAME=DIR", help="the reference first")
    args = ap.parse_args(argv)

    (ref_name, ref_dir), others = args.runs[0], args.runs[1:]
    reference = scores(ref_dir)
    print(f"{ref_name}: {sum(reference.values()) / len(reference):.4f} ({len(reference)} queries, ndcg@10)")
    for name, directory in others:
        other = scores(directory)
        if set(other) != set(reference):
            raise SystemExit(f"{directory / 'per_query.json'}: {len(set(other) ^ set(reference))} queries differ "
                             f"from {ref_dir / 'per_query.json'}'s; compare evaluations of one split")
        low, high = ci(reference, other)
        mean = sum(other.values()) / len(other)
        delta = mean - sum(reference.values()) / len(reference)
        print(f"{name}: {mean:.4f}, {delta:+.4f} [{low:+.4f}, {high:+.4f}] against {ref_name}")


if __name__ == "__main__":
    main()
