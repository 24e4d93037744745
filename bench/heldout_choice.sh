#!/usr/bin/env bash
# Issue 12: SciFact's private log, with a DP choice of the step size that costs no epsilon beyond the run's own.
#
# The rule, fixed 2026-11-28 (sixteenth session) before any part of it ran:
#   partition   the training log's query units split by a public salted hash (privret.privacy.partition): salt
#               SALT below, held-out fraction 0.2 (about 160 of 807 units held out)
#   fit run     the shipped SciFact rule (bench/regimes.sh top3-b512-c1-e4-nodrop-pn1 with every unit in each of 48
#               steps, as bench/direct_regimes.sh's scifact: step) at epsilon 8 on the fit part only
#   choice      privret retriever select at epsilon 8 on the held-out part only, among the public encoder and the fit
#               run interpolated with it at w in {0.25, 0.5, 0.75, 1}; its released model costs max(8, 8) = 8
#               (parallel composition, add/remove neighbours; docs/privacy.md, "A held-out choice")
#   reported    the chosen model on SciFact test against the public encoder (paired CI) and against the shipped rule's
#               3 runs at epsilon 8 on the whole log; runs 0, 1, 2 (each a fresh fit run and a fresh choice), and no
#               claim before all 3. The fit run at w = 1 is evaluated on test too, for reporting only.
# Why: on SciFact the shipped rule reaches 42% of the original's gain at epsilon 8 (3 runs), its step longer than
# SciFact wants (the update scaled by 1.5 lost -0.013 on test; the older regime's curve peaked at w 0.1-0.25), and no
# public proxy sees SciFact's domain. The held-out units can, for the price of training on 80% of the log.
# Steps (each skips what exists, so running the same command again resumes):
#   seed:<s>    the fit run, the choice and their test evaluations for run s (WORK/scifact-heldout/*-seed<s>*)
#   keep:<s>    ledgers, the choice's record, the per-query test evaluations and the fit run's changed tensors to
#               bench/results/heldout_choice/seed<s>
#   usage: bench/heldout_choice.sh WORK_DIR STEP...
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
P=.venv/bin/privret
source bench/lib.sh
source bench/regimes.sh
S=../shared/data/scifact
R=top3-b512-c1-e4-nodrop-pn1
SALT=privret-scifact-heldout-2026-11-28
HOLD=(--hold-out 0.2 --hold-out-salt "$SALT")
for step in "$@"; do
  case $step in
    seed:*)
      s=${step#seed:}; fit=$work/scifact-heldout/$R-eps8-fit-seed$s; chosen=$work/scifact-heldout/choice-seed$s
      # 48 steps with q = 1: --batch-size 807 is at least the fit part's unit count
      [ -f "$fit/privacy_ledger.json" ] || $P retriever train $(dp_base "$S" "$work") ${REGIMES[$R]} \
          --batch-size 807 --epochs 48 --epsilon 8 --seed "$s" "${HOLD[@]}" --out "$fit"
      [ -f "$chosen/privacy_ledger.json" ] || $P retriever select --data "$S" --candidate "$fit" --epsilon 8 \
          --weights 0.25,0.5,0.75,1 "${HOLD[@]}" --allow-over-budget --out "$chosen"
      evaluate_once "$chosen" "$S" test "$chosen-test" --no-bf16
      evaluate_once "$fit" "$S" test "$fit-test" --no-bf16
      echo "run $s: chose $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['chosen'].rsplit('/', 1)[-1])" \
          "$chosen/private_selection.json"); test $(ndcg "$chosen-test") (the fit run at w 1: $(ndcg "$fit-test"))" ;;
    keep:*)
      s=${step#keep:}; k=bench/results/heldout_choice/seed$s; mkdir -p "$k/fit/test" "$k/choice/test"
      fit=$work/scifact-heldout/$R-eps8-fit-seed$s; chosen=$work/scifact-heldout/choice-seed$s
      cp "$fit"/{privacy_ledger.json,dp_mechanism.json,train_config.json} "$k/fit/"
      cp "$chosen"/{privacy_ledger.json,private_selection.json} "$k/choice/"
      cp "$fit-test"/*.json "$k/fit/test/"; cp "$chosen-test"/*.json "$k/choice/test/"
      # the fit run's changed tensors (BitFit: about 60 KB), from which the chosen model is rebuilt
      .venv/bin/python bench/iterate_average.py --keep-changed --final-model "$fit" --save-parameters "$fit-parameters.safetensors"
      cp "$fit-parameters.safetensors" "$k/fit/parameters.safetensors" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
