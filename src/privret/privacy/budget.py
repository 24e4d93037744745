"""Per-dataset registry of DP releases and their cumulative cost under composition.

Every DP run on a private dataset is a *release*, and releases on one dataset compose. A release is keyed by the
dataset's identity, :func:`dataset_id` (the set of normalised (query text, document text) records, whatever the file
format, order or split; a user-given ``--dataset-name`` instead; a ledger without it by its ``data_hash``), in one
append-only JSON-lines file per dataset under ``$PRIVRET_BUDGET_DIR`` (default ``~/.cache/privret/budget``),
appended and fsynced under an exclusive ``flock``. A release is recorded ``planned`` before its first update can
reach disk and ``final`` when it ends, and costs its largest recorded step count: a killed run counts in full.

:func:`check_and_record` refuses, before training, a release that would take its dataset past ``cap``
(:data:`DEFAULT_CAP`) or use a second privacy unit, unless going over is allowed (a :class:`BudgetWarning`).
:func:`compose`, per dataset and unit: Poisson-subsampled Gaussian releases form one history that Opacus's RDP and
PRV accountants compose (valid for any order and adaptivity; the smaller bound, at the largest delta), any other
release adds by basic composition, and the two sides of one partition count as the larger (docs/reliability.md,
section 2; docs/privacy.md, section "A held-out choice, at no epsilon beyond the run's"). Non-DP runs are not recorded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import unicodedata
import uuid
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field

from privret.errors import InputError
from privret.io import append_log_record, read_log_records
from privret.privacy.commitment import commit, is_committed
from privret.privacy.hold_out import LogPart, compose_parts

if TYPE_CHECKING:
    from privret.data.pairs import TrainingPairs

BUDGET_ENV = "PRIVRET_BUDGET_DIR"
GAUSSIAN_ACCOUNTANTS = ("prv", "rdp")

DEFAULT_CAP = 10.0
"""Total epsilon that all DP releases on one dataset may spend unless the user says otherwise.

A run that would take the dataset past it is refused before training; ``--budget-cap`` sets
another cap, ``--allow-over-budget`` (a pipeline config's ``budget.allow_over``) runs anyway with
a warning. 10 lets one release at epsilon 8 (the largest finite epsilon of the shipped generator
grid) through and stops a second one."""

Cap = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A budget cap: a finite epsilon > 0."""


class BudgetWarning(UserWarning):
    """Cumulative epsilon past the cap, allowed by an explicit override."""


class Release(BaseModel):
    """One record of the registry (several records may describe one ``release_id``)."""

    model_config = ConfigDict(ser_json_inf_nan="strings", extra="ignore")

    release_id: str
    status: str  # planned | final
    data_hash: str
    dataset_id: str = ""
    unit: str
    n_units: int
    mechanism: str
    accountant: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    epsilon: float
    part: LogPart | None = None
    artefact: str = ""
    recorded_at: str = ""

    @property
    def dataset(self) -> str:
        """The registry key: ``dataset_id``, or ``data_hash`` for a ledger that has none."""
        return self.dataset_id or self.data_hash

    @property
    def gaussian(self) -> bool:
        return (self.accountant in GAUSSIAN_ACCOUNTANTS and self.noise_multiplier > 0
                and 0 < self.sample_rate <= 1 and self.steps >= 0)

    @classmethod
    def from_ledger(cls, ledger, *, release_id: str, status: str, artefact: str | Path = "") -> Release:
        return cls(release_id=release_id, status=status, data_hash=ledger.data_hash,
                   dataset_id=ledger.dataset_id, unit=ledger.unit,
                   n_units=ledger.n_units, mechanism=ledger.mechanism, accountant=ledger.accountant,
                   noise_multiplier=ledger.noise_multiplier, sample_rate=ledger.sample_rate, steps=ledger.steps,
                   delta=ledger.delta, epsilon=ledger.epsilon, part=ledger.part, artefact=str(artefact))


class Composition(BaseModel):
    """The cumulative guarantee of several releases on one dataset and unit."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    epsilon: float
    delta: float
    releases: int
    method: str
    unit: str = ""


class BudgetPolicy(BaseModel):
    """What a run does with the registry: record always; refuse past ``cap`` or at a second
    privacy unit unless ``allow_over``."""

    cap: Cap = DEFAULT_CAP
    allow_over: bool = False
    directory: Path | None = None
    enabled: bool = True


def new_release_id() -> str:
    return uuid.uuid4().hex


def _normal_text(text: str) -> str:
    """NFC, runs of whitespace as one space, no leading or trailing whitespace."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def dataset_id(pairs: TrainingPairs, name: str | None = None) -> str:
    """The registry key of the private data ``pairs``: releases with the same key compose.

    With a ``name`` (normalised like the texts below): ``name-<name>``, whatever the data; the user
    ties versions of a log together this way. Without: ``sha256-<hex>`` of the sorted *set* of its
    records (query text, document text), every text NFC-normalised with its whitespace collapsed,
    a document counted by its full text (title included), never by its id. File bytes and format,
    row order, repeated rows, ids, split names, and a BEIR corpus vs documents inline in a pairs
    file do not change it; any edit of a text, or a row more or less, does.
    """
    label = _normal_text(name or "")
    if label:
        return f"name-{label}"
    records = sorted({(_normal_text(p.query), _normal_text(pairs.corpus[p.doc_id].full_text)) for p in pairs.pairs})
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record).encode("ascii") + b"\n")  # JSON: unambiguous separators
    return f"sha256-{digest.hexdigest()}"


