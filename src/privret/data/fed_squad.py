"""Fed-SQuAD: a multi-client answer-sentence-selection benchmark from a SQuAD v1.1 file, built like the Fed-NewsQA of
Wang's thesis (*Distributed Open-Domain Answer Sentence Selection by Federated Learning*, 3.4.1); docs/federated.md:

* **Grouping.** Articles ordered by ``sha256(seed:title)`` are cut into ``n_clients`` consecutive groups of sizes
  proportional to 1, 2, ..., n (largest remainder, at least one article each).
* **Passages** are paragraphs; a client's collection is every sentence of its articles' paragraphs, split by a
  rule-based splitter (:func:`split_sentences`) that keeps each sentence's character span.
* **Answer sentences.** Every occurrence of every annotator answer (case-sensitive, else case-insensitive) votes for
  every sentence it overlaps; the sentences with the most votes are relevant, the first is the training positive.
  A question with no answer in its paragraph is dropped and counted.
* **Splits.** Per client, a question is ``test`` when ``sha256(seed:question_id)`` maps below ``test_fraction``,
  else ``train``; each client keeps one of each at least.

Written atomically: ``manifest.json`` and ``client_XX/{passages,sentences,questions}.jsonl``. Privacy assumption: a
client's questions, sentences and passages are its private data; this builder re-shapes a public dataset.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from privret.data.seeded import seeded_order, seeded_unit
from privret.errors import InputError
from privret.io import atomic_path, file_sha256, read_jsonl, write_jsonl

FORMAT_VERSION = 1
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "ft", "vs", "etc", "e.g", "i.e", "no", "vol",
    "co", "corp", "inc", "ltd", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov",
    "dec", "gen", "gov", "rev", "sen", "rep", "col", "lt", "capt", "sgt", "u.s", "u.k", "a.d", "b.c", "c",
    "ca", "approx", "fig", "op", "cf", "al",
}
_BREAK = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of the sentences of ``text`` (stripped, non-empty, in order)."""
    spans, start = [], 0
    for m in _BREAK.finditer(text):
        word = re.search(r"(\S+)$", text[start:m.start()])
        token = word.group(1).lower().strip("\"'“‘([") if word else ""
        if m.group(0).startswith(".") and (token in _ABBREVIATIONS or re.fullmatch(r"[a-z]", token)
                                            or re.fullmatch(r"([a-z]\.)+[a-z]", token)):
            continue
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s:
            out.append((s, e))
    return out


def _occurrences(context: str, answer: str) -> list[tuple[int, int]]:
    if not answer.strip():
        return []
    hay, needle = context, answer
    found = [m.start() for m in re.finditer(re.escape(needle), hay)]
    if not found:
        found = [m.start() for m in re.finditer(re.escape(needle.lower()), hay.lower())]
    return [(s, s + len(answer)) for s in found]


def answer_sentences(context: str, spans: list[tuple[int, int]], answers: list[str]) -> list[int]:
    """Indices of the answer sentences of a question (the vote rule in the module docstring)."""
    votes = [0] * len(spans)
    for answer in answers:
        for a_start, a_end in _occurrences(context, answer):
            for i, (s, e) in enumerate(spans):
                if a_start < e and a_end > s:  # the occurrence overlaps sentence i (spanning: several)
                    votes[i] += 1
    best = max(votes, default=0)
    return [i for i, v in enumerate(votes) if v == best] if best > 0 else []


def client_sizes(n_items: int, n_clients: int) -> list[int]:
    """Sizes proportional to 1..n_clients, largest-remainder rounding, each >= 1, summing to n_items."""
    if n_clients < 1 or n_items < n_clients:
        raise InputError(f"need at least one article per client ({n_items} articles, {n_clients} clients)",
                         field="n_clients")
    total = n_clients * (n_clients + 1) / 2
    exact = [n_items * (i + 1) / total for i in range(n_clients)]
    sizes = [max(1, int(x)) for x in exact]
    while sum(sizes) < n_items:
        i = max(range(n_clients), key=lambda j: (exact[j] - sizes[j], j))
        sizes[i] += 1
    while sum(sizes) > n_items:
        i = max((j for j in range(n_clients) if sizes[j] > 1), key=lambda j: (sizes[j] - exact[j], j))
        sizes[i] -= 1
    return sizes


