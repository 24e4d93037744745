"""``privret generator train`` (DP fine-tuning of the query generator) and ``privret generator prompt`` (the
untrained generator with public few-shot examples: the epsilon = 0 row every DP generator must beat)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import budget_policy, build_config, given_flags, hold_out_partition, out, training_pairs
from privret.cli.options import (
    ACCOUNTANT_HELP,
    DELTA_HELP,
    MODEL_HELP,
    UNIT_HELP,
    AllowOverOpt,
    BudgetCapOpt,
    CheckpointEveryOpt,
    DataOpt,
    DatasetNameOpt,
    HoldOutOpt,
    HoldOutSaltOpt,
    PairsOpt,
    ResumeOpt,
    SecureRngOpt,
    SeedOpt,
    SplitOpt,
    device_option,
    generator_training_options,
)

app = typer.Typer(help="DP fine-tuning of the query generator, and the generators made without private data.",
                  no_args_is_help=True)


@app.command("train")
@device_option
@generator_training_options(clip_norm=1.0, batch_size=64, epochs=3.0, learning_rate=2e-3, trainable="lora",
                            lora_rank=8, trained_layers=8, max_doc_tokens=128)
def generator_train(
    out_dir: Annotated[Path, typer.Option("--out", help="output directory (generator + privacy ledger)")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    public_pairs: Annotated[Optional[Path], typer.Option(
        "--public-pairs", help="train on these PUBLIC pairs ({query, doc} JSONL) without DP instead of private "
                               "data: a generator with no private data (epsilon 0 ledger)")] = None,
    warm_start: Annotated[Optional[Path], typer.Option(
        "--warm-start", help="start from this generator, which must have been made from public data only "
                             "(--public-pairs)")] = None,
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = "smollm2-135m",
    epsilon: Annotated[Optional[float], typer.Option(
        help="target epsilon (default 8); 'inf' for non-private; not with --public-pairs")] = None,
    delta: Annotated[Optional[float], typer.Option(help=DELTA_HELP)] = None,
    unit: Annotated[str, typer.Option(help=UNIT_HELP)] = "query",
    fine_tuning: dict = None,  # --clip-norm ... --max-doc-tokens, see @generator_training_options
    accountant: Annotated[str, typer.Option(help=ACCOUNTANT_HELP)] = "prv",
    seed: SeedOpt = 0,
    resume: ResumeOpt = False,
    checkpoint_every: CheckpointEveryOpt = 10,
    secure_rng: SecureRngOpt = False,
    hold_out: HoldOutOpt = None,
    hold_out_salt: HoldOutSaltOpt = None,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
) -> None:
    """DP fine-tune a generator on document -> query pairs (DP-Adam, per-unit clipping, Poisson).

    With --public-pairs, fine-tune it without DP on public pairs instead: no private data is read.
    """
    from privret.errors import InputError
    from privret.privacy.budget import dataset_id
    from privret.train.generator import train_generator
    from privret.train.settings import GeneratorTrainConfig
    from privret.train.public import train_public_generator

    if public_pairs is not None and any(v is not None for v in (epsilon, data, pairs, warm_start)):
        raise InputError("--public-pairs trains without DP on public data only; drop --epsilon, --data, --pairs and "
                         "--warm-start",
                         field="--public-pairs")
    non_private = public_pairs is not None or (epsilon is not None and math.isinf(epsilon))
    dp_only = given_flags("delta", "clip_norm", "accountant", "secure_rng", "budget_cap", "allow_over_budget",
                          "dataset_name") if non_private else []
    if dp_only:
        raise InputError("applies to DP fine-tuning only: a non-private one (--epsilon inf, --public-pairs) adds no "
                         "noise and spends no budget", field=dp_only[0])
    values = dict(model=model, delta=delta, unit=unit, **fine_tuning, accountant=accountant, seed=seed,
                  checkpoint_every=checkpoint_every, secure_rng=secure_rng,
                  hold_out=hold_out_partition(hold_out, hold_out_salt))
    if public_pairs is not None:
        cfg = build_config(GeneratorTrainConfig, epsilon=math.inf, **values)
        ledger = train_public_generator(public_pairs, out_dir, cfg, resume=resume)
    else:
        policy = budget_policy(budget_cap, allow_over_budget)
        training, data_hash = training_pairs(data, split, pairs)
        cfg = build_config(GeneratorTrainConfig, epsilon=8.0 if epsilon is None else epsilon, **values)
        ledger = train_generator(training, out_dir, cfg, data_hash=data_hash,
                                 dataset_id=dataset_id(training, dataset_name), resume=resume, budget=policy,
                                 warm_start=warm_start)
    out.print(f"generator written to {out_dir}: {ledger.summary()}")


@app.command("prompt")
@device_option
def generator_prompt(
    out_dir: Annotated[Path, typer.Option("--out", help="output directory (generator + epsilon 0 ledger)")],
    public_pairs: Annotated[Path, typer.Option(
        "--public-pairs", help="PUBLIC pairs ({query, doc} JSONL); the first --examples of them go in the prompt")],
    examples: Annotated[int, typer.Option(help="how many public pairs the prompt shows", min=1, max=32)] = 3,
    model: Annotated[str, typer.Option(help=MODEL_HELP)] = "smollm2-135m",
    unit: Annotated[str, typer.Option(help=UNIT_HELP)] = "query",
    max_doc_tokens: Annotated[int, typer.Option(help="document tokens shown per example and per prompt", min=1)] = 128,
    max_query_tokens: Annotated[int, typer.Option(min=1)] = 48,
) -> None:
    """Save the public generator, untrained, prompted with public examples: a generator with no private data.

    Its queries are the epsilon = 0 "prompted" row (docs/privacy.md, "Rows without private data"): it reads
    only the public model and the public pairs, so its ledger says epsilon 0 and records the examples' hash.
    Sample from it with `privret generate`, as from a trained generator.
    """
    from privret.data.pairs import examples_from_pairs
    from privret.train.public import write_prompted_generator

    few_shot = examples_from_pairs(public_pairs, examples)
    ledger = write_prompted_generator(model, few_shot, out_dir, unit=unit, max_doc_tokens=max_doc_tokens,
                                      max_query_tokens=max_query_tokens)
    out.print(f"prompted generator ({len(few_shot)} public examples) written to {out_dir}: {ledger.summary()}")
