"""The ``privret`` command line: a group per stage with its verbs, ``pipeline`` for a grid, ``demo``.

A module per command group (``data``, ``generator``, ``synth``, ``retriever``, ``evaluate``, ``audit``,
``federated``), whose commands may live in modules of their own (``synth generate`` in ``generate``, ``synth
filter`` in ``filtering``), or top-level command (``report``, ``pipeline``, which also holds the ``demo`` command,
whose config is in ``demo``); options that several commands take are defined once in :mod:`privret.cli.options`,
the helpers they share live in :mod:`privret.cli.common`, the renamed spellings in :mod:`privret.cli.moved`.
Commands import their heavy dependencies when they run, so ``--help`` stays fast.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import click
import typer
from rich.console import Console
from rich.markup import escape

from privret.chatter import route_library_output
from privret.cli import audit, data, evaluate, federated, generator, pipeline, report, retriever, synth
from privret.cli.common import as_flags, flags_in
from privret.cli.moved import moved_spelling
from privret.distributed import launched
from privret.errors import EXIT_BAD_INPUT, InputError
from privret.runtime import keep_freed_memory

app = typer.Typer(help="Dense retrieval on private query logs with differential privacy.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)

# --help lists the top-level commands, then the groups, each in this order
app.command("report")(report.report)
app.command("pipeline")(pipeline.pipeline)
app.command("demo")(pipeline.demo)
app.add_typer(data.app, name="data")
app.add_typer(generator.app, name="generator")
app.add_typer(synth.app, name="synth")
app.add_typer(retriever.app, name="retriever")
app.add_typer(evaluate.app, name="evaluate")
app.add_typer(audit.app, name="audit")
app.add_typer(federated.app, name="federated")


@app.callback()
def _global_options(
    verbose: Annotated[bool, typer.Option(
        "--verbose", help="show the libraries' own warnings, log lines and download/conversion bars on stderr")] = False,
    log_file: Annotated[Optional[Path], typer.Option(
        "--log-file", help="where the libraries' warnings and log lines go otherwise (default "
                           "$PRIVRET_LOG_FILE, else $XDG_CACHE_HOME/privret/privret.log, ~/.cache when unset)")] = None,
    trust_remote_pickle: Annotated[bool, typer.Option(
        "--trust-remote-pickle", help="allow loading models whose weights exist only as pickle files "
                                      "(pickles can run code; use only for sources you trust)")] = False,
) -> None:
    """Dense retrieval on private query logs with differential privacy."""
    route_library_output(verbose=verbose, log_file=log_file, rewrite=flags_in)
    if trust_remote_pickle:
        from privret.models.safety import set_trust_pickle

        set_trust_pickle(True)


PATH_ERRORS = {errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENAMETOOLONG,
               errno.EROFS, errno.ENOTEMPTY}
RENAME_TARGET_ERRORS = {errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST}


def _fail(text: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """End with ``error: TEXT`` as one line on standard error (``text`` is shown as written, never as markup)."""
    Console(stderr=True).print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)
    sys.exit(code)


def main() -> None:
    """The ``privret`` entry point: bad input ends in a one-line message and exit code 2 (a usage error too: an
    unknown flag, a value of the wrong type, a missing option, a renamed command or flag; Click's own form of these
    is a boxed usage text).
    Under torchrun (:mod:`privret.distributed`) every rank runs the command and only rank 0 prints: the others'
    standard output goes nowhere, so all they can show is an error (on standard error)."""
    keep_freed_memory()
    moved = moved_spelling(sys.argv[1:])
    if moved is not None:  # an old spelling of a command or flag: the new one, before Click reads the line
        _fail(moved)
    try:
        if not launched().main:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the life of the process)
        code = app(prog_name="privret", standalone_mode=False)  # errors come here, not printed by Click
    except click.exceptions.NoArgsIsHelpError as err:  # a group without its command: the help is printed already
        sys.exit(err.exit_code)
    except click.UsageError as err:
        hint = f" (see {err.ctx.command_path} --help)" if err.ctx is not None else ""
        _fail(" ".join(err.format_message().split()) + hint, err.exit_code)
    except click.ClickException as err:
        _fail(" ".join(err.format_message().split()), err.exit_code)
    except click.Abort:  # Ctrl-D at a prompt
        _fail("aborted", 1)
    except InputError as err:
        _fail(as_flags(err).one_line())
    except OSError as err:  # a path the user gave that cannot be read or written (a directory, a missing file)
        if err.filename is None or err.errno not in PATH_ERRORS:
            raise  # a full disk, too many open files, an I/O error: not the input's fault
        # a rename onto a directory or a taken name: the output's name, not its temporary one
        path = err.filename2 if err.filename2 and err.errno in RENAME_TARGET_ERRORS else err.filename
        _fail(f"{path}: {err.strerror}")
    if isinstance(code, int) and code != 0:  # typer.Exit(code), Ctrl-C (130)
        sys.exit(code)