def budget_dir(directory: str | Path | None = None) -> Path:
    if directory is not None:
        return Path(directory)
    if os.environ.get(BUDGET_ENV):
        return Path(os.environ[BUDGET_ENV])
    return Path(os.environ.get("PRIVRET_CACHE", Path.home() / ".cache" / "privret")) / "budget"


def registry_file(dataset: str, directory: str | Path | None = None) -> Path:
    """``<dir>/<dataset>.jsonl``; a key that is not a plain file name is hashed."""
    name = dataset if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}", dataset) else (
        "h-" + hashlib.sha256(dataset.encode("utf-8", "surrogatepass")).hexdigest())
    return budget_dir(directory) / f"{name}.jsonl"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read(path: Path) -> list[Release]:
    """Every record; a torn *last* line (a crash mid-append, before the run began) is ignored,
    anything else unreadable is an error: the spend could not be proven."""
    return read_log_records(path, Release.model_validate,
                            unreadable="unreadable budget record; the privacy spent on this dataset cannot be "
                                       "proven (repair or move the file, knowing that its releases still count)")


def _append(path: Path, release: Release) -> None:
    stamped = release.model_copy(update={"recorded_at": datetime.now(timezone.utc).isoformat()})
    append_log_record(path, stamped.model_dump_json())  # replaces a torn tail: it never counted (see _read)


def releases(*datasets: str, directory: str | Path | None = None) -> list[Release]:
    """One entry per release (the record with the most steps) in the registry files of ``datasets``
    (registry keys, or the commitments of them that ledger files show), in order of first appearance.

    A release is a (release id, artefact path) pair: a copied run directory resumed in its new
    place is a second release (their shared first steps are then counted twice: conservative)."""
    merged: dict[tuple[str, str], Release] = {}
    keys = dict.fromkeys(_registry_key(dataset, directory) for dataset in datasets)
    for r in (r for dataset in keys for r in _read(registry_file(dataset, directory))):
        key = (r.release_id, r.artefact)
        if key not in merged or r.steps >= merged[key].steps:
            merged[key] = r
    return list(merged.values())


def _registry_key(dataset: str, directory: str | Path | None) -> str:
    """``dataset``, or, given the commitment a ledger file shows (:mod:`privret.privacy.commitment`), the key
    of the registry file whose records it commits to (the commitment itself when none does)."""
    if not is_committed(dataset):
        return dataset
    for path in sorted(budget_dir(directory).glob("*.jsonl")):
        for record in _read(path)[:1]:
            for key in (record.dataset, record.data_hash):
                if commit(key) == dataset:
                    return key
    return dataset


def _dataset_releases(release: Release, directory: str | Path | None) -> list[Release]:
    """The releases on ``release``'s dataset: those recorded under its key and those that an older
    privret recorded under the hash of its data files (``<data_hash>.jsonl``), which still count."""
    return releases(release.dataset, release.data_hash, directory=directory)


def _accountant_epsilon(history: list[tuple[float, float, int]], delta: float) -> tuple[float, str]:
    from opacus.accountants import create_accountant

    best, method = math.inf, ""
    for name in ("rdp", "prv"):
        acc = create_accountant(mechanism=name)
        acc.history = list(history)
        try:
            eps = float(acc.get_epsilon(delta=delta))
        except Exception:  # noqa: BLE001 - PRV's numerics can fail on extreme histories; RDP is the fallback
            continue
        if eps < best:
            best, method = eps, name
    return best, method


