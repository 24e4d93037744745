"""``privret report``: the HTML and Markdown report of a pipeline run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import out
from privret.cli.options import output_file


def report(
    run_dir: Annotated[Path, typer.Argument(help="run directory written by `privret pipeline`")],
    out_file: Annotated[Optional[Path], typer.Option("--out", help="HTML file (default RUN_DIR/report.html)",
                                                     callback=output_file)] = None,
    show_private_queries: Annotated[bool, typer.Option(
        help="also show original (private) queries and the non-private generator's examples")] = False,
    show_private_timings_and_counts: Annotated[bool, typer.Option(
        help="also show how long each stage that read the private log took (and so the shares of the rows without "
             "private data), and the private log's pair counts (ledgers, canary audit, similarity); no guarantee "
             "covers them")] = False,
    examples: Annotated[int, typer.Option(help="documents in the example-queries table")] = 3,
    utility_json: Annotated[Optional[Path], typer.Option(
        "--utility-json", help="also write NDCG@10, retention and the CI against zero-shot per row as JSON "
        "({dataset, zero_shot, original, rows: [{name, epsilon, ndcg10_mean, ndcg10_sd, seeds, delta_ci95, "
        "retention}]}); needs the zero-shot and original rows",
        callback=output_file)] = None,
) -> None:
    """One self-contained HTML report of a pipeline run (plot, tables, examples, ledgers) and a Markdown summary.

    --utility-json adds the privacy-utility JSON. By default it leaves out the private queries, how long the stages
    that read the private log took and the log's pair counts; the --show-private-* flags add them, for those
    allowed to see the private log."""
    from privret.report import build_report

    html_path, md_path, markdown = build_report(run_dir, out=out_file, utility_out=utility_json,
                                                show_private_queries=show_private_queries,
                                                show_private_timings_and_counts=show_private_timings_and_counts,
                                                examples=examples)
    typer.echo(markdown)
    out.print(f"report: {html_path.resolve()}  (Markdown: {md_path.resolve()})")
    if utility_json is not None:
        out.print(f"privacy-utility JSON: {utility_json.resolve()}")
