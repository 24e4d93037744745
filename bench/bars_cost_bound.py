"""What the epsilon-0 rows add to a pipeline run's synthetic route at one epsilon, also while the run is unfinished.

``privret report`` gives the share once every row of the route has its metrics (src/privret/report/cost.py). A run
that cannot finish (here: a session ends before a 3-hour SciFact run does, and its directory does not outlive the
session) still bounds it. Every stage time is written as the stage ends (``timing.json``; ``eval_seconds`` in
``metrics.json``), so the route's stages timed so far are a lower bound on the route, and::

    share = (seconds of the epsilon-0 rows) / (seconds of the synthetic route)
         <= (seconds of the epsilon-0 rows) / (seconds of the route's stages timed so far)

provided the epsilon-0 rows are fully timed (else nothing is printed but what is missing) and none of their
stages was resumed after a crash (a resumed stage counts only its last part, cost.py: an under-count of the
numerator, which would break the bound; this script cannot tell, so the run must not have been resumed while an
epsilon-0 row was running). The route is the one of
cost.py: zero-shot, original pairs and the DP synthetic rows of the epsilon (``eps-<e>``, ``-filtered``,
``-selected``); rows the run has not started add nothing to the bound. It is always printed as "at most": the
figure itself is the finished run's report (the rule of bench/bars_cost.sh); this bound is for a run that did not
finish.

    usage: .venv/bin/python bench/bars_cost_bound.py RUN_DIR --epsilon 8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

from privret.report.collect import EPS_DIR, parse_eps, read_timing
from privret.report.cost import STAGES, expected_stages, minutes, timed_seconds
from privret.run_layout import FILTERED_SUFFIX, METRICS_FILE, ORIGINAL, PUBLIC_ROWS, SELECTED_SUFFIX, ZERO_SHOT


def timed_stages(row_dir: Path) -> dict[str, float]:
    """The stages of a row directory that have a time so far (keys of cost.STAGES), read as the report reads them."""
    metrics = row_dir / METRICS_FILE
    row = SimpleNamespace(timing=read_timing(row_dir), metrics=json.loads(metrics.read_text()) if metrics.is_file()
                          else {})
    return timed_seconds(row)


def method_of(name: str) -> str:
    """The row kind cost.expected_stages knows, from a row directory's name."""
    if name == ZERO_SHOT:
        return "zero-shot"
    if name == ORIGINAL:
        return "original"
    if name.endswith(FILTERED_SUFFIX):
        return "dp-synthetic-filtered"
    return "dp-synthetic-selected" if name.endswith(SELECTED_SUFFIX) else name  # plain DP and epsilon-0 rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--epsilon", type=float, required=True, help="the grid epsilon whose route is the base")
    args = parser.parse_args()
    route = [ZERO_SHOT, ORIGINAL] + sorted(
        d.name for d in args.run_dir.iterdir()
        if d.is_dir() and (m := EPS_DIR.match(d.name)) and parse_eps(m["eps"]) == args.epsilon)
    public = [key for key in PUBLIC_ROWS if (args.run_dir / key).is_dir()]
    if not public:
        raise SystemExit(f"{args.run_dir}: no epsilon-0 row")
    totals, complete = {}, {}
    for name in public + route:
        seconds = timed_stages(args.run_dir / name) if (args.run_dir / name).is_dir() else {}
        missing = expected_stages(SimpleNamespace(method=method_of(name))) - set(seconds)
        totals[name], complete[name] = sum(seconds.values()), not missing
        stages = ", ".join(f"{STAGES[s]} {minutes(v)}" for s, v in seconds.items()) or "nothing timed"
        print(f"{name}: {stages}" + (f"; not timed yet: {', '.join(STAGES[s] for s in sorted(missing))}"
                                     if missing else ""))
    if not all(complete[name] for name in public):
        raise SystemExit("an epsilon-0 row is not fully timed: no bound")
    added, base = sum(totals[n] for n in public), sum(totals[n] for n in route)
    if base <= 0:
        raise SystemExit("no stage of the synthetic route is timed yet: no bound")
    print(f"epsilon-0 rows {minutes(added)} over the {minutes(base)} of the synthetic route's stages timed so far: "
          f"at most +{100 * added / base:.1f}%")


if __name__ == "__main__":
    main()
