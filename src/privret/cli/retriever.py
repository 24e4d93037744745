"""``privret retriever train``: the dual encoder, non-private or (``--dp``) with direct DP."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import (budget_policy, build_config, flag, given_flags, hold_out_partition, out,
                                training_pairs)
from privret.cli.options import (
    ACCOUNTANT_HELP,
    DELTA_HELP,
    ENCODER_HELP,
    UNIT_HELP,
    AllowOverOpt,
    BudgetCapOpt,
    CheckpointEveryOpt,
    DataOpt,
    DatasetNameOpt,
    EpochsOpt,
    HoldOutOpt,
    HoldOutSaltOpt,
    LearningRateOpt,
    PairsOpt,
    ResumeOpt,
    SecureRngOpt,
    SeedOpt,
    SplitOpt,
    device_option,
)
from privret.errors import InputError

app = typer.Typer(help="Training the dual-encoder retriever.", no_args_is_help=True)


@app.command("train")
@device_option
def retriever_train(
    out_dir: Annotated[Path, typer.Option("--out", help="output directory (SentenceTransformer)")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    model: Annotated[str, typer.Option(help=ENCODER_HELP)] = "minilm-l6",
    epochs: EpochsOpt = 1.0,
    batch_size: Annotated[int, typer.Option(help="batch size (with --dp: expected units per step)")] = 32,
    learning_rate: LearningRateOpt = 2e-5,
    temperature: Annotated[Optional[float], typer.Option(
        help="softmax temperature (default 0.05; with --dp logit-dp 0.5)")] = None,
    seed: SeedOpt = 0,
    max_doc_tokens: Annotated[Optional[int], typer.Option(
        help="documents cut to this many tokens in training (default 128; with --dp 256)")] = None,
    dp: Annotated[Optional[str], typer.Option(
        "--dp", help="train directly with DP: naive, batch-clip, logit-dp or public-negatives")] = None,
    epsilon: Annotated[float, typer.Option(help="--dp: target epsilon")] = 8.0,
    delta: Annotated[Optional[float], typer.Option(help=f"--dp: {DELTA_HELP}")] = None,
    unit: Annotated[str, typer.Option(help=f"--dp: {UNIT_HELP}")] = "query",
    clip_norm: Annotated[float, typer.Option(help="--dp: clipping norm (C per unit/batch, B per pair)")] = 1.0,
    max_batch_units: Annotated[Optional[int], typer.Option(help="--dp: cap K on units per step")] = None,
    trainable: Annotated[str, typer.Option(help="--dp: all, layers, top:K, lora, bias (BitFit) or bias-top:K (BitFit on the top K layers)")] = "all",
    physical_batch: Annotated[Optional[int], typer.Option(
        help="--dp public-negatives: units per forward pass (memory only; default: the whole batch)")] = None,
    lora_rank: Annotated[int, typer.Option(help="--dp: LoRA rank")] = 8,
    public_negatives: Annotated[int, typer.Option(
        help="--dp public-negatives: random negatives per step, drawn from --data's corpus, without gradient "
             "(0: none; then --hard-negatives must be >= 1)")] = 32,
    hard_negatives: Annotated[int, typer.Option(
        help="--dp public-negatives: hard negatives per row, drawn from the top --hard-negative-depth documents "
             "of --data's corpus that the initial encoder ranks for its query (with gradient; Delta = C still)")] = 0,
    hard_negative_depth: Annotated[int, typer.Option(help="--dp public-negatives: candidates per row for "
                                                          "--hard-negatives")] = 30,
    dropout: Annotated[bool, typer.Option(
        "--dropout/--no-dropout", help="--dp: dropout in the trained layers during training (default --no-dropout: "
                                       "every step in eval mode, deterministic and faster on a CPU)")] = False,
    cache_dir: Annotated[Optional[Path], typer.Option(
        help="--dp public-negatives --hard-negatives: keep the public initial encoder's embeddings of --data's "
             "corpus here (no private query is in them), so that later runs and resumes skip that encoding")] = None,
    spreadout_weight: Annotated[float, typer.Option(help="--dp logit-dp: spreadout regulariser weight")] = 0.0,
    accountant: Annotated[str, typer.Option(help=f"--dp: {ACCOUNTANT_HELP}")] = "prv",
    resume: ResumeOpt = False,
    checkpoint_every: CheckpointEveryOpt = 10,
    secure_rng: SecureRngOpt = False,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
    hold_out: HoldOutOpt = None,
    hold_out_salt: HoldOutSaltOpt = None,
    select: Annotated[Optional[str], typer.Option(
        help="non-private only: choose the recipe on a validation split of the training pairs; a grid "
             "'name=v1,v2;name=v1,v2' over learning_rate, temperature, batch_size, max_doc_tokens, "
             "max_query_tokens, warmup_fraction ('default': max_doc_tokens=128,256); epochs 1..--select-max-epochs "
             "are scored too (so --epochs, and the flags the grid names, are not given with it); the validation "
             "split is drawn with seed 0 whatever --seed, so that seeds differ in training only")] = None,
    select_max_epochs: Annotated[int, typer.Option(help="--select: most epochs scored")] = 3,
    validation_pool: Annotated[int, typer.Option(
        help="--select: documents searched by the validation queries besides their relevant ones")] = 1000,
    public: Annotated[bool, typer.Option(
        "--public", help="non-private only: the training pairs are public data, no private query among them (your "
                         "statement; privret cannot check it); the output gets an epsilon-0 ledger with their "
                         "sha256 as provenance, so that it may be a public base or candidate of DP steps")] = False,
) -> None:
    """Train a dual encoder (in-batch softmax) on original or synthetic pairs; --dp trains it with DP directly."""
    from privret.train.settings import RetrieverTrainConfig

    policy = budget_policy(budget_cap, allow_over_budget)
    training, data_hash = training_pairs(data, split, pairs)
    if select is not None:  # what it chooses replaces what is given
        grid = ["max_doc_tokens"] if select == "default" else list(parse_grid(select))
        chosen = given_flags("epochs", *[n for n in grid if n in ("learning_rate", "temperature", "batch_size",
                                                                    "max_doc_tokens")])
        if chosen:
            raise InputError("is chosen by --select (epochs always, the rest when its grid names it): the value "
                             "given would be replaced", field=chosen[0])
    if select is None and given_flags("select_max_epochs", "validation_pool"):
        raise InputError("applies with --select only", field=given_flags("select_max_epochs", "validation_pool")[0])
    if dp is not None and select is not None:
        raise InputError("applies to non-private training only: a validation split of private queries would need "
                         "a privacy budget of its own", field="--select")
    if dp is not None and public:
        raise InputError("applies to non-private training only: DP training is for private data", field="--public")
    lengths = {} if max_doc_tokens is None else {"max_doc_tokens": max_doc_tokens}
    partition = hold_out_partition(hold_out, hold_out_salt)
    if dp is not None:
        from privret.privacy.budget import dataset_id
        from privret.train.dp_retriever import train_dp_retriever
        from privret.train.settings import DPRetrieverConfig

        _check_method(dp, data)
        if cache_dir is not None and not hard_negatives:
            raise InputError("keeps the embeddings --hard-negatives mines from; without it nothing is mined",
                             field="--cache-dir")
        dp_cfg = build_config(DPRetrieverConfig, method=dp, model=model, epsilon=epsilon, delta=delta, unit=unit,
                              clip_norm=clip_norm, batch_size=batch_size, max_batch_units=max_batch_units,
                              epochs=epochs, learning_rate=learning_rate, temperature=temperature,
                              spreadout_weight=spreadout_weight, trainable=trainable, lora_rank=lora_rank,
                              public_negatives=public_negatives, hard_negatives=hard_negatives,
                              hard_negative_depth=hard_negative_depth, physical_batch=physical_batch, accountant=accountant,
                              seed=seed, checkpoint_every=checkpoint_every, secure_rng=secure_rng,
                              dropout=dropout, hold_out=partition, **lengths)
        unused = dp_cfg.unused(n for n in ("physical_batch", "public_negatives", "hard_negative_depth",
                                           "max_batch_units", "lora_rank")
                               if given_flags(n))
        if unused:
            raise InputError(f"is not used by --dp {dp} with these options", field=flag(unused[0]))
        # --data's corpus plus any documents inline in --pairs: train_dp_retriever leaves the inline ones out
        ledger = train_dp_retriever(training, out_dir, dp_cfg, data_hash=data_hash,
                                    dataset_id=dataset_id(training, dataset_name), public_corpus=training.corpus,
                                    budget=policy, resume=resume, embedding_cache=cache_dir)
        out.print(f"retriever written to {out_dir} ({ledger.summary()}, {dp})")
        return
    for flag_name, given, why in (("--resume", resume, "is not checkpointed"),
                                  ("--secure-rng", secure_rng, "draws no noise"),
                                  ("--hard-negatives", hard_negatives > 0, "uses in-batch negatives"),
                                  ("--cache-dir", cache_dir is not None, "mines no hard negatives"),
                                  ("--dropout" if dropout else "--no-dropout", bool(given_flags("dropout")),
                                   "keeps sentence-transformers' dropout"),
                                  ("--hold-out", hold_out is not None, "has no DP choice to hold units out for")):
        if given:
            raise InputError(f"applies to DP training (--dp) only; non-private training {why}", field=flag_name)
    dp_only = given_flags("epsilon", "delta", "unit", "clip_norm", "max_batch_units", "trainable", "physical_batch",
                          "lora_rank", "public_negatives", "hard_negative_depth", "spreadout_weight", "accountant",
                          "checkpoint_every", "budget_cap", "allow_over_budget", "dataset_name")
    if dp_only:
        raise InputError("applies to DP training (--dp) only: without --dp the retriever trains with no noise and "
                         "no guarantee", field=dp_only[0])
    cfg = build_config(RetrieverTrainConfig, model=model, epochs=epochs, batch_size=batch_size,
                       learning_rate=learning_rate, temperature=0.05 if temperature is None else temperature, seed=seed,
                       **lengths, selection=None if select is None else {
                           **({} if select == "default" else {"grid": parse_grid(select)}),
                           "max_epochs": select_max_epochs, "validation_pool": validation_pool})
    _train_non_private(training, data_hash, out_dir, cfg, model=model, synthetic_set=data if pairs is None else None,
                       public=public)


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
    unit: Annotated[str, typer.Option(help=UNIT_HELP)] = "query",
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
    from privret.train.settings import PrivateSelectionConfig

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
    from privret.train.interpolated import save_interpolated

    ledger = save_interpolated(model, out_dir, base=base, weight=weight)
    out.print(f"retriever written to {out_dir} ({ledger.summary()}, weight {weight:g} on {model})")


def _check_method(dp: str, data: Path | None) -> None:
    """Refuse an unknown --dp method, and public-negatives without a public corpus (--data)."""
    from privret.train.settings import METHODS

    if dp not in METHODS:
        raise InputError(f"unknown method '{dp}' (choose from {', '.join(METHODS)})", field="--dp")
    if dp == "public-negatives" and data is None:
        raise InputError("--dp public-negatives draws its negatives from a public corpus: pass --data DIR (its "
                         "corpus.jsonl); documents given inline in --pairs are private", field="--data")


def _train_non_private(training, data_hash: str, out_dir: Path, cfg, *, model: str, synthetic_set: Path | None,
                       public: bool) -> None:
    """Train without DP. Its ledger is that of ``synthetic_set`` when it has one (training on a synthetic set is
    post-processing of it); with ``public``, a public epsilon-0 one; else the ledger of the original pairs: no
    guarantee."""
    from privret.privacy.ledger import PrivacyLedger, has_ledger
    from privret.runlock import RunLock
    from privret.train.retriever import non_private_ledger, public_pairs_ledger, train_retriever

    if synthetic_set is not None and has_ledger(synthetic_set):
        if public:
            raise InputError("is a synthetic set with its own privacy ledger, which already says what it is",
                             path=synthetic_set, field="--public")
        ledger = PrivacyLedger.load(synthetic_set)
    elif public:
        ledger = public_pairs_ledger(training, model, data_hash, "query")
    else:
        ledger = non_private_ledger(training, model, data_hash, "query")
    with RunLock(out_dir, what="retriever directory"):
        train_retriever(training, out_dir, cfg, ledger=ledger)
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
