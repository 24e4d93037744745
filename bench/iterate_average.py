"""A direct-DP run's trainable parameters, from kept iterates, as an encoder: one iterate or the mean of several.

A DP run releases every noisy step, so each iterate of DP-Adam (a deterministic function of the noisy gradients
released so far) and any mean of iterates is post-processing: the run's (epsilon, delta) covers it unchanged.
Averaging the last iterates (Polyak averaging) cancels part of the noise of the last steps; it also lags the
trajectory. This probe builds the encoder that ``--steps`` of the kept iterates give, for ``privret evaluate``.

Iterates are the ``params.safetensors`` of the run's checkpoints (``<out>/checkpoint``, overwritten every
``--checkpoint-every`` steps), copied aside while the run goes, one file per step: ``DIR/step-<n>.safetensors``;
the last step's iterate is the run's model (``--final-model DIR --final-step N`` adds it).

    .venv/bin/python bench/iterate_average.py --iterates runs/s32/iterates --steps 24-45 --out runs/s32/tail
    .venv/bin/python bench/iterate_average.py --iterates runs/s32/iterates --steps 45 --out runs/s32/last \
        --save-parameters bench/results/direct_regimes_c3/parameters-step45.safetensors

``--save-parameters FILE`` also writes the (averaged) trainable tensors alone (tens of KB for BitFit), so that
the encoder can be rebuilt from the public model in a later session (``--from-parameters FILE``). A finished run
without kept iterates: ``--keep-changed --final-model DIR --save-parameters FILE`` keeps the tensors of the run's
model that differ from ``--base``'s (bit for bit), and writes no encoder:

    .venv/bin/python bench/iterate_average.py --keep-changed --final-model runs/s32/top3-b512-c3-e4 \
        --save-parameters bench/results/direct_regimes/top3-b512-c3-e4/parameters.safetensors
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def parse_steps(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterates", type=Path, help="directory of step-<n>.safetensors files")
    ap.add_argument("--steps", type=parse_steps, help="N or LO-HI: every kept iterate with LO <= step <= HI")
    ap.add_argument("--final-model", type=Path, help="the run's saved model: its trained tensors are step --final-step")
    ap.add_argument("--final-step", type=int, default=0)
    ap.add_argument("--from-parameters", type=Path, help="a file written by --save-parameters instead")
    ap.add_argument("--base", default="minilm-l6", help="the public encoder the run started from")
    ap.add_argument("--keep-changed", action="store_true",
                    help="save the --final-model's tensors that differ from --base's; no encoder is written")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--save-parameters", type=Path)
    args = ap.parse_args()
    if args.keep_changed and not (args.final_model and args.save_parameters):
        ap.error("--keep-changed needs --final-model and --save-parameters")
    if not args.keep_changed and not args.out:
        ap.error("--out is required")

    import torch
    from safetensors.torch import load_file, save_file

    from privret.models.encoder import load_encoder

    if args.keep_changed:
        base = dict(load_encoder(args.base).named_parameters())
        final = dict(load_encoder(str(args.final_model)).named_parameters())
        changed = {n: v.detach().contiguous() for n, v in final.items() if not torch.equal(v, base[n])}
        args.save_parameters.parent.mkdir(parents=True, exist_ok=True)
        save_file(changed, str(args.save_parameters))
        print(f"{args.save_parameters}: {len(changed)} of {len(final)} tensors differ from {args.base}")
        return
    if args.from_parameters:
        mean, used = load_file(str(args.from_parameters)), None
    else:
        lo, hi = args.steps
        files = sorted((int(p.stem.split("-")[1]), p) for p in args.iterates.glob("step-*.safetensors"))
        tensors = {s: load_file(str(p)) for s, p in files if lo <= s <= hi}
        if args.final_model and lo <= args.final_step <= hi:
            final = dict(load_encoder(str(args.final_model)).named_parameters())
            tensors[args.final_step] = {name: final[name].detach() for name in load_file(str(files[0][1]))}
        used = sorted(tensors)
        if not used:
            raise SystemExit(f"no kept iterate in steps {lo}-{hi} under {args.iterates}")
        tensors = list(tensors.values())
        mean = {name: torch.stack([t[name].float() for t in tensors]).mean(dim=0) for name in tensors[0]}
    model = load_encoder(args.base)
    own = dict(model.named_parameters())
    missing = [name for name in mean if name not in own]
    if missing:
        raise SystemExit(f"{len(missing)} kept tensors are not parameters of {args.base}, e.g. {missing[0]}")
    with torch.no_grad():
        for name, value in mean.items():
            own[name].copy_(value)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save(str(args.out), safe_serialization=True)
    (args.out / "iterates.json").write_text(json.dumps({"steps": used, "base": args.base}) + "\n")
    if args.save_parameters:
        args.save_parameters.parent.mkdir(parents=True, exist_ok=True)
        save_file({n: v.contiguous() for n, v in mean.items()}, str(args.save_parameters))
    print(f"{args.out}: {len(mean)} tensors from steps {used if used is not None else args.from_parameters}")


if __name__ == "__main__":
    main()