def compose(items: list[Release], *, unit: str | None = None) -> Composition:
    """Cumulative (epsilon, delta) of ``items`` (see the module docstring for the rule)."""
    if unit is not None:
        items = [r for r in items if r.unit == unit]
    if not items:
        return Composition(epsilon=0.0, delta=0.0, releases=0, method="none", unit=unit or "")
    eps, delta, method = compose_parts(items, lambda r: r.part, _compose_on_one_part)
    return Composition(epsilon=eps, delta=delta, releases=len(items), method=method, unit=unit or items[0].unit)


def _compose_on_one_part(items: list[Release]) -> tuple[float, float, str]:
    """Releases that read the same data: the accountant over the Gaussian ones, plus the others' sum."""
    gaussian = [r for r in items if r.gaussian]
    other = [r for r in items if not r.gaussian]
    eps, delta, methods = 0.0, 0.0, []
    if gaussian:
        delta = max(r.delta for r in gaussian)
        history = [(r.noise_multiplier, r.sample_rate, r.steps) for r in gaussian if r.steps > 0]
        if history:
            eps, name = _accountant_epsilon(history, delta)
            methods.append(f"{name} accountant over {len(gaussian)} subsampled-Gaussian releases")
    if other:
        eps += sum(r.epsilon for r in other)
        delta += sum(r.delta for r in other)
        methods.append(f"basic composition of {len(other)} other releases")
    return eps, delta, "; ".join(methods) or "no steps taken"


def check_and_record(release: Release, policy: BudgetPolicy | None = None) -> Composition | None:
    """Record ``release`` (planned) after checking the policy; returns the composition of its unit.

    Refuses (:class:`InputError`, nothing recorded) a release whose privacy unit differs from that
    of a release already on the dataset: the registry cannot compose them (a pair-level
    (epsilon, delta) is only (k epsilon, k e^((k-1) epsilon) delta) per query, k = the most pairs
    of one query: group privacy, Dwork and Roth 2014, Thm 2.2), and refuses when the cumulative
    epsilon would pass ``policy.cap``. With ``policy.allow_over`` either only warns
    (:class:`BudgetWarning`); the cap is then checked against the releases of this unit alone.
    A release already in the registry (a resumed run) is not counted twice.
    """
    policy = policy or BudgetPolicy()
    if not policy.enabled or not math.isfinite(release.epsilon):
        return None
    path = registry_file(release.dataset, policy.directory)
    with _locked(path):
        others = [r for r in _dataset_releases(release, policy.directory)
                  if (r.release_id, r.artefact) != (release.release_id, release.artefact)]
        units = sorted({r.unit for r in others} - {release.unit})
        if units:
            _refuse_or_warn(policy, f"this dataset already has DP releases per {' and '.join(units)}; a release per "
                            f"{release.unit} does not compose with them here (one privacy unit per dataset; "
                            f"registry {path})", field="unit")
        total = compose(others + [release], unit=release.unit)
        if total.epsilon > policy.cap:
            _refuse_or_warn(policy, f"releases on this dataset (unit '{release.unit}') would reach epsilon = "
                            f"{total.epsilon:.3g} (delta = {total.delta:.2g}, {total.releases} releases, "
                            f"{total.method}), past the budget cap {policy.cap:g} (`cap` changes it); "
                            f"registry {path}", field="cap")
        _append(path, release)
    return total


def _refuse_or_warn(policy: BudgetPolicy, message: str, *, field: str) -> None:
    if not policy.allow_over:
        raise InputError(f"{message}; set `allow_over` to run anyway", field=field)
    warnings.warn(f"{message}; running anyway, as the budget policy's `allow_over` allows", BudgetWarning,
                  stacklevel=3)


def record(release: Release, policy: BudgetPolicy | None = None) -> Composition | None:
    """Append a record (e.g. the final step count of a release) and return the new total."""
    policy = policy or BudgetPolicy()
    if not policy.enabled or not math.isfinite(release.epsilon):
        return None
    path = registry_file(release.dataset, policy.directory)
    with _locked(path):
        _append(path, release)
        return compose(_dataset_releases(release, policy.directory), unit=release.unit)
