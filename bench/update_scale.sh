#!/usr/bin/env bash
# Issue 12: scale a kept direct-DP run's update by a factor w chosen on a public proxy, then carry it to SciFact.
#
# theta_0 + w (theta_run - theta_0) is post-processing of the run (bench/scaled_update.py): its ledger is the run's,
# provided w is fixed without the private log. The proxy: the 806-unit SQuAD log of SciFact's size and the shipped
# SciFact rule's schedule (48 full-batch steps, lr 2e-3, sigma 3.43 at epsilon 8; "A log of SciFact's size" in
# docs/benchmarks.md), its kept seed-0 run bench/results/direct_regimes/small/top3-b512-c1-e4-nodrop-pn1-t48-lr2e-3,
# scored on SQuAD's 4 validation articles (1,095 questions). Never SciFact: its test split is for reporting.
# The rule, fixed 2026-11-28 (fifteenth session) before any scaled model was evaluated:
#   candidates w in {1, 1.5, 2, 3} (w = 1 is the run as released; validation 0.7847);
#   the w with the best validation NDCG@10 on the proxy run; w = 1 when none beats it;
#   the chosen w is applied unchanged to every kept SciFact run of the rule (epsilon 8 and 3), scored on test.
# Steps (each skips what exists, so re-running resumes):
#   proxy:<w>            the proxy run scaled by w, evaluated on validation (WORK/proxy-w<w>-validation)
#   choose               the rule above -> WORK/choice.txt
#   scifact:<run>        the kept SciFact run bench/results/direct_regimes/scifact/<run> scaled by the chosen w,
#                        evaluated on SciFact test (WORK/scifact/<run>-w<w>-test)
# One job at a time; OMP_NUM_THREADS as set (1 by default).
#   usage: bench/update_scale.sh WORK_DIR STEP...
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
P=.venv/bin/privret
source bench/lib.sh
K=bench/results/direct_regimes
PROXY=$K/small/top3-b512-c1-e4-nodrop-pn1-t48-lr2e-3
SQUAD_VAL=$work/squad-val
scaled() {  # $1 kept run, $2 w, $3 out: the scaled encoder with the run's ledger
  [ -d "$3" ] || .venv/bin/python bench/scaled_update.py --parameters "$1/parameters.safetensors" --weight "$2" \
      --ledger-from "$1" --out "$3"; }
for step in "$@"; do
  case $step in
    proxy:*)
      w=${step#proxy:}; out=$work/proxy-w$w
      [ -d "$SQUAD_VAL" ] || $P data squad-beir --squad ../shared/data/squad/squad-v1.1-dev-40.json \
          --validation-articles 4 --out "$SQUAD_VAL"
      scaled "$PROXY" "$w" "$out"
      evaluate_once "$out" "$SQUAD_VAL" validation "$out-validation" --no-bf16
      echo "proxy w = $w: validation $(ndcg "$out-validation")" ;;
    choose)
      python3 - "$work" "$PROXY/validation" <<'EOF'
import json, sys
from pathlib import Path
work, released = Path(sys.argv[1]), Path(sys.argv[2])
score = lambda d: json.loads((d / "metrics.json").read_text())["ndcg@10"]
best, best_score = "1", score(released)
for d in sorted(work.glob("proxy-w*-validation")):
    w = d.name[len("proxy-w"):-len("-validation")]
    print(f"w = {w}: {score(d):.4f}")
    if score(d) > best_score:
        best, best_score = w, score(d)
(work / "choice.txt").write_text(f"{best}\n")
print(f"chosen on the proxy's validation split: w = {best} ({best_score:.4f}; the run as released {score(released):.4f})")
EOF
      ;;
    scifact:*)
      n=${step#scifact:}; w=$(cat "$work/choice.txt"); out=$work/scifact/$n-w$w; mkdir -p "$work/scifact"
      [ "$w" = 1 ] && { echo "the rule chose w = 1: the run as released"; continue; }
      scaled "$K/scifact/$n" "$w" "$out"
      evaluate_once "$out" ../shared/data/scifact test "$out-test" --no-bf16
      echo "SciFact $n scaled by $w: test $(ndcg "$out-test")" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
