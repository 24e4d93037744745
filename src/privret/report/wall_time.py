"""The report's wall-time table: minutes per stage of each row, and what the epsilon-0 rows add.

Privacy: how long a stage that read the private log took depends on it and no guarantee covers it, so
those times (and the totals and sentences that add them up) are withheld unless the run shows private
timings and counts.
"""

from __future__ import annotations

from privret.report.cells import escape
from privret.report.collect import Row, RunData
from privret.report.cost import STAGES, added_cost, added_cost_sentence, minutes, private_stages, stage_seconds


def wall_time_table(run: RunData) -> tuple[list[str], list[list[str]], list[str]] | None:
    """The wall-time table (headers, cells) and a sentence per epsilon on what the epsilon-0 rows add
    (:mod:`privret.report.cost`); None when no row was timed. The times :func:`_withheld` names, the totals that
    add them up and the sentences, which sum them, give way to :data:`PRIVATE_TIMINGS_NOTE`."""
    seconds = {r.key: stage_seconds(r) for r in run.rows}
    if all(s is None for s in seconds.values()):
        return None
    stages = [s for s in STAGES if any(t and s in t for t in seconds.values())]
    withheld = {r.key: _withheld(run, r, seconds[r.key]) for r in run.rows}
    cells = [[escape(r.label)] + (["-"] * len(stages) + ["not timed"] if seconds[r.key] is None else
                              _timed_cells(seconds[r.key], stages, withheld[r.key]))
             for r in run.rows]
    notes = ([PRIVATE_TIMINGS_NOTE] if any(withheld.values()) else
             [added_cost_sentence(c, run.rows) for c in added_cost(run.rows, seconds)])
    return ["training data", *(STAGES[s] for s in stages), "total"], cells, notes


def _withheld(run: RunData, row: Row, seconds: dict[str, float] | None) -> set[str]:
    """The timed stages of ``row`` that read the private log (:func:`~privret.report.cost.private_stages`), unless
    the run shows private timings."""
    if run.private_timings_and_counts or seconds is None:
        return set()
    return private_stages(row) & set(seconds)


def _timed_cells(seconds: dict[str, float], stages: list[str], withheld: set[str]) -> list[str]:
    """A timed row's minutes per stage of ``stages`` and in total; "withheld" for the stages of ``withheld``, and
    for the total when there are any."""
    return ([WITHHELD if s in withheld else minutes(seconds.get(s)) for s in stages]
            + [WITHHELD if withheld else minutes(sum(seconds.values()))])


WITHHELD = "withheld"
PRIVATE_TIMINGS_NOTE = ("Withheld: how long each stage that read the private log took (the DP fine-tune of a "
                        "generator, the training of a direct DP retriever, a DP choice, every stage of a row "
                        "trained without DP), which depends on it and which no guarantee covers, and what the rows "
                        "without private data add to them. `privret report --show-private-timings-and-counts` "
                        "shows them, for those allowed to see the private log.")
WALL_TIME_NOTE = ("Each stage as timed by the process that finished it (a stage resumed after a crash counts its "
                  "last part only); work shared by the whole grid (document choice, embedding cache) is in no row.")
