#!/usr/bin/env bash
# Reproduces docs/results.md, "Repetition penalty": query-ness of the prompted epsilon-0 generator's outputs on
# public documents only (the demo's help-desk corpus with its three public pairs; SciFact's corpus with the three
# claims of bench/scifact_public_claims.tsv), 100 documents, one query each, at each repetition penalty.
#   usage: bench/repetition_penalty.sh WORK        about 1-2 min a set on one thread, 14 sets
# One JSON line per set on stdout: corpus, penalty, seed (documents' sample seed = sampling seed), query-ness.
# Reads each corpus.jsonl only: no query and no qrels of either dataset.
set -euo pipefail
work=$1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
P=.venv/bin/privret
source bench/lib.sh
mkdir -p "$work"
scifact_public_claims ../shared/data/scifact/corpus.jsonl "$work/scifact-claims.jsonl"
[ -f "$work/demo-pairs.jsonl" ] || .venv/bin/python -c "
import json
from privret.cli.demo import DEMO_PUBLIC_EXAMPLES
for doc, query in DEMO_PUBLIC_EXAMPLES:
    print(json.dumps({'query': query, 'doc': doc}))" > "$work/demo-pairs.jsonl"
for corpus in demo scifact; do
  pairs=$work/demo-pairs.jsonl; data=src/privret/data/demo_dataset
  [ $corpus = scifact ] && pairs=$work/scifact-claims.jsonl && data=../shared/data/scifact
  [ -d "$work/gen-$corpus" ] || $P generator prompt --public-pairs "$pairs" --examples 3 --out "$work/gen-$corpus" >&2
  for run in 1.0:0 1.1:0 1.2:0 1.3:0 1.5:0 1.0:1 1.2:1; do
    penalty=${run%:*}; seed=${run#*:}; out=$work/syn-$corpus-$penalty-s$seed
    printf 'repetition_penalty: %s\n' "$penalty" > "$work/penalty-$penalty.yaml"
    [ -f "$out/manifest.json" ] || $P synth generate --model "$work/gen-$corpus" --data $data --documents corpus \
        --sample 100 --sample-seed "$seed" --seed "$seed" --num-queries 1 --config "$work/penalty-$penalty.yaml" \
        --out "$out" >&2
    .venv/bin/python -c "
import json, sys
from privret.synth.queryness import synthetic_queryness
print(json.dumps({'corpus': sys.argv[1], 'penalty': float(sys.argv[2]), 'seed': int(sys.argv[3]),
                  **synthetic_queryness(sys.argv[4]).as_dict()}))" $corpus "$penalty" "$seed" "$out"
  done
done
