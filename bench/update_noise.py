"""How much of a DP run's update is signal: the agreement of independent runs of one regime.

Each private run releases theta_i = theta_0 + Delta_i. Model Delta_i = s + n_i, where s is what the regime moves on
average and n_i is run-specific (the Gaussian noise and the sampling, as DP-Adam turns them into steps), independent
across runs with mean 0. Then, for runs i != j,

    E[<Delta_i, Delta_j>] = |s|^2,   E[|Delta_i|^2] = |s|^2 + E|n|^2,

so  rho = mean_{i<j} <Delta_i, Delta_j> / mean_i |Delta_i|^2  estimates the share of the update's squared norm that
is signal (rho = 1: every run moves the same way; rho = 0: pure noise). It is printed for the whole update and for
each kind of tensor (the same name in every layer pooled), since noise may sit where it costs nothing: the key
biases of attention, for one, have an exactly zero gradient (a softmax does not change when every logit of a row
moves by the same q.b_k), so a noisy optimizer walks them at random and the encoder's output does not move.

``--save-mean FILE`` writes theta_0 + mean_i Delta_i (for ``bench/iterate_average.py --from-parameters``): how much
the noise costs, measured by evaluating it. That mean is NOT covered by one run's guarantee: it uses k runs on the
same log, which compose (k times the privacy loss at most). A diagnosis, never a release.

    .venv/bin/python bench/update_noise.py bench/results/direct_regimes/{top3-b512-c1-e4,top3-b512-c1-e4-nodrop,top3-b512-c1-e4-nodrop-seed1}/parameters.safetensors
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path

import torch


def kind(name: str) -> str:
    """The tensor's name with its layer index removed: 'encoder.layer.3.output.dense.bias' -> 'output.dense.bias'."""
    return re.sub(r"^.*\.layer\.\d+\.", "", name)


def signal_share(deltas: list[dict[str, torch.Tensor]]) -> dict[str, dict[str, float]]:
    """rho (see the module docstring) and the update's root mean square, overall and per kind of tensor."""
    if len(deltas) < 2:
        raise ValueError("the agreement of runs needs at least two runs")
    names = sorted(deltas[0])
    if any(sorted(d) != names for d in deltas[1:]):
        raise ValueError("the runs changed different tensors: not runs of one regime")
    groups: dict[str, list[str]] = {"all": names}
    for n in names:
        groups.setdefault(kind(n), []).append(n)
    out = {}
    for group, members in groups.items():
        flat = [torch.cat([d[n].double().flatten() for n in members]) for d in deltas]
        cross = [float(a @ b) for a, b in itertools.combinations(flat, 2)]
        energy = [float(v @ v) for v in flat]
        mean_energy = sum(energy) / len(energy)
        out[group] = {"values": flat[0].numel(), "rms": (mean_energy / flat[0].numel()) ** 0.5,
                      "signal_share": sum(cross) / len(cross) / mean_energy if mean_energy > 0 else float("nan")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="each run's changed tensors (keep:<name>'s parameters.safetensors)")
    ap.add_argument("--base", default="minilm-l6", help="the public encoder the runs started from")
    ap.add_argument("--save-mean", type=Path, help="write theta_0 + the mean update (NOT one run's guarantee)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from safetensors.torch import load_file, save_file

    from privret.models.encoder import load_encoder

    for path in args.runs:
        if not path.is_file():
            sys.exit(f"{path}: no such file (a run's kept parameters.safetensors)")
    base = {n: v.detach() for n, v in load_encoder(args.base).named_parameters()}
    released = [load_file(str(p)) for p in args.runs]
    for path, tensors in zip(args.runs, released):
        unknown = [n for n in tensors if n not in base]
        if unknown:
            sys.exit(f"{path}: tensor {unknown[0]} is not a parameter of {args.base}")
    deltas = [{n: v.float() - base[n].float() for n, v in t.items()} for t in released]
    try:
        share = signal_share(deltas)
    except ValueError as e:
        sys.exit(f"{', '.join(map(str, args.runs))}: {e}")
    print(f"{len(deltas)} runs; signal share of the update's squared norm (1 = all runs agree, 0 = noise):")
    for group, s in sorted(share.items(), key=lambda kv: (kv[0] != "all", kv[0])):
        print(f"  {group:<40} {s['signal_share']:+.3f}   rms {s['rms']:.4f}   ({s['values']} values)")
    if args.json:
        args.json.write_text(json.dumps({"runs": [str(p) for p in args.runs], "base": args.base, "groups": share},
                                        indent=1) + "\n")
    if args.save_mean:
        mean = {n: (base[n].float() + sum(d[n] for d in deltas) / len(deltas)).to(base[n].dtype).contiguous()
                for n in deltas[0]}
        args.save_mean.parent.mkdir(parents=True, exist_ok=True)
        save_file(mean, str(args.save_mean))
        print(f"{args.save_mean}: base + the mean of {len(deltas)} runs' updates (a diagnosis: {len(deltas)} runs compose)")


if __name__ == "__main__":
    main()
