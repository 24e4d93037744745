"""Model weights as Flower ``ArrayRecord``s, their checkpoint files, and the encoder they are loaded into.

Shared by the ClientApp (:mod:`privret.federated.client_app`) and the ServerApp
(:mod:`privret.federated.server_app`): both load the same encoder with the same trainable parameters
(``FedConfig.trainable``, :func:`privret.models.trainable.make_trainable`) and exchange only those;
the frozen ones are the checkpoint's on every node. How they travel: :mod:`privret.federated.wire`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from privret.settings.federated import FedConfig
from privret.io import atomic_path

try:  # flwr is needed for the apps only; the rest of privret.federated works without it
    from flwr.app import Array, ArrayRecord
except ImportError:  # pragma: no cover - exercised only without flwr installed
    Array = ArrayRecord = None


def new_encoder(cfg: FedConfig):
    """``cfg.model`` with ``cfg.trainable`` parameters trainable, loaded with torch seeded by ``cfg.seed``
    (what the load initialises, LoRA adapters included, is the same on every node), in a forked random
    state: the caller's torch stream is left as it was."""
    from privret.models.encoder import load_encoder
    from privret.models.trainable import make_trainable

    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        model = load_encoder(cfg.model, max_seq_length=cfg.max_sentence_tokens, device=cfg.device)
        make_trainable(model, cfg.trainable, lora_rank=cfg.lora_rank)
        return model


def trainable_parameters(model) -> dict[str, torch.nn.Parameter]:
    return {k: p for k, p in model.named_parameters() if p.requires_grad}


def load_weights(model, arrays: ArrayRecord) -> None:
    """The trainable parameters of ``model`` from ``arrays`` (a missing or extra name is an error)."""
    params = trainable_parameters(model)
    if set(arrays) != set(params):
        missing, extra = sorted(set(params) - set(arrays)), sorted(set(arrays) - set(params))
        raise ValueError(f"the arrays do not match the trainable parameters (missing {missing[:3]}, "
                         f"unexpected {extra[:3]}): do both ends use the same model and trainable setting?")
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(torch.from_numpy(arrays[k].numpy()).to(p.dtype))


def weights(model) -> ArrayRecord:
    """A float32 copy of ``model``'s trainable parameters as an ArrayRecord (what a message carries)."""
    return ArrayRecord({k: Array(p.detach().float().cpu().numpy().copy())
                        for k, p in trainable_parameters(model).items()})


ROUND_KEY = "__round__"  # beside the weights in a checkpoint: the FedAvg round that produced them


def save_arrays(path: Path, arrays: ArrayRecord, *, round_number: int | None = None) -> None:
    """``arrays`` as an .npz (atomic); ``round_number`` is stored in the same file, so that the weights and
    the round they come from can never disagree after a crash."""
    extra = {} if round_number is None else {ROUND_KEY: np.array(round_number, dtype=np.int64)}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **{k: v.numpy() for k, v in arrays.items()}, **extra)


def load_arrays(path: Path) -> ArrayRecord:
    with np.load(path) as data:
        return ArrayRecord({k: Array(data[k]) for k in data.files if k != ROUND_KEY})


def checkpoint_round(path: Path) -> int | None:
    """The round stored with the weights by :func:`save_arrays`, or None (no file, or none stored)."""
    if not Path(path).is_file():
        return None
    with np.load(path) as data:
        return int(data[ROUND_KEY]) if ROUND_KEY in data.files else None
