#!/usr/bin/env bash
# Reproduces docs/results.md, "DP synthetic queries" (SciFact) and the SciFact references and epsilon-0 bars of
# "Direct DP training of the retriever" (bench/README.md).   usage: bench/dp_choice_rows.sh WORK STEP...
#   e.g. bench/dp_choice_rows.sh runs/scifact references prompted:0 public-pairs:0 keep:0 synthetic:0 direct
# 2 CPU cores (OMP_NUM_THREADS=2): references about 30 min, prompted:<s> 13-15 min, public-pairs:<s> 10 min (plus 6
# once), synthetic:<s> about 1 h. Each step skips what exists, so re-running resumes. Steps: the case comments below.
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
mkdir -p "$work"
P=.venv/bin/privret
source bench/lib.sh
D=../shared/data/scifact
# the settings these rows were measured with: DP fine-tuning from the plain pretrained model, whole first lines kept,
# no repetition penalty
printf 'start: pretrained\n' > "$work/generator-measured.yaml"
printf 'first_sentence: false\ndrop_degenerate: false\nrepetition_penalty: 1\n' > "$work/generate-measured.yaml"
ev() { evaluate_once "$1" "$D" test "$2" --no-bf16; }  # $1 model, $2 out dir; float32 as the headline file
choose() {  # $1 candidate, $2 output, $3 weights: the DP choice (epsilon 1), then the candidate and the choice on test
  [ -d "$2" ] || $P retriever select --data $D --split train --candidate "$1" --weights "$3" --epsilon 1 \
                   --out "$2" --allow-over-budget
  ev "$1" "$1-eval"; ev "$2" "$2-eval"
  echo "$1: test $(ndcg "$1-eval"); its DP choice: test $(ndcg "$2-eval")"
}
for step in "$@"; do
  case $step in
    references)  # zero-shot; the original pairs with the recipe chosen on validation (3 epochs, 256 tokens)
      ev minilm-l6 "$work/zero-shot"
      for s in 0 1 2; do
        [ -d "$work/original-s$s" ] || $P retriever train --data $D --out "$work/original-s$s" --epochs 3 \
                                          --max-doc-tokens 256 --seed "$s"
        ev "$work/original-s$s" "$work/original-s$s-eval"
      done ;;
    synthetic:*)  # the shipped generator settings at epsilon 7, one query for each of 565 public documents (the
      # CLI default; configs/scifact.yaml writes two); the retriever's recipe chosen on its validation split
      s=${step#synthetic:}
      [ -f "$work/gen-eps7-s$s/privacy_ledger.json" ] || $P generator train-dp --data $D --split train --epsilon 7 \
          --config "$work/generator-measured.yaml" \
          --seed "$s" --out "$work/gen-eps7-s$s" --allow-over-budget --resume
      [ -f "$work/syn-eps7-s$s/manifest.json" ] || $P synth generate --config "$work/generate-measured.yaml" --model "$work/gen-eps7-s$s" --data $D \
          --documents corpus --sample 565 --num-queries 1 --seed "$s" --out "$work/syn-eps7-s$s"
      [ -d "$work/ret-eps7-s$s" ] || $P retriever train --data "$work/syn-eps7-s$s" --out "$work/ret-eps7-s$s" \
          --select default
      choose "$work/ret-eps7-s$s" "$work/sel-eps7-s$s" 0.5,1 ;;
    retrain:*)  # synthetic:<g> again with retriever seed <r> (the recipe its seed-0 selection chose), then the choice
      g=${step#retrain:}; r=${g#*:}; g=${g%%:*}
      out=$work/ret-eps7-s$g-r$r
      read -r epochs tokens < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['chosen']; \
print(c['epochs'], c['max_doc_tokens'])" "$work/ret-eps7-s$g/recipe_selection.json")
      [ -d "$out" ] || $P retriever train --data "$work/syn-eps7-s$g" --out "$out" --epochs "$epochs" \
          --max-doc-tokens "$tokens" --seed "$r"
      choose "$out" "$work/sel-eps7-s$g-r$r" 0.5,1 ;;
    direct)  # whole log per step (q = 1), 5 steps, BitFit, lr 2e-3, public negatives; fixed before any run
      printf 'physical_batch: 64\n' > "$work/direct-bitfit-eps7.yaml"  # memory only
      [ -f "$work/direct-bitfit-eps7/privacy_ledger.json" ] || $P retriever train-dp --data $D \
          --out "$work/direct-bitfit-eps7" --epsilon 7 --batch-size 807 --epochs 5 --trainable bias --lr 2e-3 \
          --hard-negatives 0 --public-negatives 32 --dropout --config "$work/direct-bitfit-eps7.yaml" \
          --allow-over-budget --resume
      choose "$work/direct-bitfit-eps7" "$work/sel-direct-bitfit-eps7" 0.25,0.5,1 ;;
    ceiling:*)  # synthetic:<s> with the generator fine-tuned WITHOUT DP (epsilon inf): the most this route can
      # give at these settings (565 documents, one query each, the same recipe rule); no privacy claim
      s=${step#ceiling:}
      [ -f "$work/gen-inf-s$s/privacy_ledger.json" ] || $P generator train --non-private --data $D --split train \
          --config "$work/generator-measured.yaml" \
          --seed "$s" --out "$work/gen-inf-s$s"
      [ -f "$work/syn-inf-s$s/manifest.json" ] || $P synth generate --config "$work/generate-measured.yaml" --model "$work/gen-inf-s$s" --data $D \
          --documents corpus --sample 565 --num-queries 1 --seed "$s" --out "$work/syn-inf-s$s"
      [ -d "$work/ret-inf-s$s" ] || $P retriever train --data "$work/syn-inf-s$s" --out "$work/ret-inf-s$s" \
          --select default
      ev "$work/ret-inf-s$s" "$work/ret-inf-s$s-eval" ;;
    prompted:*)  # epsilon 0: the untrained generator shown three claims we wrote for public SciFact documents
      # (bench/scifact_public_claims.tsv; the documents' text is read from the corpus here, never stored), then
      # as synthetic:<s>
      s=${step#prompted:}
      scifact_public_claims $D/corpus.jsonl "$work/public-claims.jsonl"
      [ -d "$work/gen-prompted" ] || $P generator prompt --public-pairs "$work/public-claims.jsonl" --examples 3 \
          --out "$work/gen-prompted"
      [ -f "$work/syn-prompted-s$s/manifest.json" ] || $P synth generate --config "$work/generate-measured.yaml" --model "$work/gen-prompted" --data $D \
          --documents corpus --sample 565 --num-queries 1 --seed "$s" --out "$work/syn-prompted-s$s"
      [ -d "$work/ret-prompted-s$s" ] || $P retriever train --data "$work/syn-prompted-s$s" \
          --out "$work/ret-prompted-s$s" --select default
      ev "$work/ret-prompted-s$s" "$work/ret-prompted-s$s-eval" ;;
    public-pairs:*)  # epsilon 0: the generator fine-tuned WITHOUT DP on public SQuAD pairs (one question for each of
      # 1,000 paragraphs drawn with seed 0 from ../shared/data/squad; no SciFact query), then as synthetic:<s>
      s=${step#public-pairs:}
      [ -f "$work/squad-pairs.jsonl" ] || $P data squad-pairs --squad ../shared/data/squad/squad-v1.1-dev-40.json \
          --paragraphs 1000 --seed 0 --out "$work/squad-pairs.jsonl"
      [ -f "$work/gen-public-pairs/privacy_ledger.json" ] || $P generator train --public-pairs "$work/squad-pairs.jsonl" \
          --out "$work/gen-public-pairs" --resume
      [ -f "$work/syn-public-pairs-s$s/manifest.json" ] || $P synth generate --config "$work/generate-measured.yaml" --model "$work/gen-public-pairs" --data $D \
          --documents corpus --sample 565 --num-queries 1 --seed "$s" --out "$work/syn-public-pairs-s$s"
      [ -d "$work/ret-public-pairs-s$s" ] || $P retriever train --data "$work/syn-public-pairs-s$s" \
          --out "$work/ret-public-pairs-s$s" --select default
      ev "$work/ret-public-pairs-s$s" "$work/ret-public-pairs-s$s-eval" ;;
    reseed:*)  # reseed:<row>:<seed> (row inf-s<g>, prompted-s<s> or public-pairs-s<s>): its retriever with another
      # seed, in the recipe its selection chose
      row=${step#reseed:}; r=${row##*:}; row=${row%:*}
      read -r epochs tokens < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['chosen']; \
print(c['epochs'], c['max_doc_tokens'])" "$work/ret-$row/recipe_selection.json")
      [ -d "$work/ret-$row-r$r" ] || $P retriever train --data "$work/syn-$row" --out "$work/ret-$row-r$r" \
          --epochs "$epochs" --max-doc-tokens "$tokens" --seed "$r"
      ev "$work/ret-$row-r$r" "$work/ret-$row-r$r-eval" ;;
    keep:*)  # keep:<sample seed>: the per-query test figures of zero-shot, the 3 originals and that seed's two
      # epsilon-0 bars, with the bars' recipe choices and ledgers, to bench/results/scifact_references (what exists)
      s=${step#keep:}; k=bench/results/scifact_references
      for e in zero-shot original-s0-eval original-s1-eval original-s2-eval ret-prompted-s$s-eval \
               ret-public-pairs-s$s-eval; do
        [ -f "$work/$e/per_query.json" ] || continue
        mkdir -p "$k/$e"; cp "$work/$e"/{metrics.json,per_query.json} "$k/$e/"
      done
      for row in prompted-s$s public-pairs-s$s; do
        if [ -f "$work/ret-$row-eval/per_query.json" ] && [ -f "$work/ret-$row/recipe_selection.json" ]; then
          cp "$work/ret-$row/recipe_selection.json" "$work/syn-$row/privacy_ledger.json" "$k/ret-$row-eval/"
        fi
      done ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
