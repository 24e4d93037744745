"""HTML (self-contained) and Markdown renderings of a run's results, and its privacy-utility JSON.

The HTML page loads nothing: its style sheet is inline, the plot is a ``data:image/png;base64``
URI, there is no script, no font, no link to any other file. Every text taken from the run
(labels, document text, queries) is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import math
from datetime import datetime, timezone
from pathlib import Path

from privret.errors import InputError
from privret.evaluate.statistics import (BAR_HEADER, COVERAGE, EXPLANATION, ORIGINAL, ZERO_SHOT, bar_sentence,
                                        mean_sd, precision_sentence)
from privret.privacy.ledger import format_epsilon
from privret.report.collect import Row, RunData
from privret.report.cost import STAGES, added_cost, added_cost_sentence, minutes, private_stages, stage_seconds
from privret.report.plot import method_label, privacy_utility_png

RETRIEVAL_HEADERS = ["training data", "ε", "δ", "unit", "NDCG@10", "retention", "ΔNDCG@10 vs zero-shot [95% CI]",
                     "Recall@10", "Recall@100", "MRR@10"]
LEDGER_FIELDS = ("mechanism", "epsilon", "delta", "unit", "n_units", "n_pairs", "noise_multiplier", "sample_rate",
                 "steps", "clip_norm", "accountant", "model", "trainable", "data_hash", "dataset_id",
                 "created_at")

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:2em auto;max-width:1100px;
color:#222;line-height:1.45;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}th,td{border:1px solid #ccc;padding:.3em .6em;
vertical-align:top}th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#666;font-size:.9em}.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.5em .8em}
figure{margin:0}figure img{max-width:100%;height:auto;border:1px solid #eee}
code{background:#f5f5f5;padding:0 .2em}details{margin:.4em 0}summary{cursor:pointer}
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _eps(value) -> str:
    return format_epsilon(value, digits=3, infinity="∞")


def _delta(row: Row) -> str:
    d = (row.ledger or {}).get("delta")
    if d in (None, 0, 0.0) or row.epsilon is None or math.isinf(row.epsilon):
        return "-"
    return f"{d:.2g}"


def _unit(row: Row) -> str:
    if row.method == "zero-shot":
        return "-"
    return str((row.ledger or {}).get("unit", "?"))


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# -- sections -----------------------------------------------------------------------------------
def _retrieval_headers(run: RunData) -> list[str]:
    return RETRIEVAL_HEADERS + ([BAR_HEADER] if run.bar is not None else [])


def _retrieval_rows(run: RunData) -> list[list[str]]:
    out = []
    for r in run.rows:
        versus = run.versus[r.key]
        against_bar = [run.versus_bar[r.key].delta_text() if r.key in run.versus_bar else "-"] if run.bar else []
        out.append([_e(r.label), _eps(r.epsilon), _delta(r), _e(_unit(r)), _num(r.metrics.get("ndcg@10")),
                    versus.retention_text(), versus.delta_text()]
                   + [_num(r.metrics.get(m)) for m in ("recall@10", "recall@100", "mrr@10")] + against_bar)
    return out


def _precision_note(run: RunData) -> str:
    return precision_sentence([(r.label, r.metrics.get("precision")) for r in run.rows])


def _bar_note(run: RunData) -> str | None:
    """:func:`~privret.evaluate.statistics.bar_sentence` for the run's DP rows; None without an epsilon = 0 row."""
    if run.bar is None:
        return None
    bar = next(r for r in run.rows if r.key == run.bar)
    return bar_sentence(bar.label, float(bar.metrics["ndcg@10"]),
                        [(r.label, r.epsilon, run.versus_bar.get(r.key)) for r in run.rows])


def _zero_shot_section(run: RunData) -> str:
    parts = []
    for result in run.zero_shot_datasets:
        names = list(result["datasets"])
        for metric in ("ndcg@10", "recall@10"):
            rows = [[_e(row.get("source", row.get("model", "?"))), _eps(_f(row.get("epsilon")))]
                    + [_num((row["metrics"].get(d) or {}).get(metric)) for d in names] for row in result["rows"]]
            parts.append(f"<p class='muted'>{_e(metric.upper())}, split <code>{_e(result.get('split', '?'))}"
                         f"</code> (from <code>{_e(result['file'])}</code>)</p>")
            parts.append(_table(["source", "ε"] + names, rows, set(range(1, len(names) + 2))))
    return "".join(parts)


def _f(value):
    if value is None:
        return None
    if isinstance(value, str):
        return math.inf if value in ("inf", "Infinity") else float(value)
    return float(value)


