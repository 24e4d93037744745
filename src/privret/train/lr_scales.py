"""Per-tensor learning-rate scales for the direct-DP trainer: a public prior on which tensors carry signal.

In a DP step every trained coordinate gets the same Gaussian noise, and Adam, driven by updates the noise dominates,
moves each coordinate j by about its learning rate lr_j per step whatever its gradient: T steps move it by about
lr_j T m_j / (sigma C / N) along the units' common clipped gradient m_j and by about lr_j sqrt(T) at random. In a
quadratic model the loss then changes by sum_j [-lr_j T m_j^2 N / (sigma C) + (1/2) H_jj lr_j^2 T], which is best
at lr_j proportional to m_j^2 / H_jj: a tensor whose coordinates carry little common signal for their curvature
should move less. ``bench/tensor_coherence.py --lr-scales`` estimates, per trained tensor, its share of ||m||^2 over
its share of the empirical Fisher's trace on a PUBLIC log (for SciFact the domain proxy of prompted claims); the
trainer multiplies each tensor's learning rate by that scale (``DPRetrieverConfig.lr_scales``).

Privacy: the scales are fixed before the run from public data, and scaling what the optimizer does with a released
noisy update is post-processing, so Delta, sigma and epsilon are unchanged. Scales computed from the private log's
own gradients would be a release of that log outside the guarantee: never do that.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from privret.errors import InputError


def read_lr_scales(path: str | Path) -> dict[str, float]:
    """The ``scales`` mapping (trained parameter name -> scale >= 0) of a ``bench/tensor_coherence.py --lr-scales``
    file, or of any JSON object holding one."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("not found", path=path, field="--lr-scales") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"is not JSON ({err})", path=path, field="--lr-scales") from None
    scales = obj.get("scales") if isinstance(obj, dict) else None
    if not isinstance(scales, dict) or not scales:
        raise InputError("needs a non-empty object 'scales' (parameter name -> learning-rate scale)", path=path,
                         field="scales")
    for name, value in scales.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(f"scale of {name!r} must be a finite number >= 0, got {value!r}", path=path,
                             field="scales")
    return {name: float(value) for name, value in scales.items()}


def scaled_param_groups(named: dict[str, torch.nn.Parameter], learning_rate: float,
                        scales: dict[str, float] | None) -> list[dict]:
    """The optimizer's parameter groups: one group at ``learning_rate`` without scales; with them, one group per
    trained tensor at ``learning_rate * scales[name]``. The scales must name exactly the trained tensors (a file made
    for another trainable set would scale the wrong ones)."""
    if not scales:
        return [{"params": list(named.values()), "lr": learning_rate}]
    missing, unknown = sorted(set(named) - set(scales)), sorted(set(scales) - set(named))
    if missing or unknown:
        what = f"has no scale for the trained tensor {missing[0]!r}" if missing else \
            f"names {unknown[0]!r}, which this run does not train"
        raise InputError(f"{what} ({len(missing)} missing, {len(unknown)} not trained): the scales were made for "
                         f"another trainable set", field="lr_scales")
    return [{"params": [p], "lr": learning_rate * scales[name]} for name, p in named.items()]
