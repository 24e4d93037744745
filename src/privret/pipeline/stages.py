"""The stages of a pipeline run: where each writes, when it is done, and the fingerprint of its settings.

:func:`plan_stages` names every stage (its path in the run directory) and its "done" file once; the run
(:mod:`privret.pipeline.run`) reads both from the plan. Every stage records the settings that made it
(``<output>/stage.json``, or ``metrics.stage.json`` beside a ``metrics.json``): its pydantic config, the hashes (as
commitments) of the data it read and, nested, the fingerprints of the stages it was made from, so a change upstream
makes everything downstream stale.

Before any work :func:`check_stages` compares every finished stage with what the config would make: identical, it
is skipped; different, the run stops with one :class:`~privret.errors.InputError` line naming the stage and the
first differing field. A finished stage whose upstream stage is missing, or with no record (what made it cannot be
proven), is refused. The DP trainers' records are written when training starts, so an interrupted one resumes only
with its own settings. A direct DP retriever's fingerprint leaves out :data:`~privret.train.dp_run.RESUME_FREE`
(none changes the mechanism) and accepts :data:`~privret.train.dp_run.RETIRED_SETTINGS` at their one value.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from privret.settings.pipeline import PipelineConfig
from privret.errors import InputError
from privret.io import file_sha256, write_json_atomic
from privret.models.query_generator import GENERATOR_FILE
from privret.run_layout import (DIRECT_ROW_PREFIX, DOCUMENTS, DP_ROW_PREFIX, FILTERED_SUFFIX, GENERATOR, MAUVE_FILE,
                                METRICS_FILE, ORIGINAL, PUBLIC_PAIRS, PUBLIC_PROMPTED, PUBLIC_ROWS, RETRIEVER,
                                SELECTED_SUFFIX, SYNTHETIC, ZERO_SHOT)
from privret.privacy.commitment import commit
from privret.privacy.ledger import format_epsilon
from privret.synth.documents import SELECTED_IDS_FILE
from privret.train.dp_retriever import MECHANISM_FILE
from privret.settings.training import DPRetrieverConfig
from privret.train.dp_run import RETIRED_SETTINGS, STAGE_FILE, resume_settings
from privret.train.private_selection import SELECTION_FILE
from privret.train.public_start import examples_hash, start_examples

STAGE_FORMAT = 1


@dataclass
class Stage:
    """One stage's output in the run directory and the fingerprint of the settings that make it."""

    name: str  # relative to the run directory, e.g. "eps-8/generator" or "eps-8/metrics.json"
    output: Path  # the output: a directory, or the metrics file
    done: Path  # exists once the stage has finished
    fingerprint: dict
    after: list[Stage] = field(default_factory=list)  # the stages it is made from
    resumable: bool = False  # its record is written when it starts, and pins an interrupted run

    @property
    def record(self) -> Path:
        if self.output.suffix == ".json":
            return self.output.with_name(f"{self.output.stem}.{STAGE_FILE}")
        return self.output / STAGE_FILE


@dataclass
class TrainedRow:
    """A retriever and its evaluation: the original pairs, a direct DP row, or the retriever of a synthetic set."""

    label: str  # the row of the summary
    retriever: Stage
    metrics: Stage

    @property
    def directory(self) -> Path:
        return self.retriever.output.parent


@dataclass
class FilteredRow(TrainedRow):
    """A round-trip-filtered copy of a synthetic set and the retriever trained on it."""

    synthetic: Stage | None = None


@dataclass
class DirectRow(TrainedRow):
    """A retriever trained with DP directly on the private pairs (:mod:`privret.train.dp_retriever`)."""

    method: str = ""
    epsilon: float = math.inf
    selected: TrainedRow | None = None  # the DP choice on the held-out units, when the row holds units out


@dataclass
class SyntheticRow(TrainedRow):
    """A generator, the synthetic set it writes, and the retriever trained on it (public or DP)."""

    generator: Stage | None = None
    synthetic: Stage | None = None
    epsilon: float | None = None  # the generator's target; None for a public row
    filtered: FilteredRow | None = None
    selected: TrainedRow | None = None  # the DP choice among the public encoder and this row's retrievers


def _normal(obj):
    """JSON-normalised (what a record read back from disk compares equal to); keeps key order."""
    return json.loads(json.dumps(obj, default=str))


def make_stage(run_dir: Path, name: str, fingerprint: dict, *, after: tuple[Stage, ...] = (),
               done: str | None = None, resumable: bool = False) -> Stage:
    output = run_dir / name
    full = {**fingerprint, "after": {s.name: s.fingerprint for s in after}}
    return Stage(name=name, output=output, done=output / done if done else output, fingerprint=_normal(full),
                 after=list(after), resumable=resumable)


