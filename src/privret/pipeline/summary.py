"""The summary of a pipeline run: ``summary.json``, ``summary.md`` (Table 3 layout of Carranza et al., with
retention and the CI against zero-shot, and, when the run has rows made without private data, the CI
against the best of them: the epsilon = 0 bar a DP row must clear; then the query-ness of each synthetic set,
:mod:`privret.synth.queryness`, and its MAUVE against the private queries, an operator's measurement not covered by
DP) and ``budget.json`` (what releasing every row together costs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from privret.settings.pipeline import PipelineConfig
from privret.evaluate.statistics import (BAR_HEADER, COVERAGE, EXPLANATION, Versus, bar_sentence, precision_sentence,
                                        versus_bar, versus_zero_shot)
from privret.io import write_json_atomic, write_text_atomic
from privret.run_layout import (BUDGET_FILE, CHOICE, DIRECT_ROW_PREFIX, DOCUMENTS, DP_ROW_PREFIX, GENERATOR,
                                     RETRIEVER, SELECTED_SUFFIX, SUMMARY_FILE, SUMMARY_MARKDOWN, SYNTHETIC)
from privret.privacy.ledger_composition import run_composition, run_composition_sentence
from privret.privacy.ledger import LEDGER_FILE, format_epsilon
from privret.evaluate.similarity import MAUVE_HEADER, MAUVE_NOTE
from privret.synth.queryness import Queryness, synthetic_queryness

SUMMARY_COLUMNS = ("training data", "epsilon", "delta", "NDCG@10", "retention", "ΔNDCG@10 vs zero-shot [95% CI]",
                   "Recall@10", "Recall@100", "MRR@10")


@dataclass(frozen=True)
class _Comparisons:
    """Every row against zero-shot and against the epsilon = 0 bar (the best row made without private data,
    :func:`versus_bar`; ``bar`` None when the run has none), computed once per table: each is a bootstrap."""

    versus: dict[str, Versus]
    bar: dict | None
    against_bar: dict[str, Versus]

    @classmethod
    def of(cls, rows: list[dict]) -> _Comparisons:
        scores = {r["stage"]: (r["ndcg@10"], r["per_query"]) for r in rows}
        key, against_bar = versus_bar(scores, [r["stage"] for r in rows if r["epsilon"] == 0])
        return cls(versus_zero_shot(scores), next((r for r in rows if r["stage"] == key), None), against_bar)

    def columns(self) -> tuple[str, ...]:
        return SUMMARY_COLUMNS + ((BAR_HEADER,) if self.bar is not None else ())

    def note(self, rows: list[dict]) -> str | None:
        """:func:`~privret.evaluate.statistics.bar_sentence` for the run; None without an epsilon = 0 row."""
        if self.bar is None:
            return None
        return bar_sentence(self.bar["row"], self.bar["ndcg@10"],
                            [(r["row"], r["epsilon"], self.against_bar.get(r["stage"])) for r in rows])


def _summary_cells(rows: list[dict], compared: _Comparisons) -> list[list[str]]:
    """The cells of :meth:`_Comparisons.columns` for each row of :func:`privret.pipeline.run.run_pipeline`."""
    cells = []
    for r in rows:
        against = compared.versus[r["stage"]]
        against_bar = compared.against_bar.get(r["stage"])
        cells.append([r["row"], format_epsilon(r["epsilon"], digits=3),
                      "-" if r["delta"] in (None, 0.0) else f"{r['delta']:.2g}", f"{r['ndcg@10']:.4f}",
                      against.retention_text(), against.delta_text(), f"{r['recall@10']:.4f}",
                      f"{r['recall@100']:.4f}", f"{r['mrr@10']:.4f}"]
                     + ([against_bar.delta_text() if against_bar else "-"] if compared.bar else []))
    return cells


TERMINAL_COLUMNS = {"training data": "training data", "epsilon": "ε", "NDCG@10": "NDCG@10", "retention": "retention",
                    "ΔNDCG@10 vs zero-shot [95% CI]": "Δ vs zero-shot [95% CI]", BAR_HEADER: "Δ vs ε = 0 bar [95% CI]"}
"""The columns the terminal shows, by their summary.md header, with shorter headers (an 80-column terminal holds
them); summary.md has every column."""


def summary_table(rows: list[dict]) -> Table:
    """The summary for the terminal: :data:`TERMINAL_COLUMNS` of summary.md's table, numbers never wrapped or cut
    (the labels wrap instead)."""
    compared = _Comparisons.of(rows)
    sentence = compared.note(rows)
    table = Table(title="Retrieval on the evaluation split (Table 3 layout of Carranza et al.)",
                  caption=EXPLANATION + (f" {sentence}" if sentence else "") + " Every metric: summary.md.")
    columns = compared.columns()
    shown = [i for i, column in enumerate(columns) if column in TERMINAL_COLUMNS]
    for i in shown:
        label = columns[i] == "training data"
        table.add_column(TERMINAL_COLUMNS[columns[i]], justify="left" if label else "right", no_wrap=not label,
                         overflow="fold" if label else "ellipsis", ratio=1 if label else None)
    for cells in _summary_cells(rows, compared):
        table.add_row(*(cells[i] for i in shown))
    return table


def summary_markdown(rows: list[dict], cfg: PipelineConfig) -> str:
    compared = _Comparisons.of(rows)
    columns = compared.columns()
    lines = [f"# {cfg.name}: retrieval on `{cfg.eval_split}`", "", "| " + " | ".join(columns) + " |",
             "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(cells) + " |" for cells in _summary_cells(rows, compared)]
    lines += ["", EXPLANATION]
    if (sentence := compared.note(rows)) is not None:
        lines += ["", sentence]
    lines += ["", precision_sentence([(r["row"], r.get("precision")) for r in rows])]
    lines += ["", "Each DP row's (epsilon, delta) holds for that row alone, per privacy unit "
              f"'{cfg.unit.value}'; releasing several rows trained on the same data composes their budgets. "
              + COVERAGE]
    return "\n".join(lines) + "\n"


def synthetic_sets_queryness(run_dir: Path, rows: list[dict]) -> dict[str, Queryness]:
    """:func:`~privret.synth.queryness.synthetic_queryness` of the synthetic set of every row that trained on one,
    by its stage (the set alone: post-processing of its generator's release)."""
    return {r["stage"]: synthetic_queryness(run_dir / r["stage"] / SYNTHETIC) for r in rows
            if (run_dir / r["stage"] / SYNTHETIC / "manifest.json").is_file()}


def queryness_lines(rows: list[dict], measured: dict[str, Queryness], mauve: dict[str, dict]) -> list[str]:
    """The summary.md table of each synthetic set's query-ness, and its MAUVE against the private queries when the
    run measured it (:mod:`privret.pipeline.similarity`); empty without a synthetic set."""
    if not measured:
        return []
    lines = ["| synthetic set of | query-like | degenerate | outputs | degenerate outputs by reason |"
             + (f" {MAUVE_HEADER} |" if mauve else ""), "|---|---:|---:|---:|---|"
             + ("---:|" if mauve else "")]
    for r in rows:
        if (found := measured.get(r["stage"])) is not None:
            reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(found.reasons.items())) or "-"
            score = (f" {mauve[r['stage']]['mauve']:.4f} |" if r["stage"] in mauve else " - |") if mauve else ""
            lines.append(f"| {r['row']} | {found.query_like:.1%} | {found.degenerate:.1%} | {found.outputs} | "
                         f"{reasons} |{score}")
    return ["", f"Query-ness of each synthetic set, computed on the set alone (post-processing): query-like = one "
                f"sentence or question of at most {next(iter(measured.values())).max_words} words and not "
                "degenerate; degenerate = empty, one word, a copy of the document's title or first sentence or of "
                "a prompt's example query, or a repeated run (privret.synth.queryness); outputs generation dropped "
                "count in both." + (f" {MAUVE_NOTE}" if mauve else ""), ""] + lines


