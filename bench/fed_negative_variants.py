"""Stage 2 again on a finished stage 1, with other Fed-Negative settings: does a variant earn its bytes?

For each ``--variant NAME KEY=VALUE ...`` (FedConfig stage-2 fields: ``fed_negatives``, ``personal_negatives``,
``personal_epochs``, ``fed_select``...), the run directory of a finished federated run (``--run``: its
``global.npz`` and ``state.json``) is copied to ``OUT/NAME`` and only stage 2 runs there (both
personalisation variants, evaluated with per-question scores). The table gives sentence MRR@10 of each
row, the paired 95% bootstrap CI over the test questions of its difference to the base run's
"+ client-customized query encoders" row, the Fed-Negative bytes and hardness:

    OMP_NUM_THREADS=2 .venv/bin/python bench/fed_negative_variants.py --threads 2 \\
        --run runs/bench-federated-10r/seed-0 --base runs/i15/federated-10r/seed-0/federated.json \\
        --variant fed64 fed_negatives=64 --out runs/i15/fed-negative-variants
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from fed_steps import per_question

from privret.evaluate.statistics import paired_bootstrap_ci
from privret.federated.config import FedConfig
from privret.federated.runner import run_federated_local
from privret.io import write_json_atomic

ROWS = ("+query-encoders", "+query-encoders+fed-negative")


def parse(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = json.loads(value) if value[:1] in "[{\"0123456789-" else value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="work directory of a finished federated run")
    ap.add_argument("--base", type=Path, required=True, help="that run's results (federated.json or results.json)")
    ap.add_argument("--data", type=Path, default=Path("runs/fed-squad"))
    ap.add_argument("--variant", nargs="+", action="append", required=True, metavar="NAME KEY=VALUE")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = json.loads(args.base.read_text())
    reference = per_question(base["evaluations"]["+query-encoders"])
    lines = ["| run | row | S MRR@10 | Δ vs base + CCQE [95% CI] | Fed-Negative MB | share above local n-th |",
             "|---|---|---:|---|---:|---:|"]
    runs = {"base": base}
    for name, *pairs in args.variant:
        work = args.out / name
        if not (work / "results.json").is_file():
            work.mkdir(parents=True, exist_ok=True)
            for f in ("global.npz", "state.json"):
                shutil.copy2(args.run / f, work / f)
        cfg = FedConfig(**{**base["config"], **parse(pairs), "per_query_metrics": True})
        runs[name] = run_federated_local(cfg, args.data, work, resume=True)
    for name, res in runs.items():
        for row in ROWS:
            ev = res["evaluations"][row]
            scores = per_question(ev)
            qs = sorted(reference)
            lo, hi = paired_bootstrap_ci([reference[q] for q in qs], [scores[q] for q in qs])
            delta = float(np.mean([scores[q] - reference[q] for q in qs]))
            mb = sum(x["total_bytes"] for x in ev.get("fed_negative_exchanges", [])) / 1e6
            hard = ev.get("fed_negative_hardness", [{}])[0].get("mean", {}).get("fed_above_local_nth")
            lines.append(f"| {name} | {row} | {ev['pooled']['sentence']['mrr@10']:.4f} | {delta:+.4f} "
                         f"[{lo:+.4f}, {hi:+.4f}] | {mb:.1f} | {'-' if hard is None else f'{hard:.1%}'} |")
    text = "\n".join(lines) + "\n"
    (args.out / "table.md").write_text(text)
    write_json_atomic(args.out / "variants.json", {n: {"config": r["config"], "evaluations": {
        row: {k: v for k, v in r["evaluations"][row].items() if k != "per_client"} for row in ROWS}}
        for n, r in runs.items()})
    print(text)


if __name__ == "__main__":
    main()
