"""``privret retriever``: the dual encoder trained without DP (``train``) or with direct DP (``train-dp``), a DP
choice among retrievers (``select``) and their interpolation with the public base (``interpolate``).

Every default of ``train`` is a field of :class:`~privret.settings.training.RetrieverTrainConfig`, every default of
``train-dp`` one of :class:`~privret.settings.training.DPRetrieverConfig` (its batch and epochs, when not given, the
rule of :func:`~privret.settings.training.dp_schedule`, of the number of units n, which privret treats as public).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from privret.cli.common import (budget_policy, build_config, flag, given_flags, given_values, hold_out_partition,
                                out, training_pairs)
from privret.cli.options import (
    ENCODER_HELP,
    MODEL_HELP,
    AllowOverOpt,
    BudgetCapOpt,
    DataOpt,
    DatasetNameOpt,
    HoldOutForTrainingOpt,
    HoldOutOpt,
    HoldOutSaltOpt,
    LearningRateOpt,
    PairsOpt,
    ResumeOpt,
    SeedOpt,
    SplitOpt,
    UnitOpt,
    config_file_option,
    device_option,
)
from privret.errors import InputError
from privret.settings.training import METHODS, DPRetrieverConfig, RetrieverTrainConfig

app = typer.Typer(help="Training the dual-encoder retriever.", no_args_is_help=True)

PLAIN = {name: field.default for name, field in RetrieverTrainConfig.model_fields.items()}
DP = {name: field.default for name, field in DPRetrieverConfig.model_fields.items()}
OutOpt = Annotated[Path, typer.Option("--out", help="output directory (SentenceTransformer)")]
ModelOpt = Annotated[str, typer.Option(help=f"the public encoder to start from: {MODEL_HELP}")]
# the fields a method ignores (DPRetrieverConfig.unused): refused when the command line or the file sets them
METHOD_OPTIONS = ("physical_batch", "public_negatives", "hard_negative_depth", "max_batch_units", "lora_rank")


@app.command("train")
@device_option
def retriever_train(
    out_dir: OutOpt,
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    config: config_file_option("RetrieverTrainConfig") = None,
    model: ModelOpt = PLAIN["model"],
    epochs: Annotated[float, typer.Option(help="passes over the pairs")] = PLAIN["epochs"],
    batch_size: Annotated[int, typer.Option(help="pairs per step (in-batch negatives)")] = PLAIN["batch_size"],
    learning_rate: LearningRateOpt = PLAIN["learning_rate"],
    temperature: Annotated[float, typer.Option(help="softmax temperature")] = PLAIN["temperature"],
    seed: SeedOpt = PLAIN["seed"],
    max_doc_tokens: Annotated[int, typer.Option(help="documents cut to this many tokens in training")]
        = PLAIN["max_doc_tokens"],
    select: Annotated[Optional[str], typer.Option(
        help="choose the recipe on a validation split of the training pairs; a grid "
             "'name=v1,v2;name=v1,v2' over learning_rate, temperature, batch_size, max_doc_tokens, "
             "max_query_tokens, warmup_fraction ('default': max_doc_tokens=128,256); epochs 1..--select-max-epochs "
             "are scored too (so --epochs, and the flags the grid names, are not given with it); the validation "
             "split is drawn with seed 0 whatever --seed, so that seeds differ in training only")] = None,
    select_max_epochs: Annotated[int, typer.Option(help="--select: most epochs scored")] = 3,
    validation_pool: Annotated[int, typer.Option(
        help="--select: documents searched by the validation queries besides their relevant ones")] = 1000,
    public: Annotated[bool, typer.Option(
        "--public", help="the training pairs are public data, no private query among them (your statement; privret "
                         "cannot check it); the output gets an epsilon-0 ledger with their sha256 as provenance, so "
                         "that it may be a public base or candidate of DP steps")] = False,
) -> None:
    """Train a dual encoder without DP (in-batch softmax) on original or synthetic pairs; `privret retriever
    train-dp` trains one with DP."""
    flags = given_values(model=model, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
                         temperature=temperature, seed=seed, max_doc_tokens=max_doc_tokens)
    cfg = build_config(RetrieverTrainConfig, config_file=config, **flags,
                       **_selection(select, select_max_epochs, validation_pool))
    training, data_hash = training_pairs(data, split, pairs)
    _train_non_private(training, data_hash, out_dir, cfg, synthetic_set=data if pairs is None else None,
                       public=public)


def _selection(select: str | None, max_epochs: int, validation_pool: int) -> dict:
    """The ``selection`` field that ``--select`` and its two flags give ({} without --select); what it chooses
    replaces what is given, so those flags are refused beside it."""
    if select is None:
        if given := given_flags("select_max_epochs", "validation_pool"):
            raise InputError("applies with --select only", field=given[0])
        return {}
    grid = ["max_doc_tokens"] if select == "default" else list(parse_grid(select))
    chosen = given_flags("epochs", *[n for n in grid if n in ("learning_rate", "temperature", "batch_size",
                                                            "max_doc_tokens")])
    if chosen:
        raise InputError("is chosen by --select (epochs always, the rest when its grid names it): the value given "
                         "would be replaced", field=chosen[0])
    return {"selection": {**({} if select == "default" else {"grid": parse_grid(select)}),
                          "max_epochs": max_epochs, "validation_pool": validation_pool}}


@app.command("train-dp", help=(
    "Train a dual encoder with direct DP (DP-SGD with per-unit clipping and Poisson sampling; docs/direct-dp.md).\n\n"
    "The defaults are the regime docs/results.md measures on SQuAD and SciFact: public-negatives, BitFit of the top 3 "
    "layers, 2 hard and 1 random public negative per unit, no dropout, C = 1, lr 2e-3, documents cut at 256 tokens, "
    "and the batch and epochs of a rule of the number of units n (privret.settings.training.dp_schedule): batch n "
    "up to 1,024 units, else 512, and about 48 steps in whole epochs; its evidence is those two logs (SciFact, 807 "
    "units: 807 x 48 epochs; SQuAD, 5,747 units: 512 x 4 epochs, 45 steps). n is treated as public "
    "(docs/privacy.md), as the sample rate and the default delta already do.\n\n"
    "The rarely changed settings (temperature, lora_rank, hard_negative_depth, physical_batch, max_batch_units, "
    "spreadout_weight, max_doc_tokens, accountant, secure_rng, checkpoint_every, hold_out's salt, ...) come from "
    "--config."))
@device_option
def retriever_train_dp(
    out_dir: OutOpt,
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="BEIR dataset directory: the private pairs of --split, and the public corpus that "
                       "public-negatives draws its negatives from")] = None,
    split: SplitOpt = "train", pairs: PairsOpt = None,
    config: config_file_option("DPRetrieverConfig") = None,
    method: Annotated[str, typer.Option(
        click_type=click.Choice(METHODS), help="the mechanism (docs/direct-dp.md): public-negatives (Delta = C), "
                                               "naive (2KC), batch-clip (2C) or logit-dp")] = DP["method"],
    model: ModelOpt = DP["model"],
    epsilon: Annotated[float, typer.Option(help="target epsilon")] = DP["epsilon"],
    delta: Annotated[Optional[float], typer.Option(help="default 1/(2n), n units")] = None,
    unit: UnitOpt = DP["unit"].value,
    clip_norm: Annotated[float, typer.Option(help="clipping norm (C per unit or batch, B per pair for logit-dp)")]
        = DP["clip_norm"],
    batch_size: Annotated[Optional[int], typer.Option(
        help="expected units per step (Poisson); default: n, the number of units trained on, up to 1,024 (the whole "
             "log in every step), else 512")] = None,
    epochs: Annotated[Optional[float], typer.Option(
        help="expected passes over the units; default: 48 q (q = batch / n) in whole epochs, or 48 q under one "
             "epoch: about 48 steps (privret.settings.training.dp_schedule, measured at n = 807 and 5,747)")] = None,
    learning_rate: LearningRateOpt = DP["learning_rate"],
    trainable: Annotated[str, typer.Option(
        help="all, layers, top:K, lora, bias (BitFit) or bias-top:K (BitFit of the top K layers)")] = DP["trainable"],
    public_negatives: Annotated[Optional[int], typer.Option(
        help="public-negatives: random documents of --data's corpus per step, without gradient (default 1 with hard "
             "negatives, else 32)")] = None,
    hard_negatives: Annotated[Optional[int], typer.Option(
        help="public-negatives: hard negatives per row, among the top documents of --data's corpus that the initial "
             "encoder ranks for its query (with gradient; Delta = C still; default 2)")] = None,
    dropout: Annotated[bool, typer.Option(
        "--dropout/--no-dropout", help="dropout in the trained layers (default: off, every step in eval mode)")]
        = DP["dropout"],
    cache_dir: Annotated[Optional[Path], typer.Option(
        help="with hard negatives: keep the public initial encoder's embeddings of --data's corpus here (no private "
             "query is in them), so that later runs and resumes skip that encoding")] = None,
    resume: ResumeOpt = False,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
    hold_out: HoldOutForTrainingOpt = None,
) -> None:
    from privret.privacy.budget import dataset_id
    from privret.train.dp_retriever import train_dp_retriever

    policy = budget_policy(budget_cap, allow_over_budget)
    flags = given_values(method=method, model=model, epsilon=epsilon, delta=delta, unit=unit, clip_norm=clip_norm,
                         batch_size=batch_size, epochs=epochs, learning_rate=learning_rate, trainable=trainable,
                         public_negatives=public_negatives, hard_negatives=hard_negatives, dropout=dropout)
    if hold_out is not None:
        flags["hold_out"] = hold_out_partition(hold_out, None)
    cfg = build_config(DPRetrieverConfig, config_file=config, **flags)
    _refuse_unused(cfg, flags, config)
    if cfg.method == "public-negatives" and data is None:
        raise InputError("public-negatives draws its negatives from a public corpus: pass --data DIR (its "
                         "corpus.jsonl); documents given inline in --pairs are private", field="--data")
    if cache_dir is not None and not cfg.hard_negatives:
        raise InputError("keeps the embeddings hard negatives are mined from; this run mines none",
                         field="--cache-dir")
    training, data_hash = training_pairs(data, split, pairs)
    # --data's corpus plus any documents inline in --pairs: train_dp_retriever leaves the inline ones out
    ledger = train_dp_retriever(training, out_dir, cfg, data_hash=data_hash,
                                dataset_id=dataset_id(training, dataset_name), public_corpus=training.corpus,
                                budget=policy, resume=resume, embedding_cache=cache_dir)
    out.print(f"retriever written to {out_dir} ({ledger.summary()}, {cfg.method})")


def _refuse_unused(cfg: DPRetrieverConfig, flags: dict, config: Path | None) -> None:
    """Refuse an option ``cfg``'s method ignores (another method's, ``hard_negative_depth`` without hard negatives,
    ``lora_rank`` without LoRA) that a flag or the ``--config`` file sets, naming the flag or the file's field."""
    from privret.io import read_yaml_mapping

    from_file = read_yaml_mapping(config) if config is not None else {}
    unused = cfg.unused(n for n in METHOD_OPTIONS if n in flags or n in from_file)
    if unused:
        where = {"field": flag(unused[0])} if unused[0] in flags else {"field": unused[0], "path": config}
        raise InputError(f"is not used by --method {cfg.method} with these options", **where)


