"""Model weights as Flower ``ArrayRecord``s, their checkpoint files, and the encoder they are loaded into.

Shared by the ClientApp (:mod:`privret.federated.client_app`) and the ServerApp
(:mod:`privret.federated.server_app`): both load the same encoder and exchange its full state dict.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from privret.federated.config import FedConfig
from privret.io import atomic_path

try:  # flwr is needed for the apps only; the rest of privret.federated works without it
    from flwr.app import Array, ArrayRecord
except ImportError:  # pragma: no cover - exercised only without flwr installed
    Array = ArrayRecord = None


def new_encoder(cfg: FedConfig):
    """``cfg.model`` loaded with torch seeded by ``cfg.seed`` (what the load initialises is the same on every
    node), in a forked random state: the caller's torch stream is left as it was."""
    from privret.models.encoder import load_encoder

    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        return load_encoder(cfg.model, max_seq_length=cfg.max_sentence_tokens, device=cfg.device)


def load_weights(model, arrays: ArrayRecord) -> None:
    """Every weight of ``model`` from ``arrays`` (strict: a missing or extra key is an error)."""
    model.load_state_dict(arrays.to_torch_state_dict(), strict=True)


def weights(model) -> ArrayRecord:
    """A copy of ``model``'s state dict as an ArrayRecord (what a message carries)."""
    return ArrayRecord({k: Array(v.detach().cpu().numpy().copy()) for k, v in model.state_dict().items()})


def save_arrays(path: Path, arrays: ArrayRecord) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **{k: v.numpy() for k, v in arrays.items()})


def load_arrays(path: Path) -> ArrayRecord:
    with np.load(path) as data:
        return ArrayRecord({k: Array(data[k]) for k in data.files})
