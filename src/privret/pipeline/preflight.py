"""What a pipeline config is refused for before any stage runs (nothing is written): a starting model that
cannot be found or that read private data, a DP row's delta of 1/n or more, and settings chosen on a split
that the DP rows train on.
"""

from __future__ import annotations

import math

from privret.data.beir import BeirDataset, load_qrels
from privret.data.pairs import TrainingPairs
from privret.errors import InputError
from privret.models.registry import is_bundled, resolve
from privret.privacy.accounting import check_budget, default_delta
from privret.privacy.ledger import require_public
from privret.settings.pipeline import PipelineConfig


def check_starting_models(cfg: PipelineConfig) -> None:
    """Refuse, before any stage runs, a starting model that cannot be found (a missing directory, a hub id not
    in the cache offline), naming its config field, and one that read private data: every row carries only its
    own release's ledger, so each model a row starts from must be public (each stage checks again when it
    starts). Bundled names are always there (installed with privret); they are converted when first used."""
    grid = cfg.direct_dp
    models = [(cfg.retriever.model, "retriever.model", "the pipeline's encoder"),
              (cfg.generator.model, "generator.model", "generator training")]  # every epsilon has a generator row
    if cfg.synthetic_filter is not None:
        models.append((cfg.synthetic_filter.encoder, "synthetic_filter.encoder", "the round-trip filter"))
    if cfg.similarity.mauve:
        models.append((cfg.similarity.featurizer, "similarity.featurizer", "MAUVE's features"))
    for method in grid.methods if grid.epsilons else []:
        model = grid.config(method, grid.epsilons[0], cfg.unit).model
        models.append((model, f"direct_dp.{grid.section(method, 'model')}.model", "direct DP training"))
    for model, field, use in models:
        if not is_bundled(model):  # a path or a hub id: found now (a bundled one is installed with privret)
            try:
                resolve(model)
            except InputError as err:
                err.field = field
                raise
        require_public(model, field=field, use=use)


def check_dp_budgets(cfg: PipelineConfig, pairs: TrainingPairs) -> None:
    """Each DP training row's (epsilon, delta) against the log's n units, before any stage runs: a delta of 1/n or
    more is refused now, named as the config names it, instead of when its row starts (hours into a run). Each
    trainer checks again; a row that holds units out trains on fewer of them, so it is left to its trainer (its n
    is the fit part's)."""
    n = len(pairs.units(cfg.unit))
    rows = [("generator", "epsilons", cfg.generator.delta, epsilon)
            for epsilon in cfg.epsilons if math.isfinite(epsilon) and cfg.generator.hold_out is None]
    grid = cfg.direct_dp
    for method in grid.methods:
        for epsilon in grid.epsilons:
            row = grid.config(method, epsilon, cfg.unit)
            if row.hold_out is None:
                rows.append((f"direct_dp.{grid.section(method, 'delta')}", "direct_dp.epsilons", row.delta, epsilon))
    for section, epsilons, delta, epsilon in rows:
        try:
            check_budget(epsilon, delta if delta is not None else default_delta(n), n)
        except InputError as err:
            err.field = epsilons if err.field == "epsilon" else f"{section}.{err.field}"
            raise


def check_settings_split(cfg: PipelineConfig, dataset: BeirDataset) -> None:
    """Settings chosen on a split are trained without it: a release's (epsilon, delta) covers only what its
    mechanism read, so a choice made without DP on queries the DP rows then train on is outside the guarantee.
    Refuse a config that names ``settings_chosen_on`` when the dataset lacks that split or when one of its queries
    (by id or by text, the query unit's key) is also in ``train_split``."""
    split = cfg.settings_chosen_on
    if split is None:
        return
    path = dataset.root / "qrels" / f"{split}.tsv"
    if not path.is_file():
        raise InputError(f"no split '{split}', on which the config's settings were chosen: build the dataset with it "
                         f"held out of '{cfg.train_split}' (e.g. privret data squad-beir --validation-articles K)",
                         path=path, field="settings_chosen_on")
    trained = dataset.split(cfg.train_split)
    texts = {dataset.queries[q] for q in trained}
    shared = [q for q in load_qrels(path, corpus=dataset.corpus, queries=dataset.queries)
              if q in trained or dataset.queries[q] in texts]
    if shared:
        raise InputError(f"{len(shared)} queries of split '{split}', on which the config's settings were chosen, are "
                         f"also in '{cfg.train_split}', the log the rows train on: settings chosen on a split are "
                         "trained without it", path=path, field="settings_chosen_on")
