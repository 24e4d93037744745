"""Rich progress bars for every long privret command.

On a terminal they are live bars. When output goes to a file (batch jobs, CI, ``nohup``) a live
bar never refreshes, so there is no live display at all (not even its final render) and each task
instead logs a plain line at most every 30 seconds: every bar appears once, in one form.

Training loops pass per-step statistics of the private batch (loss, clipped fraction) as ``stats``.
Those are not differentially private: they are shown in the live bar on a terminal and nowhere else,
never in a plain log line or the final render written to a file (see :meth:`Progress.update`). A task whose
counts describe the private data (a DP run's pairs: only its unit count is public) is added with
``private_counts=True``: its log lines say when it is done and nothing else.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, ProgressColumn, Task, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.progress import TimeRemainingColumn
from rich.text import Text

LOG_EVERY_SECONDS = 30.0


class _StatsColumn(ProgressColumn):
    """A task's terminal-only statistics (empty when there are none)."""

    def render(self, task: Task) -> Text:
        return Text(task.fields.get("stats", ""))


class Progress(RichProgress):
    def __init__(self, console: Console | None = None) -> None:
        console = console or Console()
        super().__init__(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), TimeRemainingColumn(), _StatsColumn(), console=console,
                         disable=not console.is_terminal)
        self._last_log: dict[TaskID, float] = {}

    def update(self, task_id: TaskID, *, stats: str | None = None, **kwargs) -> None:
        """Rich's update. ``stats``: non-DP statistics of the private data, kept (and shown by the last
        column) only when the console is a terminal, so no file or log ever receives them."""
        if stats is not None and self.console.is_terminal:
            kwargs["stats"] = stats
        super().update(task_id, **kwargs)
        self._log(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id: TaskID) -> None:
        if self.console.is_terminal:
            return
        now = time.monotonic()
        task = self._tasks[task_id]
        if task.fields.get("private_counts"):
            if task.finished and task_id not in self._last_log:
                self._last_log[task_id] = now
                self.console.print(f"{task.description}: done ({task.elapsed or 0:.0f}s)", highlight=False)
            return
        if now - self._last_log.get(task_id, 0.0) >= LOG_EVERY_SECONDS or task.finished:
            self._last_log[task_id] = now
            total = f"/{task.total:g}" if task.total is not None else ""
            self.console.print(f"{task.description}: {task.completed:g}{total} ({task.elapsed or 0:.0f}s)",
                               highlight=False)
