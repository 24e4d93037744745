"""Paired comparisons of evaluations on one split: each run's mean and its difference from the first, with CI.

Each argument is ``NAME=DIR``, where ``DIR`` holds a ``per_query.json`` of ``privret evaluate --per-query`` (one
score per query). The first run is the reference; every other line gives mean(other) - mean(reference)
of NDCG@10 over the queries with the 95% paired bootstrap interval that ``bench/seed_rows.py`` reports (its
``per_query`` and ``ci``, the interval every table of docs/benchmarks.md uses), and the number of queries on which
it scores above, below and the same as the reference. Runs must cover the same queries. Used to pair regime
candidates on the validation split (docs/benchmarks.md, "Dropout off, at 45 steps"):

    .venv/bin/python bench/compare_runs.py nodrop=runs/s32/top3-b512-c1-e4-nodrop-validation \\
        clip3=bench/results/direct_regimes_c3/top3-b512-c3-e4-validation

``--by-title DATA`` repeats the comparison within each group of queries whose relevant document has the same title
in the BEIR directory DATA (the first relevant document by id; on ``privret data squad-beir`` data a title is the
query's article): where a gain or a loss lies. A query with no judgement in DATA is an error.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from privret.data.beir import load_beir
from privret.errors import InputError
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


def titles(data: Path, queries: set[str]) -> dict[str, str]:
    """Each query's group: the title of its first relevant document (by id) in any split of ``data``."""
    try:
        dataset = load_beir(data)
    except InputError as error:
        raise SystemExit(str(error)) from None
    title_of: dict[str, str] = {}
    for qrels in dataset.qrels.values():
        for query, judged in qrels.items():
            relevant = sorted(doc for doc, score in judged.items() if score > 0)
            if query in queries and relevant:
                title_of.setdefault(query, dataset.corpus[relevant[0]].title)
    missing = queries - set(title_of)
    if missing:
        raise SystemExit(f"{data / 'qrels'}: no relevant document for {len(missing)} of the compared queries "
                         f"(e.g. {sorted(missing)[0]!r}); pass the dataset the runs were evaluated on")
    return title_of


def compare(label: str, runs: list[tuple[str, dict[str, float]]]) -> None:
    """One line per run: its mean, then the others' paired difference from the first with the 95% CI, and on
    how many queries each scores above, below and exactly as the first (a query's NDCG@10 changes only when its
    top 10 does)."""
    (ref_name, reference), others = runs[0], runs[1:]
    ref_mean = sum(reference.values()) / len(reference)
    print(f"{label}{ref_name}: {ref_mean:.4f} ({len(reference)} queries, ndcg@10)")
    for name, other in others:
        low, high = ci(reference, other)
        mean = sum(other.values()) / len(other)
        delta = mean - ref_mean
        better = sum(other[q] > reference[q] for q in reference)
        worse = sum(other[q] < reference[q] for q in reference)
        print(f"{label}{name}: {mean:.4f}, {delta:+.4f} [{low:+.4f}, {high:+.4f}] against {ref_name}; better on "
              f"{better}, worse on {worse}, same on {len(reference) - better - worse} queries")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=run_argument, metavar="NAME=DIR", help="the reference first")
    ap.add_argument("--by-title", type=Path, metavar="DATA",
                    help="also compare within each title of the queries' relevant documents in this BEIR directory")
    args = ap.parse_args(argv)

    runs = [(name, scores(directory)) for name, directory in args.runs]
    (_, reference), ref_dir = runs[0], args.runs[0][1]
    for (_, other), (_, directory) in zip(runs[1:], args.runs[1:]):
        if set(other) != set(reference):
            raise SystemExit(f"{directory / 'per_query.json'}: {len(set(other) ^ set(reference))} queries differ "
                             f"from {ref_dir / 'per_query.json'}'s; compare evaluations of one split")
    title_of = titles(args.by_title, set(reference)) if args.by_title is not None else {}
    compare("", runs)
    if title_of:
        for title in sorted(set(title_of.values())):
            group = {q for q, t in title_of.items() if t == title}
            compare(f"[{title}] ", [(name, {q: s for q, s in run.items() if q in group}) for name, run in runs])


if __name__ == "__main__":
    main()
