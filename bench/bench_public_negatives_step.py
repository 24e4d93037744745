"""The time of a public-negatives clipped sum under implementation choices that leave it unchanged.

Two comparisons (``--arms``), each timed on the same batches, arms alternating in one process (fair on a shared
machine), with a check that every arm gives the first arm's clipped sum (eval mode, up to float rounding):

- ``order`` (the default): ``privret.train.clipped_sums`` embeds a part's positives and hard negatives in calls of
  documents of similar length (``length_order``), so a call pads each document to a length close to its own; the
  obvious implementation embeds them in row order (positives, then hard negatives), each call padded to its
  longest document. ``dropout=False`` (``--no-dropout``) runs the encoder in eval mode: no dropout, and attention
  without dropout can take PyTorch's fused kernel. Arms: row order with dropout (before 2026-11-27), length order
  with dropout (the default), length order without dropout.
- ``weight-norms``: the per-unit norms of linear layers' weight gradients from Gram matrices only ("ghost", the
  engine before 2026-11-27) or, per layer, the cheaper of that and per-sequence gradients ("auto", the default;
  ``privret.privacy.ghost_norms``). Length order, without dropout; it matters where weight matrices train
  (``--trainable lora``).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_public_negatives_step.py --data runs/s32/squad-val
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_public_negatives_step.py --data ../shared/data/scifact
    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_public_negatives_step.py --data runs/s32/squad-val \
        --arms weight-norms --trainable lora --lora-rank 4

The batches: ``--parts`` parts of ``--units`` units drawn from the dataset's train split, each row with
``--hard-negatives`` negatives drawn uniformly from the public pool (not mined: the time depends on the texts'
lengths only, and mining would encode the whole corpus first), 32 shared public negatives; the trainer's
settings otherwise (BitFit of the top 3 layers on the frozen-prefix cache unless ``--trainable`` says otherwise,
documents cut at 256 tokens). The frozen prefix of every text is computed before timing. The clip norm is set
below every unit's norm (``--clip-norm``), so that the check sees the norms as well as the sums, and LoRA's factors
are drawn at random instead of starting at B = 0 (where A's gradient is 0); the times depend on neither. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="BEIR dataset (its train split)")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--units", type=int, default=16, help="units per part (the trainer's --physical-batch)")
    parser.add_argument("--hard-negatives", type=int, default=2)
    parser.add_argument("--arms", choices=["order", "weight-norms"], default="order")
    parser.add_argument("--trainable", default="bias-top:3")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--clip-norm", type=float, default=1e-4)
    parser.add_argument("--max-doc-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    import functools

    import privret.train.clipped_sums as cs
    from privret.privacy.ghost_norms import GhostNorms
    from privret.data.beir import load_beir
    from privret.data.pairs import PrivacyUnit, group_units, pairs_from_beir
    from privret.models.encoder import load_encoder
    from privret.models.trainable import make_trainable
    from privret.train.dp_retriever import build_batch, draw_negatives, negative_pool
    from privret.train.settings import DPRetrieverConfig

    torch.manual_seed(0)
    dataset = load_beir(args.data, ["train"])
    pairs = pairs_from_beir(dataset, "train")
    units = group_units(pairs.pairs, PrivacyUnit.query)
    cfg = DPRetrieverConfig(method="public-negatives", trainable=args.trainable, batch_size=args.units,
                            hard_negatives=args.hard_negatives, max_doc_tokens=args.max_doc_tokens,
                            physical_batch=args.units, epsilon=8.0, lora_rank=args.lora_rank,
                            clip_norm=args.clip_norm)
    model = load_encoder(cfg.model, max_seq_length=cfg.max_doc_tokens)
    params = list(make_trainable(model, cfg.trainable, lora_rank=cfg.lora_rank).values())
    if cfg.trainable == "lora":
        with torch.no_grad():
            for p in params:
                p.normal_(0, 0.02)
    model.train()
    rng = torch.Generator().manual_seed(0)
    pool = negative_pool(pairs, dataset.corpus)
    candidates = torch.randint(len(pool), (len(pairs.pairs), 30), generator=rng).tolist()
    batches = []
    for _ in range(args.parts):
        chosen = torch.randperm(len(units), generator=rng)[:args.units].tolist()
        batch = build_batch(pairs, units, chosen, cfg, rng, draw_negatives(pool, cfg, rng), None,
                            hard=(pool, candidates))
        batches.append(batch)
    sorted_order = cs.length_order
    row_order = lambda texts: list(range(len(texts)))  # noqa: E731
    tracker = lambda weight_norms: functools.partial(GhostNorms, weight_norms=weight_norms)  # noqa: E731
    arms = ({"row order, dropout": (row_order, True, "auto"), "length order, dropout": (sorted_order, True, "auto"),
             "length order, no dropout": (sorted_order, False, "auto")} if args.arms == "order" else
            {"ghost": (sorted_order, False, "ghost"), "auto": (sorted_order, False, "auto")})

    def use(name: str) -> None:
        cs.length_order, dropout, weight_norms = arms[name]
        cs.GhostNorms = tracker(weight_norms)
        model.train(dropout)

    for batch in batches:  # fill the frozen-prefix cache and warm up
        cs.clipped_sum("public-negatives", model, params, batch, cfg)
    times = {name: [] for name in arms}
    for r in range(args.repeats):
        for name in (arms if r % 2 == 0 else reversed(list(arms))):
            use(name)
            start = time.perf_counter()
            for b in batches:
                cs.clipped_sum("public-negatives", model, params, b, cfg)
            times[name].append(time.perf_counter() - start)
    same = []  # every arm's clipped sum against the first arm's, without dropout (up to float rounding)
    for b in batches:
        got = {}
        for name in arms:
            use(name)
            model.eval()
            got[name] = cs.clipped_sum("public-negatives", model, params, b, cfg)[0]
        first = got[next(iter(arms))]
        same.append(max(float((x - y).abs().max()) for g in got.values() for x, y in zip(g, first)))
    cs.length_order, cs.GhostNorms = sorted_order, GhostNorms
    med = {name: statistics.median(t) for name, t in times.items()}
    print(json.dumps({
        "data": str(args.data), "parts": args.parts, "units_per_part": args.units,
        "hard_negatives": args.hard_negatives, "trainable": args.trainable, "max_doc_tokens": args.max_doc_tokens,
        "lora_rank": args.lora_rank if args.trainable == "lora" else None, "clip_norm": args.clip_norm,
        "threads": torch.get_num_threads(), "seconds_median": med, "seconds_all": times,
        "speed_up_over_first_arm": {name: med[next(iter(arms))] / t for name, t in med.items()},
        "max_abs_difference_of_clipped_sums_eval_mode": max(same),
    }, indent=2))


if __name__ == "__main__":
    main()
