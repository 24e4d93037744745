"""Encoding + exact search over N generated short documents: peak RSS and wall time, streaming against FAISS.
Reproduces docs/results.md, "Speed and scale" (search at 1M documents; bench/results/scale.json).
    python bench/bench_scale.py                       # N = 100k and 1M, streaming + FAISS
    python bench/bench_scale.py --sizes 20000         # a few seconds
2 CPU cores, one thread: about 75 min (1M documents: 15 min streaming, 58 min FAISS, on a loaded machine)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def words():
    from helpers import WORDS

    return sorted(set(WORDS))


def documents(n: int, seed: int = 1):
    """N short documents (6-10 words), generated on the fly: nothing of size N is kept."""
    vocab = words()
    state = seed
    for i in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        length = 6 + (state >> 60) % 5
        text = " ".join(vocab[(state >> (5 * j)) % len(vocab)] for j in range(length))
        yield f"d{i}", text


def queries(n: int = 200) -> dict[str, str]:
    return {f"q{i}": text for i, (_, text) in enumerate(documents(n, seed=7))}


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one(method: str, n: int, chunk: int, model_dir: str) -> dict:
    import torch

    torch.set_num_threads(1)
    from privret.models.encoder import load_encoder

    model = load_encoder(model_dir, max_seq_length=32)
    qs = queries()
    base = rss_mib()
    started = time.perf_counter()
    if method == "stream":
        from privret.retrieval.streaming import stream_search

        run = stream_search(model, documents(n), qs, k=100, chunk=chunk, batch_size=512)
    else:
        from privret.data.beir import Document
        from privret.retrieval.search import search

        corpus = {d: Document(d, "", t) for d, t in documents(n)}
        run = search(model, corpus, qs, k=100, batch_size=512)
    wall = time.perf_counter() - started
    assert len(run) == len(qs) and all(len(v) == 100 for v in run.values())
    return {"method": method, "n_docs": n, "chunk": chunk if method == "stream" else 50_000, "queries": len(qs),
            "k": 100, "wall_s": round(wall, 1), "docs_per_s": round(n / wall), "peak_rss_mib": round(rss_mib()),
            "rss_before_search_mib": round(base), "embedding_dim": model.get_embedding_dimension()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--methods", default="stream,faiss")
    parser.add_argument("--chunk", type=int, default=16_384)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "scale.json")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), int(args.one[2]), args.model)))
        return
    from helpers import write_tiny_bert

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(write_tiny_bert(Path(tmp) / "tiny-bert"))
        for n in (int(s) for s in args.sizes.split(",")):
            for method in args.methods.split(","):
                proc = subprocess.run([sys.executable, __file__, "--one", method, str(n), str(args.chunk),
                                       "--model", model_dir], capture_output=True, text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})
                if proc.returncode != 0:
                    print(proc.stderr[-2000:], file=sys.stderr)
                    raise SystemExit(proc.returncode)
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                print(json.dumps(row), flush=True)
                results.append(row)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": f"{os.cpu_count()} CPUs", "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