@app.command("select")
@device_option
def retriever_select(
    out_dir: Annotated[Path, typer.Option("--out", help="output directory: the chosen retriever")],
    candidate: Annotated[list[Path], typer.Option(
        "--candidate", help="a fine-tuned retriever to choose from (repeat the flag for several); its privret "
                            "ledger is composed into the output's, and a directory without one counts as public")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    epsilon: Annotated[float, typer.Option(help="epsilon of the choice (pure DP, delta 0), added to the "
                                                "candidates' own")] = 1.0,
    base: Annotated[str, typer.Option(help="the public encoder the candidates were fine-tuned from "
                                           f"(itself a candidate); {ENCODER_HELP}")] = "minilm-l6",
    weights: Annotated[str, typer.Option(
        help="interpolation weights alpha in (0, 1]: each candidate also enters as (1 - alpha) base + alpha "
             "candidate (WiSE-FT)")] = "0.5,1",
    unit: UnitOpt = "query",
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
    hold_out: HoldOutOpt = None,
    hold_out_salt: HoldOutSaltOpt = None,
) -> None:
    """Choose, with DP, the best of the base encoder, the candidates and their interpolations by NDCG@10 on
    the private log (exponential mechanism; guards against negative transfer of synthetic data)."""
    from privret.privacy.budget import dataset_id
    from privret.privacy.ledger import PrivacyLedger
    from privret.train.private_selection import select_retriever
    from privret.settings.training import PrivateSelectionConfig

    policy = budget_policy(budget_cap, allow_over_budget)
    training, data_hash = training_pairs(data, split, pairs)
    try:
        alphas = [float(w) for w in weights.split(",") if w.strip()]
    except ValueError:
        raise InputError(f"'{weights}' is not a comma-separated list of numbers", field="--weights") from None
    cfg = build_config(PrivateSelectionConfig, epsilon=epsilon, base=base, candidates=[str(c) for c in candidate],
                       weights=alphas, unit=unit, hold_out=hold_out_partition(hold_out, hold_out_salt))
    record = select_retriever(training, out_dir, cfg, data_hash=data_hash,
                              dataset_id=dataset_id(training, dataset_name), budget=policy)
    ledger = PrivacyLedger.load(out_dir)
    out.print(f"chose {record['chosen']} of {len(record['candidates'])} candidates (epsilon {epsilon:g}); "
              f"written to {out_dir}; its ledger: epsilon {ledger.epsilon:.3g}, delta {ledger.delta:.2g}"
              + (f" ({ledger.composition})" if ledger.composition else ""), markup=False)  # it holds [brackets]


@app.command("interpolate")
@device_option
def retriever_interpolate(
    model: Annotated[Path, typer.Option(help="a retriever privret trained (it has a privacy_ledger.json)")],
    weight: Annotated[float, typer.Option(help="alpha in (0, 1]: the output is (1 - alpha) base + alpha model; fix "
                                               "it without the private log (a priori or on a public proxy)")],
    out_dir: Annotated[Path, typer.Option("--out", help="output directory: the interpolated retriever")],
    base: Annotated[str, typer.Option(help=f"the public encoder the model was fine-tuned from; {ENCODER_HELP}")]
        = "minilm-l6",
) -> None:
    """Interpolate a retriever with its public base (WiSE-FT); post-processing: the ledger is the model's."""
    from privret.train.interpolated_release import save_interpolated

    ledger = save_interpolated(model, out_dir, base=base, weight=weight)
    out.print(f"retriever written to {out_dir} ({ledger.summary()}, weight {weight:g} on {model})")


def _train_non_private(training, data_hash: str, out_dir: Path, cfg: RetrieverTrainConfig, *,
                       synthetic_set: Path | None, public: bool) -> None:
    """Train without DP. Its ledger is that of ``synthetic_set`` when it has one (training on a synthetic set is
    post-processing of it); with ``public``, a public epsilon-0 one; else the ledger of the original pairs: no
    guarantee."""
    from privret.privacy.ledger import PrivacyLedger, has_ledger
    from privret.train.retriever import train_non_private

    synthetic = PrivacyLedger.load(synthetic_set) if synthetic_set is not None and has_ledger(synthetic_set) else None
    ledger = train_non_private(training, out_dir, cfg, data_hash=data_hash, synthetic=synthetic, public=public)
    out.print(f"retriever written to {out_dir} ({ledger.summary()})")


def parse_grid(text: str) -> dict[str, list[int | float]]:
    """'name=v1,v2;name=v3' -> {name: [v1, v2], name: [v3]}; a one-line error names --select."""
    grid = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, values = part.partition("=")
        try:
            if not sep:
                raise ValueError
            grid[name.strip()] = [float(v) if any(c in v for c in ".eE") else int(v) for v in values.split(",")]
        except ValueError:
            raise InputError(f"'{part}' is not name=value,value", field="--select") from None
    return grid
