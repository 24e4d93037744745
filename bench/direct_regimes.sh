#!/usr/bin/env bash
# Reproduces docs/results.md, "Direct DP training of the retriever": the SQuAD and SciFact direct-DP rows (bench/README.md).
#   usage: bench/direct_regimes.sh WORK STEP...   e.g. R=top3-b512-c1-e4-nodrop-pn1;
#          bench/direct_regimes.sh runs/direct data zero-shot original run:$R choose test:$R seed:$R:1 eps:$R:3 scifact:$R:8
# 2 CPU cores (OMP_NUM_THREADS=2 PB=16): a SQuAD run of 45 steps about 55 min with its evaluations, a SciFact run of
# 48 steps about 2 h; H200 (PB=128): 92 s and about 2 min of training. Each step skips what exists (re-running resumes).
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
P=.venv/bin/privret
source bench/lib.sh
SQUAD=../shared/data/squad/squad-v1.1-dev-40.json
S=../shared/data/scifact
D=$work/squad-val
# The log: SQuAD's 32 training articles less 4 validation articles (5,767 questions); validation: the 1,095 questions
# of those 4 articles; test: the 1,535 questions of the 8 test articles. Every regime is public-negatives with each
# unit's own hard public negatives (docs/direct-dp.md); dp_base DATA WORK holds the options they share, dp_config
# FILE SEED [YAML lines] writes the fields they take from --config (documents cut at 256 tokens: the default).
dp_base() {
  echo "--method public-negatives --data $1 --hard-negatives 2 --allow-over-budget --resume --cache-dir $2/cache"
}
dp_config() {
  local file=$1 seed=$2; shift 2
  printf '%s\n' "physical_batch: ${PB:-32}" "checkpoint_every: 2" "seed: $seed" "$@" > "$file"
}
# The candidates compared on validation by `choose` (what each trains and how it steps); the chosen one,
# top3-b512-c1-e4-nodrop-pn1, is configs/squad.yaml's and configs/scifact.yaml's public-negatives row
declare -A REGIMES=(
  [top2-b512-c1]="--trainable bias-top:2 --batch-size 512 --epochs 1 --clip-norm 1 --lr 2e-3 --dropout"
  [top2-b512-c1-lr4]="--trainable bias-top:2 --batch-size 512 --epochs 1 --clip-norm 1 --lr 4e-3 --dropout"
  [top3-b512-c1]="--trainable bias-top:3 --batch-size 512 --epochs 1 --clip-norm 1 --lr 2e-3 --dropout"
  [top3-b512-c1-lr4]="--trainable bias-top:3 --batch-size 512 --epochs 1 --clip-norm 1 --lr 4e-3 --dropout"
  [top3-b512-c1-e4]="--trainable bias-top:3 --batch-size 512 --epochs 4 --clip-norm 1 --lr 2e-3 --dropout"
  [top3-b128-c1-e4]="--trainable bias-top:3 --batch-size 128 --epochs 4 --clip-norm 1 --lr 1e-3 --dropout"
  [top3-b512-c1-e4-lr4]="--trainable bias-top:3 --batch-size 512 --epochs 4 --clip-norm 1 --lr 4e-3 --dropout"
  [top3-b512-c3-e4]="--trainable bias-top:3 --batch-size 512 --epochs 4 --clip-norm 3 --lr 2e-3 --dropout"
  [top3-b512-c1-e4-nodrop]="--trainable bias-top:3 --batch-size 512 --epochs 4 --clip-norm 1 --lr 2e-3 --no-dropout"
  [bias-b512-c1-e4-nodrop]="--trainable bias --batch-size 512 --epochs 4 --clip-norm 1 --lr 2e-3 --no-dropout"
  [lora4-b512-c1-e4-nodrop]="--trainable lora --batch-size 512 --epochs 4 --clip-norm 1 --lr 2e-3 --no-dropout"
  [top3-b512-c03-e4-nodrop]="--trainable bias-top:3 --batch-size 512 --epochs 4 --clip-norm 0.3 --lr 2e-3 --no-dropout"
  [top3-b512-c1-e4-nodrop-pn1]="--trainable bias-top:3 --batch-size 512 --epochs 4 --clip-norm 1 --lr 2e-3 --no-dropout --public-negatives 1"
  [top3-b512-c1-e4-nodrop-pn0]="--trainable bias-top:3 --batch-size 512 --epochs 4 --clip-norm 1 --lr 2e-3 --no-dropout --public-negatives 0"
)
declare -A REGIME_CONFIG=([lora4-b512-c1-e4-nodrop]="lora_rank: 4")  # what a regime sets in --config
ev() { evaluate_once "$1" "$D" "$2" "$3" --no-bf16; }  # $1 model, $2 split, $3 out dir (float32, as the headline)
dp_train() {  # $1 out dir, $2 regime, $3 data, $4 seed, then options that override the regime's (a --config's YAML
  # lines after --yaml): the DP run, unless done
  local out=$1 n=$2 data=$3 seed=$4 flags=() yaml=(); shift 4
  while [ $# -gt 0 ]; do [ "$1" = --yaml ] && { yaml+=("$2"); shift 2; } || { flags+=("$1"); shift; }; done
  [ -f "$out/privacy_ledger.json" ] && return 0
  mkdir -p "$(dirname "$out")"; dp_config "$out.yaml" "$seed" ${REGIME_CONFIG[$n]:+"${REGIME_CONFIG[$n]}"} "${yaml[@]}"
  $P retriever train-dp $(dp_base "$data" "$work") ${REGIMES[$n]} --config "$out.yaml" "${flags[@]}" --out "$out"
}
scifact_steps() {  # $1 regime: the steps it takes on SciFact, 12 per SQuAD epoch (each taking all 807 units)
  local re='--epochs ([0-9]+)'; [[ ${REGIMES[$1]} =~ $re ]]; echo $((12 * BASH_REMATCH[1]))
}
keep_evaluations() {  # $1 run dir, $2 kept dir: validation metrics and test per-query figures ($1-<split>) to $2/<split>/
  if [ -f "$1-validation/metrics.json" ]; then mkdir -p "$2/validation"; cp "$1-validation/metrics.json" "$2/validation/"; fi
  if [ -f "$1-test/per_query.json" ]; then mkdir -p "$2/test"; cp "$1-test"/{metrics,per_query}.json "$2/test/"; fi
}
keep_records() {  # $1 run dir, $2 kept dir: the run's ledger, mechanism, settings and choice record, those that exist
  local f; mkdir -p "$2"
  for f in privacy_ledger dp_mechanism train_config private_selection; do
    [ ! -f "$1/$f.json" ] || cp "$1/$f.json" "$2/"
  done
}
both_splits() {  # $1 regime, $2 epsilon, $3 seed, $4 out dir: the DP run (unless done), evaluated on both splits
  dp_train "$4" "$1" "$D" "$3" --epsilon "$2"
  ev "$4" validation "$4-validation"; ev "$4" test "$4-test"
  echo "$1 at epsilon $2, seed $3: validation $(ndcg "$4-validation"), test $(ndcg "$4-test")"
}
for step in "$@"; do
  case $step in
    data)  # the log with its validation split carved out (WORK/squad-val)
      [ -d "$D" ] || $P data squad-beir --squad $SQUAD --out "$D" --validation-articles 4 ;;
    zero-shot)  # the public encoder on validation and test
      ev minilm-l6 validation "$work/zero-shot-validation"; ev minilm-l6 test "$work/zero-shot-test" ;;
    original)  # the non-private reference on the same log (1 epoch, documents cut at 256 tokens, every weight)
      [ -f "$work/original-28/model.safetensors" ] || $P retriever train --data "$D" --out "$work/original-28" \
          --epochs 1 --max-doc-tokens 256
      ev "$work/original-28" validation "$work/original-28-validation"; ev "$work/original-28" test "$work/original-28-test"
      echo "original: validation $(ndcg "$work/original-28-validation"), test $(ndcg "$work/original-28-test")" ;;
    run:*)  # run:<regime>: its DP run at epsilon 8, evaluated on validation
      n=${step#run:}
      dp_train "$work/$n" "$n" "$D" 0 --epsilon 8
      ev "$work/$n" validation "$work/$n-validation"; echo "$n validation: $(ndcg "$work/$n-validation")" ;;
    choose)  # the regime with the best validation NDCG@10, averaged over its epsilon-8 runs (run: and seed:), or
      # the public encoder when none beats it -> WORK/choice.txt; only float32 evaluations compete; never test
      python3 - "$work" "${!REGIMES[@]}" <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
