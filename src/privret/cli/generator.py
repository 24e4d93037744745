"""``privret generator``: fine-tuning of the query generator without DP (``train``: on public pairs, or the private
log's non-private ceiling) and with DP (``train-dp``: DP-Adam, per-unit clipping, Poisson sampling), and the untrained
generator prompted with public examples (``prompt``: the epsilon = 0 row every DP generator must beat).

Every default is a field of :class:`~privret.settings.training.GeneratorTrainConfig`, read from it here."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import budget_policy, build_config, given_values, hold_out_partition, out, training_pairs
from privret.cli.options import (
    DELTA_HELP,
    MODEL_HELP,
    AccountantOpt,
    AllowOverOpt,
    BudgetCapOpt,
    DataOpt,
    DatasetNameOpt,
    HoldOutForTrainingOpt,
    PairsOpt,
    ResumeOpt,
    SecureRngOpt,
    SeedOpt,
    SplitOpt,
    UnitOpt,
    config_file_option,
    device_option,
)
from privret.errors import InputError
from privret.settings.training import GeneratorTrainConfig

app = typer.Typer(help="Fine-tuning of the query generator, without and with DP, and the generator prompted with "
                       "public examples.", no_args_is_help=True)

DEFAULT = {name: field.default for name, field in GeneratorTrainConfig.model_fields.items()}
REGIME = (f"LoRA rank {DEFAULT['lora_rank']} on the top {DEFAULT['trained_layers']} layers, documents cut at "
          f"{DEFAULT['max_doc_tokens']} tokens, a checkpoint every {DEFAULT['checkpoint_every']} steps")
SCIFACT_UNITS = 807  # the query units of SciFact's train qrels, the log docs/results.md measured the defaults on
ConfigOpt = config_file_option("GeneratorTrainConfig")
OutOpt = Annotated[Path, typer.Option("--out", help="output directory (generator + privacy ledger)")]
ModelOpt = Annotated[str, typer.Option(help=f"the public generator to start from: {MODEL_HELP}")]
WarmStartOpt = Annotated[Optional[Path], typer.Option(
    "--warm-start", help="start from this generator, which must have been made from public data only "
                         "(generator train --public-pairs)")]
BatchSizeOpt = Annotated[int, typer.Option(help="expected units per step (Poisson; without DP: units per step)")]
EpochsOpt = Annotated[float, typer.Option(help="passes over the units (expected)")]
LrOpt = Annotated[float, typer.Option("--lr", help="Adam learning rate")]
# the fields of a DP fine-tune that a non-private one has no use for
DP_ONLY = ("epsilon", "delta", "clip_norm", "accountant", "secure_rng", "hold_out")


@app.command("train", help=(
    "Fine-tune a generator without DP on document -> query pairs: on public pairs (--public-pairs: no private data "
    "read, an epsilon 0 ledger), or on the private log (--data or --pairs: the non-private ceiling of the DP "
    "generator, an epsilon inf ledger, to be released to no one).\n\n"
    f"Rarely changed settings come from --config ({REGIME} by default)."))
@device_option
def generator_train(
    out_dir: OutOpt,
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    public_pairs: Annotated[Optional[Path], typer.Option(
        "--public-pairs", help="train on these PUBLIC pairs ({query, doc} JSONL) instead of a private log")] = None,
    warm_start: WarmStartOpt = None,
    model: ModelOpt = DEFAULT["model"],
    unit: UnitOpt = DEFAULT["unit"].value,
    batch_size: BatchSizeOpt = DEFAULT["batch_size"],
    epochs: EpochsOpt = DEFAULT["epochs"],
    learning_rate: LrOpt = DEFAULT["learning_rate"],
    seed: SeedOpt = DEFAULT["seed"],
    resume: ResumeOpt = False,
    non_private: Annotated[bool, typer.Option(
        "--non-private", help="confirm a fine-tune WITHOUT DP on the private log (--data or --pairs); the DP "
                              "fine-tune is privret generator train-dp")] = False,
    config: ConfigOpt = None,
) -> None:
    from privret.train.generator import train_generator
    from privret.train.public import train_public_generator

    if public_pairs is not None and (data, pairs, warm_start) != (None, None, None):
        raise InputError("trains on public data only; drop --data, --pairs and --warm-start", field="--public-pairs")
    from_file = build_config(GeneratorTrainConfig, config_file=config).model_fields_set if config else set()
    dp_only = [f for f in DP_ONLY if f in from_file]
    if dp_only:
        raise InputError("applies to privret generator train-dp only (train fine-tunes without DP)", path=config,
                         field=dp_only[0])
    cfg = build_config(GeneratorTrainConfig, config_file=config, epsilon=math.inf,
                       **given_values(model=model, unit=unit, batch_size=batch_size, epochs=epochs,
                                      learning_rate=learning_rate, seed=seed))
    if public_pairs is not None:
        if non_private:
            raise InputError("confirms training on a private log; --public-pairs are public", field="--non-private")
        ledger = train_public_generator(public_pairs, out_dir, cfg, resume=resume)
    else:
        if not non_private:
            raise InputError("generator train fine-tunes WITHOUT DP: add --non-private to train so on the private "
                             "log, or use privret generator train-dp for the DP fine-tune",
                             field="--data" if data is not None else "--pairs")
        training, data_hash = training_pairs(data, split, pairs)
        ledger = train_generator(training, out_dir, cfg, data_hash=data_hash, resume=resume, warm_start=warm_start)
    out.print(f"generator written to {out_dir}: {ledger.summary()}")


@app.command("train-dp", help=(
    "DP fine-tune a generator on the private log's document -> query pairs (DP-Adam, per-unit clipping, Poisson "
    "sampling): a DP release, charged to the data's privacy-budget registry.\n\n"
    "The defaults are the regime docs/results.md measures (\"DP synthetic queries\"): "
    f"{REGIME}, DP-Adam lr {DEFAULT['learning_rate']:g}, expected batch {DEFAULT['batch_size']} units, "
    f"{DEFAULT['epochs']:g} epochs ({math.ceil(DEFAULT['epochs'] * SCIFACT_UNITS / DEFAULT['batch_size'])} steps "
    f"on SciFact's {SCIFACT_UNITS} units), C = {DEFAULT['clip_norm']:g}, the "
    f"{DEFAULT['accountant'].upper()} accountant. It starts from the prompted generator: public examples in every "
    "prompt, in training and sampling (--public-examples, else three generic ones; start: pretrained in --config for "
    "the zero-shot prompt). Rarely changed settings come from --config."))
@device_option
def generator_train_dp(
    out_dir: OutOpt,
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    warm_start: WarmStartOpt = None,
    public_examples: Annotated[Optional[Path], typer.Option(
        "--public-examples", help="PUBLIC pairs ({query, doc} JSONL): the first 3 are shown in every prompt of the "
                                  "default prompted start (without it: privret's generic examples; --config start: "
                                  "pretrained for the zero-shot prompt)")] = None,
    model: ModelOpt = DEFAULT["model"],
    epsilon: Annotated[float, typer.Option(help="target epsilon (finite)")] = DEFAULT["epsilon"],
    delta: Annotated[Optional[float], typer.Option(help=DELTA_HELP)] = None,
    unit: UnitOpt = DEFAULT["unit"].value,
    clip_norm: Annotated[float, typer.Option(help="per-unit L2 clipping norm C")] = DEFAULT["clip_norm"],
    batch_size: BatchSizeOpt = DEFAULT["batch_size"],
    epochs: EpochsOpt = DEFAULT["epochs"],
    learning_rate: LrOpt = DEFAULT["learning_rate"],
    accountant: AccountantOpt = DEFAULT["accountant"],
    seed: SeedOpt = DEFAULT["seed"],
    resume: ResumeOpt = False,
    secure_rng: SecureRngOpt = DEFAULT["secure_rng"],
    hold_out: HoldOutForTrainingOpt = None,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
    config: ConfigOpt = None,
) -> None:
    from privret.data.pairs import examples_from_pairs
    from privret.privacy.budget import dataset_id
    from privret.train.generator import train_generator

    if not math.isfinite(epsilon):
        raise InputError("must be finite: a non-private fine-tune is privret generator train", field="--epsilon")
    policy = budget_policy(budget_cap, allow_over_budget)
    flags = given_values(model=model, epsilon=epsilon, delta=delta, unit=unit, clip_norm=clip_norm,
                         batch_size=batch_size, epochs=epochs, learning_rate=learning_rate, accountant=accountant,
                         seed=seed, secure_rng=secure_rng)
    if hold_out is not None:
        flags["hold_out"] = hold_out_partition(hold_out, None)
    cfg = build_config(GeneratorTrainConfig, config_file=config, **flags)
    if not math.isfinite(cfg.epsilon):
        raise InputError("must be finite: a non-private fine-tune is privret generator train", path=config,
                         field="epsilon")
    shown = examples_from_pairs(public_examples, 3) if public_examples is not None else None
    training, data_hash = training_pairs(data, split, pairs)
    ledger = train_generator(training, out_dir, cfg, data_hash=data_hash, dataset_id=dataset_id(training, dataset_name),
                             resume=resume, budget=policy, warm_start=warm_start, public_examples=shown)
    out.print(f"generator written to {out_dir}: {ledger.summary()}")


@app.command("prompt")
@device_option
def generator_prompt(
    out_dir: Annotated[Path, typer.Option("--out", help="output directory (generator + epsilon 0 ledger)")],
    public_pairs: Annotated[Path, typer.Option(
        "--public-pairs", help="PUBLIC pairs ({query, doc} JSONL); the first --examples of them go in the prompt")],
    examples: Annotated[int, typer.Option(help="how many public pairs the prompt shows", min=1, max=32)] = 3,
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = DEFAULT["model"],
    unit: UnitOpt = DEFAULT["unit"].value,
    max_doc_tokens: Annotated[int, typer.Option(help="document tokens shown per example and per prompt", min=1)]
    = DEFAULT["max_doc_tokens"],
    max_query_tokens: Annotated[int, typer.Option(min=1)] = DEFAULT["max_query_tokens"],
) -> None:
    """Save the public generator, untrained, prompted with public examples: a generator with no private data.

    Its queries are the epsilon = 0 "prompted" row (docs/privacy.md, "Rows without private data"): it reads
    only the public model and the public pairs, so its ledger says epsilon 0 and records the examples' hash.
    Sample from it with `privret synth generate`, as from a trained generator.
    """
    from privret.data.pairs import examples_from_pairs
    from privret.train.public import write_prompted_generator

    few_shot = examples_from_pairs(public_pairs, examples)
    ledger = write_prompted_generator(model, few_shot, out_dir, unit=unit, max_doc_tokens=max_doc_tokens,
                                      max_query_tokens=max_query_tokens)
    out.print(f"prompted generator ({len(few_shot)} public examples) written to {out_dir}: {ledger.summary()}")
