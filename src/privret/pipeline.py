"""The whole grid in one run directory: zero-shot, original pairs, and DP synthetic per epsilon.

Layout of ``RUN_DIR``::

    zero_shot/metrics.json
    documents/documents.txt        (the documents to write queries for; with dp-select, its ledger beside it)
    original/retriever/            (SentenceTransformer + ledger: non-private)
    original/metrics.json
    public-prompted/               (with ``public_rows.prompted``: no private data, epsilon 0; the untrained
                                    generator with public few-shot examples; generator/, synthetic/, retriever/,
                                    metrics.json as for eps-<e>)
    public-pairs/                  (with ``public_rows.public_pairs``: no private data, epsilon 0; the generator
                                    fine-tuned without DP on the public pairs; same layout)
    eps-<e>/generator/             (fine-tuned generator + privacy ledger; with ``generator.warm_start:
                                    public-pairs``, started from public-pairs/generator)
    eps-<e>/synthetic/             (BEIR dataset + manifest carrying the ledger)
    eps-<e>/retriever/
    eps-<e>/metrics.json
    eps-<e>-filtered/synthetic/    (with ``synthetic_filter``: the round-trip-filtered set, same ledger)
    eps-<e>-filtered/retriever/, eps-<e>-filtered/metrics.json
    direct-<method>-eps-<e>/retriever/   (direct DP training on the original pairs, with its ledger)
    direct-<method>-eps-<e>/metrics.json
    <row>/per_query.json           (beside each metrics.json: each test query's metrics, for the CI)
    summary.json, summary.md       (the seed's Table 3 layout, with retention and the CI against zero-shot)
    cache/embeddings/<key>.npy     (the public zero-shot encoder's corpus embeddings, see below)

Each stage writes its output atomically, so a finished stage is skipped on re-run and an
interrupted one resumes (generator and direct DP retriever checkpoints, partial generation).

**Stage fingerprints.** Every stage records the exact settings that produced it: a directory
output gets ``<output>/stage.json``, a ``metrics.json`` gets ``metrics.stage.json`` beside it. The
fingerprint is the stage's pydantic config dumped to JSON, the hashes of the data it read (the
private training data; the corpus, queries and qrels of the evaluation split) and, nested, the
fingerprints of the stages it was made from (a synthetic set holds its generator's, a retriever
its synthetic set's, metrics their retriever's), so a change upstream makes everything downstream
stale. Before any work, :func:`check_stages` compares every finished stage with what the current
config would make: identical, it is skipped as before; different, the run stops with one
:class:`~privret.errors.InputError` line naming the stage and the first differing field, old and
new value. A finished stage whose upstream stage is missing (deleted, to be made anew) is refused
too. A finished stage without ``stage.json`` (written by an older privret) is *legacy*: it is
checked as far as it can be (its ``train_config.json`` or manifest settings, and its ledger's data
hash) and then adopted: its fingerprint is recorded from the current config, so later edits are
detected. The records of the DP trainers (generator, direct DP retriever) are also written when
their training starts, so an interrupted one resumes only with the settings it started with. A
direct DP retriever's fingerprint leaves out ``checkpoint_every`` (it changes nothing trained) and
``secure_rng`` when off, so records written before these fields existed still match.

**Embedding cache.** The zero-shot evaluation and the round-trip filter (once per epsilon) encode
the same public corpus, with the same public encoder when ``synthetic_filter.encoder`` is the
zero-shot model; the matrix is computed once and reused from ``cache/embeddings``
(:func:`privret.evaluate.retrieval.corpus_embeddings`; keyed by the encoder's exact weights and the
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
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

from privret.config import PipelineConfig
from privret.data.beir import BeirDataset, load_beir
from privret.data.pairs import UNIT_DEFINITIONS, PrivacyUnit, TrainingPairs, pairs_from_beir
from privret.errors import InputError
from privret.retrieval.index import SearchIndex
from privret.retrieval.metrics import evaluate_per_query, mean_metrics
from privret.evaluate.statistics import EXPLANATION, PER_QUERY_FILE, versus_zero_shot
from privret.io import file_sha256, write_json_atomic, write_text_atomic
from privret.models.device import use_device
from privret.models.encoder import load_encoder
from privret.models.generator import GENERATOR_FILE
from privret.models.model_card import record_evaluation
from privret.privacy.budget import BudgetPolicy, dataset_id, run_composition, run_composition_sentence
from privret.privacy.ledger import PrivacyLedger, has_ledger
from privret.privacy.partition_selection import selection_threshold
from privret.runlock import RunLock, recover_tree
from privret.synth.documents import (SELECTED_IDS_FILE, public_documents, read_document_ids, recorded_dp_selection,
                                     sampled, write_selection)
from privret.synth.filter import filter_round_trip
from privret.synth.generate import generate_synthetic
from privret.train.dp_retriever import MECHANISM_FILE, resume_settings, train_dp_retriever
from privret.train.settings import DPRetrieverConfig
from privret.train.generator import train_generator
from privret.train.public import examples_hash, train_public_generator, write_prompted_generator
from privret.train.retriever import train_retriever

console = Console(stderr=True)

STAGE_FILE = "stage.json"
DOCUMENTS_STAGE = "documents"
PUBLIC_ROWS = {"public-prompted": "no private data (prompted)", "public-pairs": "no private data (public pairs)"}
STAGE_FORMAT = 1
EMBEDDING_CACHE = Path("cache") / "embeddings"  # in the run directory: public encoders only


def eps_label(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def dataset_hash(dataset: BeirDataset, split: str) -> str:
    """Identity of the private data: the queries file and the training qrels."""
    root = dataset.root
    return file_sha256(root / "queries.jsonl", root / "qrels" / f"{split}.tsv")


def eval_hash(dataset: BeirDataset, split: str) -> str:
    """Identity of what an evaluation reads: corpus, queries and the split's qrels."""
    root = dataset.root
    return file_sha256(root / "corpus.jsonl", root / "queries.jsonl", root / "qrels" / f"{split}.tsv")


