"""Weight-space interpolation of a fine-tuned encoder with the model it started from (WiSE-FT).

``theta(alpha) = (1 - alpha) theta_base + alpha theta_tuned`` for every floating-point tensor of the two
state dicts (Wortsman et al., "Robust fine-tuning of zero-shot models", CVPR 2022). alpha = 0 is the
base model, 1 the fine-tuned one; in between, the fine-tune's gain is often kept while what it lost
of the base model's zero-shot quality comes back. Both models must have the same architecture (the
tuned one was fine-tuned from the base). Integer buffers (position ids) are taken from the base.
Interpolating two public or DP models is post-processing: it costs no privacy.
"""

from __future__ import annotations

import copy

from privret.errors import InputError
from privret.models.encoder import load_encoder


def blend(base, tuned, weight: float):
    """``base + weight (tuned - base)`` for one floating-point tensor, in ``base``'s dtype: the interpolation for
    weight in [0, 1], an extrapolation along the fine-tune's update for weight > 1 (task arithmetic; the caller
    fixes the weight, and only a weight chosen without the private log keeps a DP model's guarantee)."""
    return base + weight * (tuned.to(base.dtype) - base)


def interpolate(base, tuned, alpha: float, *, name: str = "tuned"):
    """A new model (a deep copy of ``base``) with weights ``(1 - alpha) base + alpha tuned``; ``name``
    labels ``tuned`` in errors."""
    if not 0.0 <= alpha <= 1.0:
        raise InputError(f"interpolation weight {alpha:g} is not in [0, 1]", field="weights")
    base_state, tuned_state = base.state_dict(), tuned.state_dict()
    if base_state.keys() != tuned_state.keys():
        missing = sorted(base_state.keys() ^ tuned_state.keys())[:3]
        raise InputError(f"{name} is not a fine-tune of the base model: their parameters differ ({', '.join(missing)})",
                         field="base")
    mixed = {}
    for key, b in base_state.items():
        t = tuned_state[key]
        if b.shape != t.shape:
            raise InputError(f"{name} is not a fine-tune of the base model: {key} has shape {tuple(t.shape)}, "
                             f"not {tuple(b.shape)}", field="base")
        mixed[key] = blend(b, t, alpha) if b.is_floating_point() else b.clone()
    model = copy.deepcopy(base)
    model.load_state_dict(mixed)
    return model


def load_interpolated(source: str | None, weight: float, *, base: str, max_seq_length: int, base_model=None):
    """``source`` (a saved encoder) interpolated with ``base`` at ``weight``; ``source`` None is the base itself,
    weight 1 the source itself (the base is then not loaded). ``base_model``: ``base`` already loaded."""
    if source is not None and weight == 1.0:
        return load_encoder(str(source), max_seq_length=max_seq_length)
    base_model = base_model if base_model is not None else load_encoder(base, max_seq_length=max_seq_length)
    if source is None:
        return base_model
    tuned = load_encoder(str(source), max_seq_length=max_seq_length)
    return interpolate(base_model, tuned, weight, name=str(source))
