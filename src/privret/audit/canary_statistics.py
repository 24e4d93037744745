"""Statistics of a canary exposure audit (:mod:`privret.audit.canary_audit`): ranks, exposure, and a
lower bound on epsilon from the canaries' ranks.

* **rank**: the number of the ``m`` candidates scoring at least as high as the secret (ties count against it);
* **exposure** ``= log2(m) - log2(rank)`` (Carlini et al. 2019, "The Secret Sharer").

Without the canary, ``P[rank <= t] = t / m`` exactly; (epsilon, delta)-DP then bounds the test "rank <= t"
(hypothesis-testing view: Kairouz et al. 2015; Jagielski et al. 2020; Stock et al. 2022), so

    epsilon >= max( ln((TPR - delta) / (t/m)),  ln((1 - t/m - delta) / (1 - TPR)) )

with TPR replaced by its one-sided Clopper-Pearson lower bound over independent trials of one (kind, k), and a
Bonferroni correction over the 3 kinds and ``t`` in {1, 5, 10} (level ``alpha / 9``): the bound holds with
confidence ``1 - alpha``. ``delta`` is the ledger's. Derivation: docs/audits-canaries.md, section "The epsilon
lower bound".
"""

from __future__ import annotations

import math
import statistics

THRESHOLDS = (1, 5, 10)


def secret_rank(scores: list[float], secret_index: int) -> int:
    """1-based rank of ``scores[secret_index]``: the number of candidates scoring at least as high
    (itself included), so ties count against the secret."""
    target = scores[secret_index]
    if math.isnan(target):
        return len(scores)
    return sum(1 for s in scores if s >= target)


def exposure(rank: int, n_candidates: int) -> float:
    """Carlini et al. (2019): ``log2(|candidates|) - log2(rank)``."""
    if not 1 <= rank <= n_candidates:
        raise ValueError(f"rank must be in [1, {n_candidates}], got {rank}")
    return math.log2(n_candidates) - math.log2(rank)


def clopper_pearson_lower(successes: int, trials: int, alpha: float) -> float:
    """One-sided (1 - alpha) lower confidence bound on a binomial proportion (exact).

    The p with ``P[Binomial(trials, p) >= successes] = alpha`` (the tail grows with p: bisection).
    """
    if trials <= 0 or successes <= 0:
        return 0.0
    if successes >= trials:
        return alpha ** (1.0 / trials)

    def upper_tail(p: float) -> float:
        return sum(math.comb(trials, i) * p ** i * (1 - p) ** (trials - i) for i in range(successes, trials + 1))

    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if upper_tail(mid) < alpha:
            lo = mid
        else:
            hi = mid
    return lo


def epsilon_lower_bound_from_test(tpr_lower: float, fpr: float, delta: float) -> float:
    """Largest epsilon lower bound implied by a test with TPR >= ``tpr_lower`` at exact FPR ``fpr``
    against an (epsilon, delta)-DP mechanism (both directions of the hypothesis-testing bound)."""
    bounds = [0.0]
    if tpr_lower - delta > 0 and fpr > 0:
        bounds.append(math.log((tpr_lower - delta) / fpr))
    if 1 - fpr - delta > 0 and tpr_lower < 1:
        bounds.append(math.log((1 - fpr - delta) / (1 - tpr_lower)))
    return max(bounds)


def epsilon_lower_bound(ranks_by_kind: dict[str, list[int]], n_candidates: int, delta: float,
                        alpha: float = 0.05, thresholds: tuple[int, ...] = THRESHOLDS) -> tuple[float, int | None]:
    """(bound, threshold that gave it) over the kinds and thresholds, Bonferroni-corrected.

    ``ranks_by_kind[kind]`` holds the ranks of one (kind, repetitions) canary across independent
    trials. Returns (0, None) when nothing is significant.
    """
    usable = [t for t in thresholds if t < n_candidates]
    tests = max(1, len(ranks_by_kind) * len(usable))
    best, best_t = 0.0, None
    for ranks in ranks_by_kind.values():
        for t in usable:
            hits = sum(1 for r in ranks if r <= t)
            lower = clopper_pearson_lower(hits, len(ranks), alpha / tests)
            bound = epsilon_lower_bound_from_test(lower, t / n_candidates, delta)
            if bound > best:
                best, best_t = bound, t
    return best, best_t


def _spread(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else 0.0)


def summarise(canary_rows: list[dict], *, n_candidates: int, delta: float, unit: str, alpha: float) -> list[dict]:
    """One row per repetition count: rank and exposure (mean, std over canaries), leaked fraction,
    the epsilon lower bound (and the threshold t that gave it)."""
    out = []
    for k in sorted({r["repetitions"] for r in canary_rows}):
        rows = [r for r in canary_rows if r["repetitions"] == k]
        ranks = [r["rank"] for r in rows]
        exposures = [r["exposure"] for r in rows]
        rank_mean, rank_std = _spread(ranks)
        exp_mean, exp_std = _spread(exposures)
        by_kind: dict[str, list[int]] = {}
        for r in rows:
            by_kind.setdefault(r["kind"], []).append(r["rank"])
        bound, threshold = epsilon_lower_bound(by_kind, n_candidates, delta, alpha)
        out.append({"repetitions": k, "canaries": len(rows), "rank_mean": rank_mean, "rank_std": rank_std,
                    "rank_median": statistics.median(ranks), "exposure_mean": exp_mean, "exposure_std": exp_std,
                    "extracted_fraction": sum(r == 1 for r in ranks) / len(ranks),
                    "leaked_fraction": sum(r["leaked"] for r in rows) / len(rows),
                    "epsilon_lower_bound": bound if k > 0 else None, "bound_threshold": threshold if k > 0 else None,
                    "comparable_to_ledger": k > 0 and (unit != "pair" or k == 1)})
    return out
