"""A private log split into a fit part and a held-out part by a public salted hash of each unit's key.

Work in progress (branch ``heldout-choice``): the building block of a held-out DP choice at no extra epsilon.
A DP run trains on the fit part and ``retriever select`` scores the candidates on the held-out part. Under
add/remove neighbours (two logs differ by one whole privacy unit) the added or removed unit lies in exactly one part,
because its side depends on its own key and the public salt alone (never on the other units). So a mechanism that
reads only the fit part and one that reads only the held-out part compose in parallel: the pair is
max(eps_fit, eps_heldout)-DP, not the sum (McSherry, "Privacy integrated queries", SIGMOD 2009, Theorem 4).
Not yet wired: the ledger's record of the side and the parallel rule in ``composed_ledger``.

A unit's key: its query text (unit ``query``), its user id (``user``), or its query and document id (``pair``).
Its side: ``heldout`` when sha256(salt, key), read as a number in [0, 1), is below ``heldout_fraction``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from privret.data.pairs import PrivacyUnit, QueryDocPair, TrainingPairs

FIT, HELDOUT = "fit", "heldout"


@dataclass(frozen=True)
class UnitPartition:
    """The public partition: ``salt`` (any string, fixed without the log) and the held-out share of units."""

    salt: str
    heldout_fraction: float

    def __post_init__(self) -> None:
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction {self.heldout_fraction:g} is not in (0, 1)")

    def side(self, key: str) -> str:
        """``heldout`` or ``fit`` for a unit's key: a function of the key and this partition only."""
        digest = hashlib.sha256(f"{self.salt}\x00{key}".encode("utf-8")).digest()
        return HELDOUT if int.from_bytes(digest, "big") / 2.0 ** 256 < self.heldout_fraction else FIT

    def split(self, pairs: TrainingPairs, unit: PrivacyUnit | str) -> tuple[TrainingPairs, TrainingPairs]:
        """(fit pairs, held-out pairs): every row of a unit on its unit's side; both keep the whole corpus."""
        unit = PrivacyUnit(unit)
        sides = {FIT: [], HELDOUT: []}
        for rows in pairs.units(unit):
            sides[self.side(unit_key(pairs.pairs[rows[0]], unit))].extend(rows)
        return tuple(TrainingPairs([pairs.pairs[i] for i in sorted(sides[s])], pairs.corpus, pairs.inline_doc_ids)
                     for s in (FIT, HELDOUT))


def unit_key(pair: QueryDocPair, unit: PrivacyUnit) -> str:
    """What identifies the unit a row belongs to (the grouping of :func:`privret.data.pairs.group_units`)."""
    if unit is PrivacyUnit.user:
        return f"user\x00{pair.user_id}"
    if unit is PrivacyUnit.pair:
        return f"pair\x00{pair.query}\x00{pair.doc_id}"
    return f"query\x00{pair.query}"
