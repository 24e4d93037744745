"""The rows of a pipeline run, each stage of a row made unless done: the original pairs' retriever, a synthetic
row (generator, synthetic set, retriever, its filtered copy and its DP choice), a direct DP retriever, and the
documents every synthetic set is written for.

Each stage writes its output atomically and records the settings that made it, so a finished stage is
skipped on re-run and an interrupted one resumes; each stage's wall time is added to its row's
``timing.json`` as it ends. Privacy: a synthetic set and the retriever trained on it carry its generator's
ledger (post-processing), composed with that of a DP document choice; rows without private data read no
private file.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from privret.data.beir import BeirDataset, load_beir
from privret.data.pairs import TrainingPairs, pairs_from_beir
from privret.errors import InputError
from privret.io import write_json_atomic
from privret.pipeline.evaluation import evaluate_stage
from privret.pipeline.memory import release_memory
from privret.pipeline.stages import DirectRow, FilteredRow, Stage, SyntheticRow, TrainedRow, write_record
from privret.privacy.budget import BudgetPolicy
from privret.privacy.ledger import LEDGER_FILE, PrivacyLedger, format_epsilon
from privret.privacy.partition_selection import selection_threshold
from privret.privacy.private_selection import MECHANISM as CHOICE_MECHANISM
from privret.run_layout import CHOICE, EMBEDDING_CACHE, TIMING_FILE
from privret.settings.pipeline import PipelineConfig
from privret.settings.training import PrivateSelectionConfig
from privret.synth.documents import public_documents, read_document_ids, recorded_dp_selection, sampled, write_selection
from privret.synth.filter import filter_round_trip
from privret.synth.generate import generate_synthetic
from privret.train.dp_retriever import train_dp_retriever
from privret.train.private_selection import select_retriever
from privret.train.retriever import non_private_ledger, train_retriever

console = Console(stderr=True)


@dataclass
class Run:
    """What every stage of one run reads: the config, the private data and where its releases are charged."""

    cfg: PipelineConfig
    run_dir: Path
    dataset: BeirDataset
    pairs: TrainingPairs
    data_hash: str
    charged_to: str  # the budget registry's key of the private data
    budget: BudgetPolicy

    @property
    def cache(self) -> Path:
        return self.run_dir / EMBEDDING_CACHE

    def evaluate(self, stage: Stage, model_name: str, extra: dict, *, public: bool = False) -> dict:
        """:func:`evaluate_stage` on the evaluation split; the embedding cache only for a ``public`` encoder."""
        return evaluate_stage(stage, model_name, self.dataset, self.cfg.eval_split, extra,
                              cache_dir=self.cache if public else None, search=self.cfg.search)


def original_row(run: Run, row: TrainedRow) -> dict:
    """The retriever trained on the private pairs without DP (a reference with no guarantee), unless done."""
    stage = row.retriever
    if not stage.done.exists():
        started = time.time()
        train_retriever(run.pairs, stage.output, run.cfg.retriever,
                        ledger=non_private_ledger(run.pairs, run.cfg.retriever.model, run.data_hash,
                                                  run.cfg.unit.value))
        write_record(stage)
        _add_timing(row.directory, {"retriever_seconds": round(time.time() - started, 1)})
        release_memory()
    return run.evaluate(row.metrics, str(stage.output), {"row": row.label, "epsilon": math.inf, "delta": 0.0})


def public_row(run: Run, row: SyntheticRow, make_generator, documents: list) -> list[dict]:
    """A row without private data (:mod:`privret.train.public`), unless done; its summary row (epsilon 0).

    Nothing here reads the private log: ``make_generator(directory)`` writes the generator from public data
    only, its queries are written for the public ``documents``, and the dataset serves the evaluation split.
    """
    console.rule(row.label)
    return synthetic_row(run, row, make_generator, documents)


def synthetic_row(run: Run, row: SyntheticRow, make_generator, documents: list, *, selection=None,
                   private_copies: set[str] | None = None) -> list[dict]:
    """Generator (``make_generator(directory)``), synthetic set, retriever and metrics of ``row``, each unless done,
    then its round-trip-filtered copy if planned; their summary rows.

    ``selection``: the ledger of a DP document choice, composed into the set's; ``private_copies``: the private
    queries a non-private set must not copy (None for a DP or public set, never compared with private text).
    """
    generator = row.generator
    if not generator.done.exists():
        started = time.time()
        if generator.resumable:
            write_record(generator)  # pins an interrupted run to these settings
        make_generator(generator.output)
        write_record(generator)  # the finished directory replaced the one holding it
        _add_timing(row.directory, {"generator_seconds": round(time.time() - started, 1)})
        release_memory()
    if not row.synthetic.done.exists():
        started = time.time()
        generate_synthetic(generator.output, documents, row.synthetic.output, run.cfg.generate,
                           document_selection=selection, resume=True, private_copies=private_copies)
        write_record(row.synthetic)
        _add_timing(row.directory, {"generate_seconds": round(time.time() - started, 1)})
        release_memory()
    _add_timing(row.directory, _train_on_synthetic(run, row.retriever, row.synthetic.output))
    ledger = PrivacyLedger.load(row.synthetic.output)  # the generator's, composed with a DP document choice
    privacy = {"epsilon": ledger.epsilon, "delta": ledger.delta}
    rows = [run.evaluate(row.metrics, str(row.retriever.output), {"row": row.label, **privacy})]
    if row.filtered is not None:
        console.rule(f"DP synthetic queries, round-trip filtered, epsilon = {format_epsilon(row.epsilon)}")
        rows.append(filtered_row(run, row.filtered, row.synthetic, privacy))
    if row.selected is not None:
        console.rule(f"DP choice of the retriever on the private log, epsilon = {format_epsilon(row.epsilon)} + "
                     f"{format_epsilon(run.cfg.private_selection.epsilon)}")
        rows.append(selected_row(run, row.selected, PrivateSelectionConfig(  # held out where the generator was
            **run.cfg.private_selection.model_dump(), base=run.cfg.retriever.model, unit=run.cfg.unit,
            hold_out=run.cfg.generator_config(row.epsilon).hold_out)))
    return rows


def selected_row(run: Run, row: TrainedRow, choice: PrivateSelectionConfig) -> dict:
    """The DP choice ``choice`` among its base, the candidates (the stages ``row`` is made from) and their
    interpolations, unless done; its ledger composes the candidates' with the choice's."""
    stage = row.retriever
    if not stage.done.exists():
        started = time.time()
        cfg = choice.model_copy(update={"candidates": [str(s.output) for s in stage.after]})
        select_retriever(run.pairs, stage.output, cfg, data_hash=run.data_hash, dataset_id=run.charged_to,
                         budget=run.budget)  # atomic: a crash leaves no directory, and a re-run chooses anew
        write_record(stage)
        _add_timing(row.directory, {"selection_seconds": round(time.time() - started, 1)})
        release_memory()
    ledger = PrivacyLedger.load(stage.output)
    (release,) = [part for part in ledger.parts if part.mechanism == CHOICE_MECHANISM]
    if not (row.directory / CHOICE / LEDGER_FILE).is_file():  # the choice's own release, for budget.json
        release.save(row.directory / CHOICE)
    return run.evaluate(row.metrics, str(stage.output), {"row": row.label, "epsilon": ledger.epsilon,
                                                         "delta": ledger.delta})


def filtered_row(run: Run, row: FilteredRow, synthetic: Stage, privacy: dict) -> dict:
    """The round-trip-filtered copy of ``synthetic`` (same ledger), its retriever and metrics, each unless done."""
    if not row.synthetic.done.exists():
        started = time.time()
        filter_round_trip(synthetic.output, run.dataset.corpus, row.synthetic.output, run.cfg.synthetic_filter,
                          cache_dir=run.cache)
        write_record(row.synthetic)
        _add_timing(row.directory, {"filter_seconds": round(time.time() - started, 1)})
        release_memory()
    _add_timing(row.directory, _train_on_synthetic(run, row.retriever, row.synthetic.output))
    return run.evaluate(row.metrics, str(row.retriever.output), {"row": row.label, **privacy})


def direct_row(run: Run, row: DirectRow) -> dict:
    """A retriever trained with DP directly on the private pairs, unless done (resumed when interrupted)."""
    stage = row.retriever
    if not stage.done.exists():
        started = time.time()
        write_record(stage)  # pins an interrupted run to these settings
        train_dp_retriever(run.pairs, stage.output, run.cfg.direct_dp.config(row.method, row.epsilon, run.cfg.unit),
                           data_hash=run.data_hash, dataset_id=run.charged_to, public_corpus=run.dataset.corpus,
                           budget=run.budget, resume=True, embedding_cache=run.cache)
        write_record(stage)  # the finished directory replaced the one holding it
        _add_timing(row.directory, {"retriever_seconds": round(time.time() - started, 1)})
        release_memory()
    ledger = PrivacyLedger.load(stage.output)
    return run.evaluate(row.metrics, str(stage.output), {"row": row.label, "epsilon": ledger.epsilon,
                                                         "delta": ledger.delta})


def _train_on_synthetic(run: Run, stage: Stage, synthetic_dir: Path) -> dict:
    """Train the retriever on a synthetic set unless done; its ledger is the set's (post-processing)."""
    if stage.done.exists():
        return {}
    started = time.time()
    synthetic = load_beir(synthetic_dir, splits=["train"])
    train_retriever(pairs_from_beir(synthetic, "train"), stage.output, run.cfg.retriever,
                    ledger=PrivacyLedger.load(synthetic_dir))
    write_record(stage)
    del synthetic
    release_memory()
    return {"retriever_seconds": round(time.time() - started, 1)}


