"""The whole grid in one run directory: zero-shot, original pairs, and DP synthetic per epsilon.

Layout of ``RUN_DIR``::

    zero_shot/metrics.json
    original/retriever/            (SentenceTransformer + ledger: non-private)
    original/metrics.json
    eps-<e>/generator/             (fine-tuned generator + privacy ledger)
    eps-<e>/synthetic/             (BEIR dataset + manifest carrying the ledger)
    eps-<e>/retriever/
    eps-<e>/metrics.json
    eps-<e>-filtered/synthetic/    (with ``synthetic_filter``: the round-trip-filtered set, same ledger)
    eps-<e>-filtered/retriever/, eps-<e>-filtered/metrics.json
    direct-<method>-eps-<e>/retriever/   (direct DP training on the original pairs, with its ledger)
    direct-<method>-eps-<e>/metrics.json
    summary.json, summary.md       (the seed's Table 3 layout)

Each stage writes its output atomically, so a finished stage is skipped on re-run and an
interrupted one resumes (generator checkpoints, partial generation).
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from privret.config import PipelineConfig
from privret.data.beir import BeirDataset, load_beir
from privret.data.pairs import TrainingPairs, pairs_from_beir
from privret.evaluate.retrieval import evaluate_retriever
from privret.io import file_sha256, write_json_atomic, write_text_atomic
from privret.models.encoder import load_encoder
from privret.privacy.budget import BudgetPolicy, run_composition, run_composition_sentence
from privret.privacy.ledger import PrivacyLedger
from privret.runlock import RunLock, recover_tree
from privret.synth.filter import filter_round_trip
from privret.synth.generate import generate_synthetic
from privret.train.dp_retriever import train_dp_retriever
from privret.train.generator import train_generator
from privret.train.retriever import train_retriever

console = Console(stderr=True)


def eps_label(epsilon: float) -> str:
    return "inf" if math.isinf(epsilon) else f"{epsilon:g}"


def dataset_hash(dataset: BeirDataset, split: str) -> str:
    """Identity of the private data: the queries file and the training qrels."""
    root = dataset.root
    return file_sha256(root / "queries.jsonl", root / "qrels" / f"{split}.tsv")


def non_private_ledger(pairs: TrainingPairs, model: str, data_hash: str, unit: str) -> PrivacyLedger:
    return PrivacyLedger(mechanism="none", epsilon=math.inf, delta=0.0, noise_multiplier=0.0, sample_rate=1.0, steps=0,
                         planned_steps=0, accountant="none", unit=unit, n_units=len(pairs.units(unit)),
                         n_pairs=len(pairs.pairs), clip_norm=math.inf, model=model, trainable="all",
                         data_hash=data_hash)


def _evaluate_stage(out: Path, model_name: str, dataset: BeirDataset, split: str, extra: dict) -> dict:
    path = out / "metrics.json"
    if path.exists():
        import json

        return json.loads(path.read_text())
    started = time.time()
    model = load_encoder(model_name)
    metrics = evaluate_retriever(model, dataset.corpus, dataset.queries, dataset.split(split))
    result = {**extra, **metrics, "eval_seconds": round(time.time() - started, 1)}
    write_json_atomic(path, result)
    return result


def _exclusive_run_dir(run):
    """Hold the run directory's lock (:class:`privret.runlock.RunLock`) for the whole call."""

    @functools.wraps(run)
    def locked(cfg, run_dir, *args, **kwargs):
        with RunLock(run_dir, what="run directory"):
            recover_tree(run_dir)  # stale staging directories and cut swaps left by a killed run
            return run(cfg, run_dir, *args, **kwargs)

    return locked


