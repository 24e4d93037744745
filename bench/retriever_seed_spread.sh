#!/bin/bash
# Seed spread of retriever training on a pipeline run's synthetic sets (docs/benchmarks.md).
# usage: bench/retriever_seed_spread.sh RUN_DIR ROW [ROW...]     e.g. runs/scifact eps-8 eps-8-filtered
# Trains with configs/scifact.yaml's retriever settings (edit below for another config), seeds 1 and 2 (seed 0 is the pipeline's own row)
# into RUN_DIR/seeds/<row>-seed<S>/ and writes <that>.json with the test metrics; finished seeds are skipped.
set -euo pipefail
run_dir=$1; shift
data=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['dataset'])" "$run_dir/config.json")
mkdir -p "$run_dir/seeds"
for row in "$@"; do
  for seed in 1 2; do
    out=$run_dir/seeds/$row-seed$seed
    [ -f "$out.json" ] && continue
    rm -rf "$out"
    .venv/bin/privret retriever train --data "$run_dir/$row/synthetic" --out "$out" \
        --epochs 1 --batch-size 32 --lr 2e-5 --temperature 0.05 --seed "$seed"
    .venv/bin/privret evaluate --model "$out" --data "$data" --split test --json "$out.json"
  done
done
