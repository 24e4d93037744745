"""Write the headline file bench/results/privacy_utility.json from bench/seed_rows.py results (its --json files).

One object per dataset, in the layout of issue 12 (zero-shot, original, rows with mean, sd, seeds, the paired CI
against zero-shot and retention), plus the number format every evaluation behind it encoded in (``precision``, as
``privret evaluate --json`` records it) and the result file it came from. The inputs must share that format: rows
evaluated under bf16 autocast and in float32 differ by about 0.001 NDCG@10, so they are never mixed in one file.

    python bench/headline.py --precision float32 --out bench/results/privacy_utility.json \\
        bench/results/direct_regimes_scifact_fp32.json bench/results/direct_regimes_squad_fp32.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from seed_rows import utility_entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+", help="bench/seed_rows.py --json files, one per dataset")
    parser.add_argument("--precision", choices=("float32", "bf16-autocast"), required=True,
                        help="the number format every evaluation behind the inputs ran in")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    headline = {}
    for path in args.results:
        result = json.loads(path.read_text())
        if result["dataset"] in headline:
            raise SystemExit(f"{path}: a second result for the dataset {result['dataset']!r}")
        headline[result["dataset"]] = {**utility_entry(result), "precision": args.precision, "source": path.as_posix()}
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(headline, indent=2) + "\n")
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
