"""A private log split into a fit part and a held-out part, and what mechanisms on the two parts cost together.

A :class:`UnitPartition` is a public ``salt`` (fixed without looking at the log) and a ``heldout_fraction``. A unit's
key is its query text (unit ``query``), its user id (``user``) or its query and document id (``pair``); the unit,
with every row of it, is *held out* when sha256(salt, key), read as a number in [0, 1), is below the fraction, and
*fit* otherwise, whatever the other units.

Under add/remove neighbours, mechanisms that read only the fit part followed, even adaptively, by mechanisms that
read only the held-out part are together (max(eps_fit, eps_held), max(delta_fit, delta_held))-DP (parallel
composition; McSherry, "Privacy integrated queries", SIGMOD 2009); under replacement the parts would add. Proof:
docs/privacy.md, section "A held-out choice, at no epsilon beyond the run's". :func:`compose_parts` composes the
releases on one log: whole-log releases by the caller's rule; the two sides of one partition side by side, the
larger side counting; then the groups add (basic composition, Dwork and Roth 2014, Theorem 3.16), and so do two
different partitions (another salt or fraction).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from privret.data.pairs import PrivacyUnit, QueryDocPair, TrainingPairs
from privret.errors import InputError

FIT, HELDOUT = "fit", "heldout"
DEFAULT_SALT = "privret-hold-out"
Side = Literal["fit", "heldout"]
T = TypeVar("T")


class UnitPartition(BaseModel):
    """The public partition of a log's units: ``salt`` and the held-out share of units."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    salt: str = Field(DEFAULT_SALT, min_length=1, description="public text fixed without the log")
    heldout_fraction: float = Field(gt=0.0, lt=1.0, description="the expected share of units held out")

    def side_of(self, key: str) -> Side:
        """``heldout`` or ``fit`` for a unit's key: a function of the key and this partition only."""
        digest = hashlib.sha256(f"{self.salt}\x00{key}".encode("utf-8")).digest()
        return HELDOUT if int.from_bytes(digest, "big") / 2.0 ** 256 < self.heldout_fraction else FIT

    def split(self, pairs: TrainingPairs, unit: PrivacyUnit | str) -> tuple[TrainingPairs, TrainingPairs]:
        """(fit pairs, held-out pairs): every row of a unit on its unit's side; both keep the whole corpus."""
        unit = PrivacyUnit(unit)
        rows = {FIT: [], HELDOUT: []}
        for unit_rows in pairs.units(unit):
            rows[self.side_of(unit_key(pairs.pairs[unit_rows[0]], unit))].extend(unit_rows)
        return tuple(TrainingPairs([pairs.pairs[i] for i in sorted(rows[side])], pairs.corpus, pairs.inline_doc_ids)
                     for side in (FIT, HELDOUT))

    def part(self, side: Side) -> LogPart:
        return LogPart(salt=self.salt, heldout_fraction=self.heldout_fraction, side=side)


class LogPart(UnitPartition):
    """One side of a :class:`UnitPartition`: what a ledger records of a release that read only that part."""

    side: Side

    @property
    def partition(self) -> UnitPartition:
        return UnitPartition(salt=self.salt, heldout_fraction=self.heldout_fraction)

    def take(self, pairs: TrainingPairs, unit: PrivacyUnit | str) -> TrainingPairs:
        """The rows of ``pairs`` on this side; refuses an empty side (nothing to train or score on)."""
        chosen = self.partition.split(pairs, unit)[0 if self.side == FIT else 1]
        if not chosen.pairs:
            raise InputError(f"the {self.side} part of the log is empty (held-out fraction {self.heldout_fraction:g}, "
                             f"{len(pairs.units(unit))} units)", field="hold_out")
        return chosen

    def describe(self) -> str:
        share = self.heldout_fraction if self.side == HELDOUT else 1 - self.heldout_fraction
        return f"{self.side} part (about {share:.0%} of units; salt '{self.salt}')"


def fit_part(hold_out: UnitPartition | None, pairs: TrainingPairs,
             unit: PrivacyUnit | str) -> tuple[LogPart | None, TrainingPairs]:
    """What a DP training run reads: the fit part of ``hold_out`` and its rows, or (None, the whole log)."""
    if hold_out is None:
        return None, pairs
    part = hold_out.part(FIT)
    return part, part.take(pairs, unit)


def unit_key(pair: QueryDocPair, unit: PrivacyUnit) -> str:
    """What identifies the unit a row belongs to (the grouping of :func:`privret.data.pairs.group_units`)."""
    if unit is PrivacyUnit.user:
        return f"user\x00{pair.user_id}"
    if unit is PrivacyUnit.pair:
        return f"pair\x00{pair.query}\x00{pair.doc_id}"
    return f"query\x00{pair.query}"


def compose_parts(items: Sequence[T], part_of: Callable[[T], LogPart | None],
                  compose: Callable[[list[T]], tuple[float, float, str]]) -> tuple[float, float, str]:
    """(epsilon, delta, how) of ``items``, releases on one log under add/remove neighbours (module docstring).

    ``part_of(item)``: the part of the log the item read (None: the whole log). ``compose(group)``: the caller's
    rule for releases that read the same data, as (epsilon, delta, how).
    """
    whole = [item for item in items if part_of(item) is None]
    partitions: dict[UnitPartition, dict[str, list[T]]] = {}
    for item in items:
        if (part := part_of(item)) is not None:
            partitions.setdefault(part.partition, {}).setdefault(part.side, []).append(item)
    costs = [compose(whole)] if whole else []
    if not items:
        return 0.0, 0.0, "nothing released"
    for partition, sides in partitions.items():
        per_side = {side: compose(group) for side, group in sorted(sides.items())}
        costs.append((max(eps for eps, _, _ in per_side.values()), max(delta for _, delta, _ in per_side.values()),
                      f"parallel over the parts of partition (salt '{partition.salt}', held out "
                      f"{partition.heldout_fraction:g}): the larger of "
                      + " and ".join(f"{side} [{how}]" for side, (_, _, how) in per_side.items())))
    epsilon, delta = sum(c[0] for c in costs), sum(c[1] for c in costs)
    how = costs[0][2] if len(costs) == 1 else "basic composition of " + "; ".join(f"[{c[2]}]" for c in costs)
    return epsilon, delta, how
