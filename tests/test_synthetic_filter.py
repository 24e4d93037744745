"""Round-trip filter: keeps exactly the pairs whose document the public encoder ranks in the top k."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import TOY_DOCS, write_beir_dir
from privret.data.beir import load_beir, load_corpus
from privret.errors import InputError
from privret.privacy.ledger import LEDGER_FILE, PrivacyLedger
from privret.synth.filter import filter_round_trip
from privret.settings.synthesis import RoundTripFilterConfig


LEDGER = PrivacyLedger(mechanism="dp-sgd", epsilon=4.0, delta=1e-3, noise_multiplier=1.1, sample_rate=0.1, steps=10,
                       planned_steps=10, accountant="prv", unit="query", n_units=50, n_pairs=60, clip_norm=1.0,
                       model="tiny", trainable="lora", data_hash="abc")


@pytest.fixture()
def synthetic_dir(tmp_path):
    corpus = [{"_id": i, "title": t, "text": x} for i, t, x in TOY_DOCS]
    texts = ["aspirin heart risk", "gene memory mice", "What a great summary.", "immune cells virus", "yes",
             "mice memory", "heart attack aspirin"]
    queries = [{"_id": f"syn-{k}", "text": t} for k, t in enumerate(texts)]
    docs = [d["_id"] for d in corpus]
    qrels = {"train": [(f"syn-{k}", docs[k % len(docs)], 1) for k in range(len(texts))]}
    root = write_beir_dir(tmp_path / "synthetic", corpus, queries, qrels)
    LEDGER.save(root)
    return root


def _brute_force_kept(encoder_dir, synthetic_dir, k: int) -> set[str]:
    from privret.retrieval.embedding import encode
    from privret.models.encoder import load_encoder

    model = load_encoder(str(encoder_dir))
    data = load_beir(synthetic_dir, splits=["train"])
    doc_ids = list(data.corpus)
    d = encode(model, [data.corpus[i].full_text for i in doc_ids])
    kept = set()
    for qid, docs in data.split("train").items():
        q = encode(model, [data.queries[qid]])[0]
        top = {doc_ids[i] for i in np.argsort(-(d @ q), kind="stable")[:k]}
        if set(docs) & top:
            kept.add(qid)
    return kept


@pytest.mark.parametrize("k", [1, 3])
def test_filter_keeps_the_round_trip_consistent_pairs(synthetic_dir, tmp_path, tiny_bert_dir, k):
    out = tmp_path / f"filtered-{k}"
    corpus = load_corpus(synthetic_dir / "corpus.jsonl")
    manifest = filter_round_trip(synthetic_dir, corpus, out, RoundTripFilterConfig(encoder=str(tiny_bert_dir), top_k=k))
    filtered = load_beir(out, splits=["train"])
    expected = _brute_force_kept(tiny_bert_dir, synthetic_dir, k)
    assert set(filtered.queries) == expected
    assert manifest["kept"] == len(expected) and manifest["removed"] == 7 - len(expected)
    assert PrivacyLedger.load(out) == PrivacyLedger.load(synthetic_dir)  # post-processing: same guarantee
    assert json.loads((out / "manifest.json").read_text())["ledger"]["epsilon"] == 4.0
    if k == 1:
        assert 0 < len(expected) < 7  # the toy data exercises both outcomes


def test_filter_output_is_the_same_with_and_without_the_cache(synthetic_dir, tiny_bert_dir, tmp_path, monkeypatch):
    from privret.retrieval import embedding

    encoded: list[int] = []
    real_encode = embedding.encode

    def counting_encode(model, texts, **kwargs):
        encoded.append(len(texts))
        return real_encode(model, texts, **kwargs)

    monkeypatch.setattr(embedding, "encode", counting_encode)
    corpus = load_corpus(synthetic_dir / "corpus.jsonl")
    cfg = RoundTripFilterConfig(encoder=str(tiny_bert_dir), top_k=1)
    cache = tmp_path / "cache"
    manifests, files = {}, {}
    for name, cache_dir in [("plain", None), ("miss", cache), ("hit", cache)]:
        encoded.clear()
        manifests[name] = filter_round_trip(synthetic_dir, corpus, tmp_path / name, cfg, cache_dir=cache_dir)
        assert encoded == ([7] if name == "hit" else [len(corpus), 7])  # a hit encodes the 7 queries only
        files[name] = {str(p.relative_to(tmp_path / name)): p.read_bytes()
                       for p in sorted((tmp_path / name).rglob("*")) if p.is_file()}
    assert 0 < manifests["plain"]["kept"] < 7
    assert manifests["plain"] == manifests["miss"] == manifests["hit"]
    assert files["plain"] == files["miss"] == files["hit"] and "qrels/train.tsv" in files["plain"]
    assert len(list(cache.glob("*.npy"))) == 1


def test_filter_refuses_a_privately_trained_encoder(synthetic_dir, tmp_path, tiny_bert_dir):
    """An encoder with a DP ledger is refused before anything is written; one whose ledger says it saw public data
    only (epsilon = 0) is still public, and filters as the same weights without a ledger do."""
    import shutil

    corpus = load_corpus(synthetic_dir / "corpus.jsonl")
    encoder = shutil.copytree(tiny_bert_dir, tmp_path / "trained")
    LEDGER.save(encoder)
    assert (encoder / LEDGER_FILE).is_file()
    with pytest.raises(InputError, match="needs a public model") as err:
        filter_round_trip(synthetic_dir, corpus, tmp_path / "out", RoundTripFilterConfig(encoder=str(encoder)))
    assert err.value.field == "encoder" and not (tmp_path / "out").exists()

    PrivacyLedger.public("public-pairs", model="tiny", public_data_hash="p", unit="query").save(encoder)
    public = filter_round_trip(synthetic_dir, corpus, tmp_path / "public", RoundTripFilterConfig(encoder=str(encoder)))
    plain = filter_round_trip(synthetic_dir, corpus, tmp_path / "plain", RoundTripFilterConfig(encoder=str(tiny_bert_dir)))
    assert public["kept"] == plain["kept"] and (tmp_path / "public" / "qrels" / "train.tsv").read_text() == \
        (tmp_path / "plain" / "qrels" / "train.tsv").read_text()


def test_cli_filter(synthetic_dir, tmp_path, tiny_bert_dir):
    from helpers import run_cli

    out = tmp_path / "filtered"
    args = ["synth", "filter", "--synthetic", str(synthetic_dir), "--data", str(synthetic_dir), "--out", str(out), "--encoder",
            str(tiny_bert_dir), "--top-k", "1"]
    result = run_cli(*args, "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    kept = len(load_beir(out, splits=["train"]).queries)
    assert f"kept {kept} of 7" in result.stdout
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1
    result = run_cli(*args[:-2], "--top-k", "0")
    assert result.returncode == 2 and "--top-k" in result.stderr
