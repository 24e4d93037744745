"""How much of the possible gain a private retriever keeps, and how sure we are of it.

Every retrieval table compares a row with two references on NDCG@10: *zero-shot* (the untrained
public encoder, :data:`ZERO_SHOT`) and *original* (the non-private retriever trained on the original
private pairs, :data:`ORIGINAL`).

* **Retention** (:func:`retention`) = (row - zero-shot) / (original - zero-shot): 1 keeps all of
  the gain of training on the private pairs, 0 none of it, below 0 is worse than not training.
  Undefined when original <= zero-shot (there is no gain to keep) and for the two references.
* **Delta NDCG@10 against zero-shot** with a 95% confidence interval from a paired bootstrap over
  the test queries (:func:`paired_bootstrap_ci`): the queries are resampled with replacement, the
  same resample for both systems, and the interval is the percentile interval of the resampled mean
  differences. It needs per-query NDCG@10 of both systems on the same queries (``per_query.json``);
  without it the interval is unknown (shown as "-"), never invented.
* Over several training seeds, :func:`mean_sd` gives the mean and the sample standard deviation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ZERO_SHOT, ORIGINAL = "zero_shot", "original"  # the references' directory names in a run directory
PER_QUERY_FILE = "per_query.json"  # beside each metrics.json of a run directory: {qid: {metric: value}}
RESAMPLES, SEED, LEVEL = 10_000, 0, 0.95  # every table's bootstrap
EXPLANATION = ("Retention = (NDCG@10 - zero-shot) / (original - zero-shot), where original is the non-private "
               "retriever trained on the original pairs. ΔNDCG@10 vs zero-shot: the row's mean minus zero-shot's, "
               f"with its {LEVEL:.0%} confidence interval in brackets (paired bootstrap over the test queries, "
               f'{RESAMPLES:,} resamples, percentile interval). "-": undefined, or no per-query scores '
               "(per_query.json) to resample.")
COVERAGE = ("A DP row's (epsilon, delta) covers its own figures: its NDCG@10, Recall and MRR and its intervals "
            "against zero-shot and against any row made without private data are its model evaluated on public test "
            "data (post-processing). No guarantee covers the original row, trained on the private pairs without DP, "
            "nor any figure computed from it: every row's retention divides by the original's gain.")
"""What the rows' figures are covered by, in the words of the summary and the report (``docs/privacy.md``)."""


def retention(score: float, zero_shot: float, original: float) -> float | None:
    """(score - zero_shot) / (original - zero_shot); None when original <= zero_shot."""
    if original <= zero_shot:
        return None
    return (score - zero_shot) / (original - zero_shot)


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                        level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval at ``level`` of mean(b - a) over the queries, by a paired bootstrap.

    ``a[i]`` and ``b[i]`` are the two systems' scores on query ``i``. Each of ``resamples`` draws
    picks n query indices uniformly with replacement and takes mean(b[idx] - a[idx]); the bounds are
    the (1 - level)/2 and (1 + level)/2 quantiles of these means. Deterministic for a given ``seed``.
    """
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    if diff.ndim != 1 or diff.size == 0:
        raise ValueError("need one score per query for each system, on at least one query")
    rng = np.random.default_rng(seed)
    step = max(1, 2**22 // diff.size)  # resamples per batch: about 32 MB of indices
    means = np.concatenate([diff[rng.integers(0, diff.size, size=(min(step, resamples - lo), diff.size))].mean(axis=1)
                            for lo in range(0, resamples, step)])
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator) of per-seed scores; sd 0.0 for one seed."""
    if not values:
        raise ValueError("no values")
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


@dataclass(frozen=True)
class Versus:
    """One row against the references (see the module docstring)."""

    delta: float | None  # the row's NDCG@10 minus zero-shot's; None for zero-shot itself or without zero-shot
    ci: tuple[float, float] | None  # 95% paired bootstrap interval of delta; None without per-query scores
    retention: float | None

    def delta_text(self) -> str:
        if self.delta is None:
            return "-"
        interval = "-" if self.ci is None else f"{self.ci[0]:+.4f}, {self.ci[1]:+.4f}"
        return f"{self.delta:+.4f} [{interval}]"

    def retention_text(self) -> str:
        return "-" if self.retention is None else f"{self.retention:.1%}"


