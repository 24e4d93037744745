"""What the commands share besides their options: the console, config validation, the budget
policy and the private training pairs."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from privret.errors import InputError, invalid_input

out = Console()

# config fields whose flag is not their name
FLAG_OF_FIELD = {"learning_rate": "--lr", "cap": "--budget-cap", "selection_grid": "--select",
                 "selection_max_epochs": "--select-max-epochs", "selection_validation_pool": "--validation-pool"}


def build_config(cls, **values):
    """``cls(**values)``; a pydantic validation error becomes an :class:`InputError` naming the flag."""
    from pydantic import ValidationError

    try:
        return cls(**values)
    except ValidationError as err:
        raise invalid_input(err, name=_flag) from None


def _flag(location: tuple) -> str:
    """The CLI flag of a config field's location."""
    name = "_".join(str(p) for p in location)
    return FLAG_OF_FIELD.get(name, "--" + name.replace("_", "-"))


def budget_policy(cap: float | None, allow_over: bool, base=None):
    """``base`` (default: a :class:`~privret.privacy.budget.BudgetPolicy` with the default cap; or a
    pipeline config's ``budget``) with the flags over it: ``--budget-cap`` replaces its cap,
    ``--allow-over-budget`` allows going over."""
    from privret.privacy.budget import BudgetPolicy

    base = base if base is not None else BudgetPolicy()
    values = {**base.model_dump(), "allow_over": base.allow_over or allow_over}
    if cap is not None:
        values["cap"] = cap
    return build_config(type(base), **values)


def training_pairs(data: Path | None, split: str, pairs: Path | None):
    """Pairs from a BEIR split, or from a pairs file (its doc_ids resolved against --data's corpus)."""
    from privret.data.beir import dataset_hash, load_beir, load_corpus
    from privret.data.pairs import load_pairs_jsonl, pairs_from_beir
    from privret.io import file_sha256

    if pairs is not None:
        corpus = load_corpus(data / "corpus.jsonl") if data is not None else None
        return load_pairs_jsonl(pairs, corpus), file_sha256(pairs)
    if data is None:
        raise InputError("give --data DIR (BEIR) or --pairs FILE", field="--data")
    dataset = load_beir(data, splits=[split])
    return pairs_from_beir(dataset, split), dataset_hash(dataset, split)
