"""Per-dataset registry of DP releases and their cumulative cost under composition.

Every DP training run on a private dataset is a *release*. Training on the same data several
times (an epsilon grid, a re-run, a direct-DP baseline) composes: an adversary who sees all the
models learns more than from any one of them. The registry keeps every release, keyed by the
content hash of the private data (``PrivacyLedger.data_hash``), and reports what they cost
together.

Where it lives: one append-only JSON-lines file per dataset, ``<dir>/<data_hash>.jsonl``, with
``<dir>`` = ``$PRIVRET_BUDGET_DIR`` or ``$PRIVRET_CACHE/budget`` (default
``~/.cache/privret/budget``). Records are appended and fsynced under an exclusive ``flock`` of
``<data_hash>.jsonl.lock``, so concurrent runs on one machine never lose a record. A release is
recorded *before* its first update can reach disk (``status = "planned"``, with its planned
steps) and again when it ends (``"final"``, with the steps its ledger counts); its cost is the
largest step count recorded for it, so a run that was killed and never resumed still counts
in full.

Composition (what :func:`compose` computes), for the releases of one dataset and one privacy
unit (releases under another unit protect another kind of neighbour and are listed apart):

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

Total: ``epsilon = epsilon_G + sum epsilon_i``, ``delta = delta_G + sum delta_i``. Non-private
runs (epsilon = inf) are not DP releases and are not recorded: releasing such a model voids
every guarantee on its data, whatever this registry says.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import re
import uuid
import warnings
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from privret.errors import InputError
from privret.io import append_log_record, read_log_records

BUDGET_ENV = "PRIVRET_BUDGET_DIR"
GAUSSIAN_ACCOUNTANTS = ("prv", "rdp")


class BudgetWarning(UserWarning):
    """Cumulative epsilon past the cap, allowed by an explicit override."""


class Release(BaseModel):
    """One record of the registry (several records may describe one ``release_id``)."""

    model_config = ConfigDict(ser_json_inf_nan="strings", extra="ignore")

    release_id: str
    status: str  # planned | final
    data_hash: str
    unit: str
    n_units: int
    mechanism: str
    accountant: str
    noise_multiplier: float
    sample_rate: float
    steps: int
    delta: float
    epsilon: float
    artefact: str = ""
    recorded_at: str = ""

    @property
    def gaussian(self) -> bool:
        return (self.accountant in GAUSSIAN_ACCOUNTANTS and self.noise_multiplier > 0
                and 0 < self.sample_rate <= 1 and self.steps >= 0)

    @classmethod
    def from_ledger(cls, ledger, *, release_id: str, status: str, artefact: str | Path = "") -> Release:
        return cls(release_id=release_id, status=status, data_hash=ledger.data_hash, unit=ledger.unit,
                   n_units=ledger.n_units, mechanism=ledger.mechanism, accountant=ledger.accountant,
                   noise_multiplier=ledger.noise_multiplier, sample_rate=ledger.sample_rate, steps=ledger.steps,
                   delta=ledger.delta, epsilon=ledger.epsilon, artefact=str(artefact))


class Composition(BaseModel):
    """The cumulative guarantee of several releases on one dataset and unit."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    epsilon: float
    delta: float
    releases: int
    method: str
    unit: str = ""


class BudgetPolicy(BaseModel):
    """What a run does with the registry: record always; refuse past ``cap`` unless ``allow_over``."""

    cap: float | None = None
    allow_over: bool = False
    directory: Path | None = None
    enabled: bool = True


def new_release_id() -> str:
    return uuid.uuid4().hex


def budget_dir(directory: str | Path | None = None) -> Path:
    if directory is not None:
        return Path(directory)
    if os.environ.get(BUDGET_ENV):
        return Path(os.environ[BUDGET_ENV])
    return Path(os.environ.get("PRIVRET_CACHE", Path.home() / ".cache" / "privret")) / "budget"


def registry_file(data_hash: str, directory: str | Path | None = None) -> Path:
    """``<dir>/<data_hash>.jsonl``; a hash that is not a plain file name is hashed again."""
    name = data_hash if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}", data_hash) else (
        "h-" + hashlib.sha256(data_hash.encode("utf-8", "surrogatepass")).hexdigest())
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


def releases(data_hash: str, *, directory: str | Path | None = None) -> list[Release]:
    """One entry per release (the record with the most steps), in order of first appearance.

    A release is a (release id, artefact path) pair: a copied run directory resumed in its new
    place is a second release (their shared first steps are then counted twice: conservative)."""
    merged: dict[tuple[str, str], Release] = {}
    for r in _read(registry_file(data_hash, directory)):
        key = (r.release_id, r.artefact)
        if key not in merged or r.steps >= merged[key].steps:
            merged[key] = r
    return list(merged.values())


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
    return Composition(epsilon=eps, delta=delta, releases=len(items), method="; ".join(methods),
                       unit=unit or items[0].unit)


