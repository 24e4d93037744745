"""SQuAD as a BEIR dataset: a larger private query log (question -> the paragraph it was asked on).

Rules (deterministic; the file is read and validated by :func:`privret.data.fed_squad.load_squad`):

* **Corpus.** Every paragraph of every article, in file order. Its id is
  ``<article index>-<paragraph index>`` (0-based positions in the file), its title the article
  title with ``_`` read as a space, its text the paragraph.
* **Queries.** Every question; its id is the SQuAD question id (unique, else an input error), its
  text the question. A question marked ``is_impossible`` (SQuAD 2.0) has no answer in its
  paragraph and is left out (counted in the manifest).
* **Split by article.** Articles are ordered by ``sha256(seed:title)``
  (:func:`~privret.data.seeded.seeded_order`, so the file's order does not matter); the first
  ``test_articles`` of that order are the test articles, all others the training articles. The
  questions of training articles form the ``train`` qrels (the private log), those of test
  articles the ``test`` qrels: no article has questions in both. Each question has one judgement,
  its own paragraph, score 1.
* **A validation split** (``validation_articles`` K, optional, default 0): the training articles ordered by
  ``sha256("validation:<article index>")`` (the article's position in the file, as in its document ids); the
  first K are validation articles, whose questions form the ``validation`` qrels (searched over the whole corpus,
  like test). They leave the private log: settings are chosen on them, never on test.

The output directory is written atomically, with a ``manifest.json`` (source hash, parameters,
the articles of each split, counts). Privacy assumption: the paragraphs are public documents; the
questions of the training articles stand for a private query log.
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
