"""Choosing the retriever's training recipe on a validation split of its own training pairs, never on test.

1. The distinct query texts of the pairs (the query unit) are shuffled with ``seed``; the first
   ``validation_fraction`` of them, with all their pairs, form the validation split.
2. Each combination of the grid trains on the rest for ``max_epochs`` and is scored after every epoch by the mean
   NDCG@10 of the validation queries, each searching its relevant documents plus ``validation_pool`` other corpus
   documents drawn with ``seed`` (the same pool for every candidate).
3. The best (combination, epochs) wins, ties to the earlier candidate (smaller values, fewer epochs), and is
   retrained on all the pairs.

Privacy: on synthetic pairs the choice reads only the synthetic set and the public corpus, so the model keeps the
synthetic set's ledger; on the original pairs it reads private queries, like the non-private training it tunes.
Direct DP training never uses it (a private validation split would need a budget of its own). One record per
finished candidate (``candidates.json``, atomic) lets an interrupted selection resume. See docs/concepts.md,
section "Choosing the recipe without the test split".
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

from privret.data.beir import Document
from privret.data.pairs import TrainingPairs
from privret.io import write_json_atomic

CANDIDATES_FILE = "candidates.json"


def validation_split(pairs: TrainingPairs, fraction: float, seed: int
                     ) -> tuple[TrainingPairs, dict[str, str], dict[str, dict[str, int]]]:
    """(training pairs, validation queries {qid: text}, validation qrels {qid: {doc_id: 1}}), split by query text."""
    units = pairs.units("query")
    order = list(range(len(units)))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(fraction * len(units)))
    if n_val >= len(units):
        raise ValueError(f"{len(units)} query units cannot leave any for training after a validation split")
    held = {i for u in order[:n_val] for i in units[u]}
    queries, qrels = {}, {}
    for k, u in enumerate(sorted(order[:n_val])):
        qid = f"val{k}"
        queries[qid] = pairs.pairs[units[u][0]].query
        qrels[qid] = {pairs.pairs[i].doc_id: 1 for i in units[u]}
    train = TrainingPairs([p for i, p in enumerate(pairs.pairs) if i not in held], pairs.corpus, pairs.inline_doc_ids)
    return train, queries, qrels


def validation_corpus(corpus: dict[str, Document], qrels: dict[str, dict[str, int]], pool: int | None,
                      seed: int) -> dict[str, Document]:
    """The relevant documents of ``qrels`` plus ``pool`` others drawn with ``seed`` (all of ``corpus`` if None)."""
    if pool is None:
        return corpus
    relevant = {d for docs in qrels.values() for d in docs}
    others = sorted(set(corpus) - relevant)
    drawn = random.Random(seed).sample(others, min(pool, len(others)))
    return {d: corpus[d] for d in sorted(relevant | set(drawn))}


def candidate_grid(grid: dict[str, list[int | float]]) -> list[dict[str, int | float]]:
    """Every combination of the grid's values, in sorted-value order."""
    names = sorted(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(sorted(grid[n]) for n in names))]


def select_recipe(pairs: TrainingPairs, cfg, *, work_dir: Path, fit) -> dict:
    """Run the rule of the module docstring for ``cfg.selection``; returns the selection record.

    ``fit(pairs, cfg, after_epoch=...)`` trains one candidate and calls ``after_epoch(epoch, model)`` after
    every epoch (:func:`privret.train.retriever.fit_retriever`).

    The record: the split's sizes, every candidate's NDCG@10 per epoch, and ``chosen`` (the winning
    settings, ``epochs`` included) to apply to ``cfg`` before the final training.
    """
    from privret.retrieval.metrics import evaluate_retriever

    rule = cfg.selection
    train, queries, qrels = validation_split(pairs, rule.validation_fraction, rule.seed)
    corpus = validation_corpus(pairs.corpus, qrels, rule.validation_pool, rule.seed)
    work_dir.mkdir(parents=True, exist_ok=True)
    record_path = work_dir / CANDIDATES_FILE
    settings = {"rule": rule.model_dump(mode="json"), "base": cfg.model_dump(mode="json", exclude={"selection"}),
                "training_pairs": len(train.pairs), "validation_queries": len(queries),
                "validation_documents": len(corpus)}
    done = json.loads(record_path.read_text()) if record_path.exists() else {}
    if done.get("settings") != settings:
        done = {"settings": settings, "candidates": []}
    for candidate in candidate_grid(rule.grid)[len(done["candidates"]):]:
        scores: list[float] = []
        trial = type(cfg).model_validate({**settings["base"], **candidate, "epochs": rule.max_epochs})
        fit(train, trial, after_epoch=lambda epoch, model: scores.append(
            evaluate_retriever(model, corpus, queries, qrels)["ndcg@10"]))
        done["candidates"].append({"settings": candidate, "ndcg10_by_epoch": scores})
        write_json_atomic(record_path, done)
    best = max(((c["settings"], e + 1, s) for c in done["candidates"] for e, s in enumerate(c["ndcg10_by_epoch"])),
               key=lambda t: t[2])
    return {**done, "chosen": {**best[0], "epochs": best[1]}, "chosen_validation_ndcg10": best[2]}
