#!/usr/bin/env bash
# Reproduces docs/results.md, "DP synthetic queries", the table at privret's defaults (bench/README.md).
#   usage: bench/synthetic_rows.sh WORK STEP...   e.g. bench/synthetic_rows.sh runs/synthetic prompted dp:8:0
# SciFact; one query for each of 500 public documents (a seeded sample of the corpus, its size fixed without the
# log); the generator's and the decoding's settings are the defaults (prompted start: the three public claims of
# bench/scifact_public_claims.tsv in every prompt; first sentence kept; degenerate outputs dropped).
# 2 CPU cores (OMP_NUM_THREADS=2): prompted about 25 min, dp:<e>:<s> about 1 h 10 min (the DP generator 40 min),
# reseed:<row>:<r> about 10 min. Each step skips what exists, so re-running resumes. Steps:
#   prompted         epsilon 0: the untrained generator shown the three claims; its synthetic set, retriever
#                    (recipe chosen on the set's validation split), test evaluation, similarity to the log
#   dp:<e>:<s>       the generator DP fine-tuned at epsilon <e> with seed <s>, then as prompted (row dp-eps<e>-s<s>)
#   reseed:<row>:<r> <row>'s retriever again with seed <r>, in the recipe its seed-0 selection chose
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
mkdir -p "$work"
P=.venv/bin/privret
source bench/lib.sh
D=../shared/data/scifact
scifact_public_claims $D/corpus.jsonl "$work/public-claims.jsonl"
row() {  # $1 row, $2 generator: synthetic set, retriever, test evaluation (float32), similarity to the log
  [ -f "$work/syn-$1/manifest.json" ] || $P synth generate --model "$2" --data $D --documents corpus --sample 500 \
      --num-queries 1 --seed 0 --out "$work/syn-$1"
  [ -d "$work/ret-$1" ] || $P retriever train --data "$work/syn-$1" --out "$work/ret-$1" --select default
  evaluate_once "$work/ret-$1" $D test "$work/ret-$1-eval" --no-bf16
  [ -f "$work/similarity-$1.json" ] || $P evaluate similarity --synthetic "$work/syn-$1" --data $D --split train \
      --json "$work/similarity-$1.json"
  mauve "$1"
  echo "$1: test NDCG@10 $(ndcg "$work/ret-$1-eval")"
}
mauve() {  # $1 row: MAUVE of its set against all the log's queries, as a pipeline run's summary computes it
  [ -f "$work/mauve-$1.json" ] && return 0
  .venv/bin/python - "$work/syn-$1" "$work/mauve-$1.json.tmp" <<'PY'
import json, sys
from privret.data.beir import load_beir
from privret.evaluate.similarity import SYNTHETIC_SPLIT, MauveSettings, mauve_of_texts
from privret.models.encoder import load_encoder
private = load_beir("../shared/data/scifact", splits=["train"])
synthetic = load_beir(sys.argv[1], splits=[SYNTHETIC_SPLIT])
result = mauve_of_texts([private.queries[q] for q in private.split("train")],
                        [synthetic.queries[q] for q in synthetic.split(SYNTHETIC_SPLIT)], load_encoder("minilm-l6"),
                        featurizer="minilm-l6", settings=MauveSettings(), max_texts=1000, seed=0)
open(sys.argv[2], "w").write(json.dumps(result, indent=2) + "\n")
PY
  mv "$work/mauve-$1.json.tmp" "$work/mauve-$1.json"
}
for step in "$@"; do
  case $step in
    prompted)
      [ -d "$work/gen-prompted" ] || $P generator prompt --public-pairs "$work/public-claims.jsonl" --examples 3 \
          --out "$work/gen-prompted"
      row prompted "$work/gen-prompted" ;;
    dp:*)
      e=${step#dp:}; s=${e#*:}; e=${e%%:*}
      [ -f "$work/gen-dp-eps$e-s$s/privacy_ledger.json" ] || $P generator train-dp --data $D --split train \
          --epsilon "$e" --public-examples "$work/public-claims.jsonl" --seed "$s" --out "$work/gen-dp-eps$e-s$s" \
          --allow-over-budget --resume
      row "dp-eps$e-s$s" "$work/gen-dp-eps$e-s$s" ;;
    reseed:*)
      row=${step#reseed:}; r=${row##*:}; row=${row%:*}
      read -r epochs tokens < <(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['chosen']; \
print(c['epochs'], c['max_doc_tokens'])" "$work/ret-$row/recipe_selection.json")
      [ -d "$work/ret-$row-r$r" ] || $P retriever train --data "$work/syn-$row" --out "$work/ret-$row-r$r" \
          --epochs "$epochs" --max-doc-tokens "$tokens" --seed "$r"
      evaluate_once "$work/ret-$row-r$r" $D test "$work/ret-$row-r$r-eval" --no-bf16
      echo "$row retriever seed $r: test NDCG@10 $(ndcg "$work/ret-$row-r$r-eval")" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
