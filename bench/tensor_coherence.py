"""Where a direct-DP step's signal lives, tensor by tensor, on a public log: what each trained tensor adds to the
noise and what it carries of the units' common direction.

In a full-batch DP step every trained coordinate gets the same noise, N(0, (sigma C / N)^2) after the division by N,
whatever its gradient; Adam then moves every coordinate by about its learning rate, so each coordinate the run trains
costs the same random walk. What a coordinate j gives back is the part of the units' gradients they share: the
clipped mean m_j = (1/N) sum_u clip_C(g_u)_j. For a group of coordinates T (a tensor type over the trained layers)
this reports, from every unit's gradient at the initial public encoder (the shipped rule's objective, one unit at a
time, no dropout: ``privret.train.dp_retriever.public_unit_gradients``, what a public subspace is fitted on), for two families of groups, each of which covers every coordinate once (tensor types across the
layers; layers):

* ``d``: its coordinates (its share of the run's noise: d_T / d);
* ``signal``: ||m_T||^2 estimated without the units' own sampling noise, as <m_T(A), m_T(B)> over two random halves
  A, B of the units (the plain ||m_T||^2 adds about (1/N) of the units' mean squared norm);
* ``share``: its part of the whole signal (sum over T = 1, up to the estimate's noise);
* ``per_coordinate``: signal / d_T against the whole's signal / d: above 1, the group carries more than its
  coordinates' share;
* ``fisher_share``: its part of the units' mean squared clipped gradient, (1/N) sum_u ||clip_C(g_u)_T||^2 (the
  empirical Fisher's trace on T): a proxy for what a random move of T's coordinates costs the loss, since a noisy
  step's damage is about (1/2) sum_j H_jj delta_j^2 and the Fisher stands in for the Hessian's diagonal H_jj;
* ``per_fisher``: share / fisher_share: above 1, the group returns more signal than it is sensitive to noise.

With ``--lr-scales FILE`` it also writes, for each trained tensor t (one layer's tensor type), the learning-rate
scale s_t = max(0, share_t / fisher_share_t) at the first clip norm given (the run's C), for ``privret retriever train
--dp --lr-scales FILE``. Why that ratio: with Adam driven by noise-dominated updates, T steps at a coordinate's
learning rate lr_j move it by about lr_j T m_j / (sigma C / N) along its signal and by about lr_j sqrt(T) at random,
so in a quadratic model the loss changes by sum_j [-lr_j T m_j^2 N / (sigma C) + (1/2) H_jj lr_j^2 T]; the best
lr_j is proportional to m_j^2 / H_jj, which over a tensor is its signal over its Fisher trace. With every scale 1
this is the uniform step; the scales keep the uniform step's level where a tensor's ratio is the whole's. A tensor
whose Fisher share is below 1e-6 has no gradient (the key biases: softmax ignores a shift shared by every key) and
gets 0. Public data in, public scales out: the run that uses them spends no epsilon on them.

Read on a public log (for SciFact the domain proxy: prompted claims, epsilon 0), never on a private one: a choice of
what to train made from a private log's gradients, without noise, would be outside the run's guarantee.

    .venv/bin/python bench/tensor_coherence.py --data runs/proxy/scifact-proxy --json bench/results/tensor_coherence.json
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from privret.data.beir import load_beir
from privret.data.pairs import pairs_from_beir
from privret.io import write_json_atomic
from privret.models.encoder import load_encoder
from privret.models.trainable import make_trainable
from privret.train.dp_retriever import negative_pool, public_unit_gradients
from privret.train.settings import DPRetrieverConfig

# the shipped SciFact rule (configs/scifact.yaml, direct_dp.per_method.public-negatives), the settings a gradient sees
SHIPPED = {"method": "public-negatives", "trainable": "bias-top:3", "hard_negatives": 2, "public_negatives": 1,
           "max_doc_tokens": 256, "dropout": False, "epsilon": 8.0, "batch_size": 807, "epochs": 48}


def tensor_type(name: str) -> str:
    """A trained tensor's name without its layer index: what it is in every layer."""
    return re.sub(r"^.*?layer\.\d+\.", "", name)


def type_and_layer(name: str) -> list[str]:
    """The groups a trained tensor is counted in: its type, and its layer if it has one."""
    layer = re.search(r"layer\.(\d+)\.", name)
    return [tensor_type(name)] + ([f"layer {layer.group(1)}"] if layer else [])


def groups_of(named: dict[str, torch.nn.Parameter],
              keys: Callable[[str], list[str]] = type_and_layer) -> dict[str, list[tuple[int, int]]]:
    """(offset, length) slices of the flattened trainable vector, by group; ``keys`` names a tensor's groups."""
    groups: dict[str, list[tuple[int, int]]] = defaultdict(list)
    offset = 0
    for name, p in named.items():
        for key in keys(name):
            groups[key].append((offset, p.numel()))
        offset += p.numel()
    return dict(groups)


