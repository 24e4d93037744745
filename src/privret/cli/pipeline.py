"""``privret pipeline`` (a grid of runs from a YAML) and ``privret demo`` (the bundled demo grid)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from privret.cli.common import budget_policy, out
from privret.cli.options import AllowOverOpt, BudgetCapOpt, ConfigDeviceOpt, DatasetNameOpt, DeviceOpt, checked_device


def pipeline(
    config: Annotated[Path, typer.Argument(help="pipeline YAML (see configs/)")],
    run_dir: Annotated[Optional[Path], typer.Option(help="default runs/<name>")] = None,
    budget_cap: BudgetCapOpt = None,
    allow_over_budget: AllowOverOpt = None,
    dataset_name: DatasetNameOpt = None,
    device: ConfigDeviceOpt = None,
) -> None:
    """Every row of a config's grid (references, public rows, DP synthetic, direct DP); re-runs skip finished stages.

    The budget flags override the config's budget section."""
    from privret.settings.pipeline import PipelineConfig, load_config
    from privret.errors import InputError
    from privret.pipeline.run import run_pipeline
    from privret.pipeline.summary import summary_table

    cfg = load_config(config)
    cfg.budget = budget_policy(budget_cap, allow_over_budget, base=cfg.budget)
    if dataset_name:
        cfg.budget.dataset_name = dataset_name
    if device is not None:
        cfg.device = device
    checked_device(cfg.device, field="--device" if device is not None else "device",
                   path=None if device is not None else config)
    target = run_dir or Path("runs") / cfg.name
    try:
        rows = run_pipeline(cfg, target)
    except InputError as err:  # a setting of the config file, named by its path there: the error names the file too
        if err.path is None and err.field and err.field.split(".")[0] in PipelineConfig.model_fields:
            err.path = str(config)
        raise
    out.print(summary_table(rows))
    out.print(f"results: {target.resolve()}/summary.md")


def demo(run_dir: Annotated[Path, typer.Option(help="where to write the demo run")] = Path("runs/demo"),
         device: DeviceOpt = "auto") -> None:
    """The pipeline at epsilon = 8 on the bundled demo dataset: the non-private references, the epsilon = 0 bar (the
    generator prompted with three public pairs), DP synthetic queries (7 for the generator, started from that
    prompt, 1 for a DP choice of retriever) and direct DP training of the retriever (8)."""
    from privret.cli.demo import demo_config
    from privret.pipeline.run import run_pipeline
    from privret.pipeline.summary import summary_table

    checked_device(device)
    rows = run_pipeline(demo_config().model_copy(update={"device": device}), run_dir)
    out.print(summary_table(rows))
    out.print(f"results: {run_dir.resolve()}/summary.md")