metrics = lambda d: json.loads((d / "metrics.json").read_text())
fmt = lambda d: metrics(d).get("precision", "unrecorded")
base = work / "zero-shot-validation"
best, best_score, want, skipped = "zero-shot", metrics(base)["ndcg@10"], fmt(base), []
for name in sorted(sys.argv[2:]):
    runs = [d for d in [work / f"{name}-validation", *sorted(work.glob(f"{name}-seed*-validation"))]
            if (d / "metrics.json").is_file()]
    skipped += [f"{d.name} ({fmt(d)})" for d in runs if fmt(d) != want]  # bf16 and float32 differ by ~0.001
    scores = [metrics(d)["ndcg@10"] for d in runs if fmt(d) == want]
    if scores:
        print(f"{name}: {sum(scores) / len(scores):.4f} (mean of {len(scores)} run(s))")
    if scores and sum(scores) / len(scores) > best_score:
        best, best_score = name, sum(scores) / len(scores)
(work / "choice.txt").write_text(f"{best}\n")
print(f"chosen on validation: {best} ({best_score:.4f}, {want})")
if skipped:
    print(f"not compared, evaluated in another number format than zero-shot's ({want}): {', '.join(skipped)}")
EOF
      ;;
    test:*)  # test:<regime>: the epsilon-8 run's test evaluation
      n=${step#test:}; ev "$work/$n" test "$work/$n-test"; echo "$n test: $(ndcg "$work/$n-test")" ;;
    eps:*)  # eps:<regime>:<epsilon>[:<seed>]: another epsilon, both splits (WORK/<regime>-eps<e>[-seed<s>])
      IFS=: read -r n e s <<<"${step#eps:}"; s=${s:-0}; out=$work/$n-eps$e; [ "$s" = 0 ] || out=$out-seed$s
      both_splits "$n" "$e" "$s" "$out" ;;
    seed:*)  # seed:<regime>:<seed>: another run at epsilon 8, both splits (the noise comes from os.urandom whatever
      # the seed; it names the run)
      IFS=: read -r n s <<<"${step#seed:}"; both_splits "$n" 8 "$s" "$work/$n-seed$s" ;;
    scifact:*)  # scifact:<regime>:<epsilon>[:<seed>]: the regime on SciFact's log (807 units), every unit in each of
      # 12 steps per SQuAD epoch, evaluated on SciFact test (WORK/scifact/<regime>-eps<e>[-seed<s>])
      IFS=: read -r n e s <<<"${step#scifact:}"; s=${s:-0}
      out=$work/scifact/$n-eps$e; [ "$s" = 0 ] || out=$out-seed$s
      D=$S ev minilm-l6 test "$work/scifact/zero-shot-test"
      dp_train "$out" "$n" "$S" "$s" --batch-size 807 --epochs "$(scifact_steps "$n")" --epsilon "$e"
      D=$S ev "$out" test "$out-test"; echo "SciFact $n at epsilon $e, seed $s: test $(ndcg "$out-test")" ;;
    heldout:*)  # heldout:<seed>: the chosen regime on SciFact's log less a held-out 20% (public salted hash), then a DP
      # choice of the step on the held-out units (privret retriever select, w in 0.25..1): epsilon 8 for both by
      # parallel composition (docs/privacy.md); evaluated on test, records kept in bench/results/heldout_choice/seed<s>
      # the salt: the kept runs' (their train_config.json), so the same units are held out
      salt=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['hold_out']['salt'])" \
          bench/results/heldout_choice/seed0/fit/train_config.json)
      s=${step#heldout:}; R=top3-b512-c1-e4-nodrop-pn1; hold=(--hold-out 0.2 --hold-out-salt "$salt")
      fit=$work/scifact-heldout/$R-eps8-fit-seed$s; chosen=$work/scifact-heldout/choice-seed$s
      dp_train "$fit" "$R" "$S" "$s" --batch-size 807 --epochs 48 --epsilon 8 --hold-out 0.2 \
          --yaml "hold_out: {salt: \"$salt\"}"
      [ -f "$chosen/privacy_ledger.json" ] || $P retriever select --data "$S" --candidate "$fit" --epsilon 8 \
          --weights 0.25,0.5,0.75,1 "${hold[@]}" --allow-over-budget --out "$chosen"
      D=$S ev "$chosen" test "$chosen-test"
      k=bench/results/heldout_choice/seed$s; keep_records "$fit" "$k/fit"; keep_records "$chosen" "$k/choice"
      keep_evaluations "$chosen" "$k/choice"; echo "held-out choice, run $s: test $(ndcg "$chosen-test")" ;;
    keep:*)  # keep:<run>: the run's records, validation metrics and test per-query figures to
      # bench/results/direct_regimes/<run> (a SciFact run: keep:scifact/<regime>-eps<e>[-seed<s>])
      n=${step#keep:}; k=bench/results/direct_regimes/$n
      keep_records "$work/$n" "$k"; keep_evaluations "$work/$n" "$k" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