def _paired_ci(base: Mapping[str, float] | None, other: Mapping[str, float] | None) -> tuple[float, float] | None:
    """:func:`paired_bootstrap_ci` of ``other - base`` over their queries; None unless both cover the same ones."""
    if base is None or other is None or other.keys() != base.keys():
        return None
    return paired_bootstrap_ci([base[q] for q in other], list(other.values()))


def versus_zero_shot(rows: Mapping[str, tuple[float, Mapping[str, float] | None]]) -> dict[str, Versus]:
    """Each row (key -> (NDCG@10, per-query NDCG@10 or None)) against the references :data:`ZERO_SHOT`
    and :data:`ORIGINAL` among them. The interval needs both per-query tables on the same queries."""
    zero, zero_queries = rows.get(ZERO_SHOT, (None, None))
    original = rows.get(ORIGINAL, (None, None))[0]
    out = {}
    for key, (score, queries) in rows.items():
        if zero is None or key == ZERO_SHOT:
            out[key] = Versus(None, None, None)
            continue
        kept = retention(score, zero, original) if original is not None and key != ORIGINAL else None
        out[key] = Versus(score - zero, _paired_ci(zero_queries, queries), kept)
    return out


def versus_bar(rows: Mapping[str, tuple[float, Mapping[str, float] | None]],
               bars: Sequence[str]) -> tuple[str | None, dict[str, Versus]]:
    """Every other row against the *bar*: the row of ``bars`` (rows made without private data, epsilon 0)
    with the highest NDCG@10, the strictest of them. Returns (the bar's key, key -> Versus with the
    difference to the bar and its paired interval; retention None); (None, {}) without bars. A DP row
    that does not clear the bar (:func:`clears`) gains nothing a public recipe would not."""
    present = [key for key in bars if key in rows]
    if not present:
        return None, {}
    bar = max(present, key=lambda key: rows[key][0])
    score, queries = rows[bar]
    return bar, {key: Versus(s - score, _paired_ci(queries, q), None) for key, (s, q) in rows.items()
                 if key not in present and key != ZERO_SHOT}


def clears(versus: Versus) -> bool:
    """Above the reference with the paired interval's lower bound above 0 (no interval: never)."""
    return versus.ci is not None and versus.ci[0] > 0


BAR_HEADER = "ΔNDCG@10 vs the epsilon = 0 bar [95% CI]"  # the column of :func:`versus_bar`


def precision_sentence(rows: Sequence[tuple[str, str | None]]) -> str:
    """Which number format the rows' evaluations encoded in (``(label, precision)``; ``precision`` as recorded by
    :func:`privret.models.device.precision_label`, None where an older privret recorded none). bf16 autocast and
    float32 differ by about 0.001 NDCG@10, so rows in different formats (a run resumed on another machine) get a
    warning. Plain text, so that Markdown and HTML show it alike."""
    formats: dict[str, list[str]] = {}
    for label, precision in rows:
        formats.setdefault(precision or "unrecorded", []).append(label)
    if list(formats) == ["unrecorded"]:
        return "The number format of the rows' evaluations was not recorded (evaluated by an older privret)."
    if len(formats) == 1:
        return f"Every row was encoded in {next(iter(formats))} for evaluation."
    parts = "; ".join(f"{fmt}: {', '.join(labels)}" for fmt, labels in formats.items())
    return (f"Warning: the rows were encoded in different number formats ({parts}), so their differences include about "
            "0.001 NDCG@10 of rounding; evaluate them again on one machine (`privret evaluate retrieval --no-bf16`) to compare.")


def bar_sentence(bar_label: str, bar_ndcg: float, rows: Sequence[tuple[str, float | None, Versus | None]]) -> str:
    """What a table with an epsilon = 0 bar says under it: the bar, and which DP rows, of ``rows`` (label,
    epsilon, Versus against the bar), do not clear it (:func:`clears`). A DP row has 0 < epsilon < inf."""
    head = (f"The epsilon = 0 bar is '{bar_label}' (NDCG@10 {bar_ndcg:.4f}), the best row made without private "
            "data: a DP row clears it when its paired 95% interval against it lies above 0.")
    dp = [(label, versus) for label, epsilon, versus in rows if epsilon is not None and 0 < epsilon < math.inf]
    short = [label for label, versus in dp if versus is None or not clears(versus)]
    if not dp:
        return head
    if not short:
        return f"{head} Every DP row clears it."
    return f"{head} Not cleared by: " + "; ".join(short) + " (no gain a public recipe would not give)."
