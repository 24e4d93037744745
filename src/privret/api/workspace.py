"""What every function of the Python API shares: where a trainer writes, the starting model, the budget policy and
the settings.

The trainers write a directory (checkpoints, the model, its ledger); without an ``out_dir`` the API gives them one
inside a temporary directory that is removed when the call returns, so a call writes nothing the caller did not ask
for. A ``SentenceTransformer`` instance is saved there first and trained from that copy. The budget registry is
written only when the caller passes a policy or a dataset name (:func:`budget_policy`).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from privret.errors import InputError, invalid_input
from privret.privacy.budget import BudgetPolicy

LEDGER_ATTRIBUTE = "privret_ledger"  # set on every model the API returns: the ledger of the data it was trained on


@contextlib.contextmanager
def workspace(out_dir: str | Path | None, *, resume: bool, name: str) -> Iterator[tuple[Path, Path]]:
    """(output, scratch): ``out_dir`` (or ``<scratch>/name``) and a temporary directory, removed on exit, for what
    the call saves before training; resuming needs an ``out_dir`` to resume in."""
    if out_dir is None and resume:
        raise InputError("resuming continues the run saved in out_dir; give out_dir", field="resume")
    with tempfile.TemporaryDirectory(prefix="privret-") as scratch:
        yield (Path(out_dir) if out_dir is not None else Path(scratch) / name), Path(scratch)


def model_location(model, scratch: Path) -> str:
    """``model`` as a name or path the trainers load: a registry name, hub id or path as it is; a
    ``SentenceTransformer`` instance saved under ``scratch`` (with the ledger of the data it was trained on when the
    API returned it, so that one trained on private data is refused as a public starting point)."""
    if isinstance(model, (str, Path)):
        return str(model)
    if not hasattr(model, "save"):
        raise InputError(f"expected a SentenceTransformer, a registry name or a path, got {type(model).__name__}",
                         field="model")
    location = scratch / "start"
    model.save(str(location), safe_serialization=True)
    ledger = getattr(model, LEDGER_ATTRIBUTE, None)
    if ledger is not None:
        ledger.save(location)
    return str(location)


def budget_policy(budget: BudgetPolicy | None, dataset_name: str | None) -> BudgetPolicy:
    """``budget``; with none, the default policy when a ``dataset_name`` is given, else a policy that records and
    checks nothing (the caller composes this release with any other on the same data)."""
    if budget is not None:
        return budget
    return BudgetPolicy() if dataset_name else BudgetPolicy(enabled=False)


def settings_model(cls, **values):
    """``cls(**values)`` (a pydantic model of :mod:`privret.settings`); a bad name or value is an
    :class:`InputError` naming the field."""
    try:
        return cls(**values)
    except ValidationError as err:
        raise invalid_input(err) from None

