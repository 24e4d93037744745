"""privret.privacy.partition: a unit's side depends on its own key and the public salt only."""

from __future__ import annotations

import pytest

from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.privacy.partition import FIT, HELDOUT, UnitPartition

CORPUS = {f"d{i}": Document(f"d{i}", "", f"document {i}") for i in range(50)}


def _log(n: int, *, users: bool = False) -> TrainingPairs:
    """n queries, each with two clicked documents (two rows per query unit); user u{i % 7} if ``users``."""
    rows = [QueryDocPair(f"query {i}", f"d{(i + k) % 50}", f"q{i}", f"u{i % 7}" if users else None)
            for i in range(n) for k in range(2)]
    return TrainingPairs(pairs=rows, corpus=dict(CORPUS))


@pytest.mark.parametrize("unit", ["query", "pair", "user"])
def test_the_parts_are_disjoint_cover_the_log_and_never_split_a_unit(unit):
    log = _log(300, users=True)
    fit, held = UnitPartition("s", 0.2).split(log, unit)
    assert sorted(map(id, fit.pairs + held.pairs)) == sorted(map(id, log.pairs))
    key = {"query": lambda p: p.query, "pair": lambda p: (p.query, p.doc_id), "user": lambda p: p.user_id}[unit]
    assert not {key(p) for p in fit.pairs} & {key(p) for p in held.pairs}
    assert fit.corpus == held.corpus == log.corpus


def test_adding_or_removing_a_unit_moves_no_other_unit():
    """Add/remove neighbours: every other unit keeps its side, so the changed unit touches one part only."""
    partition = UnitPartition("s", 0.3)
    log = _log(200)
    smaller = TrainingPairs([p for p in log.pairs if p.query != "query 17"], log.corpus)
    sides = lambda pairs: {p.query: part for part, ps in zip((FIT, HELDOUT), partition.split(pairs, "query"))
                           for p in ps.pairs}
    before, after = sides(log), sides(smaller)
    assert "query 17" not in after and all(after[q] == before[q] for q in after)


def test_the_held_out_share_follows_the_fraction_and_the_salt_changes_the_draw():
    log = _log(2000)
    fit, held = UnitPartition("s", 0.2).split(log, "query")
    assert 0.17 < len(held.units("query")) / 2000 < 0.23  # binomial sd about 0.009
    _, other = UnitPartition("t", 0.2).split(log, "query")
    assert {p.query for p in other.pairs} != {p.query for p in held.pairs}
    assert UnitPartition("s", 0.2).split(log, "query")[1].pairs == held.pairs  # deterministic


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_a_fraction_outside_the_open_interval_is_refused(fraction):
    with pytest.raises(ValueError, match="heldout_fraction"):
        UnitPartition("s", fraction)
