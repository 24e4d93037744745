"""privret.privacy.hold_out: a unit's side depends on its own key and the public salt only, and releases on the two
sides of one partition compose in parallel (in ledgers and in the budget registry), never anything else."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.privacy import budget
from privret.privacy.ledger_composition import compose_ledgers
from privret.privacy.accounting import spent_epsilon
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.hold_out import FIT, HELDOUT, UnitPartition, compose_parts
from privret.privacy.private_selection import selection_ledger
from privret.train.checkpointing import PLAN_KEYS, first_difference

CORPUS = {f"d{i}": Document(f"d{i}", "", f"document {i}") for i in range(50)}
SPLIT = UnitPartition(salt="s", heldout_fraction=0.2)


def _log(n: int, *, users: bool = False) -> TrainingPairs:
    """n queries, each with two clicked documents (two rows per query unit); user u{i % 7} if ``users``."""
    rows = [QueryDocPair(f"query {i}", f"d{(i + k) % 50}", f"q{i}", f"u{i % 7}" if users else None)
            for i in range(n) for k in range(2)]
    return TrainingPairs(pairs=rows, corpus=dict(CORPUS))


@pytest.mark.parametrize("unit", ["query", "pair", "user"])
def test_the_parts_are_disjoint_cover_the_log_and_never_split_a_unit(unit):
    log = _log(300, users=True)
    fit, held = SPLIT.split(log, unit)
    assert sorted(map(id, fit.pairs + held.pairs)) == sorted(map(id, log.pairs))
    key = {"query": lambda p: p.query, "pair": lambda p: (p.query, p.doc_id), "user": lambda p: p.user_id}[unit]
    assert not {key(p) for p in fit.pairs} & {key(p) for p in held.pairs}
    assert fit.corpus == held.corpus == log.corpus
    assert SPLIT.part(FIT).take(log, unit).pairs == fit.pairs and SPLIT.part(HELDOUT).take(log, unit).pairs == held.pairs


def test_adding_or_removing_a_unit_moves_no_other_unit():
    """Add/remove neighbours: every other unit keeps its side, so the changed unit touches one part only."""
    partition = UnitPartition(salt="s", heldout_fraction=0.3)
    log = _log(200)
    smaller = TrainingPairs([p for p in log.pairs if p.query != "query 17"], log.corpus)

    def sides(pairs):
        return {p.query: side for side, part in zip((FIT, HELDOUT), partition.split(pairs, "query")) for p in part.pairs}

    before, after = sides(log), sides(smaller)
    assert "query 17" not in after and all(after[q] == before[q] for q in after)


def test_the_held_out_share_follows_the_fraction_and_the_salt_changes_the_draw():
    log = _log(2000)
    fit, held = SPLIT.split(log, "query")
    assert 0.17 < len(held.units("query")) / 2000 < 0.23  # binomial sd about 0.009
    _, other = UnitPartition(salt="t", heldout_fraction=0.2).split(log, "query")
    assert {p.query for p in other.pairs} != {p.query for p in held.pairs}
    assert UnitPartition(salt="s", heldout_fraction=0.2).split(log, "query")[1].pairs == held.pairs  # deterministic


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_a_fraction_outside_the_open_interval_is_refused(fraction):
    with pytest.raises(ValidationError, match="heldout_fraction"):
        UnitPartition(salt="s", heldout_fraction=fraction)


def test_an_empty_side_is_refused():
    log = _log(1)
    fit, _ = SPLIT.split(log, "query")
    empty = FIT if not fit.pairs else HELDOUT
    with pytest.raises(InputError, match=f"the {empty} part of the log is empty"):
        SPLIT.part(empty).take(log, "query")


# -- composition ----------------------------------------------------------------------------------------------------


def _summed(items):
    return sum(e for e, _ in items), sum(d for _, d in items), "sum"


@pytest.mark.parametrize("parts, expected", [
    ([None, None], (3.0, 3e-6)),                                    # the whole log twice: basic composition
    ([FIT, HELDOUT], (2.0, 2e-6)),                                  # complementary sides: the larger one
    ([FIT, FIT], (3.0, 3e-6)),                                      # one side twice: they add
    ([FIT, FIT, HELDOUT], (3.0, 3e-6)),                             # fit (1 + 2) against held-out (2)
    ([None, FIT, HELDOUT], (3.0, 3e-6)),                            # the whole log's release adds to the pair's
    ([FIT, ("other-salt", HELDOUT)], (3.0, 3e-6)),                  # another partition's side: no parallel rule
    ([FIT, (0.3, HELDOUT)], (3.0, 3e-6)),                           # another fraction: sides overlap, they add
])
def test_parts_compose_in_parallel_only_across_the_sides_of_one_partition(parts, expected):
    def part_of(spec):
        if spec is None:
            return None
        if isinstance(spec, str):
            return SPLIT.part(spec)
        other, side = spec
        salt, fraction = (other, 0.2) if isinstance(other, str) else ("s", other)
        return UnitPartition(salt=salt, heldout_fraction=fraction).part(side)

    items = [(cost, cost * 1e-6, part_of(spec)) for cost, spec in zip([1.0, 2.0, 2.0], parts)]
    epsilon, delta, _ = compose_parts(items, lambda item: item[2], lambda group: _summed([i[:2] for i in group]))
    assert (epsilon, delta) == pytest.approx(expected)


def _dp_run(part=None, *, epsilon=8.0):
    return PrivacyLedger(mechanism="direct-public-negatives", epsilon=epsilon, delta=1e-4, noise_multiplier=3.5,
                         sample_rate=1.0, steps=48, planned_steps=48, accountant="prv", unit="query", n_units=640,
                         n_pairs=700, clip_norm=1.0, model="minilm-l6", trainable="bias-top:3", data_hash="h",
                         dataset_id="d", part=part)


def _choice(part=None, *, epsilon=8.0):
    return selection_ledger(epsilon=epsilon, n_units=160, unit="query", n_pairs=170, data_hash="h", dataset_id="d",
                            part=part)


def test_a_choice_on_the_held_out_part_costs_nothing_more_than_a_run_on_the_fit_part():
    parallel = _dp_run(SPLIT.part(FIT)).compose(_choice(SPLIT.part(HELDOUT)))
    assert (parallel.epsilon, parallel.delta) == (8.0, 1e-4) and "parallel" in parallel.composition
    assert parallel.part is None and [p.part.side for p in parallel.parts] == [FIT, HELDOUT]
    for run, choice in [(_dp_run(), _choice()), (_dp_run(SPLIT.part(FIT)), _choice(SPLIT.part(FIT))),
                        (_dp_run(), _choice(SPLIT.part(HELDOUT))),
                        (_dp_run(SPLIT.part(FIT)), _choice(UnitPartition(salt="t", heldout_fraction=0.2).part(HELDOUT)))]:
        assert run.compose(choice).epsilon == 16.0  # anything but complementary sides of one partition adds
    # the published form (what the file holds) keeps the parts and their sides
    again = PrivacyLedger.model_validate_json(parallel.model_dump_json())
    assert again.epsilon == 8.0 and again.parts[1].part == SPLIT.part(HELDOUT)


def test_the_registry_counts_the_larger_side_and_refuses_past_the_cap_otherwise(tmp_path):
    policy = budget.BudgetPolicy(directory=tmp_path / "budget")
    run, choice = _dp_run(SPLIT.part(FIT)), _choice(SPLIT.part(HELDOUT))
    budget.check_and_record(budget.Release.from_ledger(run, release_id="a", status="final"), policy)
    total = budget.check_and_record(budget.Release.from_ledger(choice, release_id="b", status="final"), policy)
    run_epsilon = spent_epsilon(noise_multiplier=3.5, sample_rate=1.0, steps=48, delta=1e-4)
    assert total.epsilon == pytest.approx(max(run_epsilon, 8.0)) and total.delta == pytest.approx(1e-4)
    assert total.releases == 2 and "parallel" in total.method
    # a choice on the whole log, or on the fit part again, adds: past the default cap of 10
    for i, other in enumerate([_choice(), _choice(SPLIT.part(FIT))]):
        with pytest.raises(InputError, match="past the budget cap"):
            budget.check_and_record(budget.Release.from_ledger(other, release_id=f"c{i}", status="final"), policy)


def test_a_composed_ledger_counts_every_part_when_artefacts_are_released_together():
    """compose_ledgers reads each part of a composed ledger; its top level (parts[0]'s Gaussian fields) alone would
    leave the choice out."""
    whole = _dp_run().compose(_choice(epsilon=1.0))
    run_alone = compose_ledgers([_dp_run()]).epsilon
    assert compose_ledgers([whole]).epsilon == pytest.approx(run_alone + 1.0)
    parallel = _dp_run(SPLIT.part(FIT)).compose(_choice(SPLIT.part(HELDOUT), epsilon=1.0))
    assert compose_ledgers([parallel]).epsilon == pytest.approx(max(run_alone, 1.0))


def test_a_release_carried_by_two_artefacts_counts_once_and_two_releases_count_twice(tmp_path):
    """Two retrievers chosen from one published DP run carry its ledger: released together, the run counts once.
    Two choices, or two runs made with the same settings, are separate releases and add; so do unpublished ones."""
    def published(ledger, name):
        ledger.save(tmp_path / name)
        return PrivacyLedger.load(tmp_path / name)

    run = published(_dp_run(), "run")
    run_alone = compose_ledgers([run]).epsilon
    first, second = (published(run.compose(_choice(epsilon=1.0)), name) for name in ("first", "second"))
    assert all(part.created_at for part in first.parts) and first.parts[1].created_at != second.parts[1].created_at
    assert compose_ledgers([first, second]).epsilon == pytest.approx(run_alone + 2.0)
    assert compose_ledgers([run, published(run, "copy")]).epsilon == pytest.approx(run_alone)
    assert compose_ledgers([run, published(_dp_run(), "again")]).epsilon > run_alone + 1.0
    assert compose_ledgers([_dp_run(), _dp_run()]).epsilon > run_alone + 1.0


def test_a_checkpoint_of_another_part_is_not_resumed():
    assert "part" in PLAN_KEYS
    difference = first_difference(_dp_run(SPLIT.part(FIT)), _dp_run(SPLIT.part(HELDOUT)), PLAN_KEYS)
    assert difference is not None and difference[0] == "part"
    assert first_difference(_dp_run(), _dp_run(SPLIT.part(FIT)), PLAN_KEYS)[0] == "part"