@dataclass
class StagePlan:
    """Every stage of a grid, in the order the run makes them, grouped into the rows of its summary."""

    run_dir: Path
    stages: dict[str, Stage] = field(default_factory=dict)
    zero_shot: Stage | None = None
    original: TrainedRow | None = None
    documents: Stage | None = None
    public: dict[str, SyntheticRow] = field(default_factory=dict)
    dp: list[SyntheticRow] = field(default_factory=list)
    direct: list[DirectRow] = field(default_factory=list)
    mauve: list[Stage] = field(default_factory=list)  # each made from one synthetic set (its only upstream stage)

    def add(self, name: str, fingerprint: dict, **kw) -> Stage:
        stage = make_stage(self.run_dir, name, fingerprint, **kw)
        self.stages[name] = stage
        return stage

    def trained_row(self, row: str, label: str, retriever: dict, metrics: dict, *, after: tuple[Stage, ...] = (),
                    **kw) -> TrainedRow:
        trained = self.add(f"{row}/{RETRIEVER}", retriever, after=after, **kw)
        return TrainedRow(label, trained, self.add(f"{row}/{METRICS_FILE}", metrics, after=(trained,)))


def plan_stages(cfg: PipelineConfig, run_dir: Path, *, data_hash: str, evaluation: str, corpus: str,
                few_shot: list[tuple[str, str]] | None) -> StagePlan:
    """Every stage of ``cfg``'s grid, in the order the pipeline runs them, with its fingerprint. ``few_shot``:
    the prompted row's examples as read (:meth:`~privret.settings.pipeline.PublicRows.few_shot`, with the dataset's corpus);
    None when ``cfg`` has no prompted row."""
    if cfg.public_rows.prompted and few_shot is None:
        raise ValueError("the prompted row's examples must be read (PublicRows.few_shot) before planning")
    plan = StagePlan(run_dir)
    # fingerprints are written beside the outputs: the digests as commitments (privret.privacy.commitment); the
    # evaluation digest too, since a BEIR queries.jsonl holds the private training queries as well
    train = {"train_split": cfg.train_split, "unit": cfg.unit.value, "data_hash": commit(data_hash)}
    metrics = {"eval_split": cfg.eval_split, "eval_data": commit(evaluation)}
    if cfg.search.index != "exact":  # approximate search changes the metrics; exact keeps older runs' fingerprints
        metrics["search"] = cfg.search.model_dump(mode="json")
    retriever = {"retriever": cfg.retriever.model_dump(mode="json")}
    plan.zero_shot = plan.add(f"{ZERO_SHOT}/{METRICS_FILE}", {"model": cfg.retriever.model, **metrics})
    plan.original = plan.trained_row(ORIGINAL, "original pairs (non-private)", {**retriever, **train}, metrics)
    choice = cfg.synthetic_documents
    plan.documents = plan.add(DOCUMENTS, done=SELECTED_IDS_FILE, fingerprint={
        "synthetic_documents": choice.model_dump(mode="json", exclude={"ids_file"}), "corpus": corpus,
        "ids_file": file_sha256(choice.ids_file) if choice.ids_file is not None else None,
        **(train if choice.source == "dp-select" else {})})
    public = cfg.public_rows
    if public.prompted:
        generator = plan.add(f"{PUBLIC_PROMPTED}/{GENERATOR}", {"prompted": cfg.generator.model_dump(
            mode="json", include={"model", "max_doc_tokens", "max_query_tokens"}), "unit": cfg.unit.value,
            "public_data_hash": examples_hash(few_shot)}, done=GENERATOR_FILE)
        plan.public[PUBLIC_PROMPTED] = _synthetic_row(plan, PUBLIC_PROMPTED, generator, cfg, {}, metrics)
    warm_start = None
    if public.public_pairs is not None:
        warm_start = plan.add(f"{PUBLIC_PAIRS}/{GENERATOR}", {"generator": cfg.generator_config(math.inf).model_dump(
            mode="json"), "public_pairs": file_sha256(public.public_pairs)}, done=GENERATOR_FILE, resumable=True)
        plan.public[PUBLIC_PAIRS] = _synthetic_row(plan, PUBLIC_PAIRS, warm_start, cfg, {}, metrics)
    warm = {"warm_start": cfg.generator.warm_start} if cfg.generator.warm_start else {}
    shown = dp_start_examples(cfg, few_shot)
    start = {"public_examples": examples_hash(shown)} if shown is not None else {}
    for epsilon in cfg.epsilons:
        row = f"{DP_ROW_PREFIX}{format_epsilon(epsilon)}"
        generator = plan.add(f"{row}/{GENERATOR}", {"generator": cfg.generator_config(epsilon).model_dump(
            mode="json"), **train, **warm, **start}, after=(warm_start,) if warm else (), done=GENERATOR_FILE,
            resumable=True)
        plan.dp.append(_synthetic_row(plan, row, generator, cfg, train, metrics, epsilon=epsilon, corpus=corpus))
    for epsilon in cfg.direct_dp.epsilons:  # every method at the first epsilon before the next epsilon
        for method in cfg.direct_dp.methods:
            row, eps = f"{DIRECT_ROW_PREFIX}{method}-eps-{format_epsilon(epsilon)}", format_epsilon(epsilon)
            trained = plan.trained_row(
                row, f"direct DP {method} (epsilon={eps})",
                {"direct_dp": direct_dp_fingerprint(cfg.direct_dp.config(method, epsilon, cfg.unit)), "corpus": corpus,
                 **train}, metrics, done=MECHANISM_FILE, resumable=True)
            direct = DirectRow(trained.label, trained.retriever, trained.metrics, method, epsilon)
            choice = cfg.direct_dp.held_out_selection(method, epsilon, cfg.unit)
            if choice is not None:
                direct.selected = plan.trained_row(
                    f"{row}{SELECTED_SUFFIX}", f"direct DP {method}, chosen with DP on held-out units (epsilon={eps})",
                    {"private_selection": choice.model_dump(mode="json"), **train}, metrics, after=(trained.retriever,),
                    done=SELECTION_FILE)
            plan.direct.append(direct)
    if cfg.similarity.mauve:
        _mauve_stages(plan, {"similarity": cfg.similarity.model_dump(mode="json"), "train_split": cfg.train_split,
                             "data_hash": train["data_hash"]})
    return plan


