#!/usr/bin/env bash
# Issue 12 point 5: direct DP's optimizer and step size chosen on a public proxy, then applied to SciFact.
#
# The regime is the one fixed a priori for a log of ~10^3 units (docs/direct-dp.md): public negatives, every
# unit in every step (q = 1), 5 steps, BitFit, clip 1, epsilon 7 (sigma 1.23, PRV). Two variants of what the noisy
# mean gradient drives, each with its learning rate fixed a priori:
#   adam  lr 2e-3 (the earlier run);
#   sgd   lr 1.3: the step norm Adam takes on a pure-noise gradient, lr_adam sqrt(d), over the norm of the noise
#         in the mean gradient, sigma C sqrt(d) / (q N): 2e-3 * 807 / 1.23 (sigma from the PRV accountant).
# The step actually taken is then set by a WiSE-FT weight w (the released model is (1 - w) base + w DP model;
# post-processing, same ledger):
#   proxy:<v>    SQuAD as if private, its log cut to SciFact's 807 training queries (same q, same sigma, same
#                noise-to-signal ratio): variant v once, every w of W on the proxy's test split
#   proxy-original  the non-private fine-tune on the proxy's log (3 epochs, 256 tokens; reporting only)
#   choose       the best (variant, w) on the proxy (w = 0, the public encoder, if none beats it; the smaller
#                w on a tie); written to WORK/proxy/choice.txt
#   scifact:<v>:<s>  variant v on SciFact's log with seed s (it may train beside the proxy steps), evaluated on
#                SciFact test at w = 1 and, when v is the chosen variant, at the chosen w, with per-query figures
#                (for bench/seed_rows.py)
#   scifact-curve:<v>:<s>  every w of W on SciFact test, after scifact:<v>:<s> (reporting only, never a choice)
#   proxy-eps50:<v>  the same regime on the proxy at epsilon 50 (sigma 0.30, a quarter of the noise; the most the
#                accountant calibrates): does the step gain when there is almost no noise? (a diagnosis, w 0.25 and 1)
# Each step skips what exists, so re-running resumes. One thread per job (2-core machine). PB: units per
# forward pass (memory only: at 64 a run peaks at about 14 GB, so two side by side need a smaller one).
#   usage: bench/direct_proxy.sh WORK_DIR STEP...
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
P=.venv/bin/privret
source bench/lib.sh
W="0.1 0.25 0.5 0.75 1"
S=../shared/data/scifact
Q=$work/squad-807
ev() { evaluate_once "$1" "$2" test "$3"; }  # $1 model, $2 data, $3 out dir
direct() {  # $1 data, $2 out, $3 variant, $4 seed, $5 epsilon (default 7)
  local opt=(--optimizer adam --lr 2e-3)
  [ "$3" = sgd ] && opt=(--optimizer sgd --lr 1.3)
  [ -f "$2/privacy_ledger.json" ] || $P retriever train --dp public-negatives --data "$1" --out "$2" --epsilon "${5:-7}" \
      --batch-size 807 --epochs 5 --trainable bias "${opt[@]}" --physical-batch "${PB:-64}" --seed "$4" \
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
    proxy:*)
      v=${step#proxy:}
      [ -d "$Q" ] || $P data squad-beir --squad ../shared/data/squad/squad-v1.1-dev-40.json --out "$Q" \
                       --train-queries 807
      ev minilm-l6 "$Q" "$work/proxy/zero-shot"
      direct "$Q" "$work/proxy/$v" "$v" 0
      for w in $W; do
        ev "$(at "$work/proxy/$v" "$w" "$work/proxy/$v@$w")" "$Q" "$work/proxy/eval-$v@$w"
        echo "$v w=$w: $(ndcg "$work/proxy/eval-$v@$w")"
      done ;;
    proxy-eps50:*)
      v=${step#proxy-eps50:}
      direct "$Q" "$work/proxy/eps50-$v" "$v" 0 50
      for w in 0.25 1; do
        ev "$(at "$work/proxy/eps50-$v" "$w" "$work/proxy/eps50-$v@$w")" "$Q" "$work/proxy/eval-eps50-$v@$w"
        echo "epsilon 50, $v w=$w: $(ndcg "$work/proxy/eval-eps50-$v@$w")"
      done ;;
    proxy-original)  # the non-private fine-tune on the proxy's log (reporting only: how much room the proxy has)
      [ -d "$work/proxy/original" ] || $P retriever train --data "$Q" --out "$work/proxy/original" --epochs 3 \
                                          --max-doc-tokens 256
      ev "$work/proxy/original" "$Q" "$work/proxy/eval-original"
      echo "original: $(ndcg "$work/proxy/eval-original")" ;;
    choose)
      best="adam 0"; best_score=$(ndcg "$work/proxy/zero-shot"); echo "w=0 (zero-shot): $best_score"
      for v in adam sgd; do for w in $W; do
        [ -f "$work/proxy/eval-$v@$w/metrics.json" ] || continue
        s=$(ndcg "$work/proxy/eval-$v@$w"); echo "$v w=$w: $s"
        if python3 -c "import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))" "$s" "$best_score"; then
          best="$v $w"; best_score=$s; fi
      done; done
      echo "$best" > "$work/proxy/choice.txt"; echo "chosen on the proxy: $best" ;;
    scifact:*)
      v=${step#scifact:}; s=${v#*:}; v=${v%%:*}
      direct $S "$work/scifact/$v-s$s" "$v" "$s"
      ev minilm-l6 $S "$work/scifact/zero-shot"
      ev "$work/scifact/$v-s$s" $S "$work/scifact/eval-$v-s$s@1"
      [ -f "$work/proxy/choice.txt" ] || { echo "no choice yet: run the choose step, then this one again" >&2; exit 2; }
      read -r cv w < "$work/proxy/choice.txt"
      if [ "$cv" = "$v" ] && [ "$w" != 0 ]; then
        ev "$(at "$work/scifact/$v-s$s" "$w" "$work/scifact/$v-s$s@$w")" $S "$work/scifact/eval-$v-s$s@$w"; fi ;;
    scifact-curve:*)  # every w on SciFact test: reporting only (how well the proxy's curve predicts SciFact's)
      v=${step#scifact-curve:}; s=${v#*:}; v=${v%%:*}
      for w in $W; do
        ev "$(at "$work/scifact/$v-s$s" "$w" "$work/scifact/$v-s$s@$w")" $S "$work/scifact/eval-$v-s$s@$w"
        echo "SciFact $v seed $s w=$w: $(ndcg "$work/scifact/eval-$v-s$s@$w")"
      done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