@_exclusive_run_dir
def run_pipeline(cfg: PipelineConfig, run_dir: str | Path, *, budget: BudgetPolicy | None = None) -> list[dict]:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / "config.json", cfg.model_dump(mode="json"))
    dataset = load_beir(cfg.dataset, splits=[cfg.train_split, cfg.eval_split])
    pairs = pairs_from_beir(dataset, cfg.train_split)
    data_hash = dataset_hash(dataset, cfg.train_split)
    unit = cfg.unit.value
    rows = []

    console.rule("zero-shot encoder")
    zero = _evaluate_stage(run_dir / "zero_shot", cfg.retriever.model, dataset, cfg.eval_split,
                           {"row": "zero-shot", "epsilon": None, "delta": None})
    rows.append(zero)

    console.rule("retriever on the original (private) pairs, non-private")
    original = run_dir / "original"
    if not (original / "retriever").exists():
        started = time.time()
        train_retriever(pairs, original / "retriever", cfg.retriever,
                        ledger=non_private_ledger(pairs, cfg.retriever.model, data_hash, unit))
        write_json_atomic(original / "timing.json", {"retriever_seconds": round(time.time() - started, 1)})
    rows.append(_evaluate_stage(original, str(original / "retriever"), dataset, cfg.eval_split,
                                {"row": "original pairs (non-private)", "epsilon": math.inf, "delta": 0.0}))

    documents = _synthetic_documents(cfg, dataset, pairs)
    for epsilon in cfg.epsilons:
        stage = run_dir / f"eps-{eps_label(epsilon)}"
        console.rule(f"DP synthetic queries, epsilon = {eps_label(epsilon)}")
        timing = {}
        if not (stage / "generator" / "generator.json").exists():
            started = time.time()
            train_generator(pairs, stage / "generator", cfg.generator_config(epsilon), data_hash=data_hash,
                            resume=True, budget=budget)
            timing["generator_seconds"] = round(time.time() - started, 1)
        if not (stage / "synthetic").exists():
            started = time.time()
            generate_synthetic(stage / "generator", documents, stage / "synthetic", cfg.generate,
                               private_queries={p.query for p in pairs.pairs}, resume=True)
            timing["generate_seconds"] = round(time.time() - started, 1)
        timing.update(_train_on_synthetic(stage / "synthetic", stage / "retriever", cfg))
        _add_timing(stage, timing)
        ledger = PrivacyLedger.load(stage / "generator")
        rows.append(_evaluate_stage(stage, str(stage / "retriever"), dataset, cfg.eval_split,
                                    {"row": f"DP synthetic (epsilon={eps_label(epsilon)})",
                                     "epsilon": ledger.epsilon, "delta": ledger.delta}))
        if cfg.synthetic_filter is not None:
            filtered = run_dir / f"eps-{eps_label(epsilon)}-filtered"
            console.rule(f"DP synthetic queries, round-trip filtered, epsilon = {eps_label(epsilon)}")
            timing = {}
            if not (filtered / "synthetic").exists():
                started = time.time()
                filter_round_trip(stage / "synthetic", dataset.corpus, filtered / "synthetic", cfg.synthetic_filter)
                timing["filter_seconds"] = round(time.time() - started, 1)
            timing.update(_train_on_synthetic(filtered / "synthetic", filtered / "retriever", cfg))
            _add_timing(filtered, timing)
            rows.append(_evaluate_stage(filtered, str(filtered / "retriever"), dataset, cfg.eval_split,
                                        {"row": f"DP synthetic, round-trip filtered (epsilon={eps_label(epsilon)})",
                                         "epsilon": ledger.epsilon, "delta": ledger.delta}))
    for epsilon in cfg.direct_dp.epsilons:  # every method at the first epsilon before the next epsilon
        for method in cfg.direct_dp.methods:
            stage = run_dir / f"direct-{method}-eps-{eps_label(epsilon)}"
            console.rule(f"direct DP training of the retriever: {method}, epsilon = {eps_label(epsilon)}")
            if not (stage / "retriever").exists():
                started = time.time()
                train_dp_retriever(pairs, stage / "retriever", cfg.direct_dp.config(method, epsilon, cfg.unit),
                                   data_hash=data_hash, public_corpus=dataset.corpus)
                write_json_atomic(stage / "timing.json", {"retriever_seconds": round(time.time() - started, 1)})
            ledger = PrivacyLedger.load(stage / "retriever")
            rows.append(_evaluate_stage(stage, str(stage / "retriever"), dataset, cfg.eval_split,
                                        {"row": f"direct DP {method} (epsilon={eps_label(epsilon)})",
                                         "epsilon": ledger.epsilon, "delta": ledger.delta}))
    write_summary(run_dir, rows, cfg)
    return rows


