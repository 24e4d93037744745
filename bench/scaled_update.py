"""A direct-DP run's update scaled by a fixed factor: theta_0 + w (theta_run - theta_0), as an encoder.

A DP run releases theta_run; any function of it that does not read the private log is post-processing, so the
run's (epsilon, delta) covers the scaled model unchanged *provided w is fixed without the private log* (a priori or
on a public proxy). w < 1 is WiSE-FT's interpolation toward the public encoder (``privret retriever interpolate``);
w > 1 extrapolates along the update, as task arithmetic scales a task vector (Ilharco et al., "Editing models with
task arithmetic", ICLR 2023). Why w > 1 can help a DP run: DP-Adam at a fixed learning rate takes about lr per step
on every coordinate, so a short noisy run may stop before the signal part of its update has gone far enough; why
it can hurt: the noise part is scaled by the same w (on SciFact's epsilon-8 runs that part is harmless even at
w = 1.5, while the private part overshoots: docs/benchmarks.md, "Where the DP gain comes from").

The input is a kept run's changed tensors (``parameters.safetensors``, written by ``bench/iterate_average.py
--keep-changed``), so the run can be scaled in a later session without its work directory. With ``--ledger-from
DIR`` the run's ``privacy_ledger.json`` is copied beside the encoder (the ledger is the run's: same release).

    .venv/bin/python bench/scaled_update.py --parameters bench/results/direct_regimes/small/R-t48-lr2e-3/parameters.safetensors \
        --weight 2 --out runs/s34/scaled/small-w2
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path


def scale_update(base: dict, run: dict, weight: float) -> dict:
    """{name: base[name] + weight (run[name] - base[name])} for every tensor of ``run`` (privret's ``blend``)."""
    from privret.models.interpolation import blend

    missing = [name for name in run if name not in base]
    if missing:
        raise ValueError(f"{len(missing)} tensors of the run are not in the base model, e.g. {missing[0]}")
    return {name: blend(base[name], value, weight) for name, value in run.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parameters", type=Path, required=True, help="the run's changed tensors (safetensors)")
    ap.add_argument("--weight", type=float, required=True, help="w: 1 is the run itself, 0 the public encoder")
    ap.add_argument("--base", default="minilm-l6", help="the public encoder the run started from")
    ap.add_argument("--ledger-from", type=Path, help="the run's directory: its privacy_ledger.json is copied")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not (math.isfinite(args.weight) and args.weight > 0):
        ap.error(f"--weight {args.weight:g}: give a positive finite number")
    if args.out.exists():
        ap.error(f"{args.out} already exists")

    import torch
    from safetensors.torch import load_file

    from privret.io import atomic_path
    from privret.models.encoder import load_encoder

    model = load_encoder(args.base)
    own = dict(model.named_parameters())
    scaled = scale_update({n: p.detach() for n, p in own.items()}, load_file(str(args.parameters)), args.weight)
    with torch.no_grad():
        for name, value in scaled.items():
            own[name].copy_(value)
    with atomic_path(args.out) as staged:
        model.save(str(staged), safe_serialization=True)
        if args.ledger_from:
            shutil.copyfile(args.ledger_from / "privacy_ledger.json", staged / "privacy_ledger.json")
        (staged / "scaled_update.json").write_text(json.dumps(
            {"base": args.base, "parameters": str(args.parameters), "weight": args.weight}) + "\n")
    print(f"{args.out}: {len(scaled)} tensors, update scaled by {args.weight:g}")


if __name__ == "__main__":
    main()
