"""Per-dataset registry of DP releases and their cumulative cost under composition.

Every DP training run on a private dataset is a *release*. Training on the same data several
times (an epsilon grid, a re-run, a direct-DP baseline) composes: an adversary who sees all the
models learns more than from any one of them. The registry keeps every release, keyed by the
dataset's identity (``PrivacyLedger.dataset_id``, see :func:`dataset_id`; ``data_hash`` for a
ledger written before it existed), and reports what they cost together.

Which releases share a dataset (:func:`dataset_id`): by default those whose private pairs have the
same records, (query text, document text) after normalisation, whatever the file format, row order,
split name or whether the documents came from a BEIR corpus or inline. No exact key recognises a
near-duplicate (a log with one row edited, added or removed is another dataset by content); a
user-given name (``--dataset-name``, a pipeline config's ``budget.dataset_name``) keys the
registry instead of the content and so ties such versions together.

Where it lives: one append-only JSON-lines file per dataset, ``<dir>/<key>.jsonl``, with
``<dir>`` = ``$PRIVRET_BUDGET_DIR`` or ``$PRIVRET_CACHE/budget`` (default
``~/.cache/privret/budget``). Records are appended and fsynced under an exclusive ``flock`` of
``<key>.jsonl.lock``, so concurrent runs on one machine never lose a record. A release is
recorded *before* its first update can reach disk (``status = "planned"``, with its planned
steps) and again when it ends (``"final"``, with the steps its ledger counts); its cost is the
largest step count recorded for it, so a run that was killed and never resumed still counts
in full. Releases that an older privret keyed by the hash of the data files (``<data_hash>.jsonl``)
still count for a release whose ledger has that ``data_hash``.

What a run may spend (:func:`check_and_record`): all releases on the dataset together at most
``cap`` (default :data:`DEFAULT_CAP`), and one privacy unit per dataset. Past either it is refused
before training, unless the policy allows going over (``--allow-over-budget``), which runs with a
:class:`BudgetWarning`.

Composition (what :func:`compose` computes), for the releases of one dataset and one privacy
unit (releases under another unit protect another kind of neighbour and are not composed here):

* every release that is a Poisson-subsampled Gaussian mechanism (a ledger with a noise
  multiplier sigma > 0, a sample rate q in (0, 1], ``steps`` and an Opacus accountant, as DP-SGD
  and the direct DP retrievers write) joins one *history* ``[(sigma_i, q_i, T_i)]``. The
  accountant composes the history as one adaptive sequence of sum_i T_i subsampled Gaussian
  steps, which is valid for any order and adaptivity of the runs (RDP: Mironov 2017, Prop. 1,
  additivity of Renyi divergence under adaptive composition, then one conversion to
  (epsilon, delta); PRV: Gopi, Lee and Wutschitz 2021, the privacy random variables of the
  steps add). We evaluate it at delta_G = the largest delta of those releases and report the
  smaller of the RDP and the PRV upper bound (both are upper bounds on the same quantity);
* any other release (unknown mechanism, no noise multiplier) adds its own (epsilon_i, delta_i)
  by basic composition (Dwork and Roth 2014, Theorem 3.16), which is conservative.

Total: ``epsilon = epsilon_G + sum epsilon_i``, ``delta = delta_G + sum delta_i``, for the releases
that read the whole dataset. Releases that read one side of a partition of it (``Release.part``:
a DP run on the fit part, a DP choice on the held-out part; :mod:`privret.privacy.hold_out`) are
recorded under the whole dataset's key: each side's releases compose by the rule above, the larger
side counts (parallel composition, add/remove neighbours), and that adds to the total. Non-private
runs (epsilon = inf) are not DP releases and are not recorded: releasing such a model voids
every guarantee on its data, whatever this registry says.
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
