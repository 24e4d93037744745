"""The privacy ledger: what a DP release cost, written beside every checkpoint.

The ledger travels with everything derived from the release (synthetic data, retrievers
trained on it, reports). By post-processing, a derived artefact has the same guarantee.

Every serialised ledger (file, manifest, results JSON) is the *published* form: the private data's
digests become keyed commitments (:mod:`privret.privacy.commitment`) and a DP ledger withholds the
pair count. The raw values stay in memory, for the budget registry.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, model_serializer

from privret.errors import InputError, invalid_input
from privret.io import write_text_atomic
from privret.privacy.commitment import commit
from privret.privacy.hold_out import LogPart, compose_parts

LEDGER_FILE = "privacy_ledger.json"
PUBLIC_MECHANISMS = ("public-prompted", "public-pairs")  # models made from public data only


def format_epsilon(value: float | None, *, digits: int = 6, missing: str = "-", infinity: str = "inf") -> str:
    """An epsilon as a person reads it: ``infinity`` for no guarantee (epsilon = inf), ``missing`` where none
    is known (None), else the number in ``%g`` form to ``digits`` significant digits (8, 0.5, 1e+03)."""
    if value is None:
        return missing
    return infinity if math.isinf(value) else f"{value:.{digits}g}"


def has_ledger(location: str | Path) -> bool:
    """Whether ``location`` (a model or dataset directory) carries a privret privacy ledger, i.e. was
    derived from private data by privret; a registry name or hub id never does."""
    return (Path(location).expanduser() / LEDGER_FILE).is_file()


def require_public(location: str | Path, *, field: str, use: str) -> None:
    """Refuse ``location`` (a model directory) for ``use`` when privret made it from private data.

    A model without a ledger (a registry name, a hub id, a plain directory) or with a public one
    (epsilon = delta = 0, :attr:`PrivacyLedger.is_public`) passes. One with any other ledger raises
    :class:`~privret.errors.InputError` naming ``field``: the guarantee of what ``use`` derives from
    it would depend on the private data that model saw (its own ledger does not carry over)."""
    if has_ledger(location) and not PrivacyLedger.load(Path(location).expanduser()).is_public:
        raise InputError(f"{use} needs a public model; this one was trained on private data (its privacy ledger "
                         "is not a public, epsilon-0 one), so the result's guarantee would depend on that data",
                         path=location, field=field)


class PrivacyLedger(BaseModel):
    """(epsilon, delta)-DP with respect to one privacy ``unit`` of the dataset ``data_hash``.

    ``epsilon`` is ``inf`` for a non-private reference. ``steps`` counts every noisy update that
    was (or could have been) written to disk; ``epsilon`` is what the accountant charges for them.
    ``unit_definition`` says in words what one unit is (two logs are neighbours when they differ
    by one whole unit). ``n_units`` is treated as public: it sets the sample rate q = B / n and
    the default delta = 1 / (2n), and it is printed here.

    ``part``: set when the release read only one part of the log (:mod:`privret.privacy.hold_out`: a
    DP run on the fit part, a DP choice on the held-out part); ``n_units`` then counts that part's
    units, and ``data_hash`` and ``dataset_id`` are still those of the whole log (its budget).

    A *composed* ledger (:meth:`compose`) covers several mechanisms run on the same private data
    (DP fine-tuning plus a DP choice of documents): ``epsilon`` and ``delta`` are then those of
    ``parts`` composed as ``composition`` says (sums, by basic composition, Dwork and Roth 2014,
    Theorem 3.16, except that parts on complementary sides of one partition count in parallel),
    and the other fields describe ``parts[0]``.

    A *public* ledger (:meth:`public`) belongs to a model made without any private data (a public
    generator prompted with public examples, or fine-tuned on public pairs): epsilon = delta = 0,
    since its output does not depend on the private log at all. ``provenance`` names what such a
    model read instead (``public_data_hash``), and, for a DP model started from one, that warm start.

    ``random_sources`` names each random draw of a DP mechanism (``sampling``, ``noise``, a trainer's own draws such
    as ``hard negatives``, ``dropout``) and where it came from: :data:`~privret.privacy.secure_rng.CSPRNG` or
    :data:`~privret.privacy.secure_rng.SEEDED_FROM_OS` (``docs/privacy.md``, "Where the randomness comes from");
    ``secure_rng`` says that the mechanism's own draws all came from the CSPRNG. Empty in a ledger without a DP
    mechanism or one that does not record them.

    ``data_hash`` identifies the files read (stage fingerprints and resumes compare it);
    ``dataset_id`` is the dataset's identity in the budget registry
    (:func:`privret.privacy.budget.dataset_id`, set by the trainers that record releases; empty in the
    ledgers of the non-private references and federated runs, and where not recorded). Both are exact
    functions of the private log, so they are serialised only as keyed commitments, and a DP
    ledger's ``n_pairs`` is serialised as null: only ``n_units`` is public (:meth:`published`).
    """

    model_config = ConfigDict(ser_json_inf_nan="strings", extra="forbid")

    mechanism: str  # "dp-sgd", a direct-retriever DP method, "none", or one of PUBLIC_MECHANISMS
    epsilon: float
    delta: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    planned_steps: int
    accountant: str
    unit: str
    n_units: int
    n_pairs: int | None  # None: withheld (a published DP ledger)
    clip_norm: float
    model: str
    trainable: str
    data_hash: str
    dataset_id: str = ""
    secure_rng: bool = False
    random_sources: dict[str, str] = {}  # draw -> source
    unit_definition: str = ""
    part: LogPart | None = None
    parts: list[PrivacyLedger] = []
    composition: str = ""
    provenance: dict = {}
    created_at: str = ""

    @classmethod
    def public(cls, mechanism: str, *, model: str, public_data_hash: str, unit: str, n_units: int = 0,
               n_pairs: int = 0, steps: int = 0, planned_steps: int = 0, sample_rate: float = 0.0,
               trainable: str = "none", provenance: dict | None = None) -> PrivacyLedger:
        """The ledger of a model that read no private data (``mechanism`` one of :data:`PUBLIC_MECHANISMS`);
        ``provenance`` adds to ``{"public_data_hash": public_data_hash}``."""
        if mechanism not in PUBLIC_MECHANISMS:
            raise ValueError(f"not a public mechanism: {mechanism}")
        return cls(mechanism=mechanism, epsilon=0.0, delta=0.0, noise_multiplier=0.0, sample_rate=sample_rate,
                   steps=steps, planned_steps=planned_steps, accountant="none", unit=unit, n_units=n_units,
                   n_pairs=n_pairs, clip_norm=math.inf, model=model, trainable=trainable, data_hash="",
                   unit_definition="no private data was read",
                   provenance={"public_data_hash": public_data_hash, **(provenance or {})})

    @model_serializer(mode="wrap")
    def _serialise_published(self, handler):
        """Every dump is the published form (module docstring); ``parts`` go through this one by one."""
        data = handler(self)
        data["data_hash"], data["dataset_id"] = commit(self.data_hash), commit(self.dataset_id)
        if self.is_private and not self.is_public:
            data["n_pairs"] = None
        return data

    def published(self) -> PrivacyLedger:
        """This ledger as its files say it: digests committed, a DP ledger's pair count withheld. Equal
        data give equal commitments under one installation's key, so two ledgers' published forms
        compare the data they came from without revealing it."""
        return type(self).model_validate_json(self.model_dump_json())

    @property
    def is_private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def is_public(self) -> bool:
        """Made from public data only: epsilon = delta = 0 with a public mechanism."""
        return self.epsilon == 0.0 and self.delta == 0.0 and self.mechanism in PUBLIC_MECHANISMS

    def compose(self, *others: PrivacyLedger) -> PrivacyLedger:
        """This ledger and ``others`` (mechanisms on the same data and unit, in any adaptive order) as one
        guarantee.

        Basic composition, epsilons and deltas add, except that parts which read complementary sides of one
        partition of the log count in parallel, the larger side only (:func:`~privret.privacy.hold_out.compose_parts`,
        add/remove neighbours). Conservative; an accountant that composes Gaussian mechanisms exactly (the budget
        registry's) can only give a smaller total.
        """
        parts = [part for ledger in (self, *others) for part in (ledger.parts or [ledger])]
        units = {part.unit for part in parts}
        if len(units) > 1:
            raise InputError(f"cannot compose ledgers of different privacy units ({', '.join(sorted(units))})")
        epsilon, delta, how = compose_parts(parts, lambda ledger: ledger.part, _basic_composition)
        return self.model_copy(update={"mechanism": " + ".join(part.mechanism for part in parts), "epsilon": epsilon,
                                       "delta": delta, "parts": parts, "part": None, "composition": how})

    def save(self, directory: str | Path) -> Path:
        """Writes the ledger, stamping it and each of its parts not stamped yet with the time of this first
        publication: a release's stamp tells it apart from any other, and copies of it keep the stamp."""
        now = datetime.now(timezone.utc).isoformat()
        parts = [part.model_copy(update={"created_at": part.created_at or now}) for part in self.parts]
        stamped = self.model_copy(update={"created_at": self.created_at or now, "parts": parts})
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
        except ValidationError as err:  # a field of the wrong type or value: named
            raise invalid_input(err, path=path, what="unreadable ledger") from None
        except ValueError as err:  # not JSON (json.JSONDecodeError), or not UTF-8
            raise InputError(f"unreadable ledger: {str(err).splitlines()[0]}", path=path) from None

    def summary(self) -> str:
        if self.is_public:
            return f"no private data ({self.mechanism}, public data sha256 {self.provenance['public_data_hash'][:12]})"
        if not self.is_private:
            return f"non-private (epsilon = inf), unit={self.unit}, n={self.n_units}"
        read = "" if self.part is None else f", read the log's {self.part.describe()} only"
        return (f"({self.epsilon:.3g}, {self.delta:.2g})-DP per {self.unit}, sigma={self.noise_multiplier:.3g}, "
                f"q={self.sample_rate:.3g}, steps={self.steps}, C={self.clip_norm:g}, {self.accountant}{read}")


def _basic_composition(ledgers: list[PrivacyLedger]) -> tuple[float, float, str]:
    """Epsilons and deltas add (Dwork and Roth 2014, Theorem 3.16)."""
    return (sum(ledger.epsilon for ledger in ledgers), sum(ledger.delta for ledger in ledgers),
            f"sum of {len(ledgers)}" if len(ledgers) > 1 else ledgers[0].mechanism)
