"""Options that several commands share, each defined (and its help text written) once.

Single options are ``Annotated`` types: ``data: DataOpt = None``; privacy units and accountants are Click
choices; ``--config FILE`` is :func:`config_file_option`, ``--device`` the decorator :func:`device_option`.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from privret.audit.private_output import ALLOW_FLAG
from privret.data.pairs import PrivacyUnit
from privret.errors import InputError

MODEL_HELP = "registry name, local path or HF id"
ENCODER_HELP = f"encoder: {MODEL_HELP}"
DELTA_HELP = "default 1/(2n), n units"
# Click choices, so that --help lists them and Click refuses another value (the accountants are
# privret.privacy.accounting.ACCOUNTANTS, which imports opacus: too slow for --help; a test checks they agree)
UNITS = tuple(unit.value for unit in PrivacyUnit)
ACCOUNTANTS = ("prv", "rdp")
UnitOpt = Annotated[str, typer.Option(click_type=click.Choice(UNITS), help="privacy unit")]
AccountantOpt = Annotated[str, typer.Option(click_type=click.Choice(ACCOUNTANTS), help="privacy accountant")]

# the private training pairs: a BEIR split, or a pairs file
DataOpt = Annotated[Optional[Path], typer.Option("--data", help="BEIR dataset directory")]
SplitOpt = Annotated[str, typer.Option(help="qrels split holding the private training pairs")]
PairsOpt = Annotated[Optional[Path], typer.Option("--pairs", help="pairs JSONL ({query, doc_id|doc[, user_id]})")]

# the privacy-budget registry
BudgetCapOpt = Annotated[Optional[float], typer.Option(
    help="refuse to run when all DP releases on this dataset would together exceed this epsilon "
         "(default 10; registry: $PRIVRET_BUDGET_DIR, default ~/.cache/privret/budget)")]
AllowOverOpt = Annotated[Optional[bool], typer.Option(
    "--allow-over-budget/--no-allow-over-budget",
    help="run past --budget-cap, or at another privacy unit than earlier releases, anyway (with a warning); "
         "default: no, or what a pipeline config's budget.allow_over says")]
DatasetNameOpt = Annotated[Optional[str], typer.Option(
    help="charge DP releases to this name in the budget registry (default: the content of the private pairs, "
         "so an edited copy of a log is another dataset unless both are given one name)")]

# a public partition of the log's units (privret.privacy.hold_out): DP training on the fit part, a DP choice on
# the held-out part, composed in parallel
HoldOutOpt = Annotated[Optional[float], typer.Option(
    "--hold-out", help="the expected share of privacy units held out of the log, in (0, 1), by a public salted hash "
                       "of each unit's key: retriever train-dp and generator train-dp train on the rest (their salt: "
                       "hold_out.salt in --config), retriever select scores on these; with the same share and salt "
                       "the two cost the larger epsilon, not the sum")]
# the DP trainers' --hold-out: their --config gives the salt (hold_out.salt)
HoldOutForTrainingOpt = Annotated[Optional[float], typer.Option(
    "--hold-out", help="train on the rest of the log, less this expected share of its units held out by a public "
                       "salted hash of each unit's key (the salt: hold_out.salt in --config; default "
                       "privret-hold-out), for retriever select with the same --hold-out and salt: the two cost "
                       "the larger epsilon, not the sum")]
HoldOutSaltOpt = Annotated[Optional[str], typer.Option(
    "--hold-out-salt", help="--hold-out: the public salt of the hash (any text fixed without looking at the log; "
                            "default privret-hold-out)")]

# training
LearningRateOpt = Annotated[float, typer.Option("--lr")]
SeedOpt = Annotated[int, typer.Option(help="seed of the randomness that is not a DP mechanism's; a DP training run "
                                       "ignores it (its draws seeded from os.urandom on every start; with "
                                       "--secure-rng, all but dropout drawn from it)")]
# crash safety and DP randomness of the DP trainers (generator train-dp, retriever train-dp)
ResumeOpt = Annotated[bool, typer.Option(help="continue an interrupted run in --out")]
SecureRngOpt = Annotated[bool, typer.Option(help="every draw of the DP mechanism (noise, sampling, a step's negatives) "
                                                 "from the OS CSPRNG (os.urandom); dropout masks never (the ledger's "
                                                 "random_sources names each draw's source)")]


def config_file_option(settings: str):
    """The ``--config FILE`` option of a command whose settings are the pydantic model named ``settings`` (in
    :mod:`privret.settings`): the file's fields set what the flags do not (:func:`privret.cli.common.build_config`)."""
    return Annotated[Optional[Path], typer.Option(
        "--config", help=f"YAML file of settings: any field of {settings} (the rarely changed ones have no flag); "
                         "the flags given on the command line override its fields")]


# where models run (privret.models.device)
DEVICE_HELP = "where models run: auto (CUDA when available, else CPU), cpu, cuda or cuda:N"
DeviceOpt = Annotated[str, typer.Option("--device", help=DEVICE_HELP)]
ConfigDeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help=f"{DEVICE_HELP} (default: the config's device)")]


def output_file(ctx: typer.Context, param: typer.CallbackParam, path: Optional[Path]) -> Optional[Path]:
    """Click callback of an option naming a file to write: a path that cannot become a file (an existing
    directory, or under an existing file) is refused when the command line is read, before any work, naming the
    flag (the write itself would fail only at the end, after the work)."""
    if path is None or ctx.resilient_parsing:
        return path
    if path.is_dir():
        raise InputError("is a directory; give the file to write", path=path, field=param.opts[0])
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise InputError(f"cannot be written: {parent} is a file", path=path, field=param.opts[0])
    return path


# audits of a private dataset
PrivateDataOpt = Annotated[Path, typer.Option("--data", help="the private BEIR dataset")]
AllowPrivateOutputOpt = Annotated[bool, typer.Option(
    ALLOW_FLAG, help="write this audit's output, which holds private data, inside a pipeline run directory anyway "
                     "(refused by default: the run's report is meant to be shared)")]
JsonResultOpt = Annotated[Optional[Path], typer.Option("--json", help="write the result here (JSON)",
                                                       callback=output_file)]

def checked_device(spec: str, *, field: str = "--device", path: Path | None = None) -> str:
    """``spec`` if it names a device present here; else a one-line :class:`~privret.errors.InputError`
    naming ``field`` (and the config file ``path``)."""
    from privret.models.device import resolve_device

    try:
        resolve_device(spec)
    except ValueError as err:
        raise InputError(str(err), field=field, path=path) from None
    return spec


def device_option(command):
    """Decorator: the command gets a last option ``--device`` (default ``auto``) and runs with its
    models placed there (:func:`privret.models.device.use_device`); the command itself never sees the option."""
    signature = inspect.signature(command, eval_str=True)
    parameters = [*signature.parameters.values(),
                  inspect.Parameter("device", inspect.Parameter.POSITIONAL_OR_KEYWORD, default="auto",
                                    annotation=DeviceOpt)]

    @functools.wraps(command)
    def on_device(*, device: str = "auto", **values):
        from privret.models.device import use_device

        with use_device(checked_device(device)):
            return command(**values)

    on_device.__signature__ = signature.replace(parameters=parameters)
    on_device.__annotations__ = {p.name: p.annotation for p in parameters}
    on_device.__annotations__["return"] = signature.return_annotation
    return on_device
