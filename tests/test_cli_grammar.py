"""The command line's grammar: every command within 25 options, and each renamed command or flag refused with a
one-line error naming its new spelling (exit 2)."""

from __future__ import annotations

import click
import pytest
import typer.main

from helpers import run_cli

MAX_OPTIONS = 25


def _commands(command: click.Command, path: tuple[str, ...] = ("privret",)):
    """Every command, groups included (a group's own options count too), with its path."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def option_counts() -> dict[str, int]:
    """Each command's number of options (``--help`` not counted), by its path."""
    from privret.cli import app

    return {" ".join(path): sum(isinstance(p, click.Option) and p.name != "help" for p in command.params)
            for path, command in _commands(typer.main.get_command(app))}


def test_no_command_has_more_than_25_options():
    counts = option_counts()
    assert len(counts) > 20 and "privret generator train-dp" in counts and "privret synth generate" in counts
    assert {path: n for path, n in counts.items() if n > MAX_OPTIONS} == {}


def test_the_count_sees_every_option():
    """The count is of options, not of arguments: ``report`` takes RUN_DIR and five options."""
    assert option_counts()["privret report"] == 5


@pytest.mark.parametrize("args, message", [
    (["generate", "--generator", "g"], "privret generate is now privret synth generate"),
    (["--verbose", "filter", "--synthetic", "s"], "privret filter is now privret synth filter"),
    (["synth", "generate", "--generator", "g"], "privret synth generate --generator is now --model"),
    (["generator", "train", "--data", "d", "--epsilon", "8"],
     "privret generator train --epsilon is now privret generator train-dp --epsilon (generator train fine-tunes "
     "without DP)"),
    (["audit", "canaries", "--epsilons=inf,16"],
     "privret audit canaries --epsilons is now --epsilon (one target; several in a --config file's epsilons)"),
    (["federated", "train", "--learning-rate", "1e-3"], "privret federated train --learning-rate is now --lr"),
    (["federated", "train", "--dp-epsilon", "8"], "privret federated train --dp-epsilon is now --epsilon"),
    (["federated", "train", "--evaluation-split", "validation"],
     "privret federated train --evaluation-split is now --eval-split"),
    (["federated", "train", "--dp-clip-norm", "1"], "privret federated train --dp-clip-norm is now --clip-norm"),
    (["federated", "train", "--dp-noise-multiplier", "1"],
     "privret federated train --dp-noise-multiplier is now --noise-multiplier"),
    (["generator", "train-dp", "--lora-rank", "16"],
     "privret generator train-dp --lora-rank is now the field lora_rank of a --config FILE of privret generator "
     "train-dp"),
    (["audit", "canaries", "--trained-layers", "4"],
     "privret audit canaries --trained-layers is now the field generator.trained_layers of a --config FILE of "
     "privret audit canaries"),
    (["audit", "canaries", "--candidates", "50"],
     "privret audit canaries --candidates is now the field candidates of a --config FILE of privret audit canaries"),
])
def test_an_old_spelling_names_the_new_one(args, message):
    result = run_cli(*args)
    assert result.returncode == 2 and result.stderr.strip() == f"error: {message}"


def test_a_new_spelling_is_not_taken_for_an_old_one(tmp_path):
    """A flag of the same name under another command, or a value that looks like an old flag, is left to Click."""
    from privret.cli.moved import moved_spelling

    assert moved_spelling(["generator", "train-dp", "--epsilon", "8"]) is None
    assert moved_spelling(["retriever", "train", "--out", "--learning-rate"]) is None
    assert moved_spelling(["data", "validate", "generate"]) is None


def test_the_choices_are_the_library_values():
    from privret.cli.options import ACCOUNTANTS, UNITS
    from privret.data.pairs import PrivacyUnit
    from privret.privacy.accounting import ACCOUNTANTS as ACCOUNTANTS_OF_THE_LIBRARY

    assert ACCOUNTANTS == ACCOUNTANTS_OF_THE_LIBRARY and set(UNITS) == {unit.value for unit in PrivacyUnit}


def test_audit_canaries_shows_the_defaults_it_runs():
    """Its flags override the settings only when given; the default --help shows is the settings model's."""
    from privret.audit.canary_audit import CanaryAuditConfig
    from privret.cli import app

    command = typer.main.get_command(app).commands["audit"].commands["canaries"]
    shown = {p.name: p.default for p in command.params}
    cfg = CanaryAuditConfig()
    assert (shown["trials"], shown["samples"], shown["seed"], shown["unit"], shown["subsample"]) == (
        cfg.trials, cfg.samples, cfg.seed, cfg.unit.value, cfg.subsample)
    assert [int(k) for k in shown["repetitions"].split(",")] == cfg.repetitions
    assert {name: shown[name] for name in ("model", "clip_norm", "batch_size", "epochs", "learning_rate")} == \
        cfg.generator.model_dump(include={"model", "clip_norm", "batch_size", "epochs", "learning_rate"})


def test_every_row_of_the_table_names_its_new_spelling():
    """Each old command and flag of privret.cli.moved, given on a command line, ends in its own row's message; no
    old flag is still an option of its command (the row would hide it)."""
    from privret.cli import app
    from privret.cli.moved import COMMANDS, FLAGS, moved_spelling

    for old, new in COMMANDS.items():
        assert moved_spelling([*old, "--help"]) == f"privret {' '.join(old)} is now {new}"
    root = typer.main.get_command(app)
    for (path, flag), new in FLAGS.items():
        message = moved_spelling([*path, flag, "7"])
        assert message == f"privret {' '.join(path)} {flag} is now {new.format(flag=flag, value='7')}"
        command = root
        for word in path:
            command = command.commands[word]
        options = {name for p in command.params if isinstance(p, click.Option) for name in (*p.opts, *p.secondary_opts)}
        assert flag not in options, (path, flag)
