"""A run as one dataset's privacy-utility object, what ``privret report --utility-json`` writes."""

from __future__ import annotations

from pathlib import Path

from privret.errors import InputError
from privret.evaluate.statistics import ORIGINAL, ZERO_SHOT, mean_sd
from privret.report.collect import RunData


def privacy_utility(run: RunData) -> dict:
    """The run as one dataset's privacy-utility object (what ``privret report --utility-json`` writes)::

        {"dataset": name, "zero_shot": {"ndcg10": float}, "original": {"ndcg10": float},
         "rows": [{"name", "epsilon", "ndcg10_mean", "ndcg10_sd", "seeds", "delta_ci95": [lo, hi], "retention"}]}

    One row per trained row other than the references, named by its directory (``eps-8``,
    ``direct-logit-dp-eps-8``); ``epsilon`` is its ledger's (``Infinity`` when non-private). A run
    directory holds one training seed per row, so every row has ``seeds`` 1 and
    ``ndcg10_sd`` 0.0 (:func:`~privret.evaluate.statistics.mean_sd` of one value). ``delta_ci95`` is
    the paired bootstrap interval of its NDCG@10 minus zero-shot's (null without per-query scores);
    ``retention`` is null where undefined. ``dataset`` is the name of the run's dataset directory.
    """
    rows = {r.key: r for r in run.rows}
    for key in (ZERO_SHOT, ORIGINAL):
        if key not in rows:
            raise InputError(f"the privacy-utility JSON needs {key}/metrics.json", path=run.run_dir)
    out = []
    for r in run.rows:
        if r.key in (ZERO_SHOT, ORIGINAL):
            continue
        mean, sd = mean_sd([float(r.metrics["ndcg@10"])])
        versus = run.versus[r.key]
        out.append({"name": r.key, "epsilon": r.epsilon, "ndcg10_mean": mean, "ndcg10_sd": sd, "seeds": 1,
                    "delta_ci95": None if versus.ci is None else list(versus.ci), "retention": versus.retention})
    return {"dataset": Path(str(run.config.get("dataset") or run.name)).name,
            "zero_shot": {"ndcg10": float(rows[ZERO_SHOT].metrics["ndcg@10"])},
            "original": {"ndcg10": float(rows[ORIGINAL].metrics["ndcg@10"])}, "rows": out}
