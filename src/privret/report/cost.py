"""What each row of a run cost in wall time, and what the rows made without private data add to it.

A row's seconds are its stage times: ``timing.json`` in its directory (``generator_seconds``, ``generate_seconds``,
``filter_seconds``, ``retriever_seconds``, ``selection_seconds``, written by :mod:`privret.pipeline.run` as each
stage ends) and ``eval_seconds`` in its ``metrics.json``. A stage is timed by the process that finished it, so one
resumed after a crash counts only its last part (an under-count), and a trained row without ``timing.json``
(finished by an older privret) is not timed at all.

The rows made without private data (the epsilon = 0 bars, :data:`~privret.run_layout.PUBLIC_ROWS`) are what issue 12
asks to stay cheap: at most 30% on top of the pipeline's wall time at one epsilon. For each epsilon e of the run's
grid::

    pipeline(e) = zero-shot + original pairs + every DP row of e (synthetic, filtered, chosen, direct)
    added(e)    = (sum of the epsilon-0 rows) / pipeline(e)

Work shared by the whole grid and timed in no row (the document choice, the embedding cache) is in neither.
"""

from __future__ import annotations

from dataclasses import dataclass

from privret.report.collect import Row

STAGES = {"generator": "generator", "generate": "generation", "filter": "filter", "retriever": "retriever",
          "selection": "DP choice", "eval": "evaluation"}


def stage_seconds(row: Row) -> dict[str, float] | None:
    """``{stage: seconds}`` of ``row`` (keys of :data:`STAGES`), or None when it was not timed."""
    seconds = {name.removesuffix("_seconds"): float(value) for name, value in row.timing.items()
               if name.endswith("_seconds")}
    if "eval_seconds" in row.metrics:
        seconds["eval"] = float(row.metrics["eval_seconds"])
    trained = row.method != "zero-shot"
    if "eval" not in seconds or (trained and len(seconds) == 1):
        return None
    return seconds


@dataclass(frozen=True)
class AddedCost:
    """At one epsilon of the grid: the pipeline's rows and what the epsilon-0 rows add (None: a row not timed)."""

    epsilon: float
    pipeline_rows: list[str]
    pipeline_seconds: float | None
    public_rows: list[str]
    public_seconds: float | None

    @property
    def share(self) -> float | None:
        if self.pipeline_seconds is None or self.public_seconds is None or self.pipeline_seconds <= 0:
            return None
        return self.public_seconds / self.pipeline_seconds


def added_cost(rows: list[Row]) -> list[AddedCost]:
    """One :class:`AddedCost` per epsilon of the run's grid; none when the run has no epsilon-0 row."""
    public = [r for r in rows if r.epsilon == 0]
    if not public:
        return []
    references = [r for r in rows if r.method in ("zero-shot", "original")]
    grid = sorted({r.grid_epsilon for r in rows if r.grid_epsilon is not None})
    out = []
    for epsilon in grid:
        pipeline = references + [r for r in rows if r.grid_epsilon == epsilon]
        out.append(AddedCost(epsilon, [r.key for r in pipeline], _total(pipeline), [r.key for r in public],
                             _total(public)))
    return out


def _total(rows: list[Row]) -> float | None:
    seconds = [stage_seconds(r) for r in rows]
    return None if any(s is None for s in seconds) else sum(sum(s.values()) for s in seconds)


def minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def added_cost_sentence(cost: AddedCost, labels: dict[str, str]) -> str:
    """One line on ``cost``; ``labels`` names the rows (row key -> label)."""
    from privret.privacy.ledger import format_epsilon

    at = f"At ε = {format_epsilon(cost.epsilon)}"
    if cost.share is None:
        untimed = cost.pipeline_rows if cost.pipeline_seconds is None else cost.public_rows
        return f"{at}: not every row was timed (among {', '.join(labels[k] for k in untimed)})."
    public = f"{len(cost.public_rows)} rows" if len(cost.public_rows) > 1 else "row"
    return (f"{at}: the pipeline's {len(cost.pipeline_rows)} rows (the references and the DP rows of this ε) took "
            f"{minutes(cost.pipeline_seconds)}; the {public} without private data "
            f"({', '.join(labels[k] for k in cost.public_rows)}) took {minutes(cost.public_seconds)} more, "
            f"+{100 * cost.share:.0f}%.")
