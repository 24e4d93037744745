"""Training pairs (query -> relevant document) and their grouping into privacy units.

The privacy unit is what differential privacy protects: two datasets are neighbours when
they differ by one whole unit. DP-SGD therefore samples and clips *units*, never rows.

* ``query`` (default): all pairs that share a query id or the same query text form one unit
  (a query with three relevant documents is one unit, not three). Sharing either key merges,
  which can only make units larger, i.e. the guarantee more conservative.
* ``pair``: each (query, document) row is its own unit (weaker: a query with several
  relevant documents is protected only pair by pair).
* ``user``: all pairs of one ``user_id`` form a unit (every row must carry a user id).
"""

from __future__ import annotations

import hashlib
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


@dataclass(frozen=True)
class QueryDocPair:
    query: str
    doc_id: str
    query_id: str | None = None
    user_id: str | None = None


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
    if not pairs:
        raise InputError(f"split '{split}' has no positive judgements", path=dataset.root)
    return TrainingPairs(pairs=pairs, corpus=dataset.corpus)


def inline_doc_id(text: str) -> str:
    """Stable id for a document given inline in a pairs file."""
    return "doc-" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def load_pairs_jsonl(path: str | Path, corpus: dict[str, Document] | None = None) -> TrainingPairs:
    """Read ``{"query", "doc_id"}`` or ``{"query", "doc"}`` lines (optional ``user_id``, ``query_id``).

    ``doc_id`` rows need ``corpus``; inline ``doc`` rows add their document to the corpus and, unless
    ``corpus`` already holds it, to ``inline_doc_ids`` (a document of the private file, not public).
    """
    corpus = dict(corpus or {})
    inline: set[str] = set()
    pairs: list[QueryDocPair] = []
    for line, obj in read_jsonl(path):
        query = require_text(obj, "query", path=path, line=line)
        if "doc_id" in obj:
            doc_id = require_text(obj, "doc_id", path=path, line=line)
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
        pairs.append(QueryDocPair(query=query, doc_id=doc_id, query_id=query_id, user_id=user_id))
    if not pairs:
        raise InputError("no pairs", path=path)
    return TrainingPairs(pairs=pairs, corpus=corpus, inline_doc_ids=frozenset(inline))


def group_units(pairs: list[QueryDocPair], unit: PrivacyUnit) -> list[list[int]]:
    """Row indices of each privacy unit, in order of first appearance."""
    if unit is PrivacyUnit.pair:
        return [[i] for i in range(len(pairs))]
    if unit is PrivacyUnit.user:
        missing = [i for i, p in enumerate(pairs) if p.user_id is None]
        if missing:
            raise InputError(f"privacy unit 'user' needs a user_id on every pair; pair {missing[0] + 1} has none",
                             field="user_id")
        keys = [[("user", p.user_id)] for p in pairs]
    else:
        keys = [[("text", p.query)] + ([("id", p.query_id)] if p.query_id is not None else []) for p in pairs]
    # union-find over rows that share any key
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[tuple[str, str], int] = {}
    for i, row_keys in enumerate(keys):
        for key in row_keys:
            if key in owner:
                parent[find(i)] = find(owner[key])
            else:
                owner[key] = i
    groups: dict[int, list[int]] = {}
    for i in range(len(pairs)):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda rows: rows[0])
