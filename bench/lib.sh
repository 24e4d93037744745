# Shell helpers of the bench scripts (sourced, not run; reproduces no table itself).
# Each script sets P, the privret command.

# evaluate_once MODEL DATA SPLIT OUT [privret evaluate retrieval options...]
#   NDCG@10 and friends of MODEL on DATA's SPLIT, into OUT/metrics.json and OUT/per_query.json (the per-query
#   scores bench/seed_rows.py pairs); skipped when OUT/per_query.json exists, so a script that stopped half-way can
#   be run again and redoes only what is missing.
evaluate_once() {
  local model=$1 data=$2 split=$3 out=$4; shift 4
  [ -f "$out/per_query.json" ] && return 0
  mkdir -p "$out"
  "$P" evaluate retrieval --model "$model" --data "$data" --split "$split" --per-query "$out/per_query.json" \
      --json "$out/metrics.json" "$@"
}

# ndcg OUT: the NDCG@10 that evaluate_once wrote to OUT/metrics.json
ndcg() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['ndcg@10'])" "$1/metrics.json"; }

# scifact_public_claims CORPUS OUT: the public pairs file ({query, doc} JSONL) of the prompted SciFact generator, the
#   three claims we wrote (bench/scifact_public_claims.tsv) with their documents' title and text read from CORPUS
#   (SciFact's corpus.jsonl; never stored in the repository); written to a temporary file, then renamed; skipped when
#   OUT exists
scifact_public_claims() {
  [ -f "$2" ] && return 0
  python3 - "$1" bench/scifact_public_claims.tsv > "$2.tmp" <<'EOF'
import json, sys
docs = {d["_id"]: d for d in map(json.loads, open(sys.argv[1]))}
for line in open(sys.argv[2]):
    doc_id, claim = line.rstrip("\n").split("\t")
    print(json.dumps({"query": claim, "doc": docs[doc_id]["title"] + ". " + docs[doc_id]["text"]}))
EOF
  mv "$2.tmp" "$2"
}
