"""Scale: streaming exact search is exact, and its peak memory does not grow with the corpus.

The 1M-document figures come from ``bench/bench_scale.py`` (docs/reliability.md); here N = 100k
with a 256-dimensional encoder, so that keeping all embeddings (what a flat index does) would add
78 MiB between N = 20k and N = 100k, far above the bound the test allows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DIM = 256
# glibc raises its mmap threshold after large frees, so freed per-chunk buffers then stay in the heap
# and RSS creeps up with the number of chunks (fragmentation, not live data); a fixed threshold makes
# RSS track live memory
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}


@pytest.fixture(scope="module")
def wide_encoder(tmp_path_factory, tiny_bert_dir) -> Path:
    """A 1-layer BERT with 256-dimensional embeddings (the tiny tokenizer)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    directory = tmp_path_factory.mktemp("wide-bert")
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=DIM, intermediate_size=DIM, num_hidden_layers=1,
                         num_attention_heads=4, max_position_embeddings=64)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_streaming_search_is_exact(tiny_bert_dir):
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_scale import documents, queries

    from privret.retrieval.embedding import encode
    from privret.retrieval.streaming import stream_search
    from privret.models.encoder import load_encoder

    model = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    docs = list(documents(3000))
    qs = dict(list(queries().items())[:40])
    run = stream_search(model, iter(docs), qs, k=20, chunk=700)  # 5 chunks, the last one short
    d = torch.from_numpy(encode(model, [t for _, t in docs], bf16=False))
    q = torch.from_numpy(encode(model, list(qs.values()), bf16=False))
    top = torch.topk(q @ d.T, 20, dim=1)
    for row, qid in enumerate(qs):
        expected = {docs[i][0]: s for s, i in zip(top.values[row].tolist(), top.indices[row].tolist())}
        got = run[qid]
        assert len(got) == 20
        assert sorted(got.values(), reverse=True) == pytest.approx(sorted(expected.values(), reverse=True), abs=1e-5)
        kth = min(expected.values())
        assert {k for k, s in expected.items() if s > kth + 1e-5} <= set(got)  # same set up to ties at the k-th


def test_a_beir_corpus_streams_line_by_line_and_a_bad_line_is_named(tmp_path):
    """What :func:`stream_search` reads from a BEIR corpus file: each document as the encoders read it (title, then
    body), one line at a time; a line without its text is refused with the file and the line."""
    from privret.errors import InputError
    from privret.retrieval.streaming import iter_corpus_jsonl

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "a", "title": "Kettle", "text": "claims close on the 5th"}\n'
                      '{"_id": "b", "text": "no title here"}\n{"_id": "c", "title": "x"}\n')
    rows = iter_corpus_jsonl(corpus)
    assert next(rows) == ("a", "Kettle. claims close on the 5th")
    assert next(rows) == ("b", "no title here")
    with pytest.raises(InputError) as err:
        next(rows)
    assert err.value.line == 3 and err.value.field == "text" and str(corpus) in err.value.one_line()

def _peak(model_dir: Path, n: int, chunk: int) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--one", "stream", str(n),
                           str(chunk), "--model", str(model_dir)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **FIXED_MMAP})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_peak_memory_is_bounded_by_the_chunk_not_the_corpus(wide_encoder):
    small, large = _peak(wide_encoder, 20_000, 4096), _peak(wide_encoder, 100_000, 4096)
    assert small["embedding_dim"] == DIM and large["n_docs"] == 100_000
    all_embeddings_mib = (100_000 - 20_000) * DIM * 4 / 2 ** 20  # 78 MiB: what an O(N) index would add
    growth = large["peak_rss_mib"] - small["peak_rss_mib"]
    assert growth < all_embeddings_mib / 3, (small, large)
