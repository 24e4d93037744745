"""What the config models' fields share: the path type, and the check that refuses a value nothing would use.

:data:`ConfigPath` is the type of every path field a config file may set: a ``Path`` that pydantic refuses when it
holds a NUL byte. A NUL byte cannot reach a path through the command line (``argv`` is NUL-terminated), but a YAML
or JSON config can carry one, and ``pathlib`` then fails late with a bare ``ValueError``. Declaring such fields as
:data:`ConfigPath` makes the refusal a validation error of the field, reported with the file and the field like
any other bad value (:func:`privret.errors.invalid_input`).

:func:`changed_from_default` serves the validators that refuse a setting another setting makes unused (``dp_*``
with ``dp: none``, what a recipe selection chooses, a ``dp-select`` selection with another document source): a
value equal to the field's default changes nothing and passes, any other value would be silently ignored and is
refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Iterable

from pydantic import AfterValidator, BaseModel


def _without_nul(value: Path) -> Path:
    if "\x00" in str(value):
        raise ValueError("a path may not contain a NUL byte")
    return value


ConfigPath = Annotated[Path, AfterValidator(_without_nul)]


def changed_from_default(settings: BaseModel, names: Iterable[str]) -> list[str]:
    """The fields among ``names`` whose value in ``settings`` differs from the field's declared default."""
    fields = type(settings).model_fields
    return [name for name in names if getattr(settings, name) != fields[name].get_default(call_default_factory=True)]