def non_private_ledger(pairs: TrainingPairs, model: str, data_hash: str, unit: str) -> PrivacyLedger:
    return PrivacyLedger(mechanism="none", epsilon=math.inf, delta=0.0, noise_multiplier=0.0, sample_rate=1.0, steps=0,
                         planned_steps=0, accountant="none", unit=unit, n_units=len(pairs.units(unit)),
                         n_pairs=len(pairs.pairs), clip_norm=math.inf, model=model, trainable="all",
                         data_hash=data_hash, unit_definition=UNIT_DEFINITIONS[PrivacyUnit(unit)])


# ---------------------------------------------------------------------------------------------
# Stage fingerprints


@dataclass
class Stage:
    """One stage's output in the run directory and the fingerprint of the settings that make it."""

    name: str  # relative to the run directory, e.g. "eps-8/generator" or "eps-8/metrics.json"
    output: Path  # the output: a directory, or the metrics file
    done: Path  # exists once the stage has finished
    fingerprint: dict
    after: list[Stage] = field(default_factory=list)  # the stages it is made from
    resumable: bool = False  # its record is written when it starts, and pins an interrupted run
    legacy_settings: tuple[str, str | None, str] | None = None  # (file in output, key in it or None, fingerprint key)

    @property
    def record(self) -> Path:
        if self.output.suffix == ".json":
            return self.output.with_name(f"{self.output.stem}.{STAGE_FILE}")
        return self.output / STAGE_FILE


def _normal(obj):
    """JSON-normalised (what a record read back from disk compares equal to); keeps key order."""
    return json.loads(json.dumps(obj, default=str))


def _stage(run_dir: Path, name: str, fingerprint: dict, *, after: tuple[Stage, ...] = (), done: str | None = None,
           **kw) -> Stage:
    output = run_dir / name
    full = {**fingerprint, "after": {s.name: s.fingerprint for s in after}}
    return Stage(name=name, output=output, done=output / done if done else output, fingerprint=_normal(full),
                 after=list(after), **kw)


@dataclass
class StagePlan:
    run_dir: Path
    stages: dict[str, Stage] = field(default_factory=dict)

    def add(self, name: str, fingerprint: dict, **kw) -> Stage:
        stage = _stage(self.run_dir, name, fingerprint, **kw)
        self.stages[name] = stage
        return stage


