"""Write the headline file bench/results/privacy_utility.json from bench/seed_rows.py --json files.
Reproduces docs/results.md, "Direct DP training of the retriever" (the headline table).
    .venv/bin/python bench/headline.py --precision float32 --out bench/results/privacy_utility.json \\
        bench/results/{direct_regimes_scifact_pn1,heldout_choice_scifact,direct_regimes_squad_pn1}_fp32.json
Under a second on 2 CPU cores."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from seed_rows import utility_entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="+",
                        help="bench/seed_rows.py --json files (several for one dataset are merged)")
    parser.add_argument("--precision", choices=("float32", "bf16-autocast"), required=True,
                        help="the number format every evaluation behind the inputs ran in")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    headline = {}
    for path in args.results:
        result = json.loads(path.read_text())
        entry = {**utility_entry(result), "precision": args.precision, "sources": [path.as_posix()]}
        earlier = headline.setdefault(result["dataset"], entry)
        if earlier is not entry:
            _merge(earlier, entry, path)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(headline, indent=2) + "\n")
    os.replace(tmp, args.out)


def _merge(earlier: dict, entry: dict, path: Path) -> None:
    """Add ``entry``'s rows to ``earlier`` (one dataset's object), refusing what would mix two scales or two rows."""
    for key in ("zero_shot", "original"):
        if earlier[key] != entry[key]:
            raise SystemExit(f"{path}: its {key} {entry[key]} differs from {earlier[key]} in {earlier['sources']}, "
                             "so its retention and CIs are on another scale; not merged")
    taken = {row["name"] for row in earlier["rows"]}
    twice = [row["name"] for row in entry["rows"] if row["name"] in taken]
    if twice:
        raise SystemExit(f"{path}: rows {twice} are already in {earlier['sources']}")
    earlier["rows"] += entry["rows"]
    earlier["sources"].append(entry["sources"][0])


if __name__ == "__main__":
    main()
