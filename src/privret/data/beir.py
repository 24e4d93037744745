"""Reading and writing datasets in BEIR format, with strict validation.

A BEIR dataset is a directory holding ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``) and ``qrels/<split>.tsv`` (``query-id``, ``corpus-id``,
``score``, tab-separated, with a header row). Every malformed line becomes an
:class:`~privret.errors.InputError` naming file, line and field.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from privret.errors import InputError
from privret.io import atomic_path, file_sha256, read_jsonl, read_lines, require_text, write_json_atomic, write_jsonl

QRELS_HEADER = ("query-id", "corpus-id", "score")


@dataclass(frozen=True)
class Document:
    id: str
    title: str
    text: str

    @property
    def full_text(self) -> str:
        """Title and body as one string, the way encoders and generators read a document."""
        return f"{self.title}. {self.text}" if self.title else self.text


Qrels = dict[str, dict[str, int]]  # query id -> document id -> relevance


@dataclass
class BeirDataset:
    corpus: dict[str, Document]
    queries: dict[str, str]
    qrels: dict[str, Qrels] = field(default_factory=dict)  # split -> qrels
    root: Path | None = None

    def split(self, name: str) -> Qrels:
        """The judgements of split ``name``; a split that is missing, or holds no positive judgement (an empty or
        header-only file, every score 0), is an input error: nothing can be trained or scored on it."""
        where = self.root / "qrels" if self.root else Path("qrels")
        if name not in self.qrels:
            raise InputError(f"no qrels for split '{name}' (have: {', '.join(sorted(self.qrels)) or 'none'})",
                             path=where)
        if not any(score > 0 for docs in self.qrels[name].values() for score in docs.values()):
            raise InputError("no positive judgement in this split", path=where / f"{name}.tsv")
        return self.qrels[name]


def _records_by_id(path: str | Path, what: str) -> Iterator[tuple[int, str, dict]]:
    """(line, ``_id``, object) of every record of a BEIR JSONL file; a repeated ``_id`` is an input error."""
    seen: set[str] = set()
    for line, obj in read_jsonl(path):
        record_id = require_text(obj, "_id", path=path, line=line)
        if record_id in seen:
            raise InputError(f"duplicate {what} id '{record_id}'", path=path, line=line, field="_id")
        seen.add(record_id)
        yield line, record_id, obj


def load_corpus(path: str | Path) -> dict[str, Document]:
    corpus: dict[str, Document] = {}
    for line, doc_id, obj in _records_by_id(path, "document"):
        title = require_text(obj, "title", path=path, line=line, allow_empty=True) if "title" in obj else ""
        text = require_text(obj, "text", path=path, line=line)
        corpus[doc_id] = Document(doc_id, title, text)
    if not corpus:
        raise InputError("corpus is empty", path=path)
    return corpus


def load_queries(path: str | Path) -> dict[str, str]:
    queries: dict[str, str] = {}
    for line, query_id, obj in _records_by_id(path, "query"):
        queries[query_id] = require_text(obj, "text", path=path, line=line)
    if not queries:
        raise InputError("queries file is empty", path=path)
    return queries


def load_qrels(path: str | Path, *, corpus: dict[str, Document], queries: dict[str, str]) -> Qrels:
    qrels: Qrels = {}
    for line, text in read_lines(path):
        cells = text.split("\t")
        if line == 1 and tuple(c.strip() for c in cells) == QRELS_HEADER:
            continue
        if len(cells) != 3:
            raise InputError(f"expected 3 tab-separated columns, got {len(cells)}", path=path, line=line)
        query_id, doc_id, score = (c.strip() for c in cells)
        if query_id not in queries:
            raise InputError(f"unknown query id '{query_id}'", path=path, line=line, field="query-id")
        if doc_id not in corpus:
            raise InputError(f"unknown document id '{doc_id}'", path=path, line=line, field="corpus-id")
        try:
            relevance = int(score)
        except ValueError:
            raise InputError(f"score '{score}' is not an integer", path=path, line=line, field="score") from None
        if doc_id in qrels.get(query_id, {}):
            raise InputError(f"duplicate judgement ({query_id}, {doc_id})", path=path, line=line, field="corpus-id")
        qrels.setdefault(query_id, {})[doc_id] = relevance
    return qrels


def load_beir(root: str | Path, splits: list[str] | None = None) -> BeirDataset:
    """Load a BEIR directory. ``splits=None`` loads every ``qrels/*.tsv``."""
    root = Path(root)
    if not root.is_dir():
        raise InputError("dataset directory not found", path=root)
    corpus = load_corpus(root / "corpus.jsonl")
    queries = load_queries(root / "queries.jsonl")
    qrels_dir = root / "qrels"
    names = splits if splits is not None else sorted(p.stem for p in qrels_dir.glob("*.tsv"))
    qrels = {name: load_qrels(qrels_dir / f"{name}.tsv", corpus=corpus, queries=queries) for name in names}
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels, root=root)


def dataset_hash(dataset: BeirDataset, split: str) -> str:
    """Identity of the private data a training run reads: the queries file and the split's qrels."""
    root = dataset.root
    return file_sha256(root / "queries.jsonl", root / "qrels" / f"{split}.tsv")


def eval_hash(dataset: BeirDataset, split: str) -> str:
    """Identity of what an evaluation reads: corpus, queries and the split's qrels."""
    root = dataset.root
    return file_sha256(root / "corpus.jsonl", root / "queries.jsonl", root / "qrels" / f"{split}.tsv")


def write_beir(root: str | Path, dataset: BeirDataset, manifest: dict | None = None) -> None:
    """Write ``dataset`` to ``root`` atomically (the directory appears complete or not at all)."""
    with atomic_path(root) as staged:
        staged.mkdir(parents=True)
        write_jsonl(staged / "corpus.jsonl",
                    [{"_id": d.id, "title": d.title, "text": d.text} for d in dataset.corpus.values()])
        write_jsonl(staged / "queries.jsonl", [{"_id": q, "text": t} for q, t in dataset.queries.items()])
        (staged / "qrels").mkdir()
        for split, qrels in dataset.qrels.items():
            lines = ["\t".join(QRELS_HEADER)]
            lines += [f"{q}\t{d}\t{s}" for q, docs in qrels.items() for d, s in docs.items()]
            (staged / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        if manifest is not None:
            write_json_atomic(staged / "manifest.json", manifest)
