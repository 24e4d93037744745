"""Corpus-embedding cache: a hit skips the encoder and returns the same matrix; any change misses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import TOY_DOCS, run_cli
from privret.data.beir import Document
from privret.retrieval.embedding import corpus_embeddings
from privret.retrieval.embedding_cache import corpus_cache_key
from privret.retrieval.search import search
from privret.models.device import native_bf16
from privret.models.encoder import load_encoder


@pytest.fixture()
def corpus() -> dict[str, Document]:
    return {i: Document(id=i, title=t, text=x) for i, t, x in TOY_DOCS}


@pytest.fixture()
def model(tiny_bert_dir):
    return load_encoder(str(tiny_bert_dir))


def _count_forward(model) -> list[int]:
    calls: list[int] = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def _entries(cache) -> list:
    return sorted(cache.glob("*.npy"))


def test_hit_returns_the_same_matrix_without_encoding(model, corpus, tmp_path):
    cache = tmp_path / "cache"
    calls = _count_forward(model)
    plain = corpus_embeddings(model, corpus, batch_size=4)
    encoded = len(calls)
    assert encoded == 2  # 6 documents in batches of 4
    first = corpus_embeddings(model, corpus, batch_size=4, cache_dir=cache)
    assert len(calls) == 2 * encoded and len(_entries(cache)) == 1
    second = corpus_embeddings(model, corpus, batch_size=4, cache_dir=cache)
    assert len(calls) == 2 * encoded  # a hit: the encoder is not called
    assert second.dtype == np.float32 and second.shape == (len(corpus), model.get_embedding_dimension())
    assert np.array_equal(first, plain) and np.array_equal(second, plain)
    assert _entries(cache) == [cache / f"{corpus_cache_key(model, corpus, bf16=True)}.npy"]
    assert not [p for p in cache.iterdir() if p.suffix != ".npy"]  # no staging left behind
    # rows follow list(corpus) order: the same documents in another order are another entry, rows permuted
    reordered = dict(reversed(corpus.items()))
    assert np.array_equal(corpus_embeddings(model, reordered, batch_size=4, cache_dir=cache), plain[::-1])
    assert len(_entries(cache)) == 2


def test_search_uses_the_cache(model, corpus, tmp_path):
    queries = {"a": "aspirin heart risk", "b": "immune virus"}
    cache = tmp_path / "cache"
    expected = search(model, corpus, queries, k=3)
    assert search(model, corpus, queries, k=3, cache_dir=cache) == expected
    calls = _count_forward(model)
    assert search(model, corpus, queries, k=3, cache_dir=cache) == expected
    assert len(calls) == 1  # only the queries were encoded


def test_a_changed_document_or_weight_misses(model, corpus, tmp_path):
    cache = tmp_path / "cache"
    base = corpus_embeddings(model, corpus, cache_dir=cache)
    calls = _count_forward(model)

    edited = dict(corpus)
    edited["d3"] = Document(id="d3", title="Vitamin", text=corpus["d3"].text + " and sleep")
    changed = corpus_embeddings(model, edited, cache_dir=cache)
    assert len(calls) == 1 and len(_entries(cache)) == 2
    assert not np.array_equal(changed[2], base[2])

    retitled = dict(corpus)
    retitled["d3"] = Document(id="d3", title="Vitamins", text=corpus["d3"].text)  # the title is in full_text
    corpus_embeddings(model, retitled, cache_dir=cache)
    assert len(calls) == 2 and len(_entries(cache)) == 3

    weight = next(w for name, w in model.named_parameters() if name.endswith("embeddings.LayerNorm.bias"))
    with torch.no_grad():  # one weight of the model, as after retraining into the same directory
        weight[0] += 0.5
    retrained = corpus_embeddings(model, corpus, cache_dir=cache)
    assert len(calls) == 3 and len(_entries(cache)) == 4
    assert not np.array_equal(retrained, base)
    model.max_seq_length = 8
    corpus_embeddings(model, corpus, cache_dir=cache)
    assert len(calls) == 4 and len(_entries(cache)) == 5
    corpus_embeddings(model, corpus, cache_dir=cache, bf16=False)  # another entry only where bf16 is native:
    new = int(native_bf16(model.device))                            # elsewhere both are computed in float32
    assert len(calls) == 4 + new and len(_entries(cache)) == 5 + new


def test_the_key_hashes_the_exact_weights(model, corpus):
    key = corpus_cache_key(model, corpus, bf16=True)
    assert key == corpus_cache_key(model, dict(corpus), bf16=True)
    weight = next(model.parameters())
    with torch.no_grad():
        old = weight.view(-1)[0].item()
        weight.view(-1)[0] = float(np.nextafter(np.float32(old), np.float32(np.inf)))  # one ulp
    assert corpus_cache_key(model, corpus, bf16=True) != key
    with torch.no_grad():
        weight.view(-1)[0] = old
    assert corpus_cache_key(model, corpus, bf16=True) == key


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong-shape", "wrong-dtype", "nan", "pickle"])
def test_a_corrupt_entry_is_ignored_and_replaced(model, corpus, tmp_path, damage):
    cache = tmp_path / "cache"
    good = corpus_embeddings(model, corpus, cache_dir=cache)
    [path] = _entries(cache)
    if damage == "garbage":
        path.write_bytes(b"not an npy file")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-50])
    elif damage == "wrong-shape":
        np.save(path, np.zeros((len(corpus) - 1, good.shape[1]), dtype=np.float32))
    elif damage == "wrong-dtype":
        np.save(path, good.astype(np.float64))
    elif damage == "nan":
        bad = good.copy()
        bad[1, 2] = np.nan
        np.save(path, bad)
    else:
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    calls = _count_forward(model)
    again = corpus_embeddings(model, corpus, cache_dir=cache)
    assert calls and np.array_equal(again, good)  # re-encoded, not trusted
    assert _entries(cache) == [path] and np.array_equal(np.load(path), good)  # rewritten
    calls.clear()
    assert np.array_equal(corpus_embeddings(model, corpus, cache_dir=cache), good) and not calls


def test_cli_evaluate_takes_a_cache_dir(toy_beir, tiny_bert_dir, tmp_path):
    cache = tmp_path / "cache"
    args = ["evaluate", "retrieval", "--model", str(tiny_bert_dir), "--data", str(toy_beir), "--cache-dir", str(cache)]
    metrics = []
    for run in range(2):
        result = run_cli(*args, "--json", str(tmp_path / f"m{run}.json"))
        assert result.returncode == 0, result.stderr
        metrics.append(json.loads((tmp_path / f"m{run}.json").read_text()))
        if run == 0:
            [entry] = _entries(cache)
            inode = entry.stat().st_ino
    assert _entries(cache) == [entry] and entry.stat().st_ino == inode  # read on the second run, not rewritten
    assert metrics[0] == metrics[1]
