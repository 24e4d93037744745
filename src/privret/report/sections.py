"""The report's sections as HTML: retrieval table and its notes, zero-shot across datasets, similarity,
canary audit, example queries and privacy ledgers (:mod:`privret.report.render` lays them out).
"""

from __future__ import annotations

import math

from privret.evaluate.statistics import BAR_HEADER, bar_sentence, precision_sentence
from privret.report.cells import (delta_cell, epsilon_cell, epsilon_value, escape, html_table, number_cell,
                                  unit_cell)
from privret.report.collect import Row, RunData

RETRIEVAL_HEADERS = ["training data", "ε", "δ", "unit", "NDCG@10", "retention", "ΔNDCG@10 vs zero-shot [95% CI]",
                     "Recall@10", "Recall@100", "MRR@10"]
LEDGER_FIELDS = ("mechanism", "epsilon", "delta", "unit", "n_units", "n_pairs", "noise_multiplier", "sample_rate",
                 "steps", "clip_norm", "accountant", "model", "trainable", "data_hash", "dataset_id",
                 "created_at")


def retrieval_headers(run: RunData) -> list[str]:
    return RETRIEVAL_HEADERS + ([BAR_HEADER] if run.bar is not None else [])


def retrieval_rows(run: RunData) -> list[list[str]]:
    out = []
    for r in run.rows:
        versus = run.versus[r.key]
        against_bar = [run.versus_bar[r.key].delta_text() if r.key in run.versus_bar else "-"] if run.bar else []
        out.append([escape(r.label), epsilon_cell(r.epsilon), delta_cell(r), escape(unit_cell(r)),
                    number_cell(r.metrics.get("ndcg@10")), versus.retention_text(), versus.delta_text()]
                   + [number_cell(r.metrics.get(m)) for m in ("recall@10", "recall@100", "mrr@10")] + against_bar)
    return out


def precision_note(run: RunData) -> str:
    return precision_sentence([(r.label, r.metrics.get("precision")) for r in run.rows])


def bar_note(run: RunData) -> str | None:
    """:func:`~privret.evaluate.statistics.bar_sentence` for the run's DP rows; None without an epsilon = 0 row."""
    if run.bar is None:
        return None
    bar = next(r for r in run.rows if r.key == run.bar)
    return bar_sentence(bar.label, float(bar.metrics["ndcg@10"]),
                        [(r.label, r.epsilon, run.versus_bar.get(r.key)) for r in run.rows])


def zero_shot_section(run: RunData) -> str:
    parts = []
    for result in run.zero_shot_datasets:
        names = list(result["datasets"])
        for metric in ("ndcg@10", "recall@10"):
            rows = [[escape(row.get("source", row.get("model", "?"))), epsilon_cell(epsilon_value(row.get("epsilon")))]
                    + [number_cell((row["metrics"].get(d) or {}).get(metric)) for d in names] for row in result["rows"]]
            parts.append(f"<p class='muted'>{escape(metric.upper())}, split <code>{escape(result.get('split', '?'))}"
                         f"</code> (from <code>{escape(result['file'])}</code>)</p>")
            parts.append(html_table(["source", "ε"] + names, rows, set(range(1, len(names) + 2))))
    return "".join(parts)


def similarity_section(run: RunData) -> str:
    """BLEU and MAUVE per synthetic set; the count of its queries paired with private ones (a count of the private
    log's queries per document) only with the run's private counts."""
    pairs = run.private_timings_and_counts
    rows = [[escape(s["label"]), epsilon_cell(s["epsilon"]), number_cell(s["bleu"]), number_cell(s["mauve"])]
            + ([escape(s.get("pairs") or "-")] if pairs else []) + [escape(s.get("featurizer") or "-")]
            for s in run.similarity]
    return html_table(["synthetic set", "ε", "BLEU", "MAUVE", *(["pairs"] if pairs else []), "MAUVE featuriser"], rows,
                  set(range(1, 5 if pairs else 4)))


def canary_rows(canaries: dict) -> list[list[str]]:
    m = canaries.get("candidates", 100)
    out = []
    for res in canaries["results"]:
        for r in res.get("rows", []):
            k = r["repetitions"]
            bound = r.get("epsilon_lower_bound")
            bound_text = "-" if bound is None else f"{bound:.3g}"
            if bound is not None and not r.get("comparable_to_ledger"):
                bound_text += " (group)"
            out.append([escape(res.get("epsilon")), "0 (control)" if k == 0 else str(k), str(r["canaries"]),
                        f"{r['rank_mean']:.1f}/{m} ± {r['rank_std']:.1f}",
                        f"{r['exposure_mean']:.2f} ± {r['exposure_std']:.2f}",
                        f"{r['extracted_fraction']:.0%}", f"{r['leaked_fraction']:.0%}", bound_text,
                        escape(res.get("unit", "?"))])
    return out


