"""What each row of a run cost in wall time, and what the rows made without private data add to it.

A row's seconds are its stage times: ``timing.json`` in its directory (``generator_seconds``, ``generate_seconds``,
``filter_seconds``, ``retriever_seconds``, ``selection_seconds``, each written as its stage ends) and
``eval_seconds`` in its ``metrics.json``. A row is timed when every stage of its kind (:func:`expected_stages`) has
a time; a stage resumed after a crash counts only its last part. For each epsilon e of the grid::

    synthetic route(e) = zero-shot + original pairs + the DP synthetic rows of e (plain, filtered, chosen)
    whole grid(e)      = synthetic route(e) + the direct DP rows of e
    added(e)           = (sum of the epsilon-0 rows, :data:`~privret.run_layout.PUBLIC_ROWS`) / each of the two

Work timed in no row (the document choice, the embedding cache, a public-pairs warm start) is in neither. The
time of a stage that reads the private log depends on it and no guarantee covers it: :func:`private_stages` names
those stages, and the report shows their times, and the shares that sum them, only when asked (docs/privacy.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from privret.report.collect import Row

STAGES = {"generator": "generator", "generate": "generation", "filter": "filter", "retriever": "retriever",
          "selection": "DP choice", "eval": "evaluation"}


def expected_stages(row: Row) -> set[str]:
    """The stages a row of this kind runs (keys of :data:`STAGES`)."""
    if row.method == "zero-shot":
        return {"eval"}
    if row.method.endswith("-selected"):
        return {"selection", "eval"}
    if row.method.endswith("-filtered"):
        return {"filter", "retriever", "eval"}
    if row.method == "original" or row.method.startswith("direct-"):
        return {"retriever", "eval"}
    return {"generator", "generate", "retriever", "eval"}  # DP synthetic and the rows without private data


def private_stages(row: Row) -> set[str]:
    """The stages of ``row`` whose time depends on the private log outside any DP release: every stage of a row
    trained on it without DP (epsilon = inf), and of a DP row the one that reads the log (the DP generator's
    fine-tune, the direct DP retriever's training, the DP choice). The rest are post-processing of a DP release
    with public data, or read public data only."""
    if row.epsilon is not None and math.isinf(row.epsilon):
        return expected_stages(row)
    if row.method.endswith("-selected"):
        return {"selection"}
    if row.method.startswith("direct-"):
        return {"retriever"}
    return {"generator"} if row.method == "dp-synthetic" else set()


def timed_seconds(row: Row) -> dict[str, float]:
    """``{stage: seconds}`` of the stages of ``row`` that have a time (so far, in a run still going)."""
    seconds = {name.removesuffix("_seconds"): float(value) for name, value in row.timing.items()
               if name.endswith("_seconds")}
    if "eval_seconds" in row.metrics:
        seconds["eval"] = float(row.metrics["eval_seconds"])
    return seconds


def stage_seconds(row: Row) -> dict[str, float] | None:
    """``{stage: seconds}`` of ``row``, or None when a stage it runs has no time."""
    seconds = timed_seconds(row)
    return seconds if expected_stages(row) <= set(seconds) else None


@dataclass(frozen=True)
class Share:
    """What the epsilon-0 rows add to a set of rows (None: a row among them, or among the epsilon-0 rows, is in
    ``untimed``)."""

    rows: list[str]
    seconds: float | None
    added: float | None
    untimed: list[str]

    @property
    def fraction(self) -> float | None:
        return None if self.seconds is None or self.added is None or self.seconds <= 0 else self.added / self.seconds


@dataclass(frozen=True)
class AddedCost:
    """At one epsilon of the grid: the epsilon-0 rows against the synthetic route and against the whole grid."""

    epsilon: float
    public_rows: list[str]
    synthetic_route: Share
    whole_grid: Share


def added_cost(rows: list[Row], seconds: dict[str, dict[str, float] | None]) -> list[AddedCost]:
    """One :class:`AddedCost` per epsilon of the run's grid; none when the run has no epsilon-0 row. ``seconds``:
    each row's :func:`stage_seconds` by key."""
    public = [r for r in rows if r.epsilon == 0]
    if not public:
        return []

    def share(of: list[Row]) -> Share:
        untimed = [r.key for r in of + public if seconds[r.key] is None]
        total = None if untimed else sum(sum(seconds[r.key].values()) for r in of)
        added = None if untimed else sum(sum(seconds[r.key].values()) for r in public)
        return Share([r.key for r in of], total, added, untimed)

    references = [r for r in rows if r.method in ("zero-shot", "original")]
    out = []
    for epsilon in sorted({r.grid_epsilon for r in rows if r.grid_epsilon is not None}):
        of_epsilon = [r for r in rows if r.grid_epsilon == epsilon]
        route = references + [r for r in of_epsilon if r.method.startswith("dp-synthetic")]
        out.append(AddedCost(epsilon, [r.key for r in public], share(route), share(references + of_epsilon)))
    return out


def minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def added_cost_sentence(cost: AddedCost, rows: list[Row]) -> str:
    """One line on ``cost`` for a reader; ``rows`` are the run's (for their labels)."""
    from privret.privacy.ledger import format_epsilon

    labels = {r.key: r.label for r in rows}
    at = f"At ε = {format_epsilon(cost.epsilon)}"
    public = f"{len(cost.public_rows)} rows" if len(cost.public_rows) > 1 else "row"
    names = ", ".join(labels[k] for k in cost.public_rows)
    if cost.synthetic_route.fraction is None:
        return f"{at}: not timed ({', '.join(labels[k] for k in cost.whole_grid.untimed)})."
    text = (f"{at}: the {public} without private data ({names}) took {minutes(cost.synthetic_route.added)}, "
            f"+{100 * cost.synthetic_route.fraction:.0f}% on the synthetic route's "
            f"{minutes(cost.synthetic_route.seconds)} (references and DP synthetic rows of this ε)")
    if cost.whole_grid.rows == cost.synthetic_route.rows:
        return text + "."
    if cost.whole_grid.fraction is None:
        untimed = ", ".join(labels[k] for k in cost.whole_grid.untimed)
        return text + f"; the whole grid of this ε is not timed ({untimed})."
    return text + (f", +{100 * cost.whole_grid.fraction:.0f}% on the whole grid's {minutes(cost.whole_grid.seconds)} "
                   "(with the direct DP rows).")
