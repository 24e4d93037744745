#!/usr/bin/env bash
# Issue 12: what the public-negatives objective's random public negatives do, without noise (a diagnosis, NOT DP).
#
# The non-private BitFit run of bench/per_unit_objectives.py (807 questions of SQuAD's 28 training articles, own hard
# negatives, every bias, 32 per step, 1 epoch, lr 1e-3) gained +0.046 on validation and +0.030 on test, three times
# what the DP trainer gains on the whole log. This replays that run in the DP trainer with the noise switched off
# (bench/clip_only.py) on the same 807 units (the script's carve, seed 0), so that one setting changes at a time:
#   trainer-32-negatives         the trainer's default 32 random public negatives per step, C = 1000 (never binding)
#   trainer-32-negatives-clip1   the same at C = 1 (the DP default's clip)
#   trainer-1-negative           1 random public negative per step (the least the trainer takes), C = 1000
#   script-seed<S>               the script itself (--also-test), seeds 0 and 1 (seed 1 draws other 807 questions)
# Every run is evaluated on validation (1,095 questions of 4 carved training articles) and test (1,535 questions of
# the 8 test articles; reporting only) in float32, like bench/direct_regimes.sh. About 45 min on 2 CPU threads.
# On SciFact (the second argument `scifact`), the same trainer runs, 32 against 1 negative at C = 1000, on SciFact's
# whole training log (809 claims, 25 steps of 32) evaluated on its test split (reporting only: the rule was fixed on
# SQuAD's validation split; SciFact has no validation split of its own here); about 40 min on 2 CPU threads.
#   usage: bench/public_negatives.sh WORK_DIR [scifact]  (WORK_DIR/squad-val and WORK/squad-full: direct_regimes.sh's data)
#   then:  .venv/bin/python bench/compare_runs.py zero-shot=WORK/zero-shot-test a=WORK/pn/trainer-32-negatives-test ...
set -euo pipefail
work=$1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PRIVRET_BUDGET_DIR=$work/pn/budget  # NOT DP: kept apart from the real registry
P=.venv/bin/privret
source bench/lib.sh
if [ "${2:-squad}" = scifact ]; then
  S=../shared/data/scifact
  evaluate_once minilm-l6 "$S" test "$work/pn/scifact/zero-shot-test" --no-bf16
  for n in 32 1; do
    out=$work/pn/scifact/trainer-$n-negatives
    [ -f "$out/NOT_DP.txt" ] || .venv/bin/python bench/clip_only.py retriever train --dp public-negatives --data "$S" \
        --hard-negatives 2 --max-doc-tokens 256 --physical-batch 16 --trainable bias --batch-size 32 --epochs 1 \
        --clip-norm 1000 --public-negatives $n --lr 1e-3 --epsilon 8 --seed 0 --allow-over-budget --resume --out "$out" \
        --cache-dir "$work/pn/cache"  # the public pool's embeddings for mining, encoded once for both runs
    evaluate_once "$out" "$S" test "$out-test" --no-bf16
  done
  exit 0
fi
log=$work/pn/squad-807  # the 807 questions the script trains on (its carve, seed 0), as a log the trainer reads
[ -f "$log/qrels/train.tsv" ] || .venv/bin/python bench/per_unit_objectives.py --data "$work/squad-full" \
    --write-log "$log" --log-base "$work/squad-val"
ev() {  # $1 model, $2 out prefix: both splits, in float32
  for s in validation test; do evaluate_once "$1" "$work/squad-val" $s "$2-$s" --no-bf16; done
}
trainer() {  # $1 name, $2 clip, $3 public negatives per step
  out=$work/pn/$1
  [ -f "$out/NOT_DP.txt" ] || .venv/bin/python bench/clip_only.py retriever train --dp public-negatives --data "$log" \
      --hard-negatives 2 --max-doc-tokens 256 --physical-batch 16 --trainable bias --batch-size 32 --epochs 1 \
      --clip-norm "$2" --public-negatives "$3" --lr 1e-3 --epsilon 8 --seed 0 --allow-over-budget --resume --out "$out"
  ev "$out" "$out"
}
trainer trainer-32-negatives 1000 32
trainer trainer-32-negatives-clip1 1 32
trainer trainer-1-negative 1000 1
for s in 0 1; do
  out=$work/pn/script-seed$s
  [ -f "$out/result.json" ] || .venv/bin/python bench/per_unit_objectives.py --data "$work/squad-full" --objective own-hard \
      --trainable bias --lr 1e-3 --negatives 2 --also-test --seed $s --out "$out"
  mkdir -p "$out-validation" "$out-test"
  cp "$out/per_query.json" "$out-validation/per_query.json"; cp "$out/per_query_test.json" "$out-test/per_query.json"
done