def plan_stages(cfg: PipelineConfig, run_dir: Path, *, data_hash: str, evaluation: str, corpus: str) -> StagePlan:
    """Every stage of ``cfg``'s grid, in the order the pipeline runs them, with its fingerprint."""
    plan = StagePlan(run_dir)
    train = {"train_split": cfg.train_split, "unit": cfg.unit.value, "data_hash": data_hash}
    metrics = {"eval_split": cfg.eval_split, "eval_data": evaluation}
    if cfg.search.index != "exact":  # approximate search changes the metrics; exact keeps older runs' fingerprints
        metrics["search"] = cfg.search.model_dump(mode="json")
    retriever = cfg.retriever.model_dump(mode="json")
    plan.add("zero_shot/metrics.json", {"model": cfg.retriever.model, **metrics})
    original = plan.add("original/retriever", {"retriever": retriever, **train},
                        legacy_settings=("train_config.json", None, "retriever"))
    plan.add("original/metrics.json", metrics, after=(original,))
    choice = cfg.synthetic_documents
    documents = plan.add(DOCUMENTS_STAGE, done=SELECTED_IDS_FILE, fingerprint={
        "synthetic_documents": choice.model_dump(mode="json", exclude={"ids_file"}), "corpus": corpus,
        "ids_file": file_sha256(choice.ids_file) if choice.ids_file is not None else None,
        **(train if choice.source == "dp-select" else {})})
    public = cfg.public_rows
    if public.prompted:
        generator = plan.add("public-prompted/generator", {"prompted": cfg.generator.model_dump(
            mode="json", include={"model", "max_doc_tokens", "max_query_tokens"}), "unit": cfg.unit.value,
            "public_data_hash": examples_hash(public.few_shot())}, done=GENERATOR_FILE)
        _plan_synthetic_row(plan, "public-prompted", generator, documents, cfg, {}, metrics)
    warm_start = None
    if public.public_pairs is not None:
        warm_start = plan.add("public-pairs/generator", {"generator": cfg.generator_config(math.inf).model_dump(
            mode="json"), "public_pairs": file_sha256(public.public_pairs)}, done=GENERATOR_FILE, resumable=True)
        _plan_synthetic_row(plan, "public-pairs", warm_start, documents, cfg, {}, metrics)
    warm = {"warm_start": cfg.generator.warm_start} if cfg.generator.warm_start else {}
    for epsilon in cfg.epsilons:
        label = eps_label(epsilon)
        generator = plan.add(f"eps-{label}/generator", {"generator": cfg.generator_config(epsilon).model_dump(
            mode="json"), **train, **warm}, after=(warm_start,) if warm else (), done=GENERATOR_FILE, resumable=True,
            legacy_settings=("train_config.json", None, "generator"))
        synthetic = _plan_synthetic_row(plan, f"eps-{label}", generator, documents, cfg, train, metrics)
        if cfg.synthetic_filter is not None:
            filtered = plan.add(f"eps-{label}-filtered/synthetic", {
                "synthetic_filter": cfg.synthetic_filter.model_dump(mode="json"), "corpus": corpus},
                after=(synthetic,), legacy_settings=("manifest.json", "filter", "synthetic_filter"))
            trained = plan.add(f"eps-{label}-filtered/retriever", {"retriever": retriever}, after=(filtered,),
                               legacy_settings=("train_config.json", None, "retriever"))
            plan.add(f"eps-{label}-filtered/metrics.json", metrics, after=(trained,))
    for epsilon in cfg.direct_dp.epsilons:
        for method in cfg.direct_dp.methods:
            name = f"direct-{method}-eps-{eps_label(epsilon)}"
            trained = plan.add(f"{name}/retriever", {
                "direct_dp": direct_dp_fingerprint(cfg.direct_dp.config(method, epsilon, cfg.unit)), "corpus": corpus,
                **train}, done=MECHANISM_FILE, resumable=True, legacy_settings=("train_config.json", None, "direct_dp"))
            plan.add(f"{name}/metrics.json", metrics, after=(trained,))
    return plan


