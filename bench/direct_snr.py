"""How much of one direct-DP step is signal: the clipped mean gradient against the DP noise, per clip norm.

For the ``public-negatives`` mechanism (privret.train.dp_retriever) a full-batch step releases
``(sum_u clip_C(g_u) + N(0, sigma^2 C^2 I_d)) / N``. Its signal is ``s(C) = || (1/N) sum_u clip_C(g_u) ||`` and
the norm of its noise is ``sigma C sqrt(d) / N`` (d trainable parameters, sigma from the accountant for the
planned steps, exactly as ``privret retriever train --dp`` plans it). Their ratio says whether a step moves
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
from privret.train.clipped_sums import _encode, _encode_tracked, false_negative_mask, public_negative_losses
from privret.train.dp_retriever import build_batch, draw_negatives, negative_pool
from privret.train.dp_run import plan_run
from privret.train.settings import DPRetrieverConfig

CLIP_NORMS = (1.0, 0.3, 0.1, 0.03, 0.01)


def clipped_means(model, params, pairs, units, chosen, negatives, cfg, *, chunk: int = 16):
    """Per-unit gradient norms of ``chosen`` and, for each C of CLIP_NORMS and inf, the mean of the clipped
    gradients (flattened), by ghost norms and book-keeping (one backward pass per chunk of units)."""
    norms, sums = [], {}
    for lo in range(0, len(chosen), chunk):
        batch = build_batch(pairs, units, chosen[lo:lo + chunk], cfg, None, negatives, None)
        with torch.no_grad():
            e_n = _encode(model, [d.full_text for d in negatives], cfg.max_doc_tokens)
        tracker = GhostNorms(model)
        try:
            e_q, e_d = _encode_tracked(tracker, model, batch, cfg)
            losses = public_negative_losses(e_q, e_d, e_n, cfg.tau, mask=false_negative_mask(batch))
            cot = torch.autograd.grad(losses.sum(), [e_q, e_d], retain_graph=True)
            u = batch.unit_of_row
            part = tracker.group_sq_norms([e_q, e_d], list(cot), {"q": u, "d": u}, batch.n_units,
                                          keep_deltas=True).clamp_min(0).sqrt()
            norms.append(part)
            for c in (*CLIP_NORMS, math.inf):
                factor = (c / part.clamp_min(1e-12)).clamp(max=1.0)[u]
                flat = torch.cat([g.flatten() for g in tracker.weighted_grads(params, {"q": factor, "d": factor})])
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
    ap.add_argument("--steps", type=int, default=5, help="full-batch steps the noise is calibrated for")
    ap.add_argument("--units", type=int, default=128, help="units the signal is estimated on")
    ap.add_argument("--json", type=Path, default=Path("bench/results/direct_snr.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    dataset = load_beir(args.data, ["train"])
    pairs = pairs_from_beir(dataset, "train")
    units = group_units(pairs.pairs, PrivacyUnit.query)
    cfg = DPRetrieverConfig(method="public-negatives", trainable=args.trainable, lora_rank=args.lora_rank,
                            epsilon=args.epsilon, batch_size=len(units), epochs=args.steps)
    sigma = plan_run(cfg, len(units)).sigma
    model = load_encoder(cfg.model)
    model.eval()
    params = list(make_trainable(model, cfg.trainable, lora_rank=cfg.lora_rank).values())
    d = sum(p.numel() for p in params)
    rng = torch.Generator().manual_seed(0)
    chosen = torch.randperm(len(units), generator=rng)[:args.units].tolist()
    negatives = draw_negatives(negative_pool(pairs, dataset.corpus), cfg, rng)
    norms, means = clipped_means(model, params, pairs, units, chosen, negatives, cfg)
    unclipped = means[math.inf]
    rows = []
    for c in CLIP_NORMS:
        signal, noise = means[c].norm().item(), sigma * c * math.sqrt(d) / len(units)
        rows.append({"clip_norm": c, "signal": signal, "noise": noise, "signal_to_noise": signal / noise,
                     "cos_to_unclipped": F.cosine_similarity(means[c], unclipped, dim=0).item(),
                     "units_clipped": (norms > c).float().mean().item()})
    entry = {"data": args.data.name, "trainable": args.trainable, "parameters": d, "units": len(units),
             "epsilon": args.epsilon, "steps": args.steps, "sigma": sigma, "units_sampled": args.units,
             "norm_quantiles": dict(zip(("10%", "25%", "50%", "75%", "90%"),
                                        torch.quantile(norms, torch.tensor([.1, .25, .5, .75, .9])).tolist())),
             "rows": rows}
    key = (entry["data"], entry["trainable"], entry["epsilon"], entry["steps"])
    old = json.loads(args.json.read_text()) if args.json.is_file() else []
    kept = [e for e in old if (e["data"], e["trainable"], e["epsilon"], e["steps"]) != key]
    write_json_atomic(args.json, kept + [entry])
    for r in rows:
        print(f"C={r['clip_norm']:g}: signal {r['signal']:.4f}, noise {r['noise']:.4f}, "
              f"ratio {r['signal_to_noise']:.2f}, cos {r['cos_to_unclipped']:.3f}, clipped {r['units_clipped']:.0%}")


if __name__ == "__main__":
    main()
