"""Running a grid (:func:`run_pipeline`): every stage of the plan (:mod:`privret.pipeline.stages`) not yet done,
row by row (:mod:`privret.pipeline.rows`), then the MAUVE of each synthetic set (:mod:`privret.pipeline.similarity`)
and the summary (:mod:`privret.pipeline.summary`).

The run directory is locked for the whole run. Nothing is written before the config has passed
:mod:`privret.pipeline.preflight` and every finished stage has been checked against the config
(:func:`~privret.pipeline.stages.check_stages`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

from privret.chatter import RUN_LOG, also_log_to
from privret.data.beir import dataset_hash, eval_hash, load_beir
from privret.data.pairs import pairs_from_beir
from privret.io import file_sha256, write_json_atomic
from privret.models.device import use_device
from privret.pipeline.preflight import check_dp_budgets, check_settings_split, check_starting_models
from privret.pipeline.rows import (Run, console, direct_row, original_row, public_row, selected_row,
                                   synthetic_documents, synthetic_row)
from privret.pipeline.similarity import mauve_stages
from privret.pipeline.stages import check_stages, dp_start_examples, plan_stages
from privret.pipeline.summary import write_summary
from privret.privacy.budget import dataset_id
from privret.privacy.ledger import format_epsilon, has_ledger
from privret.run_layout import CONFIG_FILE, PUBLIC_PAIRS, PUBLIC_PROMPTED
from privret.runlock import RunLock, recover_tree
from privret.settings.pipeline import PipelineConfig
from privret.train.generator import train_generator
from privret.train.public import train_public_generator, write_prompted_generator


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
    check_starting_models(cfg)
    dataset = load_beir(cfg.dataset, splits=[cfg.train_split, cfg.eval_split])
    check_settings_split(cfg, dataset)
    pairs = pairs_from_beir(dataset, cfg.train_split)
    check_dp_budgets(cfg, pairs)
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
    rows.append(original_row(run, plan.original))
    documents, selection = synthetic_documents(plan.documents, run)
    public = cfg.public_rows
    if public.prompted:
        rows += public_row(run, plan.public[PUBLIC_PROMPTED], lambda out: write_prompted_generator(
            cfg.generator.model, few_shot, out, unit=cfg.unit.value,
            max_doc_tokens=cfg.generator.max_doc_tokens, max_query_tokens=cfg.generator.max_query_tokens), documents)
    if public.public_pairs is not None:
        rows += public_row(run, plan.public[PUBLIC_PAIRS], lambda out: train_public_generator(
            public.public_pairs, out, cfg.generator_config(math.inf), resume=True), documents)
    warm_start = plan.public[PUBLIC_PAIRS].generator.output if cfg.generator.warm_start else None
    for row in plan.dp:
        console.rule(f"DP synthetic queries, epsilon = {format_epsilon(row.epsilon)}")
        rows += synthetic_row(run, row, lambda out, epsilon=row.epsilon: train_generator(
            pairs, out, cfg.generator_config(epsilon), data_hash=data_hash, dataset_id=run.charged_to, resume=True,
            budget=run.budget, warm_start=warm_start, public_examples=dp_start_examples(cfg, few_shot)), documents,
            selection=selection,
            private_copies={p.query for p in pairs.pairs} if math.isinf(row.epsilon) else None)
    for row in plan.direct:
        console.rule(f"direct DP training of the retriever: {row.method}, epsilon = {format_epsilon(row.epsilon)}")
        rows.append(direct_row(run, row))
        if row.selected is not None:
            console.rule(f"DP choice on the held-out units: {row.method}, epsilon = {format_epsilon(row.epsilon)}")
            choice = run.cfg.direct_dp.held_out_selection(row.method, row.epsilon, run.cfg.unit)
            rows.append(selected_row(run, row.selected, choice))
    write_summary(run_dir, rows, cfg, mauve_stages(run, plan.mauve))
    return rows
