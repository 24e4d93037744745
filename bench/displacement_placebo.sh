#!/usr/bin/env bash
# Issue 12: where a direct-DP run's test gain comes from. Each kept SciFact run's displacement from the public encoder,
# with every coordinate's sign redrawn (bench/displacement_placebo.py: same |Delta_j|, random direction), scored on
# SciFact test next to the run; and the mean of several kept runs' tensors. Diagnostics read on test for reporting:
# nothing here is a candidate or chooses anything, and neither model is a release (the mean of k runs composes k
# releases, so it carries no single run's epsilon).
# Steps (each skips what exists, so re-running resumes):
#   placebo:<run>:<seed>:<scale>   the kept run bench/results/direct_regimes/scifact/<run>, signs drawn with <seed>,
#                                  its move scaled by <scale> -> RESULTS/<run>-signs<seed>-a<scale>/test
#   mean:<name>:<run>,<run>,...    the coordinate-wise mean of the kept runs' tensors -> RESULTS/<name>/test
#   line:<run>:<w>                 the kept run's update itself scaled by <w> (bench/scaled_update.py), the points of
#                                  the line through the release that the placebos are read beside -> RESULTS/<run>-w<w>/test
# Encoders and tensors go under WORK_DIR (rebuildable); the per-query test scores under
# bench/results/displacement_placebo/. One job at a time; OMP_NUM_THREADS as set (1 by default).
#   usage: bench/displacement_placebo.sh WORK_DIR STEP...
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
P=.venv/bin/privret
source bench/lib.sh
K=bench/results/direct_regimes/scifact
RESULTS=bench/results/displacement_placebo
encoder() {  # $1 tensors file, $2 encoder dir
  [ -d "$2" ] || .venv/bin/python bench/iterate_average.py --from-parameters "$1" --out "$2"; }
for step in "$@"; do
  case $step in
    placebo:*)
      IFS=: read -r _ run seed scale <<< "$step"; name=$run-signs$seed-a$scale
      [ -f "$work/$name.safetensors" ] || .venv/bin/python bench/displacement_placebo.py \
          --parameters "$K/$run/parameters.safetensors" --seed "$seed" --scale "$scale" --out "$work/$name.safetensors"
      encoder "$work/$name.safetensors" "$work/$name"
      evaluate_once "$work/$name" ../shared/data/scifact test "$RESULTS/$name/test" --no-bf16
      echo "placebo $name: test $(ndcg "$RESULTS/$name/test")" ;;
    mean:*)
      IFS=: read -r _ name runs <<< "$step"
      [ -f "$work/$name.safetensors" ] || .venv/bin/python - "$work/$name.safetensors" \
          $(for r in ${runs//,/ }; do echo "$K/$r/parameters.safetensors"; done) <<'EOF'
import sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file
out, files = Path(sys.argv[1]), sys.argv[2:]
runs = [load_file(f) for f in files]
if any(set(r) != set(runs[0]) for r in runs):
    raise SystemExit(f"{files}: the runs train different tensors")
mean = {n: torch.stack([r[n].float() for r in runs]).mean(0).to(runs[0][n].dtype).contiguous() for n in runs[0]}
out.parent.mkdir(parents=True, exist_ok=True)
save_file(mean, str(out.with_name(out.name + ".tmp")))
out.with_name(out.name + ".tmp").replace(out)
print(f"{out}: the mean of {len(runs)} runs' {len(mean)} tensors")
EOF
      encoder "$work/$name.safetensors" "$work/$name"
      evaluate_once "$work/$name" ../shared/data/scifact test "$RESULTS/$name/test" --no-bf16
      echo "mean $name: test $(ndcg "$RESULTS/$name/test")" ;;
    line:*)
      IFS=: read -r _ run w <<< "$step"; name=$run-w$w
      [ -d "$work/$name" ] || .venv/bin/python bench/scaled_update.py --parameters "$K/$run/parameters.safetensors" \
          --weight "$w" --ledger-from "$K/$run" --out "$work/$name"
      evaluate_once "$work/$name" ../shared/data/scifact test "$RESULTS/$name/test" --no-bf16
      echo "line $name: test $(ndcg "$RESULTS/$name/test")" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
