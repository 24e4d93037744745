"""User-facing errors.

Every problem with what the user gave us (a file, a config, a flag) is raised as an
:class:`InputError`. The CLI prints it as one line and exits with status 2, so a script
can tell bad input (2) from a crash (1).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

EXIT_BAD_INPUT = 2


class InputError(Exception):
    """Bad user input, located as precisely as we can: file, line (1-based) and field."""

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None):
        self.message = " ".join(message.split())  # parsers' messages can span lines; ours may not
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = []
        if self.path:
            where.append(self.path if self.line is None else f"{self.path}:{self.line}")
        if self.field:
            where.append(f"field '{self.field}'")
        prefix = ", ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


class ModelUnavailableError(InputError):
    """A model id or path that cannot be resolved (offline and not cached, or missing)."""


def invalid_input(err, *, path: str | Path | None = None, under: str = "", what: str = "",
                  name: Callable[[tuple], str] | None = None) -> InputError:
    """The first error of a pydantic ``ValidationError`` ``err`` as one :class:`InputError` line.

    Its field is the error's location dotted (``a.b``), after ``under`` when given (``under.a.b``), or
    ``name(location)`` where the caller names fields otherwise (the CLI: by their flags); ``what``, when
    given, comes before the message (``what: message``).
    """
    first = err.errors()[0]
    location = tuple(first["loc"])
    field = name(location) if name is not None else ".".join(str(p) for p in ((under,) if under else ()) + location)
    message = first["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's ValueError
    return InputError(f"{what}: {message}" if what else message, path=path, field=field)
