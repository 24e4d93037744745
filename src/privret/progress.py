"""Rich progress bars for every long privret command.

On a terminal they are live bars. When output goes to a file (batch jobs, CI, ``nohup``) a live
bar never refreshes, so each task instead logs a plain line at most every 30 seconds.
"""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

LOG_EVERY_SECONDS = 30.0


class Progress(RichProgress):
    def __init__(self) -> None:
        super().__init__(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TimeElapsedColumn(), TimeRemainingColumn())
        self._last_log: dict[TaskID, float] = {}

    def update(self, task_id: TaskID, **kwargs) -> None:  # advance() also ends up here via _log
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
        if now - self._last_log.get(task_id, 0.0) >= LOG_EVERY_SECONDS or task.finished:
            self._last_log[task_id] = now
            total = f"/{task.total:g}" if task.total is not None else ""
            self.console.print(f"{task.description}: {task.completed:g}{total} ({task.elapsed or 0:.0f}s)",
                               highlight=False)