def run_releases(run_dir: Path) -> list[tuple[str, Path]]:
    """The releases of a run directory, each once: (row, directory holding its ledger).

    They are the DP document selection (``documents``, if any), the generators (``eps-*/generator``;
    the synthetic sets and retrievers derived from one carry its ledger, composed with the
    selection's, and are post-processing of them, so they are not counted again) and the direct DP
    retrievers (``direct-*/retriever``) and the DP choices of retriever (``eps-*-selected/choice`` and
    ``direct-*-selected/choice``: the choice alone; the chosen retriever's own ledger composes it with the
    generator's or the direct retriever's). Every row in the directory
    counts, also one that the current config no longer has: it was made, and may have been released.
    """
    direct = [path for path in sorted(run_dir.glob(f"{DIRECT_ROW_PREFIX}*/{RETRIEVER}/{LEDGER_FILE}"))
              if not path.parent.parent.name.endswith(SELECTED_SUFFIX)]
    ledgers = (sorted(run_dir.glob(f"{DOCUMENTS}/{LEDGER_FILE}"))
               + sorted(run_dir.glob(f"{DP_ROW_PREFIX}*/{GENERATOR}/{LEDGER_FILE}"))
               + sorted(run_dir.glob(f"{DP_ROW_PREFIX}*{SELECTED_SUFFIX}/{CHOICE}/{LEDGER_FILE}"))
               + direct + sorted(run_dir.glob(f"{DIRECT_ROW_PREFIX}*{SELECTED_SUFFIX}/{CHOICE}/{LEDGER_FILE}")))
    return [(path.relative_to(run_dir).parts[0], path.parent) for path in ledgers]


def write_summary(run_dir: Path, rows: list[dict], cfg: PipelineConfig, mauve: dict[str, dict]) -> None:
    """``summary.json`` (each row's figures; no per-query scores and no timing, which the report shows only when
    asked: ``privret report --show-private-timings-and-counts``), ``budget.json`` and ``summary.md``. ``mauve``: the
    MAUVE of each synthetic set against the private queries, by row (:func:`privret.pipeline.similarity.mauve_stages`;
    not DP, so summary.md's legend says so)."""
    measured = synthetic_sets_queryness(run_dir, rows)
    write_json_atomic(run_dir / SUMMARY_FILE, [
        {**{k: v for k, v in r.items() if k not in ("per_query", "eval_seconds")},
         **({"queryness": measured[r["stage"]].as_dict()} if r["stage"] in measured else {}),
         **({"mauve_vs_private_queries": mauve[r["stage"]]} if r["stage"] in mauve else {})} for r in rows])
    joint = run_composition(run_releases(run_dir))  # what releasing every row together costs (docs/reliability.md)
    write_json_atomic(run_dir / BUDGET_FILE, joint)
    write_text_atomic(run_dir / SUMMARY_MARKDOWN, summary_markdown(rows, cfg) + "\n".join(
        queryness_lines(rows, measured, mauve) + ["", run_composition_sentence(joint), ""]))
