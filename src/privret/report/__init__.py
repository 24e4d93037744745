"""The report people read: one self-contained HTML page per run directory, and a Markdown summary.

``build_report(run_dir)`` collects what the run holds (:mod:`privret.report.collect`), draws the
privacy-utility plot (:mod:`privret.report.plot`) and renders both formats
(:mod:`privret.report.render`). See ``docs/report.md``.
"""

from __future__ import annotations

from pathlib import Path

from privret.io import write_json_atomic, write_text_atomic
from privret.report.collect import RunData, collect
from privret.report.render import render_html, render_markdown
from privret.report.utility_json import privacy_utility


def build_report(run_dir: str | Path, *, out: str | Path | None = None, markdown_out: str | Path | None = None,
                 utility_out: str | Path | None = None, show_private_queries: bool = False,
                 show_private_timings_and_counts: bool = False, examples: int = 3) -> tuple[Path, Path, str]:
    """Write ``report.html`` and ``report.md`` (default: inside ``run_dir``) and, given ``utility_out``,
    the run's privacy-utility JSON there (a list of one :func:`privacy_utility` object); returns
    both report paths and the Markdown text. ``show_private_queries`` and ``show_private_timings_and_counts``
    add what only those allowed to see the private log may read (:func:`collect`)."""
    run = collect(run_dir, show_private_queries=show_private_queries,
                  show_private_timings_and_counts=show_private_timings_and_counts, examples=examples)
    html_path = Path(out) if out is not None else Path(run_dir) / "report.html"
    md_path = Path(markdown_out) if markdown_out is not None else html_path.with_suffix(".md")
    utility = [privacy_utility(run)] if utility_out is not None else None  # may refuse: before anything is written
    markdown = render_markdown(run)
    write_text_atomic(html_path, render_html(run))
    write_text_atomic(md_path, markdown)
    if utility is not None:
        write_json_atomic(utility_out, utility)
    return html_path, md_path, markdown


__all__ = ["RunData", "build_report", "collect", "privacy_utility", "render_html", "render_markdown"]