def _plan_synthetic_row(plan: StagePlan, row: str, generator: Stage, documents: Stage, cfg: PipelineConfig,
                        data: dict, metrics: dict) -> Stage:
    """The stages of ``row`` after its generator: synthetic set, retriever, metrics; returns the synthetic set's.

    ``data``: what the synthetic set's fingerprint adds about the private data (nothing for a public row).
    """
    synthetic = plan.add(f"{row}/synthetic", {"generate": cfg.generate.model_dump(mode="json"), **data},
                         after=(generator, documents), legacy_settings=("manifest.json", "config", "generate"))
    trained = plan.add(f"{row}/retriever", {"retriever": cfg.retriever.model_dump(mode="json")}, after=(synthetic,),
                       legacy_settings=("train_config.json", None, "retriever"))
    plan.add(f"{row}/metrics.json", metrics, after=(trained,))
    return synthetic


def direct_dp_fingerprint(cfg: DPRetrieverConfig) -> dict:
    """The settings of a direct DP retriever stage, as recorded in its fingerprint (see the module docstring)."""
    settings = resume_settings(cfg)  # without the fields that change nothing trained
    if cfg.secure_rng:  # asked for: a finished stage trained without it must not be taken
        settings["secure_rng"] = True
    return settings


def first_difference(old, new, path: str = "") -> tuple[str, object, object] | None:
    """The first field (dotted path, in ``new``'s order) where two JSON values differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in list(new) + [k for k in old if k not in new]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                return sub, "<absent>", new[key]
            if key not in new:
                return sub, old[key], "<absent>"
            found = first_difference(old[key], new[key], sub)
            if found:
                return found
        return None
    if old != new:
        return path or "(whole record)", old, new
    return None


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_record(stage: Stage) -> dict | None:
    if not stage.record.is_file():
        return None
    try:
        record = json.loads(stage.record.read_text(encoding="utf-8"))
        return record["fingerprint"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise InputError(f"unreadable stage record; delete {stage.output.name} to redo the stage (or use another "
                         "--run-dir)", path=stage.record) from None


def write_record(stage: Stage) -> None:
    """Record ``stage``'s fingerprint (atomically) in its output; the same bytes for the same settings."""
    write_json_atomic(stage.record, {"format": STAGE_FORMAT, "stage": stage.name, "fingerprint": stage.fingerprint})


def _dependents(plan: StagePlan, stage: Stage) -> list[str]:
    """Finished stages made (directly or not) from ``stage``."""
    names, found = {stage.name}, []
    for other in plan.stages.values():
        if any(up.name in names for up in other.after):
            names.add(other.name)
            if other.done.exists():
                found.append(other.name)
    return found


def _stale(plan: StagePlan, stage: Stage, message: str, *, fieldname: str | None = None) -> InputError:
    also = _dependents(plan, stage)
    redo = f"delete {stage.name}" + (f" and what was made from it ({', '.join(also)})" if also else "")
    return InputError(f"stage {message}; use another --run-dir, or {redo} to redo it", path=stage.output,
                      field=fieldname)


def _legacy_mismatch(stage: Stage, data_hash: str) -> tuple[str, object, object] | None:
    """What a stage written by an older privret can be checked against: its saved settings and ledger."""
    if stage.legacy_settings is not None:
        file, key, section = stage.legacy_settings
        path = stage.output / file
        try:
            saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (ValueError, UnicodeDecodeError):
            saved = None
        saved = saved.get(key) if isinstance(saved, dict) and key is not None else saved
        expected = stage.fingerprint.get(section)
        if isinstance(saved, dict) and isinstance(expected, dict):
            common = [k for k in expected if k in saved]  # fields an older privret did not have are not checked
            found = first_difference({k: saved[k] for k in common}, {k: expected[k] for k in common}, section)
            if found:
                return found
    ledger = stage.output / "privacy_ledger.json"
    if "data_hash" in stage.fingerprint and ledger.is_file():
        try:
            saved_hash = json.loads(ledger.read_text(encoding="utf-8")).get("data_hash")
        except (ValueError, UnicodeDecodeError, AttributeError):
            saved_hash = None
        if saved_hash not in (None, data_hash):
            return "data_hash", saved_hash, data_hash
    return None


