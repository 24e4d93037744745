#!/usr/bin/env bash
# Issue 12: a direct-DP regime for a log of ~10^3.5 units, chosen on a validation split, never on test.
#
# The log: SQuAD's 32 training articles less 4 validation articles (privret data squad-beir --validation-articles 4:
# 5,767 questions, 28 articles); validation: the 1,095 questions of the 4 carved articles; test: the 1,535 questions
# of the 8 test articles, all over the 1,703 paragraphs. Every regime is public-negatives with each unit's own hard
# public negatives (docs/direct-dp.md), at epsilon 8; the candidates differ in what they train and how they step:
#   REGIMES[name]="privret retriever train options"
# Steps (each skips what exists, so re-running resumes):
#   data                    the two BEIR directories (WORK/squad-val, WORK/squad-full)
#   zero-shot               the public encoder on validation and test (per-query figures)
#   original                the non-private reference on the same log (the original questions, 1 epoch, documents
#                           cut at 256 tokens, every weight), on validation and test: retention is against it
#   run:<name>              the DP run of a regime on the log, then its validation evaluation
#   nonoise:<name>          the same steps with the noise switched off (bench/clip_only.py: NOT DP, a diagnosis)
#   choose                  the regime with the best validation NDCG@10, averaged over its epsilon-8 runs in WORK
#                           (run: and seed: steps; DP runs only; the public encoder, when none beats it) ->
#                           WORK/choice.txt; only evaluations in zero-shot's number format compete, and runs kept
#                           elsewhere (other machines) do not: the docs pool those by hand
#   test:<name>             a run's test evaluation (for the chosen regime; reporting only for the others)
#   eps:<name>:<epsilon>[:<seed>]
#                           the regime at another epsilon, evaluated on validation and test; seed 0 unless given
#                           (another seed: WORK/<name>-eps<epsilon>-seed<seed>)
#   seed:<name>:<seed>      another run of the regime at epsilon 8, both splits (a private run draws its sampling,
#                           noise, negatives and dropout from os.urandom whatever --seed says: the seed names the run)
#   scifact-nonoise:<name>  the scifact: step's run at epsilon 8 with the noise switched off (bench/clip_only.py: NOT
#                           DP, a diagnosis, reporting only): what the schedule and clip reach on SciFact without noise
#   scifact-subspace:<name>:<eps>[:<seed>]
#                           the scifact: step's run with each noisy update projected onto 64 directions of the
#                           gradients of 512 public units (--public-subspace: post-processing, the same epsilon); the
#                           public units are the domain proxy's log (WORK/scifact-proxy's train split: prompted
#                           claims, epsilon 0; needs proxy-data in the same WORK); rank and units fixed 2026-12-03
#                           before any run (WORK/scifact/<name>-sub64-eps<eps>[-seed<seed>])
#   keep:<name>             copies what the run released and its evaluations to bench/results/direct_regimes/<name>
#                           (a nonoise run's NOT_DP.txt with them),
#                           with the tensors it changed when they fit in 1 MB (BitFit; not a merged LoRA) (rebuild:
#                           bench/iterate_average.py --from-parameters);
#                           a SciFact run is named by its directory under WORK: keep:scifact/<name>-eps<eps>[-seed<s>]
#   scifact:<name>:<eps>[:<seed>]
#                           the regime carried to SciFact's log (807 units) as a rule: its trainable parameters,
#                           clip, learning rate, hard negatives and 12 steps per epoch it takes on SQuAD (12 for
#                           --epochs 1, 48 for --epochs 4), each step taking every unit
#                           (q = 1: a smaller log gets the largest batch); evaluated on SciFact test; seed 0 unless
#                           given (another seed: another run; WORK/scifact/<name>-eps<eps>-seed<seed>)
# The small-log proxy (added 2026-11-28): SciFact's log has 807 units, so at the same epsilon the rule above puts
# sigma / B = 3.43 / 807 of noise on each averaged step against 0.693 / 512 on SQuAD's 5,747 units, 3.1 times as
# much. Whether its schedule still fits is asked on a log of SciFact's size with SQuAD's validation split:
#   small:<name>:<steps>:<lr>[:<seed>]
#                           the regime at epsilon 8 on WORK/squad-val-807 (the `data` step: the same 4 validation
#                           articles, 807 of the other 28 articles' questions, a seeded sample), every unit in each
#                           of <steps> steps at learning rate <lr>; evaluated on validation
#                           (WORK/small/<name>-t<steps>-lr<lr>[-seed<seed>])
#   choose-small            the best of those by validation NDCG@10 (mean over a schedule's runs; the public encoder
#                           when none beats it) -> WORK/small/choice.txt
# Candidates, fixed 2026-11-28 before any ran, each on the shipped rule's regime (top3-b512-c1-e4-nodrop-pn1):
#   48 steps at lr 2e-3     the shipped SciFact rule itself;
#   48 steps at lr 6.4e-4   its learning rate scaled by B / sigma. Under Adam, once the noise dominates a coordinate's
#                           second moment, a step moves the model along the signal by about lr g B / (sigma C) and
#                           moves each coordinate at random by about lr, whatever sigma; in a quadratic model the best
#                           lr then scales as B / sigma. From SQuAD's choice (lr 2e-3 at B / sigma = 512 / 0.693):
#                           2e-3 * (807 / 3.425) / (512 / 0.693) = 6.4e-4;
#   12 steps at lr 1.28e-3  the same scaling at 12 steps (sigma 1.713 at epsilon 8): a quarter of the compute.
# Run 2026-11-28 (thirteenth session), seed 0 each, validation NDCG@10 against the public encoder's 0.7368: 12 steps
# at lr 1.28e-3 0.7613, 48 steps at lr 2e-3 0.7847 (the shipped rule: -0.0235 for the scaled schedule, paired CI
# [-0.0321, -0.0151]), so the scaling argument fails on this proxy and the rule stays; 48 steps at lr 6.4e-4, stopped
# within its first step then, ran 2026-12-02 (twenty-fifth session): 0.7610, -0.0238 [-0.0319, -0.0159] against the
# shipped rule, so choose-small keeps it (docs/benchmarks.md, "A log of SciFact's size")
# SciFact's domain proxy (added 2026-12-02): the SQuAD proxies keep SciFact's log size, not its domain. This one keeps
# the domain and reads no SciFact query (privret data public-proxy, docs/concepts.md):
#   proxy-data              the untrained generator shown our three claims (bench/scifact_public_claims.tsv; epsilon 0)
#                           writes one claim for each of 1,120 public SciFact documents (a seeded sample of the corpus),
#                           cut after its first sentence (--first-sentence: the 135M model runs on past the claim);
#                           807 of those documents are the log (SciFact's number of units), 300 the validation split
#                           (SciFact's number of test queries), over the whole corpus: WORK/scifact-proxy
#   proxy:<name>[:<seed>]   the scifact: step's run at epsilon 8 on the proxy's log, evaluated on its validation split
#                           (WORK/proxy/<name>[-seed<seed>]; the public encoder in WORK/proxy-zero-shot-validation)
#   proxy-original          the non-private reference on the proxy's log (as `original`: 1 epoch, documents cut at
#                           256 tokens, every weight) and the public encoder, on the proxy's validation split: the room
#                           the proxy offers (WORK/proxy-original, WORK/proxy-{zero-shot,original}-validation)
#   choose-proxy            the best of those as choose-small does -> WORK/proxy/choice.txt
#   keep-proxy              the proxy's manifests (the claims' hash and counts, not their text) and the evaluations of
#                           proxy-original, to bench/results/direct_regimes/proxy/ (a DP run: keep:proxy/<name>)
# Candidates, fixed 2026-12-02 before any ran (bench/regimes.sh): the shipped rule's regime (top3-b512-c1-e4-nodrop-pn1),
# every bias (bias-b512-c1-e4-nodrop-pn1), LoRA of rank 4 (lora4-b512-c1-e4-nodrop-pn1), the clip at 3
# (top3-b512-c3-e4-nodrop-pn1); configs/scifact.yaml changes only when one beats the shipped regime on the proxy.
# One thread per job; two jobs fit the 2-core machine side by side. Where CUDA is available the runs use it (privret's
# device auto; PB=128 units per pass fit an H200 easily): a SciFact run of 48 steps took about 2 minutes there.
#   usage: bench/direct_regimes.sh WORK_DIR STEP...
set -euo pipefail
work=$1; shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PRIVRET_BUDGET_DIR=${PRIVRET_BUDGET_DIR:-$work/budget}
P=.venv/bin/privret
source bench/lib.sh
SQUAD=../shared/data/squad/squad-v1.1-dev-40.json
D=$work/squad-val
source bench/regimes.sh
# Evaluations run in float32 (--no-bf16) since 2026-11-27; the ones stored before ran under bf16 autocast on CPUs with
# native bf16 (about 0.001 NDCG@10; docs/benchmarks.md), and an existing per_query.json is never redone
ev() { evaluate_once "$1" "$D" "$2" "$3" --no-bf16; }  # $1 model, $2 split, $3 out dir
dp_train() {  # $1 out dir, $2 regime, $3 data, then options that override the regime's: the DP run, unless done
  local out=$1 n=$2 data=$3; shift 3
  [ -f "$out/privacy_ledger.json" ] || $P retriever train $(dp_base "$data" "$work") ${REGIMES[$n]} "$@" \
      --out "$out"
}
nonoise_train() {  # $1 out dir, $2 regime, $3 data, then overriding options: the regime's steps without noise, unless done
  local out=$1 n=$2 data=$3; shift 3
  [ -f "$out/NOT_DP.txt" ] || .venv/bin/python bench/clip_only.py retriever train $(dp_base "$data" "$work") ${REGIMES[$n]} \
      "$@" --epsilon 8 --out "$out"
}
scifact_steps() {  # $1 regime: the steps it takes on SciFact, 12 per SQuAD epoch (each taking all 807 units)
  local re='--epochs ([0-9]+)'; [[ ${REGIMES[$1]} =~ $re ]]; echo $((12 * BASH_REMATCH[1]))
}
keep_evaluations() {  # $1 run dir, $2 kept dir: the run's evaluations ($1-validation, $1-test) to $2/<split>/
  local split; for split in validation test; do
    [ ! -f "$1-$split/per_query.json" ] || { mkdir -p "$2/$split"; cp "$1-$split"/*.json "$2/$split/"; }
  done
}
both_splits() {  # $1 regime, $2 epsilon, $3 seed, $4 out dir: the DP run (unless done), evaluated on both splits
  dp_train "$4" "$1" "$D" --epsilon "$2" --seed "$3"
  ev "$4" validation "$4-validation"; ev "$4" test "$4-test"
  echo "$1 at epsilon $2, seed $3: validation $(ndcg "$4-validation"), test $(ndcg "$4-test")"
}
for step in "$@"; do
  case $step in
    data)
      [ -d "$D" ] || $P data squad-beir --squad $SQUAD --out "$D" --validation-articles 4
      [ -d "$work/squad-full" ] || $P data squad-beir --squad $SQUAD --out "$work/squad-full"
      [ -d "$work/squad-val-807" ] || $P data squad-beir --squad $SQUAD --out "$work/squad-val-807" \
          --validation-articles 4 --train-queries 807 ;;
    zero-shot)
      ev minilm-l6 validation "$work/zero-shot-validation"; ev minilm-l6 test "$work/zero-shot-test" ;;
    original)
      [ -f "$work/original-28/model.safetensors" ] || $P retriever train --data "$D" --out "$work/original-28" \
          --epochs 1 --max-doc-tokens 256
      ev "$work/original-28" validation "$work/original-28-validation"; ev "$work/original-28" test "$work/original-28-test"
      echo "original: validation $(ndcg "$work/original-28-validation"), test $(ndcg "$work/original-28-test")" ;;
    run:*)
      n=${step#run:}
      dp_train "$work/$n" "$n" "$D" --epsilon 8
      ev "$work/$n" validation "$work/$n-validation"; echo "$n validation: $(ndcg "$work/$n-validation")" ;;
    nonoise:*)
      n=${step#nonoise:}
      nonoise_train "$work/$n-nonoise" "$n" "$D"
      ev "$work/$n-nonoise" validation "$work/$n-nonoise-validation"
      echo "$n without noise (not DP) validation: $(ndcg "$work/$n-nonoise-validation")" ;;
    choose|choose-small|choose-proxy)
      base=$work/zero-shot-validation
      if [ "$step" = choose ]; then runs=$work; names=("${!REGIMES[@]}")
      else runs=$work/small; [ "$step" = choose-small ] || { runs=$work/proxy; base=$work/proxy-zero-shot-validation; }
        names=(); [ -d "$runs" ] || { echo "no runs in $runs" >&2; exit 2; }
        for d in "$runs"/*-validation; do  # one name per schedule; its other seeds are averaged in by name
          [[ $d == *-seed*-validation ]] || names+=("$(basename "${d%-validation}")"); done; fi
      python3 - "$base" "$runs" "${names[@]}" <<'EOF'
import json, sys
from pathlib import Path
base, work = Path(sys.argv[1]), Path(sys.argv[2])  # the public encoder's evaluation; the runs' directory
metrics = lambda d: json.loads((d / "metrics.json").read_text())
fmt = lambda d: metrics(d).get("precision", "unrecorded")  # evaluations before 2026-11-27 recorded none
best, best_score, want, skipped = "zero-shot", metrics(base)["ndcg@10"], fmt(base), []
for name in sys.argv[3:]:
    # a regime's runs at epsilon 8: the run: step's and every seed: step's (a private run draws its own noise, so
    # runs of one regime spread by a few 0.001 and one lucky run must not decide)
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
    print(f"not compared, evaluated in another number format than zero-shot's ({want}): {', '.join(skipped)}; "
          "evaluate them again (the ev step with their per_query.json removed)")
EOF
      ;;
    test:*)
      n=${step#test:}; ev "$work/$n" test "$work/$n-test"; echo "$n test: $(ndcg "$work/$n-test")" ;;
    eps:*)
      IFS=: read -r n e s <<<"${step#eps:}"; s=${s:-0}; out=$work/$n-eps$e; [ "$s" = 0 ] || out=$out-seed$s
      both_splits "$n" "$e" "$s" "$out" ;;
    seed:*)
      IFS=: read -r n s <<<"${step#seed:}"; both_splits "$n" 8 "$s" "$work/$n-seed$s" ;;
    small:*)
      IFS=: read -r n t lr s <<<"${step#small:}"; s=${s:-0}; Q=$work/squad-val-807
      out=$work/small/$n-t$t-lr$lr; [ "$s" = 0 ] || out=$out-seed$s
      dp_train "$out" "$n" "$Q" --batch-size 807 --epochs "$t" --lr "$lr" --epsilon 8 --seed "$s"
      ev "$out" validation "$out-validation"
      echo "small log, $n, $t steps at lr $lr, seed $s: validation $(ndcg "$out-validation")" ;;
    scifact:*)
      IFS=: read -r n e s <<<"${step#scifact:}"; s=${s:-0}; S=../shared/data/scifact
      out=$work/scifact/$n-eps$e; [ "$s" = 0 ] || out=$out-seed$s
      D=$S ev minilm-l6 test "$work/scifact/zero-shot-test"
      dp_train "$out" "$n" "$S" --batch-size 807 --epochs "$(scifact_steps "$n")" --epsilon "$e" --seed "$s"
      D=$S ev "$out" test "$out-test"; echo "SciFact $n at epsilon $e, seed $s: test $(ndcg "$out-test")" ;;
    scifact-subspace:*)  # the scifact: run, its noisy updates projected onto a public subspace (post-processing)
      IFS=: read -r n e s <<<"${step#scifact-subspace:}"; s=${s:-0}; S=../shared/data/scifact
      [ -d "$work/scifact-proxy" ] || { echo "scifact-subspace: run proxy-data in $work first" >&2; exit 2; }
      out=$work/scifact/$n-sub64-eps$e; [ "$s" = 0 ] || out=$out-seed$s
      D=$S ev minilm-l6 test "$work/scifact/zero-shot-test"
      dp_train "$out" "$n" "$S" --batch-size 807 --epochs "$(scifact_steps "$n")" --epsilon "$e" --seed "$s" \
          --public-subspace "$work/scifact-proxy" --subspace-rank 64 --subspace-units 512
      D=$S ev "$out" test "$out-test"; echo "SciFact $n with a public subspace at epsilon $e, seed $s: test $(ndcg "$out-test")" ;;
    proxy-data)  # SciFact's domain, no SciFact query: prompted claims (epsilon 0) for sampled public documents
      S=../shared/data/scifact
      scifact_public_claims $S/corpus.jsonl "$work/public-claims.jsonl"
      [ -d "$work/gen-prompted" ] || $P generator prompt --public-pairs "$work/public-claims.jsonl" --examples 3 \
          --out "$work/gen-prompted"
      [ -f "$work/proxy-claims/manifest.json" ] || $P generate --generator "$work/gen-prompted" --data $S \
          --documents corpus --sample 1120 --sample-seed 1 --num-queries 1 --seed 0 --resume --out "$work/proxy-claims"
      [ -d "$work/scifact-proxy" ] || $P data public-proxy --synthetic "$work/proxy-claims" --corpus $S \
          --train 807 --validation 300 --seed 0 --first-sentence --out "$work/scifact-proxy" ;;
    proxy-original)
      Q=$work/scifact-proxy
      [ -f "$work/proxy-original/model.safetensors" ] || $P retriever train --data "$Q" --out "$work/proxy-original" \
          --epochs 1 --max-doc-tokens 256
      D=$Q ev minilm-l6 validation "$work/proxy-zero-shot-validation"
      D=$Q ev "$work/proxy-original" validation "$work/proxy-original-validation"
      echo "SciFact proxy, validation: zero-shot $(ndcg "$work/proxy-zero-shot-validation"), original" \
           "$(ndcg "$work/proxy-original-validation")" ;;
    proxy:*)
      IFS=: read -r n s <<<"${step#proxy:}"; s=${s:-0}; Q=$work/scifact-proxy
      out=$work/proxy/$n; [ "$s" = 0 ] || out=$out-seed$s
      D=$Q ev minilm-l6 validation "$work/proxy-zero-shot-validation"
      dp_train "$out" "$n" "$Q" --batch-size 807 --epochs "$(scifact_steps "$n")" --epsilon 8 --seed "$s"
      D=$Q ev "$out" validation "$out-validation"
      echo "SciFact proxy, $n, seed $s: validation $(ndcg "$out-validation") (zero-shot $(ndcg "$work/proxy-zero-shot-validation"))" ;;
    keep-proxy)
      k=bench/results/direct_regimes/proxy; mkdir -p "$k"
      cp "$work/proxy-claims/manifest.json" "$k/claims_manifest.json"; cp "$work/scifact-proxy/manifest.json" "$k/"
      for n in zero-shot original; do keep_evaluations "$work/proxy-$n" "$k/$n"; done ;;
    scifact-nonoise:*)  # the shipped SciFact schedule of a regime with the noise switched off: NOT DP, a diagnosis
      n=${step#scifact-nonoise:}; S=../shared/data/scifact; out=$work/scifact/$n-nonoise
      D=$S ev minilm-l6 test "$work/scifact/zero-shot-test"
      nonoise_train "$out" "$n" "$S" --batch-size 807 --epochs "$(scifact_steps "$n")"
      D=$S ev "$out" test "$out-test"; echo "SciFact $n without noise (not DP): test $(ndcg "$out-test")" ;;
    keep:*)  # what survives the machine: ledger, mechanism, settings, per-query evaluations and the trained tensors
      n=${step#keep:}; k=bench/results/direct_regimes/$n; mkdir -p "$k"
      cp "$work/$n"/{privacy_ledger.json,dp_mechanism.json,train_config.json} "$k/"
      # a diagnosis trained with the noise off keeps its marker beside the ledger of the noise it did not add
      [ ! -f "$work/$n/NOT_DP.txt" ] || cp "$work/$n/NOT_DP.txt" "$k/"
      keep_evaluations "$work/$n" "$k"
      .venv/bin/python bench/iterate_average.py --keep-changed --final-model "$work/$n" \
          --save-parameters "$work/$n-parameters.safetensors"
      # BitFit changes about 60 KB of tensors; a merged LoRA changes whole weight matrices (10 MB at rank 4), which
      # the repository does not hold: those stay in the work directory
      if [ "$(stat -c %s "$work/$n-parameters.safetensors")" -le 1000000 ]; then
        cp "$work/$n-parameters.safetensors" "$k/parameters.safetensors"
      else echo "keep:$n: the changed tensors ($work/$n-parameters.safetensors) are over 1 MB and stay in the work directory"; fi ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