def _wall_time(run: RunData) -> tuple[list[str], list[list[str]], list[str]] | None:
    """The wall-time table (headers, cells) and a sentence per epsilon on what the epsilon-0 rows add
    (:mod:`privret.report.cost`); None when no row was timed. The times :func:`_withheld` names, the totals that
    add them up and the sentences, which sum them, give way to :data:`PRIVATE_TIMINGS_NOTE`."""
    seconds = {r.key: stage_seconds(r) for r in run.rows}
    if all(s is None for s in seconds.values()):
        return None
    stages = [s for s in STAGES if any(t and s in t for t in seconds.values())]
    withheld = {r.key: _withheld(run, r, seconds[r.key]) for r in run.rows}
    cells = [[_e(r.label)] + (["-"] * len(stages) + ["not timed"] if seconds[r.key] is None else
                              _timed_cells(seconds[r.key], stages, withheld[r.key]))
             for r in run.rows]
    notes = ([PRIVATE_TIMINGS_NOTE] if any(withheld.values()) else
             [added_cost_sentence(c, run.rows) for c in added_cost(run.rows, seconds)])
    return ["training data", *(STAGES[s] for s in stages), "total"], cells, notes


def _withheld(run: RunData, row: Row, seconds: dict[str, float] | None) -> set[str]:
    """The timed stages of ``row`` that read the private log (:func:`~privret.report.cost.private_stages`), unless
    the run shows private timings."""
    if run.private_timings_and_counts or seconds is None:
        return set()
    return private_stages(row) & set(seconds)


def _timed_cells(seconds: dict[str, float], stages: list[str], withheld: set[str]) -> list[str]:
    """A timed row's minutes per stage of ``stages`` and in total; "withheld" for the stages of ``withheld``, and
    for the total when there are any."""
    return ([WITHHELD if s in withheld else minutes(seconds.get(s)) for s in stages]
            + [WITHHELD if withheld else minutes(sum(seconds.values()))])


WITHHELD = "withheld"
PRIVATE_TIMINGS_NOTE = ("Withheld: how long each stage that read the private log took (the DP fine-tune of a "
                        "generator, the training of a direct DP retriever, a DP choice, every stage of a row "
                        "trained without DP), which depends on it and which no guarantee covers, and what the rows "
                        "without private data add to them. `privret report --show-private-timings-and-counts` "
                        "shows them, for those allowed to see the private log.")
WALL_TIME_NOTE = ("Each stage as timed by the process that finished it (a stage resumed after a crash counts its "
                  "last part only); work shared by the whole grid (document choice, embedding cache) is in no row.")


