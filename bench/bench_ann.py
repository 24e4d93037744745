"""FAISS HNSW and IVF against exact search: recall@100 and search time, on SciFact and generated documents.
Reproduces docs/results.md, "Speed and scale" (approximate search; bench/results/ann.json).
    python bench/bench_ann.py --scifact-embeddings CACHE.npy --scale-docs 200000   # SciFact + 200k, all settings
    python bench/bench_ann.py --scale-docs 1000000 --kinds ivf                      # 1M: exact and IVF only
2 CPU cores, one thread: about 10 min at 200k (HNSW build 5 min), about 15 min at 1M with IVF (HNSW adds 20)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

SETTINGS = [  # (label, SearchIndex fields): the defaults first, then the knob each kind is tuned with
    ("exact", {"index": "exact"}),
    ("hnsw (defaults: M 32, efSearch 128)", {"index": "hnsw"}),
    ("hnsw efSearch 256", {"index": "hnsw", "hnsw_ef_search": 256}),
    ("ivf (defaults: nlist 4 sqrt(N), nprobe 32)", {"index": "ivf"}),
    ("ivf nprobe 128", {"index": "ivf", "ivf_nprobe": 128}),
]
K = 100


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def compare(corpus_emb: np.ndarray, query_emb: np.ndarray, repeats: int, kinds: set[str], score=None) -> list[dict]:
    """One row per setting of ``kinds`` (exact always first): build and search seconds, search time /
    exact's, recall@100 vs exact."""
    from privret.retrieval.index import SearchIndex, build_index, overlap_at_k, top_k

    rows, exact, built = [], None, {}
    for label, fields in SETTINGS:
        spec = SearchIndex(**fields)
        if spec.index != "exact" and spec.index not in kinds:
            continue
        structure = json.dumps(spec.model_dump(exclude={"hnsw_ef_search", "ivf_nprobe"}), sort_keys=True)
        if structure not in built:  # a search-time knob alone does not rebuild the index
            built[structure] = timed(lambda: build_index(corpus_emb, spec), 1)
        build_s, index = built[structure]
        if spec.index == "hnsw":
            index.hnsw.efSearch = spec.hnsw_ef_search
        elif spec.index == "ivf":
            index.nprobe = min(spec.ivf_nprobe, index.nlist)
        search_s, (scores, hits) = timed(lambda: top_k(index, query_emb, K), repeats)
        if exact is None:
            exact = (search_s, hits)
        row = {"setting": label, "index": spec.model_dump(), "build_s": round(build_s, 3),
               "search_s": round(search_s, 4), "search_time_ratio": round(search_s / exact[0], 4),
               "recall@100_vs_exact": round(overlap_at_k(exact[1], hits), 4)}
        if spec.index == "ivf":
            row["nlist"] = spec.nlist(len(corpus_emb))
        if score is not None:
            row.update(score(scores, hits))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def scifact(data: Path, embeddings: Path, repeats: int, kinds: set[str]) -> dict:
    from privret.data.beir import load_beir
    from privret.retrieval.embedding import encode
    from privret.retrieval.metrics import per_query_metrics
    from privret.models.encoder import load_encoder

    dataset = load_beir(data, splits=["test"])
    qrels = dataset.split("test")
    doc_ids = list(dataset.corpus)
    corpus_emb = np.load(embeddings, allow_pickle=False)
    if corpus_emb.shape[0] != len(doc_ids):
        raise SystemExit(f"{embeddings}: {corpus_emb.shape[0]} rows for {len(doc_ids)} documents")
    qids = [q for q in qrels if q in dataset.queries]
    query_emb = encode(load_encoder("minilm-l6"), [dataset.queries[q] for q in qids])

    def ndcg(scores, hits):
        run = {q: {doc_ids[h]: float(s) for s, h in zip(scores[i], hits[i]) if h >= 0} for i, q in enumerate(qids)}
        per_query = per_query_metrics(run, qrels)
        return {"ndcg@10": round(float(np.mean([v["ndcg@10"] for v in per_query.values()])), 4)}

    return {"corpus": "SciFact test (BEIR)", "encoder": "all-MiniLM-L6-v2 (zero-shot)", "n_docs": len(doc_ids),
            "dim": int(corpus_emb.shape[1]), "queries": len(qids),
            "rows": compare(corpus_emb, query_emb, repeats, kinds, score=ndcg)}


def scale(n_docs: int, repeats: int, kinds: set[str]) -> dict:
    import torch

    from bench_scale import documents, queries
    from helpers import write_tiny_bert
    from privret.retrieval.embedding import encode
    from privret.models.encoder import load_encoder

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_encoder(str(write_tiny_bert(Path(tmp) / "tiny-bert")), max_seq_length=32)
        started = time.perf_counter()
        corpus_emb = np.empty((n_docs, model.get_embedding_dimension()), dtype=np.float32)
        batch: list[str] = []
        filled = 0
        for _, text in documents(n_docs):
            batch.append(text)
            if len(batch) == 16_384:
                corpus_emb[filled: filled + len(batch)] = encode(model, batch, batch_size=512)
                filled += len(batch)
                batch = []
        if batch:
            corpus_emb[filled: filled + len(batch)] = encode(model, batch, batch_size=512)
        encode_s = time.perf_counter() - started
        qs = queries()
        query_emb = encode(model, list(qs.values()), batch_size=512)
    return {"corpus": "bench_scale.py generated documents", "encoder": "2-layer BERT, hidden 32 (tests/helpers.py)",
            "n_docs": n_docs, "dim": int(corpus_emb.shape[1]), "queries": len(qs), "encode_s": round(encode_s, 1),
            "rows": compare(corpus_emb, query_emb, repeats, kinds)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scifact", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    parser.add_argument("--scifact-embeddings", type=Path, help="cached zero-shot corpus embeddings (.npy)")
    parser.add_argument("--scale-docs", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default="hnsw,ivf", help="approximate indexes to compare with exact search")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "ann.json")
    args = parser.parse_args()
    import faiss
    import torch

    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    result = {"machine": f"{os.cpu_count()} CPUs, 1 thread", "k": K, "faiss": faiss.__version__,
              "recall_definition": "fraction of exact search's top-100 documents also returned, mean over queries",
              "time_definition": "best of --repeats searches of all queries at once; ratio = setting / exact"}
    kinds = set(args.kinds.split(","))
    if args.scifact_embeddings is not None:
        result["scifact"] = scifact(args.scifact, args.scifact_embeddings, args.repeats, kinds)
    if args.scale_docs:
        result["scale"] = scale(args.scale_docs, args.repeats, kinds)
    from privret.io import write_json_atomic

    write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()
