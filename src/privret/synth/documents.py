"""Which public documents get synthetic queries, chosen without looking at the private log.

The synthetic set pairs generated queries with documents, so the *set of documents* is released
with it. Choosing "the documents that have private queries" would release the log's document
column outside the DP mechanism (a document with one private query reveals that query's unit),
so every source here is either public or DP:

* ``corpus`` (default): every document of the public corpus;
* ``list``: the document ids in ``ids_file`` (one per line), a list the user declares public;
* ``dp-select``: documents chosen from the private log by DP partition selection
  (:mod:`privret.privacy.partition_selection`); its (epsilon, delta) is composed into the
  synthetic set's ledger and recorded in the budget registry.

``sample`` then keeps a uniform random subset of that many documents, drawn with ``seed`` from the
candidates in corpus order: a public random choice that bounds the generation cost.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

from privret.data.beir import Document
from privret.errors import InputError
from privret.io import write_text_atomic
from privret.settings.partition_selection import PartitionSelectionConfig
from privret.settings.synthesis import DocumentChoice

SELECTED_IDS_FILE = "documents.txt"  # in a selection directory, beside the DP selection's ledger


def read_document_ids(path: Path, corpus: dict[str, Document]) -> list[str]:
    """Ids of a public document list (one per line; blank lines skipped); every id must be in ``corpus`` and appear
    once (a repeated id is refused, not merged silently)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError("document list not found", path=path) from None
    except UnicodeDecodeError:
        raise InputError("document list is not valid UTF-8", path=path) from None
    first_line: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        doc_id = line.strip()
        if not doc_id:
            continue
        if doc_id not in corpus:
            raise InputError(f"unknown document id '{doc_id}'", path=path, line=number, field="doc_id")
        if doc_id in first_line:
            raise InputError(f"document id '{doc_id}' given twice (first on line {first_line[doc_id]})", path=path,
                             line=number, field="doc_id")
        first_line[doc_id] = number
    if not first_line:
        raise InputError("document list is empty", path=path)
    return list(first_line)


def public_documents(choice: DocumentChoice, corpus: dict[str, Document]) -> list[Document]:
    """The documents of a public source (``corpus`` or ``list``), after ``sample``; reads no private data."""
    if choice.source == "dp-select":
        raise ValueError("dp-select reads the private log: use privret.privacy.partition_selection")
    ids = list(corpus) if choice.source == "corpus" else read_document_ids(choice.ids_file, corpus)
    return [corpus[d] for d in sampled(ids, choice)]


def sampled(ids: list[str], choice: DocumentChoice) -> list[str]:
    """``choice.sample`` of ``ids`` drawn with ``choice.seed``, kept in their original order (all if fewer)."""
    if choice.sample is None or choice.sample >= len(ids):
        return ids
    keep = set(random.Random(choice.seed).sample(range(len(ids)), choice.sample))
    return [d for i, d in enumerate(ids) if i in keep]


def recorded_dp_selection(pairs, unit, cfg: PartitionSelectionConfig, *, data_hash: str, dataset_id: str,
                          directory: Path, budget, field_name: Callable[[str], str]) -> tuple[list[str], object]:
    """Run a DP partition selection as a release: record it in the budget registry (cap check) before
    its noise is drawn, then select; returns the ids and the selection's ledger (saved by
    :func:`write_selection`).

    An input error on one of the selection's own settings names that setting as the caller's user wrote it,
    ``field_name(field)`` (a command's flag, a config file's path); other errors keep their field."""
    from privret.privacy import budget as budget_registry
    from privret.privacy.partition_selection import select_documents, selection_ledger

    try:
        ledger = selection_ledger(pairs, unit, cfg, data_hash=data_hash, dataset_id=dataset_id)
        budget_registry.check_and_record(budget_registry.Release.from_ledger(
            ledger, release_id=budget_registry.new_release_id(), status="final",
            artefact=Path(directory).absolute()), budget)
        return select_documents(pairs, unit, cfg, ledger), ledger
    except InputError as err:
        if err.field in PartitionSelectionConfig.model_fields:
            err.field = field_name(err.field)
        raise


def write_selection(directory: Path, ids: list[str], ledger=None) -> None:
    """A selection directory: ``documents.txt`` (written last, atomically: it marks the selection done)
    and, for a DP selection, its privacy ledger."""
    if ledger is not None:
        ledger.save(directory)
    write_text_atomic(directory / SELECTED_IDS_FILE, "".join(f"{d}\n" for d in ids))