def canary_section(run: RunData) -> str:
    c = run.canaries
    headers = ["ε (target)", "repetitions", "canaries", "rank of secret", "exposure (bits)", "rank 1",
               "leaked", "ε lower bound", "unit"]
    sub = c.get("subsample")
    pairs = (f" Private pairs: {c.get('pairs')}{' (subsample)' if sub else ''} of {c.get('pairs_available')}."
             if run.private_timings_and_counts else "")
    intro = (f"<p class='muted'>Canary exposure audit (Carlini et al. 2019; seed §6.3): {c.get('trials')} trial(s), "
             f"{len(c.get('kinds', []))} kinds, secret ranked among {c.get('candidates')} candidates by the "
             f"generator's likelihood; leaked = secret in {c.get('samples')} sampled queries of the canary's "
             f"document; ε lower bound at {1 - c.get('alpha', 0.05):.0%} confidence. Aggregates of an audit of the "
             f"private log, not covered by the DP guarantee.{pairs}</p>")
    return intro + html_table(headers, canary_rows(c), {2, 3, 4, 5, 6, 7})


def examples_section(run: RunData) -> str:
    ex = run.examples
    if ex is None:
        return ""
    parts = []
    if ex.hidden_labels:
        hidden = ", ".join(escape(h) for h in ex.hidden_labels)
        parts.append(f"<p class='warn'>Examples of ε = {hidden} are not shown: "
                     "that generator was trained without DP and its output may reproduce private queries. "
                     "Pass <code>--show-private-queries</code> to include them.</p>")
    if not ex.documents:
        return "".join(parts)
    labels = sorted(ex.synthetic, key=lambda k: -math.inf if k == "inf" else -float(k))
    headers = ["document"] + ([] if ex.originals is None else ["original query (private)"]) + \
        [f"synthetic, ε={'∞' if k == 'inf' else k}" for k in labels]
    rows = []
    for doc in ex.documents:
        text = doc["text"] if len(doc["text"]) <= 280 else doc["text"][:280] + "…"
        cell = (f"<b>{escape(doc['title'])}</b><br>" if doc["title"] else "") + escape(text)
        row = [cell]
        if ex.originals is not None:
            row.append("<br>".join(escape(q) for q in ex.originals.get(doc["id"], [])) or "-")
        row += ["<br>".join(escape(q) for q in ex.synthetic[k].get(doc["id"], [])) or "-" for k in labels]
        rows.append(row)
    if ex.originals is not None:
        parts.append("<p class='warn'>This page shows original private queries (--show-private-queries): "
                     "do not share it beyond those allowed to see the private data.</p>")
    parts.append(html_table(headers, rows))
    return "".join(parts)


def ledger_section(run: RunData) -> str:
    parts = []
    for r in run.rows:
        if r.method == "zero-shot":
            parts.append(f"<details><summary>{escape(r.label)}: no private data used</summary></details>")
            continue
        if r.ledger is None:
            parts.append(f"<details open><summary>{escape(r.label)}: <b>no ledger found</b></summary></details>")
            continue
        rows = [[escape(k), escape(_ledger_value(k, r.ledger[k]))] for k in _ledger_fields(run, r)
                if r.ledger.get(k) is not None]
        summary = ledger_summary(r.ledger)
        parts.append(f"<details><summary>{escape(r.label)}: {escape(summary)}</summary>"
                     f"<p class='muted'>{escape(r.ledger_source)}</p>{html_table(['field', 'value'], rows)}</details>")
    return "".join(parts)


def _ledger_fields(run: RunData, row: Row) -> tuple[str, ...]:
    """:data:`LEDGER_FIELDS` of ``row``'s ledger shown: its pair count only when it counts public data (a row made
    without private data) or the run shows its private counts (a DP ledger withholds it anyway)."""
    if row.epsilon == 0 or run.private_timings_and_counts:
        return LEDGER_FIELDS
    return tuple(k for k in LEDGER_FIELDS if k != "n_pairs")


def _ledger_value(key: str, value) -> str:
    if key in ("data_hash", "dataset_id") and isinstance(value, str) and len(value) > 23:
        return value[:23] + "…"  # enough to tell two hashes apart
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.6g}"
    return str(value)


def ledger_summary(ledger: dict) -> str:
    eps = ledger.get("epsilon")
    if eps is None or math.isinf(eps):
        return f"non-private (ε = ∞), unit {ledger.get('unit', '?')}, n = {ledger.get('n_units', '?')}"
    return (f"({eps:.3g}, {ledger.get('delta', 0):.2g})-DP per {ledger.get('unit', '?')}, "
            f"σ = {ledger.get('noise_multiplier', 0):.3g}, q = {ledger.get('sample_rate', 0):.3g}, "
            f"steps = {ledger.get('steps', '?')}, C = {ledger.get('clip_norm', '?')}, {ledger.get('accountant', '?')}")
