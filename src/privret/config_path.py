"""The type of every path field a config file may set: a ``Path`` that pydantic refuses when it holds a NUL byte.

A NUL byte cannot reach a path through the command line (``argv`` is NUL-terminated), but a YAML or JSON config
can carry one, and ``pathlib`` then fails late with a bare ``ValueError``. Declaring such fields as
:data:`ConfigPath` makes the refusal a validation error of the field, reported with the file and the field like
any other bad value (:func:`privret.errors.invalid_input`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator


def _without_nul(value: Path) -> Path:
    if "\x00" in str(value):
        raise ValueError("a path may not contain a NUL byte")
    return value


ConfigPath = Annotated[Path, AfterValidator(_without_nul)]
