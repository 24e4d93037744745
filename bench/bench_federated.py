"""The Table 4.1 analogue on Fed-SQuAD (thesis chapter 4), checkpointed and resumable.

Rows: BM25, zero-shot encoder, local-only, PDD-AS2 (FedAvg), + client-customized query encoders,
+ Fed-Negative, central (upper bound); per client and pooled, sentence and passage level (MRR@10,
Recall@1/20/100); bytes per FedAvg round and per Fed-Negative exchange; wall time of every step.

Every step writes ``OUT/<step>.json`` and is skipped when that file exists (local-only also per
client, the federated run per round), so an interrupted run continues where it stopped:

    .venv/bin/python bench/bench_federated.py --data runs/fed-squad --out bench/results/federated
    .venv/bin/python bench/bench_federated.py --inversion   # also the embedding inversion check

The default is small (2 rounds, 1 local epoch, 10% of each client's training questions) so that it
fits in about 20 minutes of one CPU thread; raise ``--rounds`` and ``--train-fraction`` on a GPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from privret.data.fed_squad import build_fed_squad, load_fed_squad
from privret.federated import local
from privret.federated.config import FedConfig
from privret.federated.runner import (
    evaluate_bm25_all,
    evaluate_zero_shot,
    run_federated_local,
    save_result,
    train_central,
    train_local_only,
)

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad" / "squad-v1.1-dev-40.json"
ROWS = [("BM25", "bm25"), ("zero-shot encoder", "zero-shot"), ("local-only", "local-only"),
        ("PDD-AS2", "pdd-as2"), ("+ client-customized query encoders", "+query-encoders"),
        ("+ Fed-Negative", "+query-encoders+fed-negative"), ("central (upper bound)", "central")]


def _step(out: Path, name: str, fn) -> dict:
    path = out / f"{name}.json"
    if path.is_file():
        print(f"[skip] {name} (done: {path})", flush=True)
        return json.loads(path.read_text())
    print(f"[run] {name}", flush=True)
    t0, c0 = time.time(), time.process_time()
    result = fn()
    save_result(path, result, seconds=round(time.time() - t0, 1), cpu_seconds=round(time.process_time() - c0, 1))
    print(f"[done] {name} in {time.time() - t0:.0f}s", flush=True)
    return json.loads(path.read_text())


def _local_only(cfg: FedConfig, clients, out: Path) -> dict:
    """Per-client checkpoints: a client already trained is not trained again."""
    part = out / "local-only"
    part.mkdir(parents=True, exist_ok=True)
    per_client = {}
    for c in clients:
        path = part / f"{c.name}.json"
        if not path.is_file():
            res = train_local_only(cfg, [c])
            save_result(path, res["per_client"][c.name])
        per_client[c.name] = {k: v for k, v in json.loads(path.read_text()).items() if k in local.LEVELS}
    return {"per_client": per_client, "pooled": local.pooled(per_client)}


def _fmt(m: dict) -> str:
    return " | ".join(f"{m[k]:.3f}" for k in local.METRIC_NAMES)


def table(results: dict[str, dict], clients, fed: dict) -> str:
    lines = ["| method | S MRR@10 | S R@1 | S R@20 | S R@100 | P MRR@10 | P R@1 | P R@20 | P R@100 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, key in ROWS:
        if key in results:
            p = results[key]["pooled"]
            lines.append(f"| {label} | {_fmt(p['sentence'])} | {_fmt(p['passage'])} |")
    lines += ["", "Per client, sentence R@1 (train questions used; test questions):", "",
              "| client | train q | test q | " + " | ".join(label for label, key in ROWS if key in results) + " |",
              "|---|---|---|" + "---|" * sum(key in results for _, key in ROWS)]
    cfg = FedConfig(**fed["config"]) if fed else FedConfig()
    for c in clients:
        n_train = len(local.train_questions(c, cfg.max_train_questions, cfg.seed, cfg.train_fraction))
        cells = [f"{results[key]['per_client'][c.name]['sentence']['recall@1']:.3f}"
                 for _, key in ROWS if key in results]
        lines.append(f"| {c.name} | {n_train} | {len(c.split('test'))} | " + " | ".join(cells) + " |")
    if fed:
        lines += ["", "Communication:", ""]
        for r in fed["rounds"]:
            lines.append(f"- FedAvg round {r['round']} ({r['stage']}): {r['bytes_down'] / 1e6:.1f} MB down + "
                         f"{r['bytes_up'] / 1e6:.1f} MB up, {r['seconds']:.0f} s")
        for ex in fed["evaluations"].get("+query-encoders+fed-negative", {}).get("fed_negative_exchanges", []):
            lines.append(f"- Fed-Negative exchange: {ex['query_bytes'] / 1e6:.2f} MB of query embeddings + "
                         f"{ex['answer_bytes'] / 1e6:.2f} MB of answers = {ex['total_bytes'] / 1e6:.2f} MB "
                         f"peer-to-peer ({ex['relayed_bytes'] / 1e6:.2f} MB through the SuperLink), "
                         f"{ex['messages']} messages")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--squad", type=Path, default=SQUAD)
    ap.add_argument("--data", type=Path, default=Path("runs/fed-squad"), help="Fed-SQuAD dir (built if missing)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/federated"), help="JSON results, table.md")
    ap.add_argument("--work", type=Path, default=Path("runs/bench-federated"), help="checkpoints (large)")
    ap.add_argument("--model", default="minilm-l6")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument("--local-epochs", type=int, default=1)
    ap.add_argument("--train-fraction", type=float, default=0.1)
    ap.add_argument("--personal-epochs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[], help="steps to skip: bm25 zero-shot local-only federated central")
    ap.add_argument("--inversion", action="store_true", help="also run the (tiny) embedding inversion check")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not args.data.is_dir():
        build_fed_squad(args.squad, args.data)
    clients = load_fed_squad(args.data)
    cfg = FedConfig(model=args.model, rounds=args.rounds, warmup_rounds=args.warmup_rounds,
                    local_epochs=args.local_epochs, train_fraction=args.train_fraction,
                    personal_epochs=args.personal_epochs)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
    results: dict[str, dict] = {}
    if "bm25" not in args.skip:
        results["bm25"] = _step(out, "bm25", lambda: evaluate_bm25_all(clients))
    if "zero-shot" not in args.skip:
        results["zero-shot"] = _step(out, "zero-shot", lambda: evaluate_zero_shot(cfg, clients))
    if "local-only" not in args.skip:
        results["local-only"] = _step(out, "local-only", lambda: _local_only(cfg, clients, out))
    fed = {}
    if "federated" not in args.skip:
        fed = _step(out, "federated", lambda: run_federated_local(cfg, args.data, args.work / "federated-run"))
        results.update(fed["evaluations"])
    if "central" not in args.skip:
        results["central"] = _step(out, "central", lambda: train_central(cfg, clients))
    if args.inversion:
        from privret.audit.inversion import InversionConfig, inversion_check

        _step(out, "inversion", lambda: inversion_check(clients, InversionConfig(encoder=args.model)))
    text = table(results, clients, fed)
    (out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
