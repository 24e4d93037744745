"""Where direct-DP runs moved: each run's displacement from the public encoder, against a noise floor and a reference.

For runs r with trained tensors theta_r and the public encoder theta_0, Delta_r = theta_r - theta_0 (over the
tensors every run trains). Reported per run:

* ``norm``: ||Delta_r||;
* ``cosine`` with the reference run's displacement Delta_ref (``--reference``; for issue 12 the noise-free run of
  the same schedule, which reads the private log without DP: a measurement, it chooses nothing) and ``projection``
  = <Delta_r, Delta_ref> / ||Delta_ref||, how far r travelled along the reference's direction;
* per tensor type (``by_type``: the name with its layer index removed): ``power``, the mean squared displacement per coordinate,
  and ``power_over_floor``, that over the same mean for the floor tensors (``--floor``, by default the attention key
  biases: softmax ignores a shift shared by every key, so their gradient is zero and a DP run moves them by its
  noise alone; the ratio says how much more than pure noise a tensor moved; it means nothing for a run without
  noise), and the per-type cosine; the same per layer (``by_layer``).

    .venv/bin/python bench/displacement_geometry.py --reference K/RUN-nonoise K/RUN-eps8 K/RUN-eps3 \\
        --json bench/results/displacement_placebo/geometry.json

where each argument is a kept run's directory (holding ``parameters.safetensors``) or a tensors file itself
(``bench/displacement_placebo.sh`` writes its placebos and means as such files).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

LAYER = re.compile(r"\.layer\.\d+\.")


def tensor_type(name: str) -> str:
    """The tensor's name without its layer index (``encoder.layer.4.output.dense.bias`` -> ``output.dense.bias``)."""
    parts = LAYER.split(name)
    return parts[-1] if len(parts) > 1 else name


def layer_of(name: str) -> str:
    """``layer 4`` for a tensor of ``encoder.layer.4``; the name itself outside the layers."""
    found = re.search(r"\.layer\.(\d+)\.", name)
    return f"layer {found.group(1)}" if found else name


def displacement_geometry(changed: dict[str, torch.Tensor], base: dict[str, torch.Tensor],
                          reference: dict[str, torch.Tensor] | None = None, floor: str = "key.bias") -> dict:
    """The figures above for one run; ``floor`` selects the floor tensors by a substring of their names."""
    names = sorted(changed)
    delta = {n: (changed[n].float() - base[n].float()).flatten() for n in names}
    floor_names = [n for n in names if floor in n]
    floor_power = (float(torch.cat([delta[n] for n in floor_names]).pow(2).mean()) if floor_names else None)
    out: dict = {"norm": float(torch.cat(list(delta.values())).norm()), "tensors": len(names),
                 "coordinates": sum(d.numel() for d in delta.values()), "floor_power": floor_power}
    ref = None
    if reference is not None:
        missing = [n for n in names if n not in reference]
        if missing:
            raise ValueError(f"the reference run does not train {missing[0]}")
        ref = {n: (reference[n].float() - base[n].float()).flatten() for n in names}
        whole, whole_ref = torch.cat(list(delta.values())), torch.cat(list(ref.values()))
        out["cosine"] = float(whole @ whole_ref / (whole.norm() * whole_ref.norm()))
        out["projection"] = float(whole @ whole_ref / whole_ref.norm())
    for key, group_of in (("by_type", tensor_type), ("by_layer", layer_of)):
        out[key] = _grouped(delta, ref, floor_power, group_of)
    return out


def _grouped(delta: dict[str, torch.Tensor], ref: dict[str, torch.Tensor] | None, floor_power: float | None,
             group_of) -> dict[str, dict]:
    """Power, power over the floor and cosine with the reference, over the tensors ``group_of`` puts together."""
    groups: dict[str, dict] = {}
    for kind in sorted({group_of(n) for n in delta}):
        members = [n for n in delta if group_of(n) == kind]
        d = torch.cat([delta[n] for n in members])
        row = {"coordinates": d.numel(), "power": float(d.pow(2).mean())}
        if floor_power:
            row["power_over_floor"] = row["power"] / floor_power
        if ref is not None:
            r = torch.cat([ref[n] for n in members])
            row["cosine"] = float(d @ r / (d.norm() * r.norm())) if d.norm() > 0 and r.norm() > 0 else None
        groups[kind] = row
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="kept runs' directories (each with parameters.safetensors) or tensors files")
    ap.add_argument("--reference", type=Path, help="a kept run (or tensors file) whose displacement the others are compared with")
    ap.add_argument("--base", default="minilm-l6", help="the public encoder the runs started from")
    ap.add_argument("--floor", default="key.bias", help="the noise-floor tensors, by a substring of their names")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()

    from safetensors.torch import load_file

    from privret.io import write_json_atomic
    from privret.models.encoder import load_encoder

    def tensors(path: Path) -> dict[str, torch.Tensor]:
        return load_file(str(path if path.is_file() else path / "parameters.safetensors"))

    base = {n: p.detach() for n, p in load_encoder(args.base).named_parameters()}
    reference = tensors(args.reference) if args.reference else None
    result = {"reference": str(args.reference) if args.reference else None, "floor": args.floor, "runs": {}}
    for run in [*([args.reference] if args.reference else []), *args.runs]:
        geometry = displacement_geometry(tensors(run), base, reference, args.floor)
        result["runs"][run.stem if run.is_file() else run.name] = geometry
        ratios = [r["power_over_floor"] for k, r in geometry["by_type"].items() if args.floor not in k
                  and "power_over_floor" in r]
        line = f"{run.name}: |Delta| {geometry['norm']:.3f}"
        if reference is not None:
            line += f", cosine {geometry['cosine']:.3f}, projection {geometry['projection']:.3f}"
        if ratios:
            line += f", power over the floor {min(ratios):.2f} to {max(ratios):.2f}"
        print(line)
    write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()
