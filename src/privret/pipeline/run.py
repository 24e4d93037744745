"""Running a grid (:func:`run_pipeline`): every stage of the plan (:mod:`privret.pipeline.stages`) not yet done,
then the summary (:mod:`privret.pipeline.summary`).

Each stage writes its output atomically, so a finished stage is skipped on re-run and an interrupted
one resumes (generator and direct DP retriever checkpoints, partial generation). Nothing is written
before every finished stage has been checked against the config (:func:`~privret.pipeline.stages.check_stages`).

**Embedding cache.** The zero-shot evaluation and the round-trip filter (once per epsilon) encode
the same public corpus, with the same public encoder when ``synthetic_filter.encoder`` is the
zero-shot model; the matrix is computed once and reused from ``cache/embeddings``
(:func:`privret.retrieval.embedding.corpus_embeddings`; keyed by the encoder's exact weights and the
corpus texts, so a changed model or corpus never reads a stale entry). Only public encoders are
cached: retrievers trained on the private pairs or on synthetic sets are each evaluated once, and
their embeddings are never written there. The directory may be deleted between runs; what is
missing is computed again.

**Memory.** Models of finished stages are released between stages (:func:`release_memory`):
transformers and Opacus modules sit in reference cycles that only the cyclic garbage collector
frees, and glibc keeps freed heap unless trimmed.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from privret.chatter import RUN_LOG, also_log_to
from privret.config import PipelineConfig
from privret.data.beir import BeirDataset, dataset_hash, eval_hash, load_beir, load_qrels
from privret.data.pairs import TrainingPairs, pairs_from_beir
from privret.errors import InputError
from privret.retrieval.metrics import evaluate_per_query, mean_metrics
from privret.evaluate.statistics import PER_QUERY_FILE
from privret.io import file_sha256, write_json_atomic
from privret.models.device import precision_label, use_device
from privret.models.encoder import load_encoder
from privret.models.model_card import record_evaluation
from privret.models.registry import is_bundled, resolve
from privret.run_layout import CHOICE, CONFIG_FILE, EMBEDDING_CACHE, PUBLIC_PAIRS, PUBLIC_PROMPTED, TIMING_FILE
from privret.pipeline.stages import (DirectRow, FilteredRow, Stage, SyntheticRow, TrainedRow, check_stages,
                                     plan_stages, write_record)
from privret.pipeline.summary import write_summary
from privret.privacy.accounting import check_budget, default_delta
from privret.privacy.budget import BudgetPolicy, dataset_id
from privret.privacy.ledger import LEDGER_FILE, PrivacyLedger, format_epsilon, has_ledger, require_public
from privret.privacy.partition_selection import selection_threshold
from privret.privacy.private_selection import MECHANISM as CHOICE_MECHANISM
from privret.runlock import RunLock, recover_tree
from privret.synth.documents import public_documents, read_document_ids, recorded_dp_selection, sampled, write_selection
from privret.synth.filter import filter_round_trip
from privret.synth.generate import generate_synthetic
from privret.train.dp_retriever import train_dp_retriever
from privret.train.generator import train_generator
from privret.train.private_selection import select_retriever
from privret.train.public import train_public_generator, write_prompted_generator
from privret.train.retriever import non_private_ledger, train_retriever
from privret.train.settings import PrivateSelectionConfig

console = Console(stderr=True)



def release_memory() -> None:
    """Free what finished stages left: cyclic garbage (models, Opacus hooks), CUDA cache, glibc heap."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back to the OS (glibc only)
        except (OSError, AttributeError):
            pass


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


def evaluate_stage(stage: Stage, model_name: str, dataset: BeirDataset, split: str, extra: dict, *,
                   search=None, cache_dir: Path | None = None) -> dict:
    """Metrics of a retriever searched with ``search`` (default exact), unless done; ``cache_dir`` only for a public
    encoder (privacy).

    Writes the means to ``metrics.json`` and, first, each query's metrics to ``per_query.json`` beside it.
    The row returned adds ``stage`` (the directory) and ``per_query`` (NDCG@10 per query id; None for a
    stage evaluated by an older privret, without ``per_query.json``) for the summary's statistics.
    """
    path = stage.output
    per_query_path = path.with_name(PER_QUERY_FILE)
    if path.exists():
        result = json.loads(path.read_text())
        per_query = json.loads(per_query_path.read_text()) if per_query_path.exists() else None
    else:
        started = time.time()
        model = load_encoder(model_name)
        precision = precision_label(model.device)
        per_query = evaluate_per_query(model, dataset.corpus, dataset.queries, dataset.split(split),
                                       cache_dir=cache_dir, index=search)
        del model
        result = {**extra, **mean_metrics(per_query), "precision": precision,
                  "eval_seconds": round(time.time() - started, 1)}
        write_json_atomic(per_query_path, per_query)  # before metrics.json, which marks the stage done
        record_evaluation(model_name, data=dataset.root.name if dataset.root else "data", split=split,
                          metrics=mean_metrics(per_query), precision=precision)
        write_record(stage)  # before metrics.json too: a finished evaluation always has its record
        write_json_atomic(path, result)
        release_memory()
    ndcg = None if per_query is None else {q: v["ndcg@10"] for q, v in per_query.items()}
    return {**result, "stage": path.parent.name, "per_query": ndcg}


