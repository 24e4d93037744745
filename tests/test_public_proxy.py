"""privret data public-proxy: an epsilon-0 synthetic set becomes a proxy log (train) and a validation split, split
by document over the whole public corpus; a set made with private data, or with no ledger, is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_cli
from privret.data.beir import BeirDataset, Document, load_beir, write_beir
from privret.data.seeded import seeded_order
from privret.synth.public_proxy import build_public_proxy
from privret.errors import InputError
from privret.privacy.ledger import PrivacyLedger

N_DOCS = 12


def _corpus(tmp_path: Path) -> Path:
    corpus = {f"d{i}": Document(f"d{i}", f"Title {i}", f"Abstract {i}.") for i in range(N_DOCS)}
    write_beir(tmp_path / "corpus", BeirDataset(corpus=corpus, queries={}, qrels={}))
    return tmp_path / "corpus"


def _synthetic(tmp_path: Path, docs: range, *, ledger: PrivacyLedger | None, per_doc: int = 2) -> Path:
    """A synthetic set as privret generate writes it: per_doc queries syn-<doc>-<k> for each document."""
    corpus = {f"d{i}": Document(f"d{i}", f"Title {i}", f"Abstract {i}.") for i in docs}
    queries = {f"syn-d{i}-{k}": f"claim {k} about {i}" for i in docs for k in range(per_doc)}
    qrels = {"train": {q: {q.rsplit("-", 1)[0][4:]: 1} for q in queries}}
    out = tmp_path / "synthetic"
    write_beir(out, BeirDataset(corpus=corpus, queries=queries, qrels=qrels))
    if ledger is not None:
        ledger.save(out)
    return out


def _public() -> PrivacyLedger:
    return PrivacyLedger.public("public-prompted", model="tiny", public_data_hash="h", unit="query")


def _private() -> PrivacyLedger:
    return PrivacyLedger(mechanism="dp-sgd", epsilon=8.0, delta=1e-5, noise_multiplier=0.6, sample_rate=0.01,
                         steps=10, planned_steps=10, accountant="prv", unit="query", n_units=100, n_pairs=100,
                         clip_norm=1.0, model="tiny", trainable="full", data_hash="x")


def test_split_by_document_over_the_whole_corpus(tmp_path):
    synthetic = _synthetic(tmp_path, range(1, 11), ledger=_public())
    manifest = build_public_proxy(synthetic, _corpus(tmp_path), tmp_path / "proxy", train_documents=6,
                                  validation_documents=3, seed=5)
    proxy = load_beir(tmp_path / "proxy")
    assert set(proxy.corpus) == {f"d{i}" for i in range(N_DOCS)}  # the whole corpus, not only the synthetic docs
    docs = {split: {d for rel in proxy.qrels[split].values() for d in rel} for split in ("train", "validation")}
    order = seeded_order([f"d{i}" for i in range(1, 11)], 5)
    assert docs == {"train": set(order[:6]), "validation": set(order[6:9])}
    for split in ("train", "validation"):  # every query of a document, in that document's split, text unchanged
        assert set(proxy.qrels[split]) == {f"syn-{d}-{k}" for d in docs[split] for k in range(2)}
        assert all(rel == {q.rsplit("-", 1)[0][4:]: 1} for q, rel in proxy.qrels[split].items())
    written = load_beir(synthetic).queries
    assert proxy.queries == {q: written[q] for qrels in proxy.qrels.values() for q in qrels}
    assert manifest["documents_left_out"] == 1
    assert manifest["splits"] == {"train": {"documents": 6, "queries": 12}, "validation": {"documents": 3, "queries": 6}}
    assert PrivacyLedger.load(tmp_path / "proxy").is_public  # the synthetic set's ledger comes along
    build_public_proxy(synthetic, _corpus(tmp_path), tmp_path / "again", train_documents=6, validation_documents=3,
                       seed=6)
    assert load_beir(tmp_path / "again").qrels["train"] != proxy.qrels["train"]  # the seed moves the split


@pytest.mark.parametrize("ledger", [_private(), None], ids=["private", "no-ledger"])
def test_a_set_with_private_data_or_unknown_provenance_is_refused(tmp_path, ledger):
    synthetic = _synthetic(tmp_path, range(4), ledger=ledger)
    with pytest.raises(InputError, match="without private data") as err:
        build_public_proxy(synthetic, _corpus(tmp_path), tmp_path / "proxy", train_documents=2,
                           validation_documents=1)
    assert err.value.field == "synthetic"
    assert not (tmp_path / "proxy").exists()


def test_too_few_documents_and_foreign_documents_are_refused(tmp_path):
    synthetic = _synthetic(tmp_path, range(4), ledger=_public())
    with pytest.raises(InputError, match="need 5"):
        build_public_proxy(synthetic, _corpus(tmp_path), tmp_path / "proxy", train_documents=4,
                           validation_documents=1)
    small_corpus = tmp_path / "small"
    write_beir(small_corpus, BeirDataset(corpus={"d0": Document("d0", "", "x")}, queries={}, qrels={}))
    with pytest.raises(InputError, match="not in the public corpus"):
        build_public_proxy(synthetic, small_corpus, tmp_path / "proxy", train_documents=2, validation_documents=1)
    assert not (tmp_path / "proxy").exists()


def test_cli_writes_the_proxy_and_reports_bad_input_in_one_line(tmp_path):
    synthetic = _synthetic(tmp_path, range(1, 11), ledger=_public(), per_doc=1)
    args = ["data", "public-proxy", "--synthetic", str(synthetic), "--corpus", str(_corpus(tmp_path) / "corpus.jsonl"),
            "--train", "7", "--validation", "3", "--out", str(tmp_path / "proxy")]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert "train: 7 documents, 7 queries, validation: 3 documents, 3 queries" in " ".join(done.stdout.split())
    manifest = json.loads((tmp_path / "proxy" / "manifest.json").read_text())
    assert manifest["splits"]["validation"]["queries"] == 3
    again = run_cli(*args)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    assert f"{tmp_path / 'proxy'}: already exists" in again.stderr
    other = run_cli(*args[:-1], str(tmp_path / "other"))  # another output: written
    assert other.returncode == 0
    zero = run_cli(*[("0" if a == "7" else a) for a in args[:-1]], str(tmp_path / "zero"))
    assert zero.returncode == 2 and "--train" in zero.stderr and not (tmp_path / "zero").exists()
