#!/usr/bin/env bash
# Issue 12 point 5: the step size of direct DP chosen on a public proxy, then applied to SciFact.
#
# The regime is the one fixed a priori for a log of ~10^3 units (docs/direct-dp.md): public negatives, every
# unit in every step (q = 1), 5 steps, BitFit, lr 2e-3, clip 1, epsilon 7. Its step size is then set by a
# WiSE-FT weight w (the released model is (1 - w) base + w DP model; post-processing, same ledger):
#   proxy        SQuAD as if private, its log cut to SciFact's 807 training queries (same q, same sigma, same
#                noise-to-signal ratio): direct DP once, every w of W on the proxy's test split, w* = the best
#                (the smaller on a tie); written to WORK/proxy/choice.txt
#   scifact:<s>  the same run on SciFact's log with seed s (it may train beside the proxy step), released at w*
#                (and at 1, the unscaled model), both evaluated on SciFact test with per-query figures (for
#                bench/seed_rows.py)
# Each step skips what exists, so re-running resumes. One thread per job (2-core machine). PB: units per
# forward pass (memory only: at 64 a run peaks at about 14 GB, so two side by side need a smaller one).
#   usage: bench/direct_proxy.sh WORK_DIR STEP...
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
P=.venv/bin/privret
W="0.1 0.25 0.5 0.75 1"
ev() { [ -f "$3/per_query.json" ] || { mkdir -p "$3"; $P evaluate --model "$1" --data "$2" --split test \
         --per-query "$3/per_query.json" --json "$3/metrics.json"; }; }
direct() {  # $1 data, $2 out, $3 seed
  [ -f "$2/privacy_ledger.json" ] || $P retriever train --dp public-negatives --data "$1" --out "$2" --epsilon 7 \
      --batch-size 807 --epochs 5 --trainable bias --lr 2e-3 --physical-batch "${PB:-64}" --seed "$3" \
      --allow-over-budget --resume
}
at() {  # $1 model, $2 weight, $3 out: the model at weight w (1: the model itself)
  if [ "$2" = 1 ]; then echo "$1"; else
    [ -d "$3" ] || $P retriever interpolate --model "$1" --weight "$2" --out "$3" >&2
    echo "$3"; fi
}
ndcg() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ndcg@10'])" "$1/metrics.json"; }
for step in "$@"; do
  case $step in
    proxy)
      D=$work/squad-807
      [ -d "$D" ] || $P data squad-beir --squad ../shared/data/squad/squad-v1.1-dev-40.json --out "$D" \
                       --train-queries 807
      ev minilm-l6 "$D" "$work/proxy/zero-shot"
      direct "$D" "$work/proxy/direct" 0
      best=0; best_score=$(ndcg "$work/proxy/zero-shot")
      echo "w=0 (zero-shot): $best_score"
      for w in $W; do
        ev "$(at "$work/proxy/direct" "$w" "$work/proxy/direct@$w")" "$D" "$work/proxy/eval@$w"
        s=$(ndcg "$work/proxy/eval@$w"); echo "w=$w: $s"
        if python3 -c "import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))" "$s" "$best_score"; then
          best=$w; best_score=$s; fi
      done
      echo "$best" > "$work/proxy/choice.txt"; echo "chosen on the proxy: w* = $best" ;;
    scifact:*)
      s=${step#scifact:}; D=../shared/data/scifact
      direct $D "$work/scifact/direct-s$s" "$s"  # needs no w*: may run beside the proxy step
      ev minilm-l6 $D "$work/scifact/zero-shot"
      ev "$work/scifact/direct-s$s" $D "$work/scifact/eval-s$s@1"
      [ -f "$work/proxy/choice.txt" ] || { echo "no w* yet: run the proxy step, then this one again" >&2; exit 2; }
      w=$(cat "$work/proxy/choice.txt")
      [ "$w" = 0 ] || ev "$(at "$work/scifact/direct-s$s" "$w" "$work/scifact/direct-s$s@$w")" $D \
                         "$work/scifact/eval-s$s@$w" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