def check_stages(plan: StagePlan, *, data_hash: str) -> list[Stage]:
    """Compare every finished stage with ``plan`` before any work; raise on the first stale one.

    Returns the legacy stages (finished, no record) that passed the checks; the caller records them.
    """
    redo: set[str] = set()
    legacy = []
    for stage in plan.stages.values():
        recorded = _read_record(stage)
        if not stage.done.exists():
            redo.add(stage.name)
            started = stage.output.is_dir() and any(p.name != STAGE_FILE for p in stage.output.iterdir())
            if stage.resumable and recorded is not None and started:  # a checkpoint or step log to resume from
                found = first_difference(recorded, stage.fingerprint)
                if found:
                    where, old, new = found
                    raise _stale(plan, stage, f"holds an interrupted run started with other settings (was "
                                              f"{_short(old)}, now {_short(new)}); it cannot resume", fieldname=where)
            continue
        missing = [up.name for up in stage.after if up.name in redo]
        if missing:
            raise _stale(plan, stage, f"made from an earlier {missing[0]}, which is gone and will be made anew")
        if recorded is None:
            found = _legacy_mismatch(stage, data_hash)
        else:
            found = first_difference(recorded, stage.fingerprint)
        if found:
            where, old, new = found
            raise _stale(plan, stage, f"made with other settings (was {_short(old)}, now {_short(new)})",
                         fieldname=where)
        if recorded is None:
            legacy.append(stage)
    return legacy


# ---------------------------------------------------------------------------------------------
# Memory


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


# ---------------------------------------------------------------------------------------------
# The pipeline