def _add_timing(directory: Path, timing: dict) -> None:
    """Merge this stage's time into ``directory/timing.json`` as soon as it ends (a row resumed after a crash keeps
    the times of the stages finished before it)."""
    path = directory / TIMING_FILE
    if timing:
        write_json_atomic(path, {**(json.loads(path.read_text()) if path.exists() else {}), **timing})


def synthetic_documents(stage: Stage, run: Run) -> tuple[list, PrivacyLedger | None]:
    """The documents of every synthetic set of the run, chosen once (``documents/``).

    A public source reads no private data. ``dp-select`` is a DP release of its own: recorded in
    the budget registry before its noise is drawn, its ledger saved beside the selection, and
    composed into each synthetic set's ledger. A finished selection is reused, never redrawn.
    """
    choice = run.cfg.synthetic_documents
    if not stage.done.exists():
        ledger = None
        if choice.source == "dp-select":
            console.rule("DP choice of documents (partition selection)")
            selected, ledger = recorded_dp_selection(run.pairs, run.cfg.unit, choice.selection,
                                                     data_hash=run.data_hash, dataset_id=run.charged_to,
                                                     directory=stage.output, budget=run.budget,
                                                     field_name=lambda field: f"synthetic_documents.selection.{field}")
            ids = sampled(selected, choice)
            if not ids:
                ledger.save(stage.output)  # the release happened: it stays on record
                raise InputError(f"the DP document selection kept no document (threshold "
                                 f"{selection_threshold(choice.selection, ledger.delta):.3g} units per document); use "
                                 "synthetic_documents: corpus or a public list, or a larger selection epsilon",
                                 path=stage.output, field="synthetic_documents.selection.epsilon")
        else:
            ids = [d.id for d in public_documents(choice, run.dataset.corpus)]
        write_record(stage)  # before documents.txt, which marks the stage done
        write_selection(stage.output, ids, ledger)
    ids = read_document_ids(stage.done, run.dataset.corpus)
    corpus = run.dataset.corpus
    return [corpus[d] for d in ids], PrivacyLedger.load(stage.output) if choice.source == "dp-select" else None
