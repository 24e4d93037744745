"""The privacy ledger: what a DP release cost, written beside every checkpoint.

The ledger travels with everything derived from the release (synthetic data, retrievers
trained on it, reports). By post-processing, a derived artefact has the same guarantee.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from privret.errors import InputError
from privret.io import write_text_atomic

LEDGER_FILE = "privacy_ledger.json"


def has_ledger(location: str | Path) -> bool:
    """Whether ``location`` (a model or dataset directory) carries a privret privacy ledger, i.e. was
    derived from private data by privret; a registry name or hub id never does."""
    return (Path(location).expanduser() / LEDGER_FILE).is_file()


class PrivacyLedger(BaseModel):
    """(epsilon, delta)-DP with respect to one privacy ``unit`` of the dataset ``data_hash``.

    ``epsilon`` is ``inf`` for a non-private reference. ``steps`` counts every noisy update that
    was (or could have been) written to disk; ``epsilon`` is what the accountant charges for them.
    ``data_hash`` identifies the files read (stage fingerprints and resumes compare it);
    ``dataset_id`` is the dataset's identity in the budget registry
    (:func:`privret.privacy.budget.dataset_id`, set by the trainers that record releases; empty in
    older ledgers and in those of the non-private references and federated runs).
    """

    model_config = ConfigDict(ser_json_inf_nan="strings", extra="forbid")

    mechanism: str  # "dp-sgd", a direct-retriever DP method, or "none"
    epsilon: float
    delta: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    planned_steps: int
    accountant: str
    unit: str
    n_units: int
    n_pairs: int
    clip_norm: float
    model: str
    trainable: str
    data_hash: str
    dataset_id: str = ""
    secure_rng: bool = False
    created_at: str = ""

    @property
    def is_private(self) -> bool:
        return math.isfinite(self.epsilon)

    def save(self, directory: str | Path) -> Path:
        stamped = self.model_copy(update={"created_at": self.created_at or datetime.now(timezone.utc).isoformat()})
        path = Path(directory) / LEDGER_FILE
        write_text_atomic(path, stamped.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> PrivacyLedger:
        path = Path(directory) / LEDGER_FILE
        if not path.is_file():
            raise InputError("no privacy ledger (was this written by privret?)", path=path)
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, ValueError) as err:
            raise InputError(f"unreadable ledger: {str(err).splitlines()[0]}", path=path) from None

    def summary(self) -> str:
        if not self.is_private:
            return f"non-private (epsilon = inf), unit={self.unit}, n={self.n_units}"
        return (f"({self.epsilon:.3g}, {self.delta:.2g})-DP per {self.unit}, sigma={self.noise_multiplier:.3g}, "
                f"q={self.sample_rate:.3g}, steps={self.steps}, C={self.clip_norm:g}, {self.accountant}")
