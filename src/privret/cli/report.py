"""``privret report``: the HTML and Markdown report of a pipeline run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import out


def report(
    run_dir: Annotated[Path, typer.Argument(help="run directory written by `privret pipeline`")],
    out_file: Annotated[Optional[Path], typer.Option("--out", help="HTML file (default RUN_DIR/report.html)")]
    = None,
    show_private_queries: Annotated[bool, typer.Option(
        help="also show original (private) queries and the non-private generator's examples")] = False,
    examples: Annotated[int, typer.Option(help="documents in the example-queries table")] = 3,
) -> None:
    """One self-contained HTML report (plot, tables, examples, ledgers) + a Markdown summary."""
    from privret.report import build_report

    html_path, md_path, markdown = build_report(run_dir, out=out_file, show_private_queries=show_private_queries,
                                                examples=examples)
    typer.echo(markdown)
    out.print(f"report: {html_path.resolve()}  (Markdown: {md_path.resolve()})")
