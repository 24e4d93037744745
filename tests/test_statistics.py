"""Retention, the paired bootstrap interval against zero-shot, and mean ± sd over seeds."""

from __future__ import annotations

import numpy as np
import pytest

from privret.evaluate.statistics import Versus, mean_sd, paired_bootstrap_ci, precision_sentence, retention, versus_zero_shot


def test_retention_by_hand():
    assert retention(0.5, 0.25, 0.75) == 0.5  # half of the gain of training on the private pairs
    assert retention(0.0, 0.25, 0.75) == -0.5  # worse than not training at all
    assert retention(0.75, 0.25, 0.75) == 1.0
    assert retention(0.5, 0.25, 0.25) is None and retention(0.5, 0.5, 0.25) is None  # no gain to keep


def test_bootstrap_interval_by_hand():
    # the same resample for both systems: a constant difference has no spread, however spread the scores are
    a = [0.0, 1.0, 0.25, 0.5, 1.0, 0.0]
    assert paired_bootstrap_ci(a, [x + 0.25 for x in a]) == (0.25, 0.25)
    # differences (0, 0, 0, 1): a resample's mean is k/4 with k ~ Binomial(4, 1/4):
    # P(k <= 2) = 0.949 < 0.975 < P(k <= 3) = 0.996, and P(k = 0) = 0.316 > 0.025, so the 95% interval is [0, 3/4]
    assert paired_bootstrap_ci([0.5, 0.5, 0.5, 0.0], [0.5, 0.5, 0.5, 1.0]) == (0.0, 0.75)
    # the interval is of b - a: swapping the systems mirrors it
    assert paired_bootstrap_ci([0.5, 0.5, 0.5, 1.0], [0.5, 0.5, 0.5, 0.0]) == (-0.75, 0.0)
    rng = np.random.default_rng(1)
    x, y = rng.random(50), rng.random(50)
    assert paired_bootstrap_ci(x, y, seed=3) == paired_bootstrap_ci(x, y, seed=3)  # deterministic
    low50, high50 = paired_bootstrap_ci(x, y, level=0.5)
    low, high = paired_bootstrap_ci(x, y)
    assert low < low50 < float(np.mean(y - x)) < high50 < high


def test_bootstrap_interval_covers_the_true_difference():
    """300 queries, b = a + d + noise: the 95% interval covers d in about 95% of 200 simulated test sets."""
    rng = np.random.default_rng(7)
    d = 0.02
    covered = 0
    for _ in range(200):
        a = rng.random(300)
        b = a + d + rng.normal(0.0, 0.2, size=300)
        low, high = paired_bootstrap_ci(a, b, resamples=1000, seed=int(rng.integers(2**31)))
        covered += low <= d <= high
    assert 0.88 <= covered / 200 <= 0.99
    for _ in range(20):  # a large difference (about 9 standard errors) is never in doubt
        a = rng.random(300)
        assert paired_bootstrap_ci(a, a + 0.1 + rng.normal(0.0, 0.2, size=300), resamples=1000)[0] > 0


def test_mean_sd():
    assert mean_sd([0.4]) == (0.4, 0.0)
    assert mean_sd([1.0, 2.0, 3.0]) == (2.0, 1.0)  # sample sd: sqrt((1 + 0 + 1) / 2)
    with pytest.raises(ValueError, match="no values"):
        mean_sd([])


def test_versus_zero_shot_rows():
    zero = {"q1": 0.25, "q2": 0.5}
    rows = {"zero_shot": (0.375, zero), "original": (0.875, {"q1": 0.75, "q2": 1.0}),
            "eps-8": (0.625, {"q1": 0.5, "q2": 0.75}), "eps-4": (0.5, None), "eps-2": (0.5, {"q1": 0.5})}
    versus = versus_zero_shot(rows)
    assert versus["zero_shot"] == Versus(None, None, None)
    assert versus["original"] == Versus(0.5, (0.5, 0.5), None)  # retention of a reference is not shown
    assert versus["eps-8"] == Versus(0.25, (0.25, 0.25), 0.5)
    assert versus["eps-4"] == Versus(0.125, None, 0.25)  # no per-query scores: no interval
    assert versus["eps-2"].ci is None  # not the same queries: no pairing
    assert versus["eps-8"].delta_text() == "+0.2500 [+0.2500, +0.2500]" and versus["eps-8"].retention_text() == "50.0%"
    assert versus["eps-4"].delta_text() == "+0.1250 [-]" and versus["zero_shot"].delta_text() == "-"
    assert versus_zero_shot({"eps-8": (0.5, None)}) == {"eps-8": Versus(None, None, None)}  # no zero-shot row


def test_versus_bar_takes_the_best_row_without_private_data_and_clears_needs_the_interval_above_0():
    from privret.evaluate.statistics import clears, versus_bar

    q = ["a", "b", "c"]

    def table(values):
        return dict(zip(q, values))

    rows = {"zero_shot": (0.4, table([0.3, 0.4, 0.5])),
            "prompted": (0.5, table([0.4, 0.5, 0.6])), "pairs": (0.3, table([0.2, 0.3, 0.4])),
            "dp-above": (0.6, table([0.5, 0.6, 0.7])), "dp-level": (0.5, table([0.6, 0.5, 0.4])),
            "dp-no-per-query": (0.9, None)}
    bar, versus = versus_bar(rows, ["prompted", "pairs"])
    assert bar == "prompted"  # the strictest bar
    assert set(versus) == {"dp-above", "dp-level", "dp-no-per-query"}  # not the bars, not zero-shot
    assert versus["dp-above"].delta == pytest.approx(0.1) and versus["dp-above"].ci == pytest.approx((0.1, 0.1))
    assert clears(versus["dp-above"])
    assert versus["dp-level"].delta == pytest.approx(0.0) and versus["dp-level"].ci[0] < 0 < versus["dp-level"].ci[1]
    assert not clears(versus["dp-level"])
    assert versus["dp-no-per-query"].ci is None and not clears(versus["dp-no-per-query"])  # never by its mean alone
    assert versus_bar(rows, []) == (None, {}) and versus_bar(rows, ["absent"]) == (None, {})


def test_precision_sentence_names_one_format_or_warns_about_several():
    assert precision_sentence([("zero-shot", "float32"), ("original", "float32")]) == \
        "Every row was encoded in float32 for evaluation."
    assert "not recorded" in precision_sentence([("zero-shot", None)])
    mixed = precision_sentence([("zero-shot", "float32"), ("original", "float32"), ("DP", "bf16-autocast"), ("old", None)])
    assert mixed.startswith("Warning: the rows were encoded in different number formats (float32: zero-shot, original; "
                            "bf16-autocast: DP; unrecorded: old)")
