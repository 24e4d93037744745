"""How much of one direct-DP step is signal: the clipped mean gradient against the DP noise, per clip norm.

For the ``public-negatives`` mechanism (privret.train.dp_retriever) a step with expected batch B (``--batch``;
default the whole log, B = N) releases ``(sum_u clip_C(g_u) + N(0, sigma^2 C^2 I_d)) / B``. Its signal is
``s(C) = || (1/B) sum_u clip_C(g_u) ||`` ~ the norm of the clipped mean gradient, and the norm of its noise is
``sigma C sqrt(d) / B`` (d trainable parameters, sigma from the accountant for ``--epochs`` at sample rate B / N,
exactly as ``privret retriever train --dp`` plans it). ``--hard-negatives K`` adds each unit's own K hard public
negatives (with gradient, :mod:`privret.train.hard_negatives`) to its loss, as the trainer does. Their ratio says whether a step moves
along the gradient at all: at a ratio below 1 most of the step's length is noise. ``s(C)`` is estimated on
``--units`` units drawn uniformly (their mean is a slight over-estimate: it keeps the units' sampling noise),
at the initial (public) encoder; ``cos`` is the cosine between the clipped and the unclipped mean, what
clipping costs in direction. The per-unit gradient norms (their quantiles) tell where C bites.

    OMP_NUM_THREADS=1 .venv/bin/python bench/direct_snr.py --data DIR --trainable bias --epsilon 7 --steps 5 \\
        --json bench/results/direct_snr.json

The JSON file keeps one entry per (data, trainable, epsilon, steps); a new run replaces its own entry.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from privret.data.beir import load_beir
from privret.data.pairs import PrivacyUnit, group_units, pairs_from_beir
from privret.io import write_json_atomic
from privret.models.encoder import load_encoder
from privret.models.trainable import make_trainable
from privret.privacy.ghost_norms import GhostNorms
from privret.train.clipped_sums import _encode, false_negative_mask, public_negative_unit_norms
from privret.train.dp_retriever import build_batch, draw_negatives, negative_pool
from privret.train.hard_negatives import mine_candidates
from privret.train.dp_run import plan_run
from privret.train.settings import DPRetrieverConfig

CLIP_NORMS = (10.0, 3.0, 1.0, 0.3, 0.1, 0.03, 0.01)


def clipped_means(model, params, pairs, units, chosen, negatives, cfg, *, hard=None, chunk: int = 16):
    """Per-unit gradient norms of ``chosen`` and, for each C of CLIP_NORMS and inf, the mean of the clipped
    gradients (flattened), by ghost norms and book-keeping (one backward pass per chunk of units)."""
    norms, sums = [], {}
    for lo in range(0, len(chosen), chunk):
        batch = build_batch(pairs, units, chosen[lo:lo + chunk], cfg, torch.Generator().manual_seed(lo), negatives,
                            None, hard=hard)
        with torch.no_grad():
            e_n = _encode(model, [d.full_text for d in negatives], cfg.max_doc_tokens)
        tracker = GhostNorms(model)
        try:
            part, groups, _ = public_negative_unit_norms(tracker, model, batch, e_n, false_negative_mask(batch), cfg)
            norms.append(part)
            for c in (*CLIP_NORMS, math.inf):
                factor = (c / part.clamp_min(1e-12)).clamp(max=1.0)
                weights = {slot: factor[g] for slot, g in groups.items()}
                flat = torch.cat([g.flatten() for g in tracker.weighted_grads(params, weights)])
                sums[c] = sums[c] + flat if c in sums else flat
        finally:
            tracker.remove()
        print(f"{min(lo + chunk, len(chosen))}/{len(chosen)} units", flush=True)
    return torch.cat(norms), {c: s / len(chosen) for c, s in sums.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="BEIR dataset; its train split is the private log")
    ap.add_argument("--trainable", default="bias")
    ap.add_argument("--lora-rank", type=int, default=1)
    ap.add_argument("--epsilon", type=float, default=7.0)
    ap.add_argument("--steps", type=int, default=5, help="full-batch steps the noise is calibrated for (no --batch)")
    ap.add_argument("--batch", type=int, default=0, help="expected units per step (0: the whole log)")
    ap.add_argument("--epochs", type=float, default=1.0, help="with --batch: epochs the noise is calibrated for")
    ap.add_argument("--hard-negatives", type=int, default=0, help="each unit's own hard public negatives (K)")
    ap.add_argument("--hard-negative-depth", type=int, default=30)
    ap.add_argument("--max-doc-tokens", type=int, default=128)
    ap.add_argument("--units", type=int, default=128, help="units the signal is estimated on")
    ap.add_argument("--json", type=Path, default=Path("bench/results/direct_snr.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    dataset = load_beir(args.data, ["train"])
    pairs = pairs_from_beir(dataset, "train")
    units = group_units(pairs.pairs, PrivacyUnit.query)
    batch = args.batch or len(units)
    rank = {"lora_rank": args.lora_rank} if args.trainable == "lora" else {}
    cfg = DPRetrieverConfig(method="public-negatives", trainable=args.trainable, **rank,
                            epsilon=args.epsilon, batch_size=batch, epochs=args.epochs if args.batch else args.steps,
                            hard_negatives=args.hard_negatives, hard_negative_depth=args.hard_negative_depth,
                            max_doc_tokens=args.max_doc_tokens)
    run_plan = plan_run(cfg, len(units))
    sigma = run_plan.sigma
    model = load_encoder(cfg.model, max_seq_length=cfg.max_doc_tokens)
    model.eval()
    params = list(make_trainable(model, cfg.trainable, lora_rank=cfg.lora_rank).values())
    d = sum(p.numel() for p in params)
    rng = torch.Generator().manual_seed(0)
    chosen = torch.randperm(len(units), generator=rng)[:args.units].tolist()
    pool = negative_pool(pairs, dataset.corpus)
    negatives = draw_negatives(pool, cfg, rng)
    hard = None
    if cfg.hard_negatives:
        hard = (pool, mine_candidates(model, pairs, units, pool, cfg.hard_negative_depth))
    norms, means = clipped_means(model, params, pairs, units, chosen, negatives, cfg, hard=hard)
    unclipped = means[math.inf]
    rows = []
    for c in CLIP_NORMS:
        signal, noise = means[c].norm().item(), sigma * c * math.sqrt(d) / batch
        rows.append({"clip_norm": c, "signal": signal, "noise": noise, "signal_to_noise": signal / noise,
                     "cos_to_unclipped": F.cosine_similarity(means[c], unclipped, dim=0).item(),
                     "units_clipped": (norms > c).float().mean().item()})
    entry = {"data": args.data.name, "trainable": args.trainable, "parameters": d, "units": len(units),
             "epsilon": args.epsilon, "steps": run_plan.steps, "expected_batch": batch, "sigma": sigma,
             "hard_negatives": cfg.hard_negatives, "max_doc_tokens": cfg.max_doc_tokens, "units_sampled": args.units,
             "norm_quantiles": dict(zip(("10%", "25%", "50%", "75%", "90%"),
                                        torch.quantile(norms, torch.tensor([.1, .25, .5, .75, .9])).tolist())),
             "rows": rows}
    def key(e: dict) -> tuple:
        return (e["data"], e["trainable"], e["epsilon"], e["steps"], e.get("expected_batch"), e.get("hard_negatives", 0))
    old = json.loads(args.json.read_text()) if args.json.is_file() else []
    kept = [e for e in old if key(e) != key(entry)]
    write_json_atomic(args.json, kept + [entry])
    for r in rows:
        print(f"C={r['clip_norm']:g}: signal {r['signal']:.4f}, noise {r['noise']:.4f}, "
              f"ratio {r['signal_to_noise']:.2f}, cos {r['cos_to_unclipped']:.3f}, clipped {r['units_clipped']:.0%}")


if __name__ == "__main__":
    main()