def _train_on_synthetic(synthetic_dir: Path, out: Path, cfg: PipelineConfig) -> dict:
    """Train the retriever on a synthetic set unless done; its ledger is the set's (post-processing)."""
    if out.exists():
        return {}
    started = time.time()
    synthetic = load_beir(synthetic_dir, splits=["train"])
    train_retriever(pairs_from_beir(synthetic, "train"), out, cfg.retriever, ledger=PrivacyLedger.load(synthetic_dir))
    return {"retriever_seconds": round(time.time() - started, 1)}


def _add_timing(stage: Path, timing: dict) -> None:
    """Merge this call's stage times into ``stage/timing.json`` (a resumed stage keeps the others)."""
    if timing:
        write_json_atomic(stage / "timing.json", {**_read_json(stage / "timing.json"), **timing})


def _read_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text()) if path.exists() else {}


def _synthetic_documents(cfg: PipelineConfig, dataset: BeirDataset, pairs: TrainingPairs):
    if cfg.synthetic_documents == "corpus":
        return list(dataset.corpus.values())
    seen = dict.fromkeys(p.doc_id for p in pairs.pairs)
    return [dataset.corpus[d] for d in seen]


def _fmt_eps(value) -> str:
    if value is None:
        return "-"
    return "inf" if math.isinf(value) else f"{value:.3g}"


def summary_table(rows: list[dict]) -> Table:
    table = Table(title="Retrieval on the evaluation split (seed Table 3 layout)")
    for column in ("training data", "epsilon", "delta", "NDCG@10", "Recall@10", "Recall@100", "MRR@10"):
        table.add_column(column, justify="left" if column == "training data" else "right")
    for r in rows:
        table.add_row(r["row"], _fmt_eps(r["epsilon"]), "-" if r["delta"] in (None, 0.0) else f"{r['delta']:.2g}",
                      f"{r['ndcg@10']:.4f}", f"{r['recall@10']:.4f}", f"{r['recall@100']:.4f}", f"{r['mrr@10']:.4f}")
    return table


def summary_markdown(rows: list[dict], cfg: PipelineConfig) -> str:
    lines = [f"# {cfg.name}: retrieval on `{cfg.eval_split}`", "",
             "| training data | epsilon | delta | NDCG@10 | Recall@10 | Recall@100 | MRR@10 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        delta = "-" if r["delta"] in (None, 0.0) else f"{r['delta']:.2g}"
        lines.append(f"| {r['row']} | {_fmt_eps(r['epsilon'])} | {delta} | {r['ndcg@10']:.4f} | "
                     f"{r['recall@10']:.4f} | {r['recall@100']:.4f} | {r['mrr@10']:.4f} |")
    lines += ["", "Each DP row's (epsilon, delta) holds for that row alone, per privacy unit "
              f"'{cfg.unit.value}'; releasing several rows trained on the same data composes their budgets."]
    return "\n".join(lines) + "\n"


def write_summary(run_dir: Path, rows: list[dict], cfg: PipelineConfig) -> None:
    write_json_atomic(run_dir / "summary.json", rows)
    joint = run_composition(run_dir)  # what releasing every row together costs (docs/reliability.md)
    write_json_atomic(run_dir / "budget.json", joint)
    write_text_atomic(run_dir / "summary.md", summary_markdown(rows, cfg) + "\n" + run_composition_sentence(joint) + "\n")