def _exclusive_run_dir(run):
    """Hold the run directory's lock (:class:`privret.runlock.RunLock`) for the whole call."""

    @functools.wraps(run)
    def locked(cfg, run_dir, *args, **kwargs):
        with RunLock(run_dir, what="run directory"):
            recover_tree(run_dir)  # stale staging directories and cut swaps left by a killed run
            return run(cfg, run_dir, *args, **kwargs)

    return locked


@_exclusive_run_dir
def run_pipeline(cfg: PipelineConfig, run_dir: str | Path) -> list[dict]:
    """Run (or finish) ``cfg``'s grid in ``run_dir`` with its models on ``cfg.device``; its DP releases are
    checked against ``cfg.budget``."""
    with use_device(cfg.device):
        return _run_grid(cfg, Path(run_dir))


def _check_starting_models(cfg: PipelineConfig) -> None:
    """Refuse, before any stage runs, a starting model that cannot be found (a missing directory, a hub id not
    in the cache offline), naming its config field, and one that read private data: every row carries only its
    own release's ledger, so each model a row starts from must be public (each stage checks again when it
    starts). Bundled names are always there (installed with privret); they are converted when first used."""
    grid = cfg.direct_dp
    models = [(cfg.retriever.model, "retriever.model", "the pipeline's encoder"),
              (cfg.generator.model, "generator.model", "generator training")]  # every epsilon has a generator row
    if cfg.synthetic_filter is not None:
        models.append((cfg.synthetic_filter.encoder, "synthetic_filter.encoder", "the round-trip filter"))
    for method in grid.methods if grid.epsilons else []:
        model = grid.config(method, grid.epsilons[0], cfg.unit).model
        models.append((model, f"direct_dp.{grid.section(method, 'model')}.model", "direct DP training"))
    for model, field, use in models:
        if not is_bundled(model):  # a path or a hub id: found now (a bundled one is installed with privret)
            try:
                resolve(model)
            except InputError as err:
                err.field = field
                raise
        require_public(model, field=field, use=use)


def _check_dp_budgets(cfg: PipelineConfig, pairs: TrainingPairs) -> None:
    """Each DP training row's (epsilon, delta) against the log's n units, before any stage runs: a delta of 1/n or
    more is refused now, named as the config names it, instead of when its row starts (hours into a run). Each
    trainer checks again; a row that holds units out trains on fewer of them, so it is left to its trainer (its n
    is the fit part's)."""
    n = len(pairs.units(cfg.unit))
    rows = [("generator", "epsilons", cfg.generator.delta, epsilon)
            for epsilon in cfg.epsilons if math.isfinite(epsilon) and cfg.generator.hold_out is None]
    grid = cfg.direct_dp
    for method in grid.methods:
        for epsilon in grid.epsilons:
            row = grid.config(method, epsilon, cfg.unit)
            if row.hold_out is None:
                rows.append((f"direct_dp.{grid.section(method, 'delta')}", "direct_dp.epsilons", row.delta, epsilon))
    for section, epsilons, delta, epsilon in rows:
        try:
            check_budget(epsilon, delta if delta is not None else default_delta(n), n)
        except InputError as err:
            err.field = epsilons if err.field == "epsilon" else f"{section}.{err.field}"
            raise


def _check_settings_split(cfg: PipelineConfig, dataset: BeirDataset) -> None:
    """Settings chosen on a split are trained without it: a release's (epsilon, delta) covers only what its
    mechanism read, so a choice made without DP on queries the DP rows then train on is outside the guarantee.
    Refuse a config that names ``settings_chosen_on`` when the dataset lacks that split or when one of its queries
    (by id or by text, the query unit's key) is also in ``train_split``."""
    split = cfg.settings_chosen_on
    if split is None:
        return
    path = dataset.root / "qrels" / f"{split}.tsv"
    if not path.is_file():
        raise InputError(f"no split '{split}', on which the config's settings were chosen: build the dataset with it "
                         f"held out of '{cfg.train_split}' (e.g. privret data squad-beir --validation-articles K)",
                         path=path, field="settings_chosen_on")
    trained = dataset.split(cfg.train_split)
    texts = {dataset.queries[q] for q in trained}
    shared = [q for q in load_qrels(path, corpus=dataset.corpus, queries=dataset.queries)
              if q in trained or dataset.queries[q] in texts]
    if shared:
        raise InputError(f"{len(shared)} queries of split '{split}', on which the config's settings were chosen, are "
                         f"also in '{cfg.train_split}', the log the rows train on: settings chosen on a split are "
                         "trained without it", path=path, field="settings_chosen_on")