def load_squad(path: Path) -> list[dict]:
    """The articles of a SQuAD-format file, validated (InputError naming file, line or field)."""
    if not path.is_file():
        raise InputError("file not found", path=path)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise InputError(f"not valid UTF-8 (byte {err.start})", path=path) from None
    except json.JSONDecodeError as err:
        raise InputError(f"malformed JSON ({err.msg})", path=path, line=err.lineno) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("data"), list):
        raise InputError("expected a SQuAD object with a 'data' list", path=path, field="data")
    articles = obj["data"]

    def need_text(node, key: str, where: str, message: str) -> None:
        if not isinstance(node, dict) or not isinstance(node.get(key), str) or not node[key].strip():
            raise InputError(message, path=path, field=f"{where}.{key}")

    def need_list(node: dict, key: str, where: str) -> list:
        if not isinstance(node.get(key), list):
            raise InputError(f"missing {key} list", path=path, field=f"{where}.{key}")
        return node[key]

    question_ids: set[str] = set()
    for a_i, art in enumerate(articles):
        where = f"data[{a_i}]"
        need_text(art, "title", where, "missing or empty title")
        for p_i, par in enumerate(need_list(art, "paragraphs", where)):
            pw = f"{where}.paragraphs[{p_i}]"
            need_text(par, "context", pw, "missing or empty context")
            for q_i, qa in enumerate(need_list(par, "qas", pw)):
                qw = f"{pw}.qas[{q_i}]"
                for key in ("id", "question"):
                    need_text(qa, key, qw, "missing or empty")
                if qa["id"] in question_ids:  # a question's id keys its split, its metrics and its relevance
                    raise InputError(f"duplicate question id '{qa['id']}'", path=path, field=f"{qw}.id")
                question_ids.add(qa["id"])
                for an_i, an in enumerate(need_list(qa, "answers", qw)):
                    text = an.get("text") if isinstance(an, dict) else an
                    if not isinstance(text, str):
                        raise InputError("an answer must be a string or {'text': ...}", path=path,
                                         field=f"{qw}.answers[{an_i}]")
    titles = [a["title"] for a in articles]
    if len(set(titles)) != len(titles):
        dup = next(t for t in titles if titles.count(t) > 1)
        raise InputError(f"duplicate article title '{dup}'", path=path, field="data.title")
    return articles