def _evaluate_stage(stage: Stage, model_name: str, dataset: BeirDataset, split: str, extra: dict, *,
                    search: SearchIndex | None = None, cache_dir: Path | None = None) -> dict:
    """Metrics of a retriever searched with ``search`` (default exact), unless done; ``cache_dir`` only for a public encoder
    (privacy).

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
        per_query = evaluate_per_query(model, dataset.corpus, dataset.queries, dataset.split(split),
                                       cache_dir=cache_dir, index=search)
        del model
        result = {**extra, **mean_metrics(per_query), "eval_seconds": round(time.time() - started, 1)}
        write_json_atomic(per_query_path, per_query)  # before metrics.json, which marks the stage done
        record_evaluation(model_name, data=dataset.root.name if dataset.root else "data", split=split,
                          metrics=mean_metrics(per_query))
        write_json_atomic(path, result)
        write_record(stage)
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


def _run_grid(cfg: PipelineConfig, run_dir: Path) -> list[dict]:
    run_dir.mkdir(parents=True, exist_ok=True)
    dataset = load_beir(cfg.dataset, splits=[cfg.train_split, cfg.eval_split])
    pairs = pairs_from_beir(dataset, cfg.train_split)
    data_hash = dataset_hash(dataset, cfg.train_split)
    budget, charged_to = cfg.budget.policy(), dataset_id(pairs, cfg.budget.dataset_name)
    plan = plan_stages(cfg, run_dir, data_hash=data_hash, evaluation=eval_hash(dataset, cfg.eval_split),
                       corpus=file_sha256(dataset.root / "corpus.jsonl"))
    for stage in check_stages(plan, data_hash=data_hash):  # nothing is written before every stage is checked
        console.print(f"[yellow]{stage.name}: no stage.json (older privret); settings checked where recorded, "
                      "fingerprint recorded now[/yellow]")
        write_record(stage)
    stages = plan.stages
    write_json_atomic(run_dir / "config.json", cfg.model_dump(mode="json"))
    unit = cfg.unit.value
    rows = []
    cache = run_dir / EMBEDDING_CACHE

    console.rule("zero-shot encoder")
    public = not has_ledger(cfg.retriever.model)  # not trained by privret on private data
    zero = _evaluate_stage(stages["zero_shot/metrics.json"], cfg.retriever.model, dataset, cfg.eval_split,
                           {"row": "zero-shot", "epsilon": None, "delta": None}, cache_dir=cache if public else None,
                           search=cfg.search)
    rows.append(zero)

    console.rule("retriever on the original (private) pairs, non-private")
    original = run_dir / "original"
    if not (original / "retriever").exists():
        started = time.time()
        train_retriever(pairs, original / "retriever", cfg.retriever,
                        ledger=non_private_ledger(pairs, cfg.retriever.model, data_hash, unit))
        write_record(stages["original/retriever"])
        write_json_atomic(original / "timing.json", {"retriever_seconds": round(time.time() - started, 1)})
        release_memory()
    rows.append(_evaluate_stage(stages["original/metrics.json"], str(original / "retriever"), dataset, cfg.eval_split,
                                {"row": "original pairs (non-private)", "epsilon": math.inf, "delta": 0.0},
                                search=cfg.search))

    documents, selection = _synthetic_documents(stages[DOCUMENTS_STAGE], cfg, dataset, pairs, data_hash, charged_to,
                                                budget)
    public = cfg.public_rows
    if public.prompted:
        rows.append(_public_row(stages, "public-prompted", lambda out: write_prompted_generator(
            cfg.generator.model, public.few_shot(), out, unit=unit, max_doc_tokens=cfg.generator.max_doc_tokens,
            max_query_tokens=cfg.generator.max_query_tokens), documents, dataset, cfg))
    if public.public_pairs is not None:
        rows.append(_public_row(stages, "public-pairs", lambda out: train_public_generator(
            public.public_pairs, out, cfg.generator_config(math.inf), resume=True), documents, dataset, cfg))
    warm_start = run_dir / "public-pairs" / "generator" if cfg.generator.warm_start else None
    for epsilon in cfg.epsilons:
        label = eps_label(epsilon)
        stage = run_dir / f"eps-{label}"
        console.rule(f"DP synthetic queries, epsilon = {label}")
        timing = {}
        if not (stage / "generator" / "generator.json").exists():
            started = time.time()
            write_record(stages[f"eps-{label}/generator"])  # pins an interrupted run to these settings
            train_generator(pairs, stage / "generator", cfg.generator_config(epsilon), data_hash=data_hash,
                            dataset_id=charged_to, resume=True, budget=budget, warm_start=warm_start)
            write_record(stages[f"eps-{label}/generator"])  # the finished directory replaced the one holding it
            timing["generator_seconds"] = round(time.time() - started, 1)
            release_memory()
        if not (stage / "synthetic").exists():
            started = time.time()
            generate_synthetic(stage / "generator", documents, stage / "synthetic", cfg.generate,
                               document_selection=selection, resume=True,
                               private_copies={p.query for p in pairs.pairs} if math.isinf(epsilon) else None)
            write_record(stages[f"eps-{label}/synthetic"])
            timing["generate_seconds"] = round(time.time() - started, 1)
            release_memory()
        timing.update(_train_on_synthetic(stages[f"eps-{label}/retriever"], stage / "synthetic", cfg))
        _add_timing(stage, timing)
        ledger = PrivacyLedger.load(stage / "synthetic")  # the generator's, composed with a DP document choice
        rows.append(_evaluate_stage(stages[f"eps-{label}/metrics.json"], str(stage / "retriever"), dataset,
                                    cfg.eval_split, {"row": f"DP synthetic (epsilon={label})",
                                                     "epsilon": ledger.epsilon, "delta": ledger.delta},
                                    search=cfg.search))
        if cfg.synthetic_filter is not None:
            filtered = run_dir / f"eps-{label}-filtered"
            console.rule(f"DP synthetic queries, round-trip filtered, epsilon = {label}")
            timing = {}
            if not (filtered / "synthetic").exists():
                started = time.time()
                filter_round_trip(stage / "synthetic", dataset.corpus, filtered / "synthetic", cfg.synthetic_filter,
                                  cache_dir=cache)
                write_record(stages[f"eps-{label}-filtered/synthetic"])
                timing["filter_seconds"] = round(time.time() - started, 1)
                release_memory()
            timing.update(_train_on_synthetic(stages[f"eps-{label}-filtered/retriever"], filtered / "synthetic", cfg))
            _add_timing(filtered, timing)
            rows.append(_evaluate_stage(stages[f"eps-{label}-filtered/metrics.json"], str(filtered / "retriever"),
                                        dataset, cfg.eval_split,
                                        {"row": f"DP synthetic, round-trip filtered (epsilon={label})",
                                         "epsilon": ledger.epsilon, "delta": ledger.delta}, search=cfg.search))
    for epsilon in cfg.direct_dp.epsilons:  # every method at the first epsilon before the next epsilon
        for method in cfg.direct_dp.methods:
            name = f"direct-{method}-eps-{eps_label(epsilon)}"
            stage = run_dir / name
            console.rule(f"direct DP training of the retriever: {method}, epsilon = {eps_label(epsilon)}")
            if not (stage / "retriever" / MECHANISM_FILE).exists():
                started = time.time()
                write_record(stages[f"{name}/retriever"])  # pins an interrupted run to these settings
                train_dp_retriever(pairs, stage / "retriever", cfg.direct_dp.config(method, epsilon, cfg.unit),
                                   data_hash=data_hash, dataset_id=charged_to, public_corpus=dataset.corpus,
                                   budget=budget, resume=True)
                write_record(stages[f"{name}/retriever"])  # the finished directory replaced the one holding it
                write_json_atomic(stage / "timing.json", {"retriever_seconds": round(time.time() - started, 1)})
                release_memory()
            ledger = PrivacyLedger.load(stage / "retriever")
            rows.append(_evaluate_stage(stages[f"{name}/metrics.json"], str(stage / "retriever"), dataset,
                                        cfg.eval_split, {"row": f"direct DP {method} (epsilon={eps_label(epsilon)})",
                                                         "epsilon": ledger.epsilon, "delta": ledger.delta},
                                        search=cfg.search))
    write_summary(run_dir, rows, cfg)
    return rows


def _public_row(stages: dict[str, Stage], name: str, make_generator, documents: list, dataset: BeirDataset,
                cfg: PipelineConfig) -> dict:
    """A row without private data (:mod:`privret.train.public`), unless done; its summary row (epsilon 0).

    Nothing here reads the private log: ``make_generator(directory)`` writes the generator from public data
    only, its queries are written for the public ``documents``, and ``dataset`` serves the evaluation split.
    """
    generator = stages[f"{name}/generator"]
    row = generator.output.parent
    console.rule(PUBLIC_ROWS[name])
    timing = {}
    if not generator.done.exists():
        started = time.time()
        if generator.resumable:
            write_record(generator)  # pins an interrupted run to these settings
        make_generator(generator.output)
        write_record(generator)
        timing["generator_seconds"] = round(time.time() - started, 1)
        release_memory()
    if not (row / "synthetic").exists():
        started = time.time()
        generate_synthetic(generator.output, documents, row / "synthetic", cfg.generate, resume=True)
        write_record(stages[f"{name}/synthetic"])
        timing["generate_seconds"] = round(time.time() - started, 1)
        release_memory()
    timing.update(_train_on_synthetic(stages[f"{name}/retriever"], row / "synthetic", cfg))
    _add_timing(row, timing)
    ledger = PrivacyLedger.load(row / "synthetic")
    return _evaluate_stage(stages[f"{name}/metrics.json"], str(row / "retriever"), dataset, cfg.eval_split,
                           {"row": PUBLIC_ROWS[name], "epsilon": ledger.epsilon, "delta": ledger.delta},
                           search=cfg.search)


def _train_on_synthetic(record: Stage, synthetic_dir: Path, cfg: PipelineConfig) -> dict:
    """Train the retriever on a synthetic set unless done; its ledger is the set's (post-processing)."""
    out = record.output
    if out.exists():
        return {}
    started = time.time()
    synthetic = load_beir(synthetic_dir, splits=["train"])
    train_retriever(pairs_from_beir(synthetic, "train"), out, cfg.retriever, ledger=PrivacyLedger.load(synthetic_dir))
    write_record(record)
    del synthetic
    release_memory()
    return {"retriever_seconds": round(time.time() - started, 1)}


