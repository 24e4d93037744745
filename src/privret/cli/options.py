"""Options that several commands share, each defined (and its help text written) once.

Single options are ``Annotated`` types: ``data: DataOpt = None``. The generator fine-tuning options,
which ``generator train`` and ``audit canaries`` both take (with different defaults), come as a block
from :func:`generator_training_options`.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.audit.private_output import ALLOW_FLAG
from privret.errors import InputError

MODEL_HELP = "registry name, local path or HF id"
ENCODER_HELP = f"encoder: {MODEL_HELP}"
DELTA_HELP = "default 1/(2n), n units"
UNIT_HELP = "privacy unit: query, pair or user"
ACCOUNTANT_HELP = "prv or rdp"

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
                       "of each unit's key: retriever train --dp and generator train train on the rest, retriever "
                       "select scores on these; with the same --hold-out and --hold-out-salt the two cost the larger "
                       "epsilon, not the sum")]
HoldOutSaltOpt = Annotated[Optional[str], typer.Option(
    "--hold-out-salt", help="--hold-out: the public salt of the hash (any text fixed without looking at the log; "
                            "default privret-hold-out)")]

# training
EpochsOpt = Annotated[float, typer.Option()]
LearningRateOpt = Annotated[float, typer.Option("--lr")]
SeedOpt = Annotated[int, typer.Option(help="seed of the randomness that is not a DP mechanism's; a DP training run "
                                       "ignores it (its draws seeded from os.urandom on every start; with "
                                       "--secure-rng, all but dropout drawn from it)")]
# crash safety and DP randomness of the DP trainers (generator train, retriever train --dp)
ResumeOpt = Annotated[bool, typer.Option(help="continue an interrupted run in --out")]
SecureRngOpt = Annotated[bool, typer.Option(help="every draw of the DP mechanism (noise, sampling, a step's negatives) "
                                                 "from the OS CSPRNG (os.urandom); dropout masks never (the ledger's "
                                                 "random_sources names each draw's source)")]
CheckpointEveryOpt = Annotated[int, typer.Option(
    min=1, help="DP training: write a resumable checkpoint every N steps (one write of the trained weights)")]


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

# GeneratorTrainConfig fields, in --help order
_GENERATOR_TRAINING = {
    "clip_norm": Annotated[float, typer.Option(help="per-unit L2 clipping norm C")],
    "batch_size": Annotated[int, typer.Option(help="expected units per step (Poisson)")],
    "epochs": EpochsOpt,
    "learning_rate": LearningRateOpt,
    "trainable": Annotated[str, typer.Option(help="lora or full")],
    "lora_rank": Annotated[int, typer.Option()],
    "trained_layers": Annotated[int, typer.Option(help="train the top k layers (0 = all)")],
    "max_doc_tokens": Annotated[int, typer.Option()],
}


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


def generator_training_options(*, clip_norm: float, batch_size: int, epochs: float, learning_rate: float,
                               trainable: str, lora_rank: int, trained_layers: int, max_doc_tokens: int):
    """Decorator: the command's ``fine_tuning`` parameter becomes the generator fine-tuning options
    (``--clip-norm`` ... ``--max-doc-tokens``, at its place in ``--help``) with these defaults.

    The command receives them as one dict of :class:`~privret.settings.training.GeneratorTrainConfig`
    fields, ``--trained-layers 0`` (all layers) given as ``trained_layers=None``.
    """
    defaults = dict(clip_norm=clip_norm, batch_size=batch_size, epochs=epochs, learning_rate=learning_rate,
                    trainable=trainable, lora_rank=lora_rank, trained_layers=trained_layers,
                    max_doc_tokens=max_doc_tokens)

    def decorate(command):
        signature = inspect.signature(command, eval_str=True)
        parameters = []
        for parameter in signature.parameters.values():
            if parameter.name != "fine_tuning":
                parameters.append(parameter)
                continue
            parameters += [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=defaults[name],
                                             annotation=annotation)
                           for name, annotation in _GENERATOR_TRAINING.items()]

        @functools.wraps(command)
        def with_fine_tuning(**values):
            fine_tuning = {name: values.pop(name) for name in _GENERATOR_TRAINING}
            fine_tuning["trained_layers"] = fine_tuning["trained_layers"] or None
            return command(**values, fine_tuning=fine_tuning)

        with_fine_tuning.__signature__ = signature.replace(parameters=parameters)
        with_fine_tuning.__annotations__ = {p.name: p.annotation for p in parameters}
        with_fine_tuning.__annotations__["return"] = signature.return_annotation
        return with_fine_tuning

    return decorate
