"""``privret synth``: synthetic queries for public documents (``generate``) and their round-trip filter
(``filter``); each command lives in its own module."""

from __future__ import annotations

import typer

from privret.cli.filtering import filter_synthetic
from privret.cli.generate import generate

app = typer.Typer(help="Synthetic queries for public documents from a generator, and their filter.",
                  no_args_is_help=True)
app.command("generate")(generate)
app.command("filter")(filter_synthetic)