def _add_timing(stage: Path, timing: dict) -> None:
    """Merge this call's stage times into ``stage/timing.json`` (a resumed stage keeps the others)."""
    if timing:
        write_json_atomic(stage / "timing.json", {**_read_json(stage / "timing.json"), **timing})


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _synthetic_documents(stage: Stage, cfg: PipelineConfig, dataset: BeirDataset, pairs: TrainingPairs,
                         data_hash: str, charged_to: str, budget: BudgetPolicy) -> tuple[list, PrivacyLedger | None]:
    """The documents of every synthetic set of the run, chosen once (``documents/``).

    A public source reads no private data. ``dp-select`` is a DP release of its own: recorded in
    the budget registry before its noise is drawn, its ledger saved beside the selection, and
    composed into each synthetic set's ledger. A finished selection is reused, never redrawn.
    """
    choice = cfg.synthetic_documents
    if not stage.done.exists():
        if choice.source == "dp-select":
            console.rule("DP choice of documents (partition selection)")
            selected, ledger = recorded_dp_selection(pairs, cfg.unit, choice.selection, data_hash=data_hash,
                                                     dataset_id=charged_to, directory=stage.output, budget=budget)
            ids = sampled(selected, choice)
            if not ids:
                ledger.save(stage.output)  # the release happened: it stays on record
                raise InputError(f"the DP document selection kept no document (threshold "
                                 f"{selection_threshold(choice.selection, ledger.delta):.3g} units per document); use "
                                 "synthetic_documents: corpus or a public list, or a larger selection epsilon",
                                 path=stage.output, field="synthetic_documents.selection.epsilon")
            write_selection(stage.output, ids, ledger)
        else:
            write_selection(stage.output, [d.id for d in public_documents(choice, dataset.corpus)])
        write_record(stage)
    ids = read_document_ids(stage.done, dataset.corpus)
    return [dataset.corpus[d] for d in ids], PrivacyLedger.load(stage.output) if choice.source == "dp-select" else None


