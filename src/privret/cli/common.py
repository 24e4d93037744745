"""What the commands share besides their options: the console, config validation, the budget
policy and the private training pairs."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console

from privret.errors import InputError, invalid_input

out = Console()

# The one mapping from the library's field names to the command line's flags. Library code names the field
# (InputError.field); the CLI shows the flag. Fields whose flag is not ``--`` + their name with dashes:
FLAG_OF_FIELD = {"learning_rate": "--lr", "cap": "--budget-cap", "allow_over": "--allow-over-budget",
                 "selection": "--select", "selection_grid": "--select", "selection_max_epochs": "--select-max-epochs",
                 "selection_validation_pool": "--validation-pool", "candidates": "--candidate",
                 "hold_out_heldout_fraction": "--hold-out"}
# Fields that library functions raise errors on and that the commands take as flags of the same name: a bare
# name here is always that flag (config files name their fields with a path, or with their section: a.b).
OPTION_FIELDS = ("datasets", "label", "max_texts", "min_tokens", "sample", "subsample", "md5", "archive", "resume",
                 "trust_remote_pickle", "unit", "run_dir", "weight", "test_articles", "public", "batch_size", "epochs")


def flag(field: str) -> str:
    """The command-line flag of the field ``field``."""
    return FLAG_OF_FIELD.get(field, "--" + field.replace("_", "-"))


def _has_flag(field: str | None) -> bool:
    return field in FLAG_OF_FIELD or field in OPTION_FIELDS


def flags_in(text: str, fields=()) -> str:
    """``text`` with the fields it names in backquotes (```allow_over```) shown as flags, when they are ones
    the command line sets by a flag (library errors and warnings name config fields), or are among ``fields``
    (the fields of a config the command builds from its flags)."""
    return re.sub(r"`([a-z_]+)`", lambda m: flag(m[1]) if _has_flag(m[1]) or m[1] in fields else m[0], text)


def as_flags(err: InputError) -> InputError:
    """``err`` with its field, and the fields its message names (:func:`flags_in`), shown as flags; a field of a
    YAML config file (``--config``, a pipeline config) stays the file's field name."""
    if _has_flag(err.field) and Path(err.path or "").suffix not in (".yaml", ".yml"):
        err.field = flag(err.field)
    err.message = flags_in(err.message)
    return err


def given_flags(*names: str) -> list[str]:
    """The flags of the command's parameters ``names`` that its command line gave rather than left at their
    defaults, in that order (none outside a command line)."""
    import click

    ctx = click.get_current_context(silent=True)
    params = {p.name: p for p in ctx.command.params} if ctx is not None else {}
    return [params[n].opts[0] for n in given_parameters(*names)]


def given_values(**values) -> dict:
    """Those of ``values`` (each keyed by the command's parameter of that name) that the command line gave rather
    than left at their defaults: what overrides a ``--config`` file's fields (none outside a command line)."""
    given = given_parameters(*values)
    return {name: value for name, value in values.items() if name in given}


def given_parameters(*names: str) -> list[str]:
    """Those of the command's parameters ``names`` that its command line gave (none outside a command line)."""
    import click
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return []
    return [n for n in names if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]


def build_config(cls, *, config_file: Path | None = None, flag_of: dict[str, str] | None = None, **values):
    """``cls`` with the fields of the YAML ``config_file`` (when given) and ``values`` over them (a mapping field
    given in both is merged, ``values``' keys winning). A pydantic validation error becomes an
    :class:`InputError`: a field the file set (and ``values`` did not) is named with the file, any other by its
    flag; an error of the whole config, with no location, names its fields in backquotes, shown as flags unless
    they came from the file. ``flag_of`` names this command's flags that differ from :data:`FLAG_OF_FIELD`'s."""
    from pydantic import ValidationError

    from privret.io import read_yaml_mapping

    from_file = read_yaml_mapping(config_file) if config_file is not None else {}
    merged = {**from_file, **{k: {**from_file[k], **v} if isinstance(v, dict) and isinstance(from_file.get(k), dict)
                              else v for k, v in values.items()}}
    file_only = {k for k in from_file if k not in values}

    def name(location: tuple) -> str | None:
        field = "_".join(str(p) for p in location)
        return (flag_of or {}).get(field) or flag(field) if location else None

    try:
        return cls(**merged)
    except ValidationError as err:
        first = err.errors()[0]
        location = tuple(first["loc"])
        if location:  # a section's key (generator.lora_rank) is the file's when the flags did not set that key
            key, inner = location[0], location[1:2]
            from_the_file = key in file_only or (key in from_file and isinstance(values.get(key), dict)
                                                 and bool(inner) and inner[0] not in values[key])
            in_file = [str(key)] if from_the_file else []
        else:
            in_file = [n for n in re.findall(r"`([a-z_]+)`", first["msg"]) if n in file_only]
        if in_file:
            error = invalid_input(err, path=config_file)
            error.field = error.field or in_file[0]
            if first["type"] == "extra_forbidden":
                error.message = f"unknown field (not a setting of {cls.__name__})"
        else:
            error = invalid_input(err, name=name)
        error.message = flags_in(error.message, set(cls.model_fields) - file_only)
        raise error from None


def hold_out_partition(fraction: float | None, salt: str | None) -> dict | None:
    """The ``hold_out`` field (a :class:`~privret.privacy.hold_out.UnitPartition`'s values) that ``--hold-out`` and
    ``--hold-out-salt`` give, or None (the whole log); :func:`build_config` checks it and names the flag."""
    if fraction is None:
        if salt is not None:
            raise InputError("applies with --hold-out only", field="--hold-out-salt")
        return None
    return {"heldout_fraction": fraction} | ({} if salt is None else {"salt": salt})


def budget_policy(cap: float | None, allow_over: bool | None, base=None):
    """``base`` (default: a :class:`~privret.privacy.budget.BudgetPolicy` with the default cap; or a
    pipeline config's ``budget``) with the flags given over it: ``--budget-cap`` replaces its cap,
    ``--allow-over-budget`` / ``--no-allow-over-budget`` its ``allow_over``."""
    from privret.privacy.budget import BudgetPolicy

    base = base if base is not None else BudgetPolicy()
    values = {**base.model_dump(), "allow_over": base.allow_over if allow_over is None else allow_over}
    if cap is not None:
        values["cap"] = cap
    return build_config(type(base), **values)


def training_pairs(data: Path | None, split: str, pairs: Path | None):
    """Pairs from a BEIR split, or from a pairs file (its doc_ids resolved against --data's corpus):
    :func:`privret.data.sources.pairs_from_paths`, as the Python API reads them."""
    from privret.data.sources import pairs_from_paths

    if pairs is not None and given_flags("split"):
        raise InputError("names a split of --data; --pairs is read whole (--data gives its corpus only)",
                         field="--split")
    if pairs is None and data is None:
        raise InputError("give --data DIR (BEIR) or --pairs FILE", field="--data")
    return pairs_from_paths(data, split, pairs)
