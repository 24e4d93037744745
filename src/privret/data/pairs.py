"""Training pairs (query -> relevant document) and their grouping into privacy units.

The privacy unit is what differential privacy protects: two datasets are neighbours when
they differ by one whole unit. DP-SGD therefore samples and clips *units*, never rows.

* ``query`` (default): all pairs with the same query text (the exact string) form one unit: a
  query with three relevant documents is one unit, not three, and a text logged under two query
  ids is one unit too. Query ids play no part. Neighbouring logs differ by every row of one
  distinct query text, so removing only one of two ids that share a text is *not* a neighbour
  step (it would change the merged unit's clipped term by up to 2C, a substitution); the unit
  is the text, and the ledger says so (:data:`UNIT_DEFINITIONS`).
* ``pair``: each (query, document) row is its own unit (weaker: a query with several
  relevant documents is protected only pair by pair).
* ``user``: all pairs of one ``user_id`` form a unit (every row must carry a user id).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from privret.data.beir import BeirDataset, Document
from privret.errors import InputError
from privret.io import read_jsonl, require_text


class PrivacyUnit(str, Enum):
    query = "query"
    pair = "pair"
    user = "user"


UNIT_DEFINITIONS = {
    PrivacyUnit.query: "all pairs with one distinct query text (exact string; query ids are not used)",
    PrivacyUnit.pair: "one (query, document) row",
    PrivacyUnit.user: "all pairs with one user_id",
}


@dataclass(frozen=True)
class QueryDocPair:
    query: str
    doc_id: str
    query_id: str | None = None
    user_id: str | None = None
    # where the pair was read (a pairs file and its line, or a record of a caller's list; None for a BEIR split),
    # for errors about it only: not part of the pair (equality, the dataset's id and the units ignore it)
    source: tuple[str, int | None] | None = field(default=None, compare=False)


@dataclass
class TrainingPairs:
    """Private training pairs over a public corpus.

    ``inline_doc_ids``: the documents of ``corpus`` that came with the private pairs themselves (given
    inline in a pairs file, or inserted canaries) rather than from a public corpus. They are private:
    never public negatives.
    """

    pairs: list[QueryDocPair]
    corpus: dict[str, Document]
    inline_doc_ids: frozenset[str] = field(default_factory=frozenset)

    def units(self, unit: PrivacyUnit | str) -> list[list[int]]:
        return group_units(self.pairs, PrivacyUnit(unit))


def pairs_from_beir(dataset: BeirDataset, split: str) -> TrainingPairs:
    """Every judged (query, document) with a positive score in ``split`` becomes a pair."""
    pairs = [QueryDocPair(query=dataset.queries[q], doc_id=d, query_id=q)
             for q, docs in dataset.split(split).items() for d, score in docs.items() if score > 0]
    return TrainingPairs(pairs=pairs, corpus=dataset.corpus)  # split() refuses a split without a positive one


def inline_doc_id(text: str) -> str:
    """Stable id for a document given inline in a pairs file."""
    return "doc-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def load_pairs_jsonl(path: str | Path, corpus: dict[str, Document] | None = None) -> TrainingPairs:
    """Read ``{"query", "doc_id"}`` or ``{"query", "doc"}`` lines (optional ``user_id``, ``query_id``) with
    :func:`pairs_from_records`; an error names the file and line."""
    return pairs_from_records(((str(path), line, obj) for line, obj in read_jsonl(path)), corpus, where=path)


def pairs_from_records(records: Iterable[tuple[str, int | None, dict]], corpus: dict[str, Document] | None = None,
                       *, where: str | Path = "pairs") -> TrainingPairs:
    """Pairs from ``(location, line, {"query", "doc_id" | "doc", "user_id"?, "query_id"?})`` records.

    ``doc_id`` rows need ``corpus``; inline ``doc`` rows add their document to the corpus and, unless
    ``corpus`` already holds it, to ``inline_doc_ids`` (a document of the private pairs, not public).
    An error names the record's location and line, and the field.
    """
    have_corpus, corpus = corpus is not None, dict(corpus or {})
    inline: set[str] = set()
    pairs: list[QueryDocPair] = []
    for path, line, obj in records:
        if not isinstance(obj, dict):
            raise InputError(f"expected a mapping, got {type(obj).__name__}", path=path, line=line)
        query = require_text(obj, "query", path=path, line=line)
        if "doc_id" in obj:
            doc_id = require_text(obj, "doc_id", path=path, line=line)
            if not have_corpus:
                raise InputError(f"names document '{doc_id}' by id, and no corpus was given to look it up in (the "
                                 "BEIR dataset whose documents the file names)", path=path, line=line, field="doc_id")
            if doc_id not in corpus:
                raise InputError(f"unknown document id '{doc_id}'", path=path, line=line, field="doc_id")
        elif "doc" in obj:
            text = require_text(obj, "doc", path=path, line=line)
            doc_id = inline_doc_id(text)
            if doc_id not in corpus:
                corpus[doc_id] = Document(doc_id, "", text)
                inline.add(doc_id)
        else:
            raise InputError("missing (need 'doc_id' or 'doc')", path=path, line=line, field="doc_id")
        user_id = require_text(obj, "user_id", path=path, line=line) if "user_id" in obj else None
        query_id = require_text(obj, "query_id", path=path, line=line) if "query_id" in obj else None
        pairs.append(QueryDocPair(query=query, doc_id=doc_id, query_id=query_id, user_id=user_id,
                                  source=(path, line)))
    if not pairs:
        raise InputError("no pairs", path=where)
    return TrainingPairs(pairs=pairs, corpus=corpus, inline_doc_ids=frozenset(inline))


def group_units(pairs: list[QueryDocPair], unit: PrivacyUnit) -> list[list[int]]:
    """Row indices of each privacy unit, in order of first appearance (see :data:`UNIT_DEFINITIONS`)."""
    if unit is PrivacyUnit.pair:
        return [[i] for i in range(len(pairs))]
    if unit is PrivacyUnit.user:
        missing = next((p for p in pairs if p.user_id is None), None)
        if missing is not None:
            if missing.source is not None:
                raise InputError("missing: privacy unit 'user' needs a user_id on every pair", path=missing.source[0],
                                 line=missing.source[1], field="user_id")
            raise InputError("privacy unit 'user' needs a user_id on every pair, and these pairs carry none (a BEIR "
                             "split has no user ids: give a pairs file with user_id)", field="user_id")
        keys = [p.user_id for p in pairs]
    else:
        keys = [p.query for p in pairs]
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return list(groups.values())  # dicts keep insertion order: by first appearance


def examples_from_pairs(path: str | Path, k: int) -> list[tuple[str, str]]:
    """The first ``k`` (document, query) pairs of a public pairs JSONL (``{query, doc}`` lines)."""
    pairs = load_pairs_jsonl(path)
    return [(pairs.corpus[p.doc_id].full_text, p.query) for p in pairs.pairs[:k]]
