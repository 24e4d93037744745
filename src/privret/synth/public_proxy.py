"""A public proxy log in a private log's domain: queries written without private data for public documents.

A DP regime has to be chosen without looking at the private log, or the choice leaks it; a proxy from another
dataset keeps the log's size but not its domain. This one keeps the domain: an epsilon-0 synthetic set (from a
generator that read no private data, e.g. ``privret generator prompt``) for a seeded sample of the public corpus
becomes a BEIR dataset whose ``train`` split plays the log and whose ``validation`` split compares regimes.

* **Public only.** The synthetic set must carry an epsilon = 0 ledger
  (:attr:`~privret.privacy.ledger.PrivacyLedger.is_public`), else it is refused: a choice on the proxy spends no
  budget. The ledger is copied into the proxy.
* **Corpus.** The whole public corpus (``corpus_dir``), which must hold every synthetic document.
* **Split by document**, in ``sha256("<seed>:<doc id>")`` order: the first ``train_documents`` give ``train``, the
  next ``validation_documents`` give ``validation``, the rest are left out and counted.

Written atomically with a ``manifest.json``; see docs/concepts.md, section "Private logs to experiment on".
"""

from __future__ import annotations

from pathlib import Path

from privret.data.beir import BeirDataset, load_beir, load_corpus, write_beir
from privret.data.seeded import seeded_order
from privret.errors import InputError
from privret.io import atomic_path, file_sha256
from privret.privacy.ledger import PrivacyLedger, has_ledger

FORMAT_VERSION = 1


def build_public_proxy(synthetic_dir: str | Path, corpus_dir: str | Path, out_dir: str | Path, *,
                       train_documents: int, validation_documents: int, seed: int = 0) -> dict:
    """Write the proxy dataset ``out_dir`` (atomic) from an epsilon-0 synthetic set; returns its manifest."""
    synthetic_dir, corpus_dir, out_dir = Path(synthetic_dir), Path(corpus_dir), Path(out_dir)
    if out_dir.exists():
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    for name, value in (("train_documents", train_documents), ("validation_documents", validation_documents)):
        if value < 1:
            raise InputError(f"must be at least 1 (got {value})", field=name)
    if not has_ledger(synthetic_dir) or not PrivacyLedger.load(synthetic_dir).is_public:
        raise InputError("a public proxy log needs a synthetic set written without private data (an epsilon-0 "
                         "privacy ledger, e.g. from a prompted generator); this one has none or another one",
                         path=synthetic_dir, field="synthetic")
    synthetic = load_beir(synthetic_dir, ["train"])
    corpus_file = corpus_dir / "corpus.jsonl" if corpus_dir.is_dir() else corpus_dir
    corpus = load_corpus(corpus_file)
    missing = sorted(set(synthetic.corpus) - set(corpus))
    if missing:
        raise InputError(f"{len(missing)} synthetic documents are not in the public corpus (first: {missing[0]})",
                         path=synthetic_dir / "corpus.jsonl", field="_id")
    queries_of: dict[str, list[str]] = {}
    for qid, docs in synthetic.split("train").items():
        if len(docs) != 1:
            raise InputError(f"query {qid} has {len(docs)} documents; a synthetic query has exactly one",
                             path=synthetic_dir / "qrels" / "train.tsv", field="query-id")
        queries_of.setdefault(next(iter(docs)), []).append(qid)
    wanted = train_documents + validation_documents
    if len(queries_of) < wanted:
        raise InputError(f"has queries for {len(queries_of)} documents; --train {train_documents} and --validation "
                         f"{validation_documents} need {wanted}", path=synthetic_dir / "qrels" / "train.tsv")
    order = seeded_order(queries_of, seed)
    parts = {"train": order[:train_documents], "validation": order[train_documents:wanted]}
    qrels = {split: {q: {d: 1} for d in docs for q in queries_of[d]} for split, docs in parts.items()}
    queries = {q: synthetic.queries[q] for split in qrels.values() for q in split}
    manifest = {
        "format_version": FORMAT_VERSION,
        "synthetic": str(synthetic_dir), "synthetic_sha256": file_sha256(synthetic_dir / "queries.jsonl",
                                                                         synthetic_dir / "qrels" / "train.tsv"),
        "corpus": str(corpus_file), "corpus_sha256": file_sha256(corpus_file), "seed": seed,
        "rule": "the synthetic set's documents in sha256('<seed>:<doc id>') order: the first train_documents are "
                "train, the next validation_documents validation, the rest left out; the whole corpus is kept",
        "documents": len(corpus), "documents_left_out": len(order) - wanted,
        "splits": {split: {"documents": len(parts[split]), "queries": len(qrels[split])} for split in parts},
    }
    ledger = PrivacyLedger.load(synthetic_dir)
    with atomic_path(out_dir) as staged:  # dataset and ledger appear together
        write_beir(staged, BeirDataset(corpus=corpus, queries=queries, qrels=qrels), manifest=manifest)
        ledger.save(staged)
    return manifest
