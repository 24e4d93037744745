"""Query-ness of a synthetic set: how many outputs read as one short query, how many are degenerate.

An output is *query-like* when it is not degenerate, is one sentence or question (no sentence end followed by
more text) and has at most ``max_words`` whitespace-separated words. It is *degenerate* when it is empty, one
word, a copy of its document's title or first sentence or of a query the generator's prompt shows (after case
and punctuation are dropped), or holds a repeated run: a word n-gram (n <= 8) three times in a row, or a non-digit
1-3 character group five times in a row.
:func:`~privret.models.decoding.first_sentence` is the format step generation applies: the text up to its first
sentence end.

Privacy: every figure reads only the synthetic set (the generator's release) and its public documents, never a
private query, so it is post-processing of that release and carries its ledger.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from privret.data.beir import load_beir
from privret.errors import InputError
from privret.models.decoding import first_sentence

MAX_QUERY_WORDS = 20
_WORD_RUN = re.compile(r"(?:^|\s)((?:\S+\s+){1,8}?)\1{2,}")
_CHARACTER_RUN = re.compile(r"(\D{1,3}?)\1{4,}")
_PUNCTUATION = re.compile(r"[^\w\s]")


def _plain(text: str) -> str:
    return " ".join(_PUNCTUATION.sub(" ", text.casefold()).split())


def degeneracy(text: str, title: str, body: str, shown: Collection[str] = ()) -> str | None:
    """Why ``text``, written for the document (``title``, ``body``) by a generator whose prompt shows the queries
    ``shown`` (public few-shot examples), is degenerate (``empty``, ``one-word``, ``copy-of-document``,
    ``copy-of-example``, ``repeated-run``); None when it is not."""
    words = text.split()
    if not words:
        return "empty"
    if len(words) == 1:
        return "one-word"
    plain = _plain(text)
    if plain in {_plain(title), _plain(first_sentence(body))} - {""}:
        return "copy-of-document"
    if plain in {_plain(query) for query in shown}:
        return "copy-of-example"
    if _WORD_RUN.search(text + " ") or _CHARACTER_RUN.search(text):
        return "repeated-run"
    return None


def is_query_like(text: str, max_words: int = MAX_QUERY_WORDS) -> bool:
    """One sentence or question of at most ``max_words`` words (degeneracy is checked apart)."""
    return first_sentence(text) == text.strip() and 0 < len(text.split()) <= max_words


@dataclass(frozen=True)
class Queryness:
    """Shares of a set's outputs: query-like (and not degenerate) and degenerate, with the count per reason."""

    outputs: int
    query_like: float
    degenerate: float
    reasons: dict[str, int]
    max_words: int = MAX_QUERY_WORDS

    def as_dict(self) -> dict:
        return {"outputs": self.outputs, "query_like": round(self.query_like, 4),
                "degenerate": round(self.degenerate, 4), "reasons": dict(sorted(self.reasons.items())),
                "max_words": self.max_words}

    def text(self) -> str:
        return (f"{self.query_like:.0%} query-like (one sentence, at most {self.max_words} words), "
                f"{self.degenerate:.0%} degenerate, of {self.outputs} outputs")


def measure(outputs: list[tuple[str, str, str]], *, max_words: int = MAX_QUERY_WORDS,
            dropped: Counter | None = None) -> Queryness:
    """Query-ness of ``outputs`` ((text, document title, document body) each); ``dropped``: outputs not in the set
    by degeneracy reason (those generation dropped), counted as outputs and as degenerate."""
    reasons = Counter(dropped or {})
    query_like = 0
    for text, title, body in outputs:
        reason = degeneracy(text, title, body)
        if reason is not None:
            reasons[reason] += 1
        elif is_query_like(text, max_words):
            query_like += 1
    total = len(outputs) + sum((dropped or {}).values())
    share = (lambda k: k / total) if total else (lambda k: 0.0)
    return Queryness(outputs=total, query_like=share(query_like), degenerate=share(sum(reasons.values())),
                     reasons=dict(reasons), max_words=max_words)


def synthetic_queryness(synthetic_dir: str | Path) -> Queryness:
    """:func:`measure` of a synthetic BEIR set (``train`` split), counting the outputs its manifest says generation
    dropped as empty or degenerate (the ``dropped_empty`` and ``dropped_degenerate_<reason>`` counts)."""
    synthetic_dir = Path(synthetic_dir)
    data = load_beir(synthetic_dir, splits=["train"])
    manifest = _manifest(synthetic_dir / "manifest.json")
    dropped = Counter({"empty": manifest.get("dropped_empty", 0)})
    prefix = "dropped_degenerate_"
    dropped.update({key[len(prefix):]: count for key, count in manifest.items() if key.startswith(prefix)})
    outputs = [(data.queries[qid], data.corpus[doc].title, data.corpus[doc].text)
               for qid, docs in data.split("train").items() for doc in docs if qid in data.queries]
    return measure(outputs, dropped=+dropped)


def _manifest(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InputError("unreadable synthetic set manifest", path=path) from None
    if not isinstance(manifest, dict):
        raise InputError("expected a JSON object", path=path)
    return manifest
