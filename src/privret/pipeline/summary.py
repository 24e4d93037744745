"""The summary of a pipeline run: ``summary.json``, ``summary.md`` (the seed's Table 3 layout, with
retention and the CI against zero-shot) and ``budget.json`` (what releasing every row together costs)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from privret.config import PipelineConfig
from privret.evaluate.statistics import EXPLANATION, versus_zero_shot
from privret.io import write_json_atomic, write_text_atomic
from privret.run_layout import (BUDGET_FILE, CHOICE, DIRECT_ROW_PREFIX, DOCUMENTS, DP_ROW_PREFIX, GENERATOR,
                                     RETRIEVER, SELECTED_SUFFIX, SUMMARY_FILE, SUMMARY_MARKDOWN)
from privret.privacy.budget import run_composition, run_composition_sentence
from privret.privacy.ledger import LEDGER_FILE, format_epsilon

SUMMARY_COLUMNS = ("training data", "epsilon", "delta", "NDCG@10", "retention", "ΔNDCG@10 vs zero-shot [95% CI]",
                   "Recall@10", "Recall@100", "MRR@10")


def _summary_cells(rows: list[dict]) -> list[list[str]]:
    """The cells of :data:`SUMMARY_COLUMNS` for each row of :func:`privret.pipeline.run.run_pipeline`."""
    versus = versus_zero_shot({r["stage"]: (r["ndcg@10"], r["per_query"]) for r in rows})
    cells = []
    for r in rows:
        against = versus[r["stage"]]
        cells.append([r["row"], format_epsilon(r["epsilon"], digits=3),
                      "-" if r["delta"] in (None, 0.0) else f"{r['delta']:.2g}", f"{r['ndcg@10']:.4f}",
                      against.retention_text(), against.delta_text(), f"{r['recall@10']:.4f}",
                      f"{r['recall@100']:.4f}", f"{r['mrr@10']:.4f}"])
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


def run_releases(run_dir: Path) -> list[tuple[str, Path]]:
    """The releases of a run directory, each once: (row, directory holding its ledger).

    They are the DP document selection (``documents``, if any), the generators (``eps-*/generator``;
    the synthetic sets and retrievers derived from one carry its ledger, composed with the
    selection's, and are post-processing of them, so they are not counted again) and the direct DP
    retrievers (``direct-*/retriever``) and the DP choices of retriever (``eps-*-selected/choice``: the choice
    alone; the chosen retriever's own ledger composes it with the generator's). Every row in the directory
    counts, also one that the current config no longer has: it was made, and may have been released.
    """
    ledgers = (sorted(run_dir.glob(f"{DOCUMENTS}/{LEDGER_FILE}"))
               + sorted(run_dir.glob(f"{DP_ROW_PREFIX}*/{GENERATOR}/{LEDGER_FILE}"))
               + sorted(run_dir.glob(f"{DP_ROW_PREFIX}*{SELECTED_SUFFIX}/{CHOICE}/{LEDGER_FILE}"))
               + sorted(run_dir.glob(f"{DIRECT_ROW_PREFIX}*/{RETRIEVER}/{LEDGER_FILE}")))
    return [(path.relative_to(run_dir).parts[0], path.parent) for path in ledgers]


def write_summary(run_dir: Path, rows: list[dict], cfg: PipelineConfig) -> None:
    write_json_atomic(run_dir / SUMMARY_FILE, [{k: v for k, v in r.items() if k != "per_query"} for r in rows])
    joint = run_composition(run_releases(run_dir))  # what releasing every row together costs (docs/reliability.md)
    write_json_atomic(run_dir / BUDGET_FILE, joint)
    write_text_atomic(run_dir / SUMMARY_MARKDOWN,
                      summary_markdown(rows, cfg) + "\n" + run_composition_sentence(joint) + "\n")