def _similarity_section(run: RunData) -> str:
    """BLEU and MAUVE per synthetic set; the count of its queries paired with private ones (a count of the private
    log's queries per document) only with the run's private counts."""
    pairs = run.private_timings_and_counts
    rows = [[_e(s["label"]), _eps(s["epsilon"]), _num(s["bleu"]), _num(s["mauve"])]
            + ([_e(s.get("pairs") or "-")] if pairs else []) + [_e(s.get("featurizer") or "-")] for s in run.similarity]
    return _table(["synthetic set", "ε", "BLEU", "MAUVE", *(["pairs"] if pairs else []), "MAUVE featuriser"], rows,
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
            out.append([_e(res.get("epsilon")), "0 (control)" if k == 0 else str(k), str(r["canaries"]),
                        f"{r['rank_mean']:.1f}/{m} ± {r['rank_std']:.1f}",
                        f"{r['exposure_mean']:.2f} ± {r['exposure_std']:.2f}",
                        f"{r['extracted_fraction']:.0%}", f"{r['leaked_fraction']:.0%}", bound_text,
                        _e(res.get("unit", "?"))])
    return out


def _canary_section(run: RunData) -> str:
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
    return intro + _table(headers, canary_rows(c), {2, 3, 4, 5, 6, 7})


def _examples_section(run: RunData) -> str:
    ex = run.examples
    if ex is None:
        return ""
    parts = []
    if ex.hidden_labels:
        parts.append(f"<p class='warn'>Examples of ε = {', '.join(_e(h) for h in ex.hidden_labels)} are not shown: "
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
        cell = (f"<b>{_e(doc['title'])}</b><br>" if doc["title"] else "") + _e(text)
        row = [cell]
        if ex.originals is not None:
            row.append("<br>".join(_e(q) for q in ex.originals.get(doc["id"], [])) or "-")
        row += ["<br>".join(_e(q) for q in ex.synthetic[k].get(doc["id"], [])) or "-" for k in labels]
        rows.append(row)
    if ex.originals is not None:
        parts.append("<p class='warn'>This page shows original private queries (--show-private-queries): "
                     "do not share it beyond those allowed to see the private data.</p>")
    parts.append(_table(headers, rows))
    return "".join(parts)


def _ledger_section(run: RunData) -> str:
    parts = []
    for r in run.rows:
        if r.method == "zero-shot":
            parts.append(f"<details><summary>{_e(r.label)}: no private data used</summary></details>")
            continue
        if r.ledger is None:
            parts.append(f"<details open><summary>{_e(r.label)}: <b>no ledger found</b></summary></details>")
            continue
        rows = [[_e(k), _e(_ledger_value(k, r.ledger[k]))] for k in _ledger_fields(run, r)
                if r.ledger.get(k) is not None]
        summary = _ledger_summary(r.ledger)
        parts.append(f"<details><summary>{_e(r.label)}: {_e(summary)}</summary>"
                     f"<p class='muted'>{_e(r.ledger_source)}</p>{_table(['field', 'value'], rows)}</details>")
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


def _ledger_summary(ledger: dict) -> str:
    eps = ledger.get("epsilon")
    if eps is None or math.isinf(eps):
        return f"non-private (ε = ∞), unit {ledger.get('unit', '?')}, n = {ledger.get('n_units', '?')}"
    return (f"({eps:.3g}, {ledger.get('delta', 0):.2g})-DP per {ledger.get('unit', '?')}, "
            f"σ = {ledger.get('noise_multiplier', 0):.3g}, q = {ledger.get('sample_rate', 0):.3g}, "
            f"steps = {ledger.get('steps', '?')}, C = {ledger.get('clip_norm', '?')}, {ledger.get('accountant', '?')}")


# -- page ----------------------------------------------------------------------------------------
def render_html(run: RunData) -> str:
    png = privacy_utility_png(run)
    cfg = run.config
    facts = []
    if cfg.get("dataset"):
        facts.append(f"dataset <code>{_e(cfg['dataset'])}</code>")
    if cfg.get("eval_split"):
        facts.append(f"evaluated on <code>{_e(cfg['eval_split'])}</code>")
    if cfg.get("unit"):
        facts.append(f"privacy unit <code>{_e(cfg['unit'])}</code>")
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = [f"<h1>privret report: {_e(run.name)}</h1>",
                f"<p class='muted'>{'; '.join(facts)}{'; ' if facts else ''}run directory "
                f"<code>{_e(run.run_dir)}</code>; generated {generated}.</p>",
                "<p>Each DP row's (ε, δ) holds for that row alone, per privacy unit; releasing several rows "
                "trained on the same private data composes their budgets. Retrievers trained on DP synthetic "
                f"data carry the generator's guarantee (post-processing). {_e(COVERAGE)}</p>",
                "<h2 id='plot'>Privacy-utility</h2>"]
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        sections.append(f"<figure id='privacy-utility'><img alt='NDCG@10 against epsilon' "
                        f"src='data:image/png;base64,{data}'></figure>")
    else:
        sections.append("<p>No rows to plot.</p>")
    headers = _retrieval_headers(run)
    sections += ["<h2 id='retrieval'>Retrieval (Table 3 layout of Carranza et al.)</h2>",
                 _table(headers, _retrieval_rows(run), set(range(1, len(headers))) - {3}),
                 f"<p class='muted'>{_e(EXPLANATION)} {_e(_precision_note(run))}</p>"]
    if (note := _bar_note(run)) is not None:
        sections.append(f"<p>{_e(note)}</p>")
    if (wall := _wall_time(run)) is not None:
        headers, cells, notes = wall
        sections += ["<h2 id='wall-time'>Wall time</h2>", _table(headers, cells, set(range(1, len(headers)))),
                     *(f"<p>{_e(n)}</p>" for n in notes), f"<p class='muted'>{_e(WALL_TIME_NOTE)}</p>"]
    if run.zero_shot_datasets:
        sections += ["<h2 id='zero-shot'>Zero-shot across datasets (Table 5 layout of Carranza et al.)</h2>",
                     _zero_shot_section(run)]
    if run.similarity:
        sections += ["<h2 id='similarity'>Similarity of synthetic to original queries (Table 6 of Carranza et al.)</h2>",
                     "<p class='muted'>Computed from the private queries: the scores themselves are not "
                     "covered by the DP guarantee.</p>", _similarity_section(run)]
    if run.canaries:
        sections += ["<h2 id='leakage'>Privacy leakage (Table 7 of Carranza et al.)</h2>", _canary_section(run)]
    if run.examples is not None:
        sections += ["<h2 id='examples'>Example synthetic queries (Table 2 of Carranza et al.)</h2>", _examples_section(run)]
    sections += ["<h2 id='ledgers'>Privacy ledgers</h2>", _ledger_section(run)]
    if run.notes:
        sections += ["<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in run.notes) + "</ul>"]
    body = "\n".join(sections)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>privret report: {_e(run.name)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            f"</body></html>\n")


def render_markdown(run: RunData) -> str:
    headers = _retrieval_headers(run)
    lines = [f"# privret report: {run.name}", "", "## Retrieval", "", "| " + " | ".join(headers) + " |",
             "|---|---:|---:|---|" + "---:|" * (len(headers) - 4)]
    lines += ["| " + " | ".join(html.unescape(c) for c in row) + " |" for row in _retrieval_rows(run)]
    lines += ["", EXPLANATION, "", _precision_note(run), "", COVERAGE]
    if (note := _bar_note(run)) is not None:
        lines += ["", note]
    if (wall := _wall_time(run)) is not None:
        headers, cells, notes = wall
        lines += ["", "## Wall time", "", "| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
        lines += ["| " + " | ".join(html.unescape(c) for c in row) + " |" for row in cells]
        lines += [*(line for n in notes for line in ("", n)), "", WALL_TIME_NOTE]
    for result in run.zero_shot_datasets:
        names = list(result["datasets"])
        lines += ["", f"## Zero-shot NDCG@10 across datasets ({result['file']})", "",
                  "| source | ε | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
        for row in result["rows"]:
            lines.append(f"| {row.get('source', '?')} | {_eps(_f(row.get('epsilon')))} | "
                         + " | ".join(_num((row["metrics"].get(d) or {}).get("ndcg@10")) for d in names) + " |")
    if run.similarity:
        lines += ["", "## Similarity", "", "| synthetic set | ε | BLEU | MAUVE |", "|---|---:|---:|---:|"]
        lines += [f"| {s['label']} | {_eps(s['epsilon'])} | {_num(s['bleu'])} | {_num(s['mauve'])} |"
                  for s in run.similarity]
    if run.canaries:
        lines += ["", "## Privacy leakage (canaries)", "",
                  "| ε | repetitions | canaries | rank | exposure | rank 1 | leaked | ε lower bound | unit |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        lines += ["| " + " | ".join(html.unescape(c) for c in row) + " |" for row in canary_rows(run.canaries)]
    lines += ["", "## Ledgers", ""]
    for r in run.rows:
        if r.method == "zero-shot":
            continue
        lines.append(f"- {r.label}: " + (_ledger_summary(r.ledger) if r.ledger else "no ledger found"))
    for note in run.notes:
        lines.append(f"- note: {note}")
    return "\n".join(lines) + "\n"


def privacy_utility(run: RunData) -> dict:
    """The run as one dataset's privacy-utility object (what ``privret report --utility-json`` writes)::

        {"dataset": name, "zero_shot": {"ndcg10": float}, "original": {"ndcg10": float},
         "rows": [{"name", "epsilon", "ndcg10_mean", "ndcg10_sd", "seeds", "delta_ci95": [lo, hi], "retention"}]}

    One row per trained row other than the references, named by its directory (``eps-8``,
    ``direct-logit-dp-eps-8``); ``epsilon`` is its ledger's (``Infinity`` when non-private). A run
    directory holds one training seed per row, so every row has ``seeds`` 1 and
    ``ndcg10_sd`` 0.0 (:func:`~privret.evaluate.statistics.mean_sd` of one value). ``delta_ci95`` is
    the paired bootstrap interval of its NDCG@10 minus zero-shot's (null without per-query scores);
    ``retention`` is null where undefined. ``dataset`` is the name of the run's dataset directory.
    """
    rows = {r.key: r for r in run.rows}
    for key in (ZERO_SHOT, ORIGINAL):
        if key not in rows:
            raise InputError(f"the privacy-utility JSON needs {key}/metrics.json", path=run.run_dir)
    out = []
    for r in run.rows:
        if r.key in (ZERO_SHOT, ORIGINAL):
            continue
        mean, sd = mean_sd([float(r.metrics["ndcg@10"])])
        versus = run.versus[r.key]
        out.append({"name": r.key, "epsilon": r.epsilon, "ndcg10_mean": mean, "ndcg10_sd": sd, "seeds": 1,
                    "delta_ci95": None if versus.ci is None else list(versus.ci), "retention": versus.retention})
    return {"dataset": Path(str(run.config.get("dataset") or run.name)).name,
            "zero_shot": {"ndcg10": float(rows[ZERO_SHOT].metrics["ndcg@10"])},
            "original": {"ndcg10": float(rows[ORIGINAL].metrics["ndcg@10"])}, "rows": out}


__all__ = ["privacy_utility", "render_html", "render_markdown", "method_label"]
