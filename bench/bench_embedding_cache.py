"""Corpus embeddings with the cache: encoding them (a miss) against reading them back (a hit).

    OMP_NUM_THREADS=1 python bench/bench_embedding_cache.py --data ../shared/data/scifact --docs 1000

The first ``--docs`` documents of the dataset's corpus, the public encoder ``--encoder``, one torch
thread; the cache lives in a temporary directory removed afterwards. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="BEIR dataset (its corpus.jsonl is encoded)")
    parser.add_argument("--docs", type=int, default=1000, help="the first N documents")
    parser.add_argument("--encoder", default="minilm-l6")
    args = parser.parse_args()

    import torch

    from privret.data.beir import load_corpus
    from privret.retrieval.embedding import corpus_embeddings
    from privret.models.encoder import load_encoder

    torch.set_num_threads(1)
    corpus = dict(itertools.islice(load_corpus(args.data / "corpus.jsonl").items(), args.docs))
    model = load_encoder(args.encoder)
    result = {"encoder": args.encoder, "documents": len(corpus), "threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as cache:
        for name in ("miss_seconds", "hit_seconds"):
            started = time.perf_counter()
            corpus_embeddings(model, corpus, cache_dir=cache)
            result[name] = round(time.perf_counter() - started, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
