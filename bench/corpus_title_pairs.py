"""Public (title -> body) pairs from a BEIR corpus: in-domain training pairs that read no private query (issue 12).

Every document of ``corpus.jsonl`` with a non-empty title and body gives one pair ``{"query": title, "doc": body}``
(the body alone: the title is not left inside its own document). The corpus is public by assumption
(docs/privacy.md), so a retriever trained on these pairs alone is an epsilon = 0 row, and a public start for DP
training. ``privret retriever train --pairs`` reads the file (non-private; its ledger then says epsilon = inf, which
is about the pairs file, not the private log: the measurement in docs/benchmarks.md, "The corpus's own titles",
says how it was treated).

    .venv/bin/python bench/corpus_title_pairs.py ../shared/data/scifact/corpus.jsonl runs/s33/titles/pairs.jsonl
"""
import argparse
import sys

from privret.data.beir import load_corpus
from privret.errors import InputError
from privret.io import atomic_path, write_jsonl

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("corpus", help="a BEIR corpus.jsonl (public documents)")
ap.add_argument("out", help="the pairs JSONL to write")
a = ap.parse_args()
try:
    corpus = load_corpus(a.corpus)
except InputError as e:  # the file, line and field, one line
    sys.exit(f"error: {e}")
pairs = [{"query": d.title.strip(), "doc": d.text.strip()} for d in corpus.values() if d.title.strip() and d.text.strip()]
with atomic_path(a.out) as staged:
    write_jsonl(staged, pairs)
print(f"{len(pairs)} pairs of {len(corpus)} documents written to {a.out}")
