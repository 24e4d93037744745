"""What an audit writes holds private data: it says so first, and stays out of run directories unless asked.

An audit reads the private log without differential privacy: the overlap audit's JSON holds the ids and texts of the
private queries it found, the canary audit's files a private query id per canary, the private document of some and
the log's pair count, the inversion check's some of the clients' sentences. :func:`mark_private` puts a one-line
warning under :data:`~privret.io.PRIVATE_DATA_KEY`, which :func:`~privret.io.write_json_atomic` writes first.
:func:`refuse_run_directory` keeps such output out of a pipeline run directory, whose report is meant to be shared
(and reads files there), unless the user asks for it with :data:`ALLOW_FLAG`.
"""

from __future__ import annotations

from pathlib import Path

from privret.errors import InputError
from privret.io import PRIVATE_DATA_KEY
from privret.run_layout import CONFIG_FILE, METRICS_FILE

ALLOW_FLAG = "--allow-private-output-in-run"


def mark_private(result: dict, holds: str) -> dict:
    """``result`` with a first key saying that it holds private data (``holds``: what, in a few words)."""
    return {PRIVATE_DATA_KEY: f"PRIVATE DATA: {holds}. No DP guarantee covers it: show it only to those allowed "
                              "to see the private data.", **result}


def run_directory_of(path: Path) -> Path | None:
    """The pipeline run directory ``path`` lies in (``path`` itself or a parent holding a ``config.json`` and a
    ``*/metrics.json``, what ``privret report`` reads as a run), or None."""
    for directory in (path, *path.parents):
        if (directory / CONFIG_FILE).is_file() and any(directory.glob(f"*/{METRICS_FILE}")):
            return directory
    return None


def refuse_run_directory(path: str | Path, *, allowed: bool) -> None:
    """Raise :class:`InputError` when an audit's output ``path`` lies in a run directory, unless ``allowed``."""
    run = None if allowed else run_directory_of(Path(path).resolve())
    if run is not None:
        raise InputError(f"lies in the run directory {run}, whose report is meant to be shared, and this audit's "
                         f"output holds private data: write it elsewhere, or pass {ALLOW_FLAG}", path=path)