def _fmt_eps(value) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.3g}"


SUMMARY_COLUMNS = ("training data", "epsilon", "delta", "NDCG@10", "retention", "ΔNDCG@10 vs zero-shot [95% CI]",
                   "Recall@10", "Recall@100", "MRR@10")


def _summary_cells(rows: list[dict]) -> list[list[str]]:
    """The cells of :data:`SUMMARY_COLUMNS` for each row of :func:`run_pipeline`."""
    versus = versus_zero_shot({r["stage"]: (r["ndcg@10"], r["per_query"]) for r in rows})
    cells = []
    for r in rows:
        against = versus[r["stage"]]
        cells.append([r["row"], _fmt_eps(r["epsilon"]), "-" if r["delta"] in (None, 0.0) else f"{r['delta']:.2g}",
                      f"{r['ndcg@10']:.4f}", against.retention_text(), against.delta_text(),
                      f"{r['recall@10']:.4f}", f"{r['recall@100']:.4f}", f"{r['mrr@10']:.4f}"])
    return cells


def summary_table(rows: list[dict]) -> Table:
    table = Table(title="Retrieval on the evaluation split (seed Table 3 layout)", caption=EXPLANATION)
    for column in SUMMARY_COLUMNS:
        table.add_column(column, justify="left" if column == "training data" else "right")
    for cells in _summary_cells(rows):
        table.add_row(*cells)
    return table


def summary_markdown(rows: list[dict], cfg: PipelineConfig) -> str:
    lines = [f"# {cfg.name}: retrieval on `{cfg.eval_split}`", "", "| " + " | ".join(SUMMARY_COLUMNS) + " |",
             "|---|" + "---:|" * (len(SUMMARY_COLUMNS) - 1)]
    lines += ["| " + " | ".join(cells) + " |" for cells in _summary_cells(rows)]
    lines += ["", EXPLANATION, "", "Each DP row's (epsilon, delta) holds for that row alone, per privacy unit "
              f"'{cfg.unit.value}'; releasing several rows trained on the same data composes their budgets."]
    return "\n".join(lines) + "\n"


def write_summary(run_dir: Path, rows: list[dict], cfg: PipelineConfig) -> None:
    write_json_atomic(run_dir / "summary.json", [{k: v for k, v in r.items() if k != "per_query"} for r in rows])
    joint = run_composition(run_dir)  # what releasing every row together costs (docs/reliability.md)
    write_json_atomic(run_dir / "budget.json", joint)
    write_text_atomic(run_dir / "summary.md", summary_markdown(rows, cfg) + "\n" + run_composition_sentence(joint) + "\n")
