"""HTML (self-contained) and Markdown renderings of a run's results, its sections in order.

The HTML page loads nothing: its style sheet is inline, the plot is a ``data:image/png;base64``
URI, there is no script, no font, no link to any other file. Every text taken from the run
(labels, document text, queries) is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
from datetime import datetime, timezone

from privret.evaluate.similarity import MAUVE_HEADER, MAUVE_NOTE
from privret.evaluate.statistics import COVERAGE, EXPLANATION
from privret.report.cells import epsilon_cell, epsilon_value, escape, html_table, number_cell
from privret.report.collect import RunData
from privret.report.plot import privacy_utility_png
from privret.report.sections import (bar_note, canary_rows, canary_section, examples_section, ledger_section,
                                     ledger_summary, precision_note, retrieval_headers, retrieval_rows,
                                     similarity_section, zero_shot_section)
from privret.report.wall_time import WALL_TIME_NOTE, wall_time_table
from privret.run_layout import SYNTHETIC
from privret.synth.queryness import MAX_QUERY_WORDS

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


QUERYNESS_HEADERS = ["synthetic set", "query-like", "degenerate", "outputs", "degenerate outputs by reason"]
QUERYNESS_NOTE = (f"Computed on each synthetic set alone (post-processing of its generator's release): query-like = "
                  f"one sentence or question of at most {MAX_QUERY_WORDS} words and not degenerate; degenerate = "
                  "empty, one word, a copy of the document's title or first sentence or of a prompt's example query, "
                  "or a repeated run (privret.synth.queryness). Outputs generation dropped count in both.")


def queryness_table(run: RunData) -> tuple[list[str], list[list[str]], str] | None:
    """Headers, escaped cells and legend of the query-ness table (a row per synthetic set), with a MAUVE column when
    the run measured MAUVE against the private queries (``<row>/mauve.json``); None without a synthetic set."""
    rows = [r for r in run.rows if r.queryness is not None]
    if not rows:
        return None
    mauve = any(r.mauve is not None for r in rows)
    cells = [[escape(f"{r.key}/{SYNTHETIC}"), f"{r.queryness.query_like:.1%}", f"{r.queryness.degenerate:.1%}",
              str(r.queryness.outputs),
              escape(", ".join(f"{k} {n}" for k, n in sorted(r.queryness.reasons.items())) or "-")]
             + ([number_cell(r.mauve)] if mauve else []) for r in rows]
    return (QUERYNESS_HEADERS + ([MAUVE_HEADER] if mauve else []), cells,
            QUERYNESS_NOTE + (f" {MAUVE_NOTE}" if mauve else ""))


def render_html(run: RunData) -> str:
    png = privacy_utility_png(run)
    cfg = run.config
    facts = []
    if cfg.get("dataset"):
        facts.append(f"dataset <code>{escape(cfg['dataset'])}</code>")
    if cfg.get("eval_split"):
        facts.append(f"evaluated on <code>{escape(cfg['eval_split'])}</code>")
    if cfg.get("unit"):
        facts.append(f"privacy unit <code>{escape(cfg['unit'])}</code>")
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sections = [f"<h1>privret report: {escape(run.name)}</h1>",
                f"<p class='muted'>{'; '.join(facts)}{'; ' if facts else ''}run directory "
                f"<code>{escape(run.run_dir)}</code>; generated {generated}.</p>",
                "<p>Each DP row's (ε, δ) holds for that row alone, per privacy unit; releasing several rows "
                "trained on the same private data composes their budgets. Retrievers trained on DP synthetic "
                f"data carry the generator's guarantee (post-processing). {escape(COVERAGE)}</p>",
                "<h2 id='plot'>Privacy-utility</h2>"]
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        sections.append(f"<figure id='privacy-utility'><img alt='NDCG@10 against epsilon' "
                        f"src='data:image/png;base64,{data}'></figure>")
    else:
        sections.append("<p>No rows to plot.</p>")
    headers = retrieval_headers(run)
    sections += ["<h2 id='retrieval'>Retrieval (Table 3 layout of Carranza et al.)</h2>",
                 html_table(headers, retrieval_rows(run), set(range(1, len(headers))) - {3}),
                 f"<p class='muted'>{escape(EXPLANATION)} {escape(precision_note(run))}</p>"]
    if (note := bar_note(run)) is not None:
        sections.append(f"<p>{escape(note)}</p>")
    if (wall := wall_time_table(run)) is not None:
        headers, cells, notes = wall
        sections += ["<h2 id='wall-time'>Wall time</h2>", html_table(headers, cells, set(range(1, len(headers)))),
                     *(f"<p>{escape(n)}</p>" for n in notes), f"<p class='muted'>{escape(WALL_TIME_NOTE)}</p>"]
    if run.zero_shot_datasets:
        sections += ["<h2 id='zero-shot'>Zero-shot across datasets (Table 5 layout of Carranza et al.)</h2>",
                     zero_shot_section(run)]
    if run.similarity:
        sections += ["<h2 id='similarity'>Similarity of synthetic to original queries (Table 6 of Carranza et al.)</h2>",
                     "<p class='muted'>Computed from the private queries: the scores themselves are not "
                     "covered by the DP guarantee.</p>", similarity_section(run)]
    if run.canaries:
        sections += ["<h2 id='leakage'>Privacy leakage (Table 7 of Carranza et al.)</h2>", canary_section(run)]
    if (queryness := queryness_table(run)) is not None:
        headers, cells, note = queryness
        sections += ["<h2 id='queryness'>Query-ness of the synthetic sets</h2>",
                     html_table(headers, cells, {1, 2, 3, 5}), f"<p class='muted'>{escape(note)}</p>"]
    if run.examples is not None:
        sections += ["<h2 id='examples'>Example synthetic queries (Table 2 of Carranza et al.)</h2>",
                     examples_section(run)]
    sections += ["<h2 id='ledgers'>Privacy ledgers</h2>", ledger_section(run)]
    if run.notes:
        sections += ["<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in run.notes) + "</ul>"]
    body = "\n".join(sections)
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>privret report: {escape(run.name)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            f"</body></html>\n")


def render_markdown(run: RunData) -> str:
    headers = retrieval_headers(run)
    lines = [f"# privret report: {run.name}", "", "## Retrieval", "", "| " + " | ".join(headers) + " |",
             "|---|---:|---:|---|" + "---:|" * (len(headers) - 4)]
    lines += ["| " + " | ".join(html.unescape(c) for c in row) + " |" for row in retrieval_rows(run)]
    lines += ["", EXPLANATION, "", precision_note(run), "", COVERAGE]
    if (note := bar_note(run)) is not None:
        lines += ["", note]
    if (wall := wall_time_table(run)) is not None:
        headers, cells, notes = wall
        lines += ["", "## Wall time", "", "| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
        lines += ["| " + " | ".join(html.unescape(c) for c in row) + " |" for row in cells]
        lines += [*(line for n in notes for line in ("", n)), "", WALL_TIME_NOTE]
    for result in run.zero_shot_datasets:
        names = list(result["datasets"])
        lines += ["", f"## Zero-shot NDCG@10 across datasets ({result['file']})", "",
                  "| source | ε | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
        for row in result["rows"]:
            lines.append(f"| {row.get('source', '?')} | {epsilon_cell(epsilon_value(row.get('epsilon')))} | "
                         + " | ".join(number_cell((row["metrics"].get(d) or {}).get("ndcg@10")) for d in names) + " |")
    if (queryness := queryness_table(run)) is not None:
        headers, cells, note = queryness
        lines += ["", "## Query-ness of the synthetic sets", "", "| " + " | ".join(headers) + " |",
                  "|---|---:|---:|---:|---|" + "---:|" * (len(headers) - 5)]
        lines += ["| " + " | ".join(html.unescape(c) for c in row) + " |" for row in cells]
        lines += ["", note]
    if run.similarity:
        lines += ["", "## Similarity", "", "| synthetic set | ε | BLEU | MAUVE |", "|---|---:|---:|---:|"]
        lines += [f"| {s['label']} | {epsilon_cell(s['epsilon'])} | {number_cell(s['bleu'])} | "
                  f"{number_cell(s['mauve'])} |"
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
        lines.append(f"- {r.label}: " + (ledger_summary(r.ledger) if r.ledger else "no ledger found"))
    for note in run.notes:
        lines.append(f"- note: {note}")
    return "\n".join(lines) + "\n"
