"""Public (question, paragraph) pairs from a SQuAD-format file: the input of the epsilon = 0 rows (the public-pairs
row and the public warm start, docs/privacy.md, section "Rows without private data").

Deterministic rules (the file is read and validated by :func:`privret.data.fed_squad.load_squad`):

* **Pool.** Every paragraph with at least one answerable question, in file order.
* **Sample.** ``paragraphs`` N draws N of them without replacement with ``random.Random(seed)`` (all, in file
  order, when N is not given).
* **One question per paragraph**, drawn with the same generator after the sample, so no paragraph is seen twice.

Each row is ``{"query": question, "doc": paragraph}`` (:func:`privret.data.pairs.load_pairs_jsonl`'s inline
form), written atomically. Privacy assumption: the SQuAD file is public and is not the private log; a file whose
questions came from the log would make the epsilon = 0 rows leak it, which privret cannot tell.
"""

from __future__ import annotations

import random
from pathlib import Path

from privret.data.fed_squad import load_squad
from privret.errors import InputError
from privret.io import atomic_path, write_jsonl


def squad_public_pairs(squad: Path, paragraphs: int | None = None, seed: int = 0) -> list[dict]:
    """The pairs of ``squad`` under the rules above: one ``{"query", "doc"}`` row per drawn paragraph."""
    pool = []
    for article in load_squad(squad):
        for paragraph in article["paragraphs"]:
            questions = [qa["question"] for qa in paragraph["qas"] if not qa.get("is_impossible")]
            if questions:
                pool.append((paragraph["context"], questions))
    if not pool:
        raise InputError("no paragraph has an answerable question", path=squad, field="data")
    rng = random.Random(seed)
    if paragraphs is not None:
        if not 1 <= paragraphs <= len(pool):
            raise InputError(f"must be between 1 and {len(pool)} (paragraphs with a question in {squad})",
                             field="paragraphs")
        pool = rng.sample(pool, paragraphs)
    return [{"query": rng.choice(questions), "doc": context} for context, questions in pool]


def write_squad_public_pairs(squad: Path, out: Path, paragraphs: int | None = None, seed: int = 0) -> int:
    """Write :func:`squad_public_pairs` to ``out`` (JSON lines, atomically); returns the number of pairs."""
    rows = squad_public_pairs(squad, paragraphs, seed)
    with atomic_path(out) as staged:
        write_jsonl(staged, rows)
    return len(rows)
