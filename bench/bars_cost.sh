#!/usr/bin/env bash
# Issue 12's cost goal: the rows made without private data (the epsilon-0 bars of configs/scifact.yaml's
# public_rows) add at most 30% to the pipeline's wall time at one epsilon. The shipped SciFact config with its
# grid cut to epsilon 8 and without its direct DP rows, run once end to end; `privret report` then reads each row's
# stage times and prints the share in its "Wall time" section (src/privret/report/cost.py).
# The rule, fixed before any run: one run, epsilon 8, the config's settings otherwise unchanged; the goal's figure is
# the report's share against the synthetic route (zero-shot, original and the DP synthetic rows of epsilon 8: the
# stricter one, as the earlier estimate in docs/benchmarks.md was made); measured only if the report times every row
# it needs (a stage resumed after a crash counts its last part only: a resumed run is reported as such).
# The direct DP rows are left out (changed 2026-11-29, before any run): they are not in that figure, they would add
# five or more hours on 2 cores, and a run directory does not outlive a session here; with them, the share against
# the whole grid is smaller, so leaving them out can only make the goal harder to meet. About 2.5 hours on 2 cores;
# re-running resumes (the pipeline skips finished stages).
# Added 2026-12-01 (twenty-second session) before any figure of its run existed: the run takes hours here (each
# selected retriever trains 3 times: two candidates and the retrain on all pairs), maybe more than a session gives,
# and its directory does not outlive the session. For a run that cannot finish,
# `bench/bars_cost_bound.py WORK_DIR/run --epsilon 8` bounds the share from above by the route's stages timed so far
# (the epsilon-0 row fully timed and never resumed); reported as "at most",
# the goal met only if that bound is at most 30%, "not shown" otherwise (never "not met" on a bound).
# Run 2026-12-01 (twenty-third session, runs/s36): 1 h 46 min end to end; the bar added +56% (docs/benchmarks.md,
# "What the epsilon-0 bar costs, end to end"; its files in bench/results/bars_cost/).
#   usage: bench/bars_cost.sh WORK_DIR
set -euo pipefail
work=$1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
mkdir -p "$work"
config=$work/scifact-eps8.yaml
[ -f "$config" ] || .venv/bin/python - "$config" <<'EOF'
import sys
from pathlib import Path

import yaml

source = Path("configs/scifact.yaml")
cfg = yaml.safe_load(source.read_text())
cfg["name"] = "scifact-eps8"
cfg["dataset"] = str((source.parent / cfg["dataset"]).resolve())  # the copy lives elsewhere
cfg["epsilons"] = [8]
del cfg["direct_dp"]  # not in the goal's figure; hours on 2 cores (see above)
Path(sys.argv[1]).write_text(yaml.safe_dump(cfg, sort_keys=False))
EOF
.venv/bin/privret pipeline "$config" --run-dir "$work/run"
.venv/bin/privret report "$work/run"
sed -n '/^## Wall time/,/^## /p' "$work/run/report.md"
