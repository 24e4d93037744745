"""A placebo for a direct-DP run: its displacement from the public encoder with every coordinate's sign redrawn.

A DP run at epsilon 8 on SciFact moves its 30 trained tensors mostly by noise (``bench/displacement_geometry.py``):
each tensor type's displacement has 0.93 to 1.48 times the squared norm per coordinate of the key biases' (whose
gradient is zero, so they move by noise alone), and its cosine with the noise-free run's displacement is 0.21 to
0.23 (0.11 to 0.12 at epsilon 3, which scores the same on test). Does the test gain come from the direction the
private log gave, or would any move of that size do as well? The placebo keeps every coordinate's |Delta_j| (so
each tensor's norm and the distribution of step sizes) and draws its sign at random (seeded):

    theta_placebo_j = theta_public_j + a s_j |theta_run_j - theta_public_j|,   s_j = +1 or -1 with probability 1/2

with a = ``--scale`` (1 by default; 1.5 asks what a 1.5 times longer random move costs, next to the run's update
scaled by 1.5 in docs/benchmarks.md, "The update scaled").

It is a diagnostic read on test for reporting, never a candidate: it chooses nothing. It writes the tensors in the
format of ``bench/iterate_average.py --save-parameters``, so that ``--from-parameters`` builds the encoder.

    .venv/bin/python bench/displacement_placebo.py --parameters bench/results/direct_regimes/scifact/RUN/parameters.safetensors \
        --seed 0 --out runs/placebo/RUN-seed0.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def sign_placebo(changed: dict[str, torch.Tensor], base: dict[str, torch.Tensor], seed: int,
                 scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Each tensor of ``changed`` moved from ``base`` by ``scale`` times its own |displacement|, coordinate by
    coordinate, with random signs drawn from a generator seeded with ``seed`` (tensors in sorted-name order)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name in sorted(changed):
        start = base[name].float()
        size = (changed[name].float() - start).abs()
        signs = torch.randint(0, 2, size.shape, generator=gen).float() * 2 - 1
        out[name] = (start + scale * signs * size).to(changed[name].dtype).contiguous()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parameters", type=Path, required=True,
                    help="a run's changed tensors (bench/iterate_average.py --keep-changed)")
    ap.add_argument("--base", default="minilm-l6", help="the public encoder the run started from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="a: the placebo's move is a times the run's, in size")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from safetensors.torch import load_file, save_file

    from privret.models.encoder import load_encoder

    changed = load_file(str(args.parameters))
    base = {n: p.detach() for n, p in load_encoder(args.base).named_parameters()}
    placebo = sign_placebo(changed, base, args.seed, args.scale)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    save_file(placebo, str(tmp))
    tmp.replace(args.out)
    run = torch.cat([(changed[n].float() - base[n].float()).flatten() for n in sorted(changed)])
    moved = torch.cat([(placebo[n].float() - base[n].float()).flatten() for n in sorted(changed)])
    print(f"{args.out}: {len(placebo)} tensors, |Delta| {moved.norm():.4f} (the run's {run.norm():.4f}), "
          f"cosine with the run's {float(moved @ run / (moved.norm() * run.norm())):.4f}")


if __name__ == "__main__":
    main()