def build_fed_squad(squad_json: str | Path, out_dir: str | Path, *, n_clients: int = 10,
                    test_fraction: float = 0.3, seed: int = 0, overwrite: bool = False) -> dict:
    """Build Fed-SQuAD from a SQuAD-format file into ``out_dir`` (atomic); returns the manifest."""
    squad_json, out_dir = Path(squad_json), Path(out_dir)
    if not 0 < test_fraction < 1:
        raise InputError("must be in (0, 1)", field="test_fraction")
    if out_dir.exists() and not overwrite:
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    articles = load_squad(squad_json)
    order = seeded_order(articles, seed, key=lambda a: a["title"])
    sizes = client_sizes(len(order), n_clients)
    clients, dropped, lo = [], 0, 0
    for c, size in enumerate(sizes):
        group, lo = order[lo: lo + size], lo + size
        passages, sentences, questions = [], [], []
        for art in group:
            for p_i, par in enumerate(art["paragraphs"]):
                pid = f"c{c}-{hashlib.sha1(art['title'].encode()).hexdigest()[:8]}-p{p_i}"
                context = par["context"]
                spans = split_sentences(context)
                sids = [f"{pid}-s{j}" for j in range(len(spans))]
                passages.append({"id": pid, "title": art["title"], "text": context, "sentence_ids": sids})
                sentences += [{"id": sid, "passage_id": pid, "text": context[s:e], "start": s, "end": e}
                              for sid, (s, e) in zip(sids, spans)]
                for qa in par["qas"]:
                    if qa.get("is_impossible"):
                        continue
                    answers = [a["text"] if isinstance(a, dict) else a for a in qa["answers"]]
                    gold = answer_sentences(context, spans, answers)
                    if not gold:
                        dropped += 1
                        continue
                    split = "test" if seeded_unit(seed, qa["id"]) < test_fraction else "train"
                    questions.append({"id": qa["id"], "question": qa["question"], "split": split,
                                      "passage_id": pid, "positive": sids[gold[0]],
                                      "answer_sentences": [sids[g] for g in gold], "answers": answers})
        for need in ("train", "test"):  # every client keeps at least one question in each split
            if questions and all(q["split"] != need for q in questions) and len(questions) > 1:
                pick = min(questions, key=lambda q: abs(seeded_unit(seed, q["id"]) - test_fraction))
                pick["split"] = need
        clients.append({"articles": [a["title"] for a in group], "passages": passages,
                        "sentences": sentences, "questions": questions})
    manifest = {
        "format_version": FORMAT_VERSION, "source": str(squad_json), "source_sha256": file_sha256(squad_json),
        "n_clients": n_clients, "test_fraction": test_fraction, "seed": seed, "dropped_questions": dropped,
        "rules": {"grouping": "sha256(seed:title) order, sizes proportional to 1..n (largest remainder, >=1)",
                  "answer_sentence": "annotator-vote: sentences overlapped by answer occurrences; an occurrence "
                                     "spanning a break votes for every sentence it overlaps; max votes win, ties "
                                     "all relevant; positive = first",
                  "split": "per question, sha256(seed:id) < test_fraction -> test"},
        "clients": [{"client": f"client_{c:02d}", "articles": cl["articles"], "passages": len(cl["passages"]),
                     "sentences": len(cl["sentences"]),
                     "train_questions": sum(q["split"] == "train" for q in cl["questions"]),
                     "test_questions": sum(q["split"] == "test" for q in cl["questions"])}
                    for c, cl in enumerate(clients)],
    }
    with atomic_path(out_dir) as staged:
        staged.mkdir(parents=True)
        for c, cl in enumerate(clients):
            cdir = staged / f"client_{c:02d}"
            cdir.mkdir()
            write_jsonl(cdir / "passages.jsonl", cl["passages"])
            write_jsonl(cdir / "sentences.jsonl", cl["sentences"])
            write_jsonl(cdir / "questions.jsonl", cl["questions"])
        (staged / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


@dataclass
class Question:
    id: str
    text: str
    split: str
    passage_id: str
    positive: str
    answer_sentences: list[str]


@dataclass
class ClientData:
    """One client's private OD-AS2 data: its sentence collection, passages and questions."""

    name: str
    sentence_ids: list[str]
    sentences: list[str]
    sentence_passage: list[str]
    passages: dict[str, list[str]]  # passage id -> its sentence ids
    questions: list[Question] = field(default_factory=list)

    def split(self, name: str) -> list[Question]:
        return [q for q in self.questions if q.split == name]


def _row(obj: dict, key: str, path: Path, line: int, kind=str):
    value = obj.get(key)
    if not isinstance(value, kind) or (kind is str and not value.strip()):
        raise InputError(f"missing or not a {kind.__name__}", path=path, line=line, field=key)
    return value


def _new_id(seen: dict[str, int], row: dict, path: Path, line: int) -> str:
    """The row's ``id``, refused if an earlier line of the file (recorded in ``seen``) has it."""
    key = _row(row, "id", path, line)
    if key in seen:
        raise InputError(f"duplicate id '{key}' (first on line {seen[key]})", path=path, line=line, field="id")
    seen[key] = line
    return key


def load_client(client_dir: str | Path) -> ClientData:
    """Read one ``client_XX`` directory strictly (InputError with file, line and field; ids unique per file)."""
    client_dir = Path(client_dir)
    sids, texts, owner, passages = [], [], [], {}
    path, seen = client_dir / "passages.jsonl", {}
    for line, row in read_jsonl(path):
        passages[_new_id(seen, row, path, line)] = list(_row(row, "sentence_ids", path, line, list))
    path, seen = client_dir / "sentences.jsonl", {}
    for line, row in read_jsonl(path):
        sids.append(_new_id(seen, row, path, line))
        texts.append(_row(row, "text", path, line))
        pid = _row(row, "passage_id", path, line)
        if pid not in passages:
            raise InputError(f"unknown passage '{pid}'", path=path, line=line, field="passage_id")
        owner.append(pid)
    known = set(sids)
    questions = []
    path, seen = client_dir / "questions.jsonl", {}
    for line, row in read_jsonl(path):
        q = Question(id=_new_id(seen, row, path, line), text=_row(row, "question", path, line),
                     split=_row(row, "split", path, line), passage_id=_row(row, "passage_id", path, line),
                     positive=_row(row, "positive", path, line),
                     answer_sentences=list(_row(row, "answer_sentences", path, line, list)))
        if q.split not in ("train", "test"):
            raise InputError("must be 'train' or 'test'", path=path, line=line, field="split")
        for field, sids_of_field in (("positive", [q.positive]), ("answer_sentences", q.answer_sentences)):
            for sid in sids_of_field:
                if sid not in known:
                    raise InputError(f"unknown sentence '{sid}'", path=path, line=line, field=field)
        questions.append(q)
    return ClientData(name=client_dir.name, sentence_ids=sids, sentences=texts, sentence_passage=owner,
                      passages=passages, questions=questions)


def load_fed_squad(root: str | Path) -> list[ClientData]:
    """All clients of a Fed-SQuAD directory, in client order."""
    root = Path(root)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise InputError("not a Fed-SQuAD directory (no manifest.json)", path=root)
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"malformed JSON ({err.msg})", path=manifest_path, line=err.lineno) from None
    names = [c.get("client") for c in manifest.get("clients", [])] if isinstance(manifest, dict) else []
    if not names or not all(isinstance(n, str) for n in names):
        raise InputError("no clients listed", path=manifest_path, field="clients")
    return [load_client(root / n) for n in names]