def _run_grid(cfg: PipelineConfig, run_dir: Path) -> list[dict]:
    _check_starting_models(cfg)
    dataset = load_beir(cfg.dataset, splits=[cfg.train_split, cfg.eval_split])
    _check_settings_split(cfg, dataset)
    pairs = pairs_from_beir(dataset, cfg.train_split)
    _check_dp_budgets(cfg, pairs)
    run_dir.mkdir(parents=True, exist_ok=True)  # only now: a run refused above leaves nothing behind
    also_log_to(run_dir / RUN_LOG)
    data_hash = dataset_hash(dataset, cfg.train_split)
    run = Run(cfg, run_dir, dataset, pairs, data_hash, dataset_id(pairs, cfg.budget.dataset_name), cfg.budget.policy())
    few_shot = cfg.public_rows.few_shot(dataset.corpus) if cfg.public_rows.prompted else None
    plan = plan_stages(cfg, run_dir, data_hash=data_hash, evaluation=eval_hash(dataset, cfg.eval_split),
                       corpus=file_sha256(dataset.root / "corpus.jsonl"), few_shot=few_shot)
    check_stages(plan)  # nothing is written before every stage is checked
    write_json_atomic(run_dir / CONFIG_FILE, cfg.model_dump(mode="json"))

    console.rule("zero-shot encoder")
    rows = [run.evaluate(plan.zero_shot, cfg.retriever.model, {"row": "zero-shot", "epsilon": None, "delta": None},
                         public=not has_ledger(cfg.retriever.model))]  # not trained by privret on private data
    console.rule("retriever on the original (private) pairs, non-private")
    rows.append(_original_row(run, plan.original))
    documents, selection = _synthetic_documents(plan.documents, run)
    public = cfg.public_rows
    if public.prompted:
        rows += _public_row(run, plan.public[PUBLIC_PROMPTED], lambda out: write_prompted_generator(
            cfg.generator.model, few_shot, out, unit=cfg.unit.value,
            max_doc_tokens=cfg.generator.max_doc_tokens, max_query_tokens=cfg.generator.max_query_tokens), documents)
    if public.public_pairs is not None:
        rows += _public_row(run, plan.public[PUBLIC_PAIRS], lambda out: train_public_generator(
            public.public_pairs, out, cfg.generator_config(math.inf), resume=True), documents)
    warm_start = plan.public[PUBLIC_PAIRS].generator.output if cfg.generator.warm_start else None
    for row in plan.dp:
        console.rule(f"DP synthetic queries, epsilon = {format_epsilon(row.epsilon)}")
        rows += _synthetic_row(run, row, lambda out, epsilon=row.epsilon: train_generator(
            pairs, out, cfg.generator_config(epsilon), data_hash=data_hash, dataset_id=run.charged_to, resume=True,
            budget=run.budget, warm_start=warm_start), documents, selection=selection,
            private_copies={p.query for p in pairs.pairs} if math.isinf(row.epsilon) else None)
    for row in plan.direct:
        console.rule(f"direct DP training of the retriever: {row.method}, epsilon = {format_epsilon(row.epsilon)}")
        rows.append(_direct_row(run, row))
        if row.selected is not None:
            console.rule(f"DP choice on the held-out units: {row.method}, epsilon = {format_epsilon(row.epsilon)}")
            choice = run.cfg.direct_dp.held_out_selection(row.method, row.epsilon, run.cfg.unit)
            rows.append(_selected_row(run, row.selected, choice))
    write_summary(run_dir, rows, cfg)
    return rows


def _original_row(run: Run, row: TrainedRow) -> dict:
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


def _public_row(run: Run, row: SyntheticRow, make_generator, documents: list) -> list[dict]:
    """A row without private data (:mod:`privret.train.public`), unless done; its summary row (epsilon 0).

    Nothing here reads the private log: ``make_generator(directory)`` writes the generator from public data
    only, its queries are written for the public ``documents``, and the dataset serves the evaluation split.
    """
    console.rule(row.label)
    return _synthetic_row(run, row, make_generator, documents)


def _synthetic_row(run: Run, row: SyntheticRow, make_generator, documents: list, *, selection=None,
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
        rows.append(_filtered_row(run, row.filtered, row.synthetic, privacy))
    if row.selected is not None:
        console.rule(f"DP choice of the retriever on the private log, epsilon = {format_epsilon(row.epsilon)} + "
                     f"{format_epsilon(run.cfg.private_selection.epsilon)}")
        rows.append(_selected_row(run, row.selected, PrivateSelectionConfig(  # held out where the generator was
            **run.cfg.private_selection.model_dump(), base=run.cfg.retriever.model, unit=run.cfg.unit,
            hold_out=run.cfg.generator_config(row.epsilon).hold_out)))
    return rows


def _selected_row(run: Run, row: TrainedRow, choice: PrivateSelectionConfig) -> dict:
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


def _filtered_row(run: Run, row: FilteredRow, synthetic: Stage, privacy: dict) -> dict:
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


def _direct_row(run: Run, row: DirectRow) -> dict:
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


def _synthetic_documents(stage: Stage, run: Run) -> tuple[list, PrivacyLedger | None]:
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