def check_and_record(release: Release, policy: BudgetPolicy | None = None) -> Composition | None:
    """Record ``release`` (planned) after checking the cap; returns the composition including it.

    Refuses (:class:`InputError`) when the cumulative epsilon would pass ``policy.cap`` and
    ``policy.allow_over`` is not set; warns (:class:`BudgetWarning`) when it passes with the
    override. A release already in the registry (a resumed run) is not counted twice.
    """
    policy = policy or BudgetPolicy()
    if not policy.enabled or not math.isfinite(release.epsilon):
        return None
    if policy.cap is not None and not (policy.cap > 0 and math.isfinite(policy.cap)):
        raise InputError(f"the budget cap must be a finite epsilon > 0, got {policy.cap}", field="--budget-cap")
    path = registry_file(release.data_hash, policy.directory)
    with _locked(path):
        others = [r for r in releases(release.data_hash, directory=policy.directory)
                  if (r.release_id, r.artefact) != (release.release_id, release.artefact)]
        total = compose(others + [release], unit=release.unit)
        if policy.cap is not None and total.epsilon > policy.cap:
            message = (f"releases on this dataset (unit '{release.unit}') would reach epsilon = {total.epsilon:.3g} "
                       f"(delta = {total.delta:.2g}, {total.releases} releases, {total.method}), past the budget cap "
                       f"{policy.cap:g}; registry {path}")
            if not policy.allow_over:
                raise InputError(message + "; pass --allow-over-budget to run anyway", field="--budget-cap")
            warnings.warn(message + " (allowed by --allow-over-budget)", BudgetWarning, stacklevel=2)
        _append(path, release)
    return total


def record(release: Release, policy: BudgetPolicy | None = None) -> Composition | None:
    """Append a record (e.g. the final step count of a release) and return the new total."""
    policy = policy or BudgetPolicy()
    if not policy.enabled or not math.isfinite(release.epsilon):
        return None
    path = registry_file(release.data_hash, policy.directory)
    with _locked(path):
        _append(path, release)
        return compose(releases(release.data_hash, directory=policy.directory), unit=release.unit)


def compose_ledgers(ledgers: list) -> Composition:
    """What releasing all these artefacts together costs (one unit; non-private ledgers make it inf)."""
    if any(not math.isfinite(ledger.epsilon) for ledger in ledgers):
        return Composition(epsilon=math.inf, delta=0.0, releases=len(ledgers), method="a non-private release")
    items = [Release.from_ledger(ledger, release_id=str(k), status="final") for k, ledger in enumerate(ledgers)]
    units = {r.unit for r in items}
    if len(units) > 1:
        raise InputError(f"cannot compose releases under different privacy units ({', '.join(sorted(units))})")
    return compose(items)


def run_composition(run_dir: str | Path) -> dict:
    """What releasing every DP model of a pipeline run together costs.

    The releases are the DP document selection (``documents``, if any), the generators
    (``eps-*/generator``; the synthetic sets and retrievers derived from one carry its ledger,
    composed with the selection's, and are post-processing of them, so they are not counted
    again) and the direct DP retrievers (``direct-*/retriever``).
    """
    from privret.privacy.ledger import LEDGER_FILE, PrivacyLedger

    run_dir = Path(run_dir)
    paths = (sorted(run_dir.glob(f"documents/{LEDGER_FILE}")) + sorted(run_dir.glob(f"eps-*/generator/{LEDGER_FILE}"))
             + sorted(run_dir.glob(f"direct-*/retriever/{LEDGER_FILE}")))
    ledgers = [(p.relative_to(run_dir).parts[0], PrivacyLedger.load(p.parent)) for p in paths]
    private = [(name, ledger) for name, ledger in ledgers if ledger.is_private]
    result = {"releases": [name for name, _ in private],
              "non_private": [name for name, ledger in ledgers if not ledger.is_private]}
    by_unit: dict[str, list] = {}
    for _, ledger in private:
        by_unit.setdefault(ledger.unit, []).append(ledger)
    result["composition"] = {unit: compose_ledgers(items).model_dump(mode="json") for unit, items in by_unit.items()}
    return result


def run_composition_sentence(summary: dict) -> str:
    parts = [f"releasing all {c['releases']} DP models of this run together (unit '{unit}') costs "
             f"epsilon = {c['epsilon']:.3g}, delta = {c['delta']:.2g} ({c['method']})"
             for unit, c in summary["composition"].items()]
    text = "; ".join(parts) if parts else "no DP model in this run yet"
    if summary["non_private"]:
        text += ("; the non-private rows (" + ", ".join(summary["non_private"]) + ") are references with no "
                 "guarantee: releasing any of them voids the privacy of this data")
    return text[0].upper() + text[1:] + "."
