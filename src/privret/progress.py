"""Rich progress bars with the columns every long privret command shows."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress as _RichProgress, TextColumn, TimeElapsedColumn, \
    TimeRemainingColumn


def Progress() -> _RichProgress:  # noqa: N802 - reads like the class it builds
    return _RichProgress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), TimeRemainingColumn(), transient=False)
