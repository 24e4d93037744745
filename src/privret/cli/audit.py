"""``privret audit``: privacy audits of the data (overlap) and of the DP generator (canaries)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import click
import typer

from privret.cli.common import budget_policy, build_config, given_flags, given_values, out, training_pairs
from privret.cli.options import (
    MODEL_HELP,
    UNITS,
    AllowOverOpt,
    AllowPrivateOutputOpt,
    BudgetCapOpt,
    DataOpt,
    DatasetNameOpt,
    JsonResultOpt,
    PairsOpt,
    PrivateDataOpt,
    SplitOpt,
    config_file_option,
    device_option,
)
from privret.errors import InputError
from privret.settings.training import GeneratorSettings

app = typer.Typer(help="Privacy audits of the data and the models.", no_args_is_help=True)

OVERLAP_HOLDS = ("the id and text of each private query found in the corpus and the ids of the documents relevant to "
                 "private queries found; statistics of the private queries")


@app.command("overlap")
@device_option
def audit_overlap(
    data: PrivateDataOpt,
    corpus: Annotated[Optional[list[Path]], typer.Option(
        help="text corpus standing for the pretraining data: .txt (a record per line) or .jsonl; .gz ok; repeatable")]
    = None,
    split: Annotated[str, typer.Option(help="split holding the private queries")] = "train",
    field: Annotated[Optional[str], typer.Option(help="JSONL field with the text (default 'text' for *.jsonl)")]
    = None,
    min_tokens: Annotated[int, typer.Option(help="leave out queries shorter than this (normalised tokens)")] = 1,
    sample: Annotated[Optional[int], typer.Option(help="check a random sample of this many private queries")] = None,
    likelihood: Annotated[bool, typer.Option(help="also run the likelihood test (no corpus needed)")] = True,
    model: Annotated[str, typer.Option(help="public causal LM for the likelihood test")] = "smollm2-135m",
    heldout_split: Annotated[str, typer.Option(help="never-private queries of the same distribution")] = "test",
    max_queries: Annotated[int, typer.Option(help="likelihood test: queries per set (random subsample)")] = 1000,
    seed: Annotated[int, typer.Option(help="seed of the --sample and --max-queries subsamples")] = 0,
    json_out: JsonResultOpt = None,
    allow_private_output_in_run: AllowPrivateOutputOpt = False,
) -> None:
    """Private queries/documents found verbatim in a public corpus, and the public LM's loss gap (Carranza et al., section 5.2.3).

    The terminal shows counts and statistics; --json also writes the id and text of every private query found."""
    from rich.table import Table

    from privret.audit.private_output import mark_private, refuse_run_directory
    from privret.io import write_json_atomic

    if not corpus and not likelihood:
        raise InputError("nothing to do: give --corpus FILE and/or keep --likelihood", field="--corpus")
    overlap_only = given_flags("field", "min_tokens", "sample") if not corpus else []
    if overlap_only:
        raise InputError("applies to the corpus overlap (--corpus) only", field=overlap_only[0])
    likelihood_only = given_flags("model", "heldout_split", "max_queries") if not likelihood else []
    if likelihood_only:
        raise InputError("applies to the likelihood test only, which --no-likelihood leaves out",
                         field=likelihood_only[0])
    if json_out is not None:
        refuse_run_directory(json_out, allowed=allow_private_output_in_run)
    result: dict = {}
    if corpus:
        from privret.audit.overlap import corpus_overlap

        result["overlap"] = corpus_overlap(data, split, list(corpus), field=field, min_tokens=min_tokens,
                                           sample=sample, seed=seed)
        table = Table(title=f"verbatim overlap of {data.name}/{split} with {len(corpus)} corpus file(s)")
        for column in ("", "checked", "found", "fraction"):
            table.add_column(column, justify="right")
        for kind in ("queries", "documents"):
            row = result["overlap"][kind]
            table.add_row(kind, str(row["eligible"]), str(row["found"]),
                          "-" if row["fraction"] is None else f"{row['fraction']:.2%}")
        out.print(table)
    if likelihood:
        from privret.data.beir import load_beir
        from privret.audit.overlap import likelihood_test, queries_of_split

        dataset = load_beir(data, splits=[split, heldout_split])
        lik = likelihood_test(queries_of_split(dataset, split), queries_of_split(dataset, heldout_split),
                              model=model, max_queries=max_queries, seed=seed)
        result["likelihood"] = {**lik, "private_split": split, "heldout_split": heldout_split}
        table = Table(title=f"likelihood test: {model} on {split} (private) vs {heldout_split} (held out)")
        for column in ("loss private", "loss held-out", "gap", "AUC", "z", "p", "flagged"):
            table.add_column(column, justify="right")
        table.add_row(f"{lik['private']['mean']:.3f}", f"{lik['heldout']['mean']:.3f}", f"{lik['mean_gap']:+.3f}",
                      f"{lik['auc']:.3f}", f"{lik['z']:.2f}", f"{lik['p_value']:.2g}",
                      "[bold red]yes[/]" if lik["flagged"] else "no")
        out.print(table)
    if json_out is not None:
        write_json_atomic(json_out, mark_private(result, OVERLAP_HOLDS))


GENERATOR = {name: field.default for name, field in GeneratorSettings.model_fields.items()}
# the audit's fields whose flag is not -- + their name: the generator's that audit canaries sets by a flag (its
# --config sets any in its `generator` section), and the epsilon
FLAG_OF = {"epsilons": "--epsilon", "generator_model": "--model", "generator_clip_norm": "--clip-norm",
           "generator_batch_size": "--batch-size", "generator_epochs": "--epochs", "generator_learning_rate": "--lr",
           "generator_seed": "--seed"}


@app.command("canaries")
@device_option
def audit_canaries(
    out_dir: Annotated[Path, typer.Option("--out", help="audit directory (trial generators + canaries.json, "
                                          "which hold private data); RUN_DIR/canaries, with "
                                          "--allow-private-output-in-run, puts its table in the run's report")],
    data: DataOpt = None, split: SplitOpt = "train", pairs: PairsOpt = None,
    epsilon: Annotated[Optional[float], typer.Option(
        help="the target epsilon of the audited fine-tunes; 'inf' = non-private (default: the --config file's "
             "epsilons, else inf and 16; a later run with another epsilon and the same settings adds its trials)")]
    = None,
    trials: Annotated[int, typer.Option(help="independent trials (fresh canaries, fresh training)")] = 3,
    repetitions: Annotated[str, typer.Option(help="comma-separated insertion counts")] = "1,10,100",
    samples: Annotated[int, typer.Option(help="queries sampled per canary document to test 'leaked'")] = 10,
    subsample: Annotated[Optional[int], typer.Option(help="keep this many private pairs (uniform, seeded)")] = None,
    unit: Annotated[str, typer.Option(click_type=click.Choice(UNITS),
                                      help="privacy unit: query (a canary = 1 unit) or pair (k units)")] = "query",
    model: Annotated[str, typer.Option(help=f"generator: {MODEL_HELP}")] = GENERATOR["model"],
    clip_norm: Annotated[float, typer.Option(help="per-unit L2 clipping norm C")] = GENERATOR["clip_norm"],
    batch_size: Annotated[int, typer.Option(help="expected units per step")] = GENERATOR["batch_size"],
    epochs: Annotated[float, typer.Option()] = GENERATOR["epochs"],
    learning_rate: Annotated[float, typer.Option("--lr")] = GENERATOR["learning_rate"],
    seed: Annotated[int, typer.Option(help="seed of the canaries, the --subsample and the leak test's sampling (the "
                                           "DP fine-tunes ignore it: their sampling, noise and dropout come from "
                                           "os.urandom)")] = 0,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
    allow_private_output_in_run: AllowPrivateOutputOpt = False,
    config: config_file_option("CanaryAuditConfig (privret.audit.canary_audit), the generator's in its `generator` "
                               "section") = None,
) -> None:
    """Canary exposure audit of the DP generator (Carranza et al., section 6.3): rank, exposure, leaks, epsilon lower bound.

    The audited fine-tune is the one privret generator train-dp makes with its defaults; --config sets the others
    (its generator section) and the audit's candidates, top_p and alpha. Every DP trial counts in the data's
    privacy-budget registry, like any DP training on it."""
    from privret.audit.canary_audit import CanaryAuditConfig, canary_table_markdown, run_canary_audit
    from privret.privacy.budget import dataset_id

    policy = budget_policy(budget_cap, allow_over_budget)
    generator = given_values(model=model, clip_norm=clip_norm, batch_size=batch_size, epochs=epochs,
                             learning_rate=learning_rate, seed=seed)
    audit = given_values(trials=trials, samples=samples, subsample=subsample, seed=seed, unit=unit)
    if epsilon is not None:
        audit["epsilons"] = [epsilon]
    if "repetitions" in given_values(repetitions=repetitions):
        audit["repetitions"] = _numbers(repetitions, "--repetitions")
    cfg = build_config(CanaryAuditConfig, config_file=config, flag_of=FLAG_OF,
                       **audit, **({"generator": generator} if generator else {}))
    training, data_hash = training_pairs(data, split, pairs)
    report = run_canary_audit(training, out_dir, cfg, data_hash=data_hash,
                              dataset_id=dataset_id(training, dataset_name), budget=policy,
                              allow_private_output_in_run=allow_private_output_in_run)
    typer.echo(canary_table_markdown(report))
    out.print(f"written: {out_dir / 'canaries.json'} (holds private data: see its first key)")


def _numbers(text: str, field: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"'{text}' is not a comma-separated list of whole numbers", field=field) from None