def _mauve_stages(plan: StagePlan, fingerprint: dict) -> None:
    """A MAUVE stage (``<row>/mauve.json``) after every synthetic set of the plan: the public rows', the DP rows'
    and their filtered copies'."""
    for row in [*plan.public.values(), *plan.dp]:
        for synthetic in (row.synthetic, row.filtered.synthetic if row.filtered else None):
            if synthetic is not None:
                name = f"{synthetic.output.parent.name}/{MAUVE_FILE}"
                plan.mauve.append(plan.add(name, fingerprint, after=(synthetic,)))


def dp_start_examples(cfg: PipelineConfig, few_shot: list[tuple[str, str]] | None) -> list[tuple[str, str]] | None:
    """The few-shot examples the DP generators' prompts show (:mod:`privret.train.public_start`): with the prompted
    start and no warm start, the prompted row's (``few_shot``, so that before any private step the DP generator
    writes what that epsilon-0 row writes), else privret's generic ones; None for another start."""
    if cfg.generator.warm_start or cfg.generator.start != "prompted":
        return None
    return start_examples(few_shot)


def _synthetic_row(plan: StagePlan, row: str, generator: Stage, cfg: PipelineConfig, data: dict, metrics: dict, *,
                   epsilon: float | None = None, corpus: str = "") -> SyntheticRow:
    """The stages of ``row`` after its generator: synthetic set, retriever, metrics (and the filtered copy of a DP
    row's set, with ``synthetic_filter``).

    ``data``: what the synthetic set's fingerprint adds about the private data (nothing for a public row);
    ``corpus``: the hash of the corpus the filter searches.
    """
    synthetic = plan.add(f"{row}/{SYNTHETIC}", {"generate": cfg.generate.recorded(), **data},
                         after=(generator, plan.documents))
    retriever = {"retriever": cfg.retriever.model_dump(mode="json")}
    label = PUBLIC_ROWS[row] if epsilon is None else f"DP synthetic (epsilon={format_epsilon(epsilon)})"
    trained = plan.trained_row(row, label, retriever, metrics, after=(synthetic,))
    result = SyntheticRow(label, trained.retriever, trained.metrics, generator=generator, synthetic=synthetic,
                          epsilon=epsilon)
    if epsilon is not None and cfg.synthetic_filter is not None:
        name = f"{row}{FILTERED_SUFFIX}"
        filtered = plan.add(f"{name}/{SYNTHETIC}", {"synthetic_filter": cfg.synthetic_filter.model_dump(mode="json"),
                                                    "corpus": corpus}, after=(synthetic,))
        trained = plan.trained_row(name, f"DP synthetic, round-trip filtered (epsilon={format_epsilon(epsilon)})",
                                   retriever, metrics, after=(filtered,))
        result.filtered = FilteredRow(trained.label, trained.retriever, trained.metrics, synthetic=filtered)
    if epsilon is not None and cfg.private_selection is not None:
        candidates = (result.retriever,) + ((result.filtered.retriever,) if result.filtered else ())
        result.selected = plan.trained_row(
            f"{row}{SELECTED_SUFFIX}", f"DP synthetic, retriever chosen with DP (epsilon={format_epsilon(epsilon)}"
                                        f" + {format_epsilon(cfg.private_selection.epsilon)})",
            {"private_selection": cfg.private_selection.model_dump(mode="json"), "model": cfg.retriever.model,
             **data}, metrics, after=candidates, done=SELECTION_FILE)
    return result


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
                if key in RETIRED_SETTINGS and old[key] == RETIRED_SETTINGS[key]:
                    continue  # a retired setting recorded at the value every run has
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
                         "`run_dir`)", path=stage.record) from None


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
    return InputError(f"stage {message}; use another `run_dir`, or {redo} to redo it", path=stage.output,
                      field=fieldname)


def check_stages(plan: StagePlan) -> None:
    """Compare every finished stage with ``plan`` before any work; raise on the first stale one."""
    redo: set[str] = set()
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
            raise _stale(plan, stage, f"is finished but has no {stage.record.name} (made by a privret before stage "
                                      "records, or cut between its output and its record): its settings are unknown")
        found = first_difference(recorded, stage.fingerprint)
        if found:
            where, old, new = found
            raise _stale(plan, stage, f"made with other settings (was {_short(old)}, now {_short(new)})",
                         fieldname=where)
