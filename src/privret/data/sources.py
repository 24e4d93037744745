"""Training pairs and corpora from what a caller holds: a BEIR directory, a pairs JSONL file, or data in memory.

In memory, pairs are (query, doc_id) tuples or mappings ``{query, doc_id | doc, user_id?, query_id?}`` (a list, or
a ``datasets.Dataset`` with those columns), and a corpus is a mapping id -> text (or -> ``{title?, text}``) or
mappings ``{_id | id, title?, text}``. Everything is validated as the files are (:func:`~privret.data.pairs.
pairs_from_records`): an error names the record (``pairs[3]``) and its field. Each source also gets the
``data_hash`` its ledger records: the files' sha256, as the command line computes it, or the sha256 of the records
in memory. A document given inline with the pairs is private (``TrainingPairs.inline_doc_ids``) wherever it came from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from privret.data.beir import Document, dataset_hash, load_beir, load_corpus
from privret.data.pairs import TrainingPairs, load_pairs_jsonl, pairs_from_beir, pairs_from_records
from privret.errors import InputError
from privret.io import file_sha256, require_text

PathLike = str | Path


def pairs_from_paths(data: PathLike | None, split: str, pairs_file: PathLike | None) -> tuple[TrainingPairs, str]:
    """(pairs, data_hash) of a BEIR split of ``data``, or of ``pairs_file`` with its ``doc_id``s looked up in
    ``data``'s corpus; the hash is that of the files read (the split's queries and qrels, or the pairs file)."""
    if pairs_file is not None:
        corpus = load_corpus(Path(data) / "corpus.jsonl") if data is not None else None
        return load_pairs_jsonl(pairs_file, corpus), file_sha256(pairs_file)
    if data is None:
        raise InputError("give a BEIR directory (data) or a pairs file", field="data")
    dataset = load_beir(data, splits=[split])
    return pairs_from_beir(dataset, split), dataset_hash(dataset, split)


def training_pairs(pairs, corpus=None, *, split: str = "train") -> tuple[TrainingPairs, str]:
    """(pairs, data_hash) from ``pairs``: a BEIR directory (its ``split``, over its own corpus), a pairs JSONL file
    or records in memory (see the module docstring), whose ``doc_id``s are looked up in ``corpus``."""
    if isinstance(pairs, (str, Path)) and Path(pairs).is_dir():
        if corpus is not None:
            raise InputError("a BEIR directory brings its own corpus; give one or the other", field="corpus")
        return pairs_from_paths(pairs, split, None)
    public = as_corpus(corpus) if corpus is not None else None
    if isinstance(pairs, (str, Path)):
        return load_pairs_jsonl(pairs, public), file_sha256(pairs)
    records = list(_pair_records(pairs))
    found = pairs_from_records(records, public, where="pairs")
    return found, _records_hash(obj for _, _, obj in records)


def as_corpus(corpus) -> dict[str, Document]:
    """A public corpus from a BEIR directory, a ``corpus.jsonl`` file, a mapping id -> text (or -> ``{title?,
    text}``, or -> :class:`~privret.data.beir.Document`) or an iterable of ``{_id | id, title?, text}`` mappings."""
    if isinstance(corpus, (str, Path)):
        path = Path(corpus)
        return load_corpus(path / "corpus.jsonl" if path.is_dir() else path)
    if isinstance(corpus, Mapping) and all(isinstance(doc, Document) for doc in corpus.values()):
        return dict(corpus)  # already documents (a BEIR corpus as privret reads it)
    if isinstance(corpus, Mapping):
        rows = ({"_id": doc_id, **(value if isinstance(value, Mapping) else {"text": value})}
                for doc_id, value in corpus.items())
    else:
        rows = ({**row, "_id": row["id"]} if isinstance(row, Mapping) and "_id" not in row and "id" in row else row
                for row in _iterable(corpus, "corpus"))
    documents: dict[str, Document] = {}
    for k, row in enumerate(rows):
        where = f"corpus[{k}]"
        if not isinstance(row, Mapping):
            raise InputError(f"expected a mapping, got {type(row).__name__}", path=where)
        doc_id = require_text(row, "_id", path=where, line=None)
        if doc_id in documents:
            raise InputError(f"duplicate document id '{doc_id}'", path=where, field="_id")
        title = require_text(row, "title", path=where, line=None, allow_empty=True) if row.get("title") else ""
        documents[doc_id] = Document(doc_id, title, require_text(row, "text", path=where, line=None))
    if not documents:
        raise InputError("is empty", field="corpus")
    return documents


def _pair_records(pairs) -> Iterator[tuple[str, None, dict]]:
    """``(pairs[k], None, mapping)`` for every pair; a (query, doc_id) tuple becomes ``{query, doc_id}``."""
    for k, row in enumerate(_iterable(pairs, "pairs")):
        if isinstance(row, tuple) and len(row) == 2:
            row = {"query": row[0], "doc_id": row[1]}
        if isinstance(row, Mapping):  # a Dataset's row holds None where its column has no value
            row = {key: value for key, value in row.items() if value is not None}
        yield f"pairs[{k}]", None, row


def _iterable(value, field: str) -> Iterable:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InputError(f"expected a path or an iterable of records, got {type(value).__name__}", field=field)
    return value


def _records_hash(records: Iterable[dict]) -> str:
    """sha256 of the records as JSON lines (keys sorted): the in-memory counterpart of a pairs file's hash."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(record, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8") + b"\n")
    return digest.hexdigest()


def as_queries(queries) -> dict[str, str]:
    """Queries from a mapping id -> text."""
    if not isinstance(queries, Mapping) or not queries:
        raise InputError("expected a non-empty mapping of query id -> text", field="queries")
    return {str(query_id): require_text(queries, query_id, path="queries", line=None) for query_id in queries}


def as_qrels(qrels, queries: dict[str, str], corpus: dict[str, Document]) -> dict[str, dict[str, int]]:
    """Judgements from a mapping query id -> {doc id: relevance} or (query id, doc id[, relevance]) tuples, every id
    known to ``queries`` and ``corpus``."""
    if isinstance(qrels, Mapping):
        rows = [(query_id, doc_id, score) for query_id, judged in qrels.items() for doc_id, score in judged.items()]
    else:
        rows = [tuple(row) if len(row) == 3 else (*row, 1) for row in _iterable(qrels, "qrels")]
    judged: dict[str, dict[str, int]] = {}
    for k, (query_id, doc_id, score) in enumerate(rows):
        if query_id not in queries:
            raise InputError(f"unknown query id '{query_id}'", path=f"qrels[{k}]", field="query_id")
        if doc_id not in corpus:
            raise InputError(f"unknown document id '{doc_id}'", path=f"qrels[{k}]", field="doc_id")
        if isinstance(score, bool) or not isinstance(score, int):
            raise InputError(f"relevance {score!r} is not an integer", path=f"qrels[{k}]", field="score")
        judged.setdefault(query_id, {})[doc_id] = score
    if not any(score > 0 for docs in judged.values() for score in docs.values()):
        raise InputError("no positive judgement", field="qrels")
    return judged
