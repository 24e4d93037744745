"""``privret federated``: federated answer sentence selection (PDD-AS2, Fed-Negative) on Flower.

``privret data fed-squad`` builds its benchmark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional, get_args

import click
import typer

from privret.cli.common import budget_policy, build_config, given_flags, out
from privret.cli.options import (ENCODER_HELP, AllowOverOpt, BudgetCapOpt, ConfigDeviceOpt, DatasetNameOpt,
                                 checked_device, config_file_option)
from privret.errors import InputError
from privret.settings.federated import FedConfig

FedConfigOpt = config_file_option("FedConfig (privret.settings.federated; configs/fed-squad.yaml)")


def _choices(field: str) -> click.Choice:
    """The values of a FedConfig field typed as a Literal, as a Click choice."""
    return click.Choice(get_args(FedConfig.model_fields[field].annotation))


app = typer.Typer(help="Federated dense retrieval for answer sentence selection (PDD-AS2, Flower).",
                  no_args_is_help=True)

# FedConfig's fields whose flag is not -- + their name
FLAG_OF = {"dp_clip_norm": "--clip-norm", "dp_noise_multiplier": "--noise-multiplier",
           "evaluation_split": "--eval-split"}


def _fed_config(config: Path | None, **flags) -> FedConfig:
    """The run's FedConfig: the ``--config`` file's fields, then the flags given (not None) over them."""
    return build_config(FedConfig, config_file=config, flag_of=FLAG_OF,
                        **{name: value for name, value in flags.items() if value is not None})


BASELINES = ("pdd-as2", "local-only", "central", "bm25", "zero-shot")


@app.command("train")
def federated_train(
    data: Annotated[Path, typer.Option("--data", help="Fed-SQuAD directory (privret data fed-squad)")],
    out_dir: Annotated[Path, typer.Option("--out", help="run directory (checkpoints, results.json, ledger)")],
    config: FedConfigOpt = None,
    baseline: Annotated[str, typer.Option(click_type=click.Choice(BASELINES),
                                          help="pdd-as2 trains with Flower; the others are references")] = "pdd-as2",
    model: Annotated[Optional[str], typer.Option(help=ENCODER_HELP)] = None,
    rounds: Annotated[Optional[int], typer.Option(help="FedAvg rounds")] = None,
    warmup_rounds: Annotated[Optional[int], typer.Option(help="rounds with BM25 negatives")] = None,
    local_epochs: Annotated[Optional[int], typer.Option()] = None,
    learning_rate: Annotated[Optional[float], typer.Option(
        "--lr", help="AdamW learning rate of local training (default 3e-5; BitFit wants about 1e-3)")] = None,
    train_fraction: Annotated[Optional[float], typer.Option(help="share of each client's training questions")] = None,
    trainable: Annotated[Optional[str], typer.Option(
        help="parameters trained and exchanged: layers (default; embeddings frozen), all, top:K, lora, "
             "bias (BitFit) or bias-top:K (BitFit of the top K layers)")] = None,
    wire_dtype: Annotated[Optional[str], typer.Option(click_type=_choices("wire_dtype"),
                                                      help="weights down, updates up (default float16)")] = None,
    remine_every: Annotated[Optional[int], typer.Option(help="re-mine hard negatives every k-th hard round")] = None,
    eval_every: Annotated[Optional[int], typer.Option(help="evaluate every k rounds (0: at the end only)")] = None,
    evaluation_split: Annotated[Optional[str], typer.Option(
        "--eval-split", click_type=_choices("evaluation_split"),
        help="test (default) or validation: the training questions --train-fraction leaves out, to choose "
             "settings without looking at test")] = None,
    dp: Annotated[Optional[str], typer.Option(click_type=_choices("dp"),
                                              help="Flower's DP-FedAvg wrappers (default none)")] = None,
    dp_noise_multiplier: Annotated[Optional[float], typer.Option(
        "--noise-multiplier", help="noise std / clip norm of DP-FedAvg (--dp server or client); or let --epsilon "
                                   "set it")] = None,
    epsilon: Annotated[Optional[float], typer.Option(
        help="target client-level epsilon over --rounds: sets the noise multiplier, over a --config's "
             "dp_noise_multiplier (--dp server or client)")] = None,
    dp_clip_norm: Annotated[Optional[float], typer.Option(
        "--clip-norm", help="DP-FedAvg: clipping norm of a client's update")] = None,
    threads: Annotated[int, typer.Option(help="torch CPU threads")] = 1,
    resume: Annotated[bool, typer.Option(
        help="continue from the last finished round in --out; a baseline's saved result with these settings and "
             "data is reused")] = True,
    device: ConfigDeviceOpt = None,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
) -> None:
    """PDD-AS2 + client-customized query encoders + Fed-Negative with the Flower apps on this machine.

    A DP run (--dp server or client) is a release per client in the budget registry; rarely changed settings come
    from --config."""
    import torch

    from privret.federated import runner

    torch.set_num_threads(threads)
    cfg = _fed_config(config, model=model, rounds=rounds, warmup_rounds=warmup_rounds, local_epochs=local_epochs,
                      train_fraction=train_fraction, trainable=trainable, wire_dtype=wire_dtype,
                      learning_rate=learning_rate, evaluation_split=evaluation_split,
                      remine_every=remine_every, eval_every=eval_every, dp=dp, dp_noise_multiplier=dp_noise_multiplier,
                      dp_clip_norm=dp_clip_norm, device=device)
    if baseline != "pdd-as2" and (cfg.dp != "none" or epsilon is not None):
        field = "--epsilon" if epsilon is not None else "--dp" if dp is not None else "dp"
        raise InputError(f"--baseline {baseline} trains without DP (DP-FedAvg is --baseline pdd-as2's)", field=field,
                         path=config if field == "dp" else None)
    if epsilon is not None:
        cfg = _with_target_epsilon(cfg, epsilon, noise_multiplier_given=dp_noise_multiplier is not None)
    checked_device(cfg.device, field="--device" if device is not None else "device",
                   path=None if device is not None else config)
    _refuse_budget_flags_without_dp(cfg)
    if baseline == "pdd-as2":
        policy = budget_policy(budget_cap, allow_over_budget)
        evaluations = runner.run_federated_local(cfg, data, out_dir, resume=resume, budget=policy,
                                                 dataset_name=dataset_name)["evaluations"]
    else:
        evaluations = {baseline: runner.run_baseline(baseline, cfg, data, out_dir, resume=resume)}
    for name, ev in evaluations.items():
        s, p = ev["pooled"]["sentence"], ev["pooled"]["passage"]
        out.print(f"{name}: sentence MRR@10 {s['mrr@10']:.3f} R@1 {s['recall@1']:.3f} R@20 {s['recall@20']:.3f} "
                  f"R@100 {s['recall@100']:.3f} | passage MRR@10 {p['mrr@10']:.3f} R@1 {p['recall@1']:.3f}")
    out.print(f"results in {out_dir}")


def _with_target_epsilon(cfg: FedConfig, epsilon: float, *, noise_multiplier_given: bool) -> FedConfig:
    """``cfg`` with the noise multiplier whose ``rounds`` releases spend at most ``epsilon`` (``--epsilon``)."""
    from privret.federated.strategy import with_target_epsilon

    if cfg.dp == "none":
        raise InputError("--epsilon needs --dp server or --dp client", field="--epsilon")
    if noise_multiplier_given:
        raise InputError("sets the noise multiplier that --noise-multiplier gives: give one of them", field="--epsilon")
    return with_target_epsilon(cfg, epsilon)


def _refuse_budget_flags_without_dp(cfg) -> None:
    """The budget flags apply to a DP run (the release they record); without DP nothing is recorded."""
    given = given_flags("budget_cap", "allow_over_budget", "dataset_name")
    if given and cfg.dp == "none":
        raise InputError("applies to DP training (--dp server or client) only: a run without DP is no release in "
                         "the budget registry", field=given[0])


@app.command("flower-app")
def federated_flower_app(
    app_dir: Annotated[Path, typer.Option("--app", help="directory to write the Flower App into")],
    out_dir: Annotated[str, typer.Option("--out", help="where the ServerApp writes results (on the SuperLink host)")],
    num_clients: Annotated[int, typer.Option(help="SuperNodes to wait for")] = 10,
    config: FedConfigOpt = None,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: Annotated[Optional[str], typer.Option(
        help="DP: the name the ServerApp charges the release to in the budget registry of its host (required: the "
             "server never sees the clients' data)")] = None,
) -> None:
    """Write a Flower App (pyproject.toml) for `flwr run APP SUPERLINK` across machines."""
    from privret.federated.runner import dataset_key, write_flower_app

    cfg = _fed_config(config)
    _refuse_budget_flags_without_dp(cfg)
    if cfg.dp != "none" and not (dataset_name or "").strip():
        raise InputError("a DP run is charged to its dataset in the budget registry, and the server never sees the "
                         "clients' data: name it", field="--dataset-name")
    write_flower_app(app_dir, cfg, out_dir=out_dir, num_clients=num_clients,
                     dataset_id=dataset_key([], dataset_name) if dataset_name else "",
                     budget=budget_policy(budget_cap, allow_over_budget))
    out.print(f"Flower App written to {app_dir}; run it with: flwr run {app_dir} <superlink-connection>")
