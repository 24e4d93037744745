"""SQuAD as a BEIR dataset: a larger private query log (question -> the paragraph it was asked on). Deterministic
rules (the file is read and validated by :func:`privret.data.fed_squad.load_squad`):

* **Corpus.** Every paragraph, id ``<article index>-<paragraph index>``, title the article's (``_`` as a space).
* **Queries.** Every question, id its SQuAD id (unique, else an input error); ``is_impossible`` questions are left
  out and counted. Each question has one judgement, its own paragraph.
* **Split by article.** Articles ordered by ``sha256(seed:title)`` (:func:`~privret.data.seeded.seeded_order`):
  the first ``test_articles`` give the ``test`` qrels, the others the ``train`` qrels, the private log.
* **Validation** (``validation_articles`` K, default 0): the first K training articles in
  ``sha256("validation:<article index>")`` order leave the log for a ``validation`` split, searched over the whole
  corpus like test: settings are chosen on it, never on test.

Written atomically with a ``manifest.json`` (source hash, parameters, articles of each split, counts). Privacy
assumption: the paragraphs are public documents; the training articles' questions stand for a private log
(docs/concepts.md, section "Private logs to experiment on").
"""

from __future__ import annotations

from pathlib import Path

from privret.data.beir import BeirDataset, Document, Qrels, write_beir
from privret.data.fed_squad import load_squad
from privret.data.seeded import seeded_order
from privret.errors import InputError
from privret.io import file_sha256

FORMAT_VERSION = 1


def split_articles(articles: list[dict], test_articles: int, seed: int) -> dict[str, str]:
    """Article title -> ``"train"`` or ``"test"``: the first ``test_articles`` in seeded order are test."""
    if not 1 <= test_articles < len(articles):
        raise InputError(f"must be between 1 and {len(articles) - 1} (the file has {len(articles)} articles)",
                         field="test_articles")
    order = seeded_order(articles, seed, key=lambda a: a["title"])
    return {art["title"]: "test" if rank < test_articles else "train" for rank, art in enumerate(order)}


def carve_validation(split_of: dict[str, str], articles: list[dict], validation_articles: int) -> None:
    """Mark the first ``validation_articles`` training articles in ``sha256("validation:<index>")`` order
    ``"validation"`` in ``split_of`` (in place; ``<index>`` is the article's position in ``articles``)."""
    training = [str(i) for i, art in enumerate(articles) if split_of[art["title"]] == "train"]
    if not 0 <= validation_articles < len(training):
        raise InputError(f"must be between 0 and {len(training) - 1} (the file has {len(training)} training "
                         f"articles)", field="validation_articles")
    order = seeded_order(training, "validation")
    for i in order[:validation_articles]:
        split_of[articles[int(i)]["title"]] = "validation"


def build_squad_beir(squad_json: str | Path, out_dir: str | Path, *, test_articles: int = 8,
                     seed: int = 0, validation_articles: int = 0) -> dict:
    """Convert a SQuAD-format file into a BEIR directory ``out_dir`` (atomic); returns the manifest."""
    squad_json, out_dir = Path(squad_json), Path(out_dir)
    if out_dir.exists():
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    articles = load_squad(squad_json)
    split_of = split_articles(articles, test_articles, seed)
    carve_validation(split_of, articles, validation_articles)
    names = ("train", "validation", "test") if validation_articles else ("train", "test")
    corpus: dict[str, Document] = {}
    queries: dict[str, str] = {}
    qrels: dict[str, Qrels] = {name: {} for name in names}
    impossible = 0
    for a_i, art in enumerate(articles):
        for p_i, par in enumerate(art["paragraphs"]):
            doc_id = f"{a_i}-{p_i}"
            corpus[doc_id] = Document(doc_id, art["title"].replace("_", " "), par["context"])
            for qa in par["qas"]:
                if qa.get("is_impossible"):
                    impossible += 1
                    continue
                queries[qa["id"]] = qa["question"]
                qrels[split_of[art["title"]]][qa["id"]] = {doc_id: 1}
    manifest = {
        "format_version": FORMAT_VERSION, "source": str(squad_json), "source_sha256": file_sha256(squad_json),
        "seed": seed, "test_articles": test_articles, "validation_articles": validation_articles,
        "rules": {"corpus": "every paragraph; id <article index>-<paragraph index> in file order",
                  "split": "articles in sha256(seed:title) order; the first test_articles are test",
                  "validation": "training articles in sha256('validation:<article index>') order; the first "
                                "validation_articles are validation",
                  "qrels": "question -> its own paragraph, score 1; is_impossible questions left out"},
        "documents": len(corpus), "impossible_questions_left_out": impossible,
        "splits": {name: {"articles": sorted(t for t, s in split_of.items() if s == name),
                          "queries": len(qrels[name])} for name in names},
    }
    write_beir(out_dir, BeirDataset(corpus=corpus, queries=queries, qrels=qrels), manifest)
    return manifest