def coherence(grads: torch.Tensor, groups: dict[str, list[tuple[int, int]]], clip: float, seed: int = 0) -> dict:
    """Per group: d, the split-half signal, its share and its per-coordinate ratio (module docstring), at clip C."""
    norms = grads.norm(dim=1, keepdim=True)
    clipped = grads * (clip / norms.clamp_min(1e-12)).clamp(max=1.0)
    order = torch.randperm(len(grads), generator=torch.Generator().manual_seed(seed))
    half = len(order) // 2
    mean_a, mean_b = clipped[order[:half]].mean(0), clipped[order[half:2 * half]].mean(0)
    total, d = float(mean_a @ mean_b), grads.shape[1]
    fisher = clipped.pow(2).mean(0)
    fisher_total = float(fisher.sum())
    rows = {}
    for name, slices in groups.items():
        index = torch.cat([torch.arange(o, o + n) for o, n in slices])
        signal, fisher_share = float(mean_a[index] @ mean_b[index]), float(fisher[index].sum()) / fisher_total
        rows[name] = {"d": len(index), "signal": signal, "share": signal / total,
                      "per_coordinate": (signal / len(index)) / (total / d), "fisher_share": fisher_share,
                      "per_fisher": signal / total / fisher_share if fisher_share > 0 else float("nan")}
    return {"clip_norm": clip, "signal": total, "units_clipped": float((norms.squeeze(1) > clip).float().mean()),
            "groups": rows}


def lr_scales(grads: torch.Tensor, named: dict[str, torch.nn.Parameter], clip: float) -> dict[str, float]:
    """Per trained tensor: max(0, share / fisher_share) at ``clip``, 0 where the Fisher share is below 1e-6 (module
    docstring)."""
    rows = coherence(grads, groups_of(named, keys=lambda name: [name]), clip)["groups"]
    return {name: 0.0 if g["fisher_share"] < 1e-6 else max(0.0, g["per_fisher"]) for name, g in rows.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a public BEIR log; its train split's query units")
    ap.add_argument("--units", type=int, default=0, help="units to read (0: all)")
    ap.add_argument("--clip-norms", default="1,0.3,0.1")
    ap.add_argument("--trainable", default=SHIPPED["trainable"],
                    help="the candidate coordinates (privret.models.trainable's specs; default: the shipped rule's)")
    ap.add_argument("--json", type=Path, default=Path("bench/results/tensor_coherence.json"))
    ap.add_argument("--lr-scales", type=Path, help="write each trained tensor's learning-rate scale at the first "
                                                   "clip norm here (module docstring)")
    ap.add_argument("--cache-dir", type=Path, help="the public encoder's corpus embeddings (the runs' --cache-dir)")
    args = ap.parse_args()
    torch.manual_seed(0)
    dataset = load_beir(args.data, ["train"])
    pairs = pairs_from_beir(dataset, "train")
    settings = {**SHIPPED, "trainable": args.trainable}
    cfg = DPRetrieverConfig(**settings)
    units = pairs.units(cfg.unit)
    units = units[:args.units] if args.units else units
    model = load_encoder(cfg.model, max_seq_length=cfg.max_doc_tokens)
    named = make_trainable(model, cfg.trainable)
    grads = public_unit_gradients(model, list(named.values()), pairs, units, negative_pool(pairs, dataset.corpus), cfg,
                                  cache_dir=args.cache_dir)
    groups = groups_of(named)
    entry = {"data": str(args.data), "units": len(units), "parameters": grads.shape[1], "settings": settings,
             "norm_quantiles": dict(zip(("10%", "25%", "50%", "75%", "90%"), torch.quantile(
                 grads.norm(dim=1), torch.tensor([.1, .25, .5, .75, .9])).tolist())),
             "by_clip": [coherence(grads, groups, float(c)) for c in args.clip_norms.split(",")]}
    write_json_atomic(args.json, entry)
    if args.lr_scales:
        clip = float(args.clip_norms.split(",")[0])
        scales = lr_scales(grads, named, clip)
        write_json_atomic(args.lr_scales, {"data": str(args.data), "units": len(units), "clip_norm": clip,
                                           "settings": settings, "scales": scales})
        print(f"learning-rate scales at C = {clip:g} -> {args.lr_scales}")
        for name, scale in scales.items():
            print(f"  {name:60s} {scale:5.2f}")
    for row in entry["by_clip"]:
        print(f"C = {row['clip_norm']:g} (units clipped {row['units_clipped']:.0%}, signal {row['signal']:.3g})")
        for name, g in sorted(row["groups"].items(), key=lambda kv: -kv[1]["per_coordinate"]):
            print(f"  {name:40s} d {g['d']:6d}  share {g['share']:6.1%}  per coordinate {g['per_coordinate']:5.2f}"
                  f"  Fisher {g['fisher_share']:6.1%}  per Fisher {g['per_fisher']:5.2f}")


if __name__ == "__main__":
    main()
