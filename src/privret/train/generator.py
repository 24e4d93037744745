"""DP fine-tuning of a query generator (Carranza et al., section 4.1): DP-Adam over Poisson-sampled privacy units.

A private step, target (epsilon, delta): every unit joins the batch with probability q = batch_size / n; per-row
gradients from Opacus's ``GradSampleModule`` hooks are summed per unit and each unit gradient is clipped to norm C
(:mod:`privret.privacy.clipping`), micro-batching whole units; the sum gets N(0, sigma^2 C^2) noise, is divided by
the expected batch q n, and Adam steps. One unit moves the clipped sum by at most C, and sigma is calibrated for
T = ceil(epochs / q) steps (docs/privacy.md, section "DP fine-tuning of the generator"). ``epsilon = inf`` trains
the non-private reference with the same sampler and no clip or noise.

The run (plan, ledger, budget registry, step log, checkpoints, resumption with fresh noise, atomic save) is
:mod:`privret.train.dp_run`'s; under ``torchrun`` each rank clips its shard's units (:mod:`privret.train.dp_parallel`).
``public=True`` marks ``pairs`` as public: non-private training with a public ledger (epsilon 0, ``public-pairs``),
nothing in the budget registry. The start (a public warm start, else by default the few-shot prompted model,
:mod:`privret.train.public_start`) is chosen without the log, as DP-SGD requires: only a public warm start is
accepted, and the ledger records the start as provenance (a warm start's copy is saved in ``warm_start/``).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from privret import distributed
from privret.data.pairs import UNIT_DEFINITIONS, TrainingPairs
from privret.errors import InputError
from privret.models.device import precision_label, resolve_device
from privret.models.generator import WARM_START_DIR, load_generator, load_trained_generator
from privret.models.query_generator import GENERATOR_FILE, QueryGenerator
from privret.privacy import budget as budget_registry
from privret.privacy.clipping import clip_units
from privret.privacy.ledger import PrivacyLedger, require_public
from privret.privacy.hold_out import LogPart, fit_part
from privret.distributed import SINGLE, Group
from privret.privacy.secure_rng import SecureRandom
from privret.progress import Progress
from privret.train.dp_parallel import set_noisy_mean, sum_gradients
from privret.train.dp_run import DPRun, RunPlan, plan_run, resume_settings, run_training
from privret.settings.training import GeneratorTrainConfig
from privret.train.public_start import prompted_provenance, start_examples


def _plan(cfg: GeneratorTrainConfig, n_units: int) -> tuple[float, int, float, float]:
    """(sample rate, steps, delta, sigma) for the run (:func:`~privret.train.dp_run.plan_run`; sigma = 0 if not
    private)."""
    run_plan = plan_run(cfg, n_units)
    return run_plan.sample_rate, run_plan.steps, run_plan.delta, run_plan.sigma


def micro_batches(units: list[list[int]], chosen: list[int], max_rows: int) -> list[list[int]]:
    """Split the chosen units into groups of whole units with about ``max_rows`` rows each."""
    groups, current, rows = [], [], 0
    for u in chosen:
        if current and rows + len(units[u]) > max_rows:
            groups.append(current)
            current, rows = [], 0
        current.append(u)
        rows += len(units[u])
    if current:
        groups.append(current)
    return groups


def warm_start_provenance(directory: str | Path, model: str) -> dict:
    """What a DP ledger records of a warm start; refuses one that is not public (see the module docstring)."""
    directory = Path(directory)
    require_public(directory, field="warm_start", use="a DP generator's warm start")
    ledger = PrivacyLedger.load(directory)  # required: it names the public data the warm start was made from
    if ledger.model != model:
        raise InputError(f"the warm start was made from {ledger.model}, not from the model {model}", path=directory,
                         field="warm_start")
    return {"mechanism": ledger.mechanism, "model": ledger.model, "trainable": ledger.trainable,
            "public_data_hash": ledger.provenance["public_data_hash"]}


def public_start(cfg: GeneratorTrainConfig, warm_start: Path | None, public_examples: list[tuple[str, str]] | None,
                 *, public: bool = False) -> tuple[dict, list[tuple[str, str]]]:
    """The provenance a ledger records of the run's start and the few-shot examples its prompts show without a
    warm start (the rule of :mod:`privret.train.public_start`; a warm start keeps its own; training on public
    pairs starts from the pretrained model)."""
    if public:  # public pairs teach the format themselves
        return {}, []
    if warm_start is not None:
        if public_examples:
            raise InputError("a warm start keeps its own prompt: give public examples or a warm start, not both",
                             field="public_examples")
        return {"warm_start": warm_start_provenance(warm_start, cfg.model)}, []
    if cfg.start == "pretrained":
        if public_examples:
            raise InputError("public examples are shown by the prompted start only", field="public_examples")
        return {}, []
    examples = start_examples(public_examples)
    return {"warm_start": prompted_provenance(cfg.model, examples)}, examples


def train_generator(pairs: TrainingPairs, out_dir: str | Path, cfg: GeneratorTrainConfig, *,
                    data_hash: str, dataset_id: str = "", resume: bool = False,
                    budget: budget_registry.BudgetPolicy | None = None, public: bool = False,
                    warm_start: str | Path | None = None,
                    public_examples: list[tuple[str, str]] | None = None) -> PrivacyLedger:
    """Fine-tune ``cfg.model`` (or the public generator ``warm_start``) on ``pairs`` into ``out_dir``; returns
    the ledger.

    ``dataset_id``: the dataset a DP run is charged to in the budget registry (default: that of
    ``pairs``, :func:`~privret.privacy.budget.dataset_id`). ``budget``: cap and registry location
    (default: record in ``$PRIVRET_BUDGET_DIR``, the default cap). ``public``: ``pairs`` are public
    data (see the module docstring). ``cfg.hold_out``: train on that partition's fit part only (the ledger
    records the part), keeping the held-out part for a DP choice among the retrievers trained on this
    generator's queries (``retriever select`` with the same partition), which then composes in parallel.
    ``warm_start``, ``cfg.start`` and ``public_examples`` (public (document, query) pairs, default
    :data:`~privret.train.public_start.GENERIC_EXAMPLES`) set where training starts
    (:mod:`privret.train.public_start`).
    """
    if public and math.isfinite(cfg.epsilon):
        raise InputError("public pairs are trained on without DP; the epsilon must be inf", field="epsilon")
    require_public(cfg.model, field="model", use="generator training (its ledger covers this run only)")
    dataset_id = dataset_id or budget_registry.dataset_id(pairs)  # the whole log's: its budget, also with hold_out
    part, pairs = fit_part(cfg.hold_out, pairs, cfg.unit)
    with distributed.main_lock(Path(out_dir), what="generator directory"):
        return _train_generator(pairs, Path(out_dir), cfg, data_hash=data_hash, dataset_id=dataset_id, resume=resume,
                                budget=budget, public=public,
                                warm_start=Path(warm_start) if warm_start is not None else None,
                                public_examples=public_examples, part=part)


def _train_generator(pairs: TrainingPairs, out_dir: Path, cfg: GeneratorTrainConfig, *, data_hash: str,
                     dataset_id: str, resume: bool, budget: budget_registry.BudgetPolicy | None, public: bool,
                     warm_start: Path | None, public_examples: list[tuple[str, str]] | None,
                     part: LogPart | None) -> PrivacyLedger:
    units = pairs.units(cfg.unit)
    run_plan = plan_run(cfg, len(units))
    private = run_plan.private
    provenance, examples = public_start(cfg, warm_start, public_examples, public=public)
    trainable = f"{cfg.trainable}:top{cfg.trained_layers or 'all'}"

    def describe(*, steps: int, epsilon: float, secure_rng: bool) -> PrivacyLedger:
        if public:
            return PrivacyLedger.public("public-pairs", model=cfg.model, public_data_hash=data_hash,
                                        unit=cfg.unit.value, n_units=run_plan.n_units, n_pairs=len(pairs.pairs),
                                        steps=steps, planned_steps=run_plan.steps, sample_rate=run_plan.sample_rate,
                                        trainable=trainable, provenance=provenance)
        return PrivacyLedger(mechanism="dp-sgd" if private else "none", epsilon=epsilon,
                             delta=run_plan.delta if private else 0.0, noise_multiplier=run_plan.sigma,
                             sample_rate=run_plan.sample_rate, steps=steps, planned_steps=run_plan.steps,
                             accountant=cfg.accountant if private else "none", unit=cfg.unit.value,
                             n_units=run_plan.n_units, n_pairs=len(pairs.pairs),
                             clip_norm=cfg.clip_norm if private else math.inf, model=cfg.model, trainable=trainable,
                             data_hash=data_hash, dataset_id=dataset_id, secure_rng=secure_rng,
                             unit_definition=UNIT_DEFINITIONS[cfg.unit], provenance=provenance, part=part)

    def load() -> _GeneratorTrainer:
        settings = dict(max_doc_tokens=cfg.max_doc_tokens, max_query_tokens=cfg.max_query_tokens,
                        trained_layers=cfg.trained_layers, bf16=cfg.bf16)
        if warm_start is not None:
            generator = load_trained_generator(warm_start, **settings)  # with its own prompt's examples, if any
        else:
            generator = load_generator(cfg.model, **settings)
            if examples and generator.kind != "causal":
                raise InputError(f"few-shot prompts need a causal LM; {cfg.model} is {generator.kind}: start it "
                                 "pretrained", field="start")
            generator.examples = examples
        generator.make_trainable(cfg.trainable, lora_rank=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank)
        params = generator.trainable_parameters()
        return _GeneratorTrainer(generator=generator, params=params,
                                 optimizer=torch.optim.Adam(params.values(), lr=cfg.learning_rate), pairs=pairs,
                                 units=units, cfg=cfg, plan=run_plan, warm_start=warm_start,
                                 group=distributed.current())

    run = DPRun(out_dir=out_dir, plan=run_plan, describe=describe, what="generator", finished_marker=GENERATOR_FILE,
                label=f"training generator (epsilon={cfg.epsilon:g})",
                train_config={**cfg.model_dump(mode="json"), "precision": precision_label(resolve_device(), cfg.bf16)},
                seed=cfg.seed, checkpoint_every=cfg.checkpoint_every, secure_rng=cfg.secure_rng,
                settings=resume_settings(cfg), budget=budget)
    return run_training(run, load, resume=resume)


@dataclass
class _GeneratorTrainer:
    """The generator in a DP run (:class:`privret.train.dp_run.Trainer`): :meth:`prepare` caches the frozen
    layers' outputs of the rows of the units this rank owns (all of them in one process); one step is
    :func:`_dp_step` (private) or :func:`_plain_step` on this rank's shard of the sampled units."""

    generator: QueryGenerator
    params: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    pairs: TrainingPairs
    units: list[list[int]]
    cfg: GeneratorTrainConfig
    plan: RunPlan
    warm_start: Path | None
    group: Group = SINGLE
    items: dict = field(default_factory=dict)  # row index -> cached frozen-layer output (this rank's rows)
    loss_module: torch.nn.Module | None = None

    def prepare(self, progress: Progress) -> None:
        from opacus import GradSampleModule

        rows = sorted(r for u in self.group.shard(range(len(self.units))) for r in self.units[u])
        pairs = [self.pairs.pairs[r] for r in rows]
        examples = [self.generator.example(self.pairs.corpus[p.doc_id].full_text, p.query) for p in pairs]
        # a DP run's pair count is not released (only its unit count is public): no count in a log line
        task = progress.add_task("caching frozen layers", total=len(examples), private_counts=self.plan.private)
        self.items = dict(zip(rows, self.generator.prepare(examples, progress=lambda k: progress.advance(task, k))))
        loss_module = self.generator.loss_module()  # without dropout (privret.models.query_generator.without_dropout)
        if self.plan.private:
            loss_module = GradSampleModule(loss_module, batch_first=True, loss_reduction="sum")
        self.loss_module = loss_module

    def step(self, chosen: list[int], rng: torch.Generator | SecureRandom | None) -> float:
        if self.plan.private:
            return _dp_step(self.generator, self.loss_module, self.items, self.units, self.group.shard(chosen),
                            self.params, self.cfg, self.plan.sigma, self.plan.expected_batch, rng, self.group)
        return _plain_step(self.generator, self.loss_module, self.items, self.units, chosen, self.cfg.physical_batch,
                           self.group)

    def save(self, staged: Path, *, resumed_at_step: int) -> None:
        self.generator.save(staged)
        if self.warm_start is not None:  # loading this generator applies the warm start first
            shutil.copytree(self.warm_start, staged / WARM_START_DIR)


def _rows_of(units, group):
    rows, owner = [], []
    for k, u in enumerate(group):
        rows += units[u]
        owner += [k] * len(units[u])
    return rows, torch.tensor(owner)


def _dp_step(generator: QueryGenerator, loss_module, items, units, chosen, params, cfg, sigma, expected_batch,
             rng, group: Group = SINGLE) -> float:
    """Set ``p.grad = (sum_u clip_C(G_u) + N(0, sigma^2 C^2)) / expected_batch`` over the chosen units ``u``
    (under torchrun: ``chosen`` is this rank's shard, the sum runs over every rank's, the noise is drawn once:
    :func:`~privret.train.dp_parallel.set_noisy_mean`).

    Returns the mean per-example loss of the batch, computed without noise: **not DP**. It may be shown on
    a live terminal (:class:`privret.progress.Progress` ``stats``) and must never be written to a file, a
    log or a report.
    """
    names = list(params)
    total = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    losses = []
    for micro in micro_batches(units, chosen, cfg.physical_batch):
        rows, owner = _rows_of(units, micro)
        batch = generator.collate([items[r] for r in rows])
        with generator.autocast():
            per_example = loss_module(**batch)
        per_example.sum().backward()
        losses.append(per_example.detach().float())
        grads = [params[n].grad_sample for n in names]
        clipped, _ = clip_units(grads, owner.to(grads[0].device), len(micro), cfg.clip_norm)
        for n, g in zip(names, clipped):
            total[n] += g
            params[n].grad_sample = None
            params[n].grad = None
    set_noisy_mean([params[n] for n in names], [total[n] for n in names], std=sigma * cfg.clip_norm,
                   expected_batch=expected_batch, rng=rng, group=group)
    return torch.cat(losses).mean().item() if losses else float("nan")


def _plain_step(generator, loss_module, items, units, chosen, physical_batch: int, group: Group = SINGLE) -> float:
    """Set ``p.grad`` to the gradient of the mean per-example loss over the rows of the chosen units (a non-private
    run), ``physical_batch`` rows per forward pass; returns that mean loss (under torchrun: each rank computes
    the rows of its shard of ``chosen``, divided by the number of rows of all of ``chosen``, and the gradients
    are summed over the ranks)."""
    n_rows = sum(len(units[u]) for u in chosen)
    if not n_rows:
        return float("nan")
    rows = [r for u in group.shard(chosen) for r in units[u]]
    losses = []
    for lo in range(0, len(rows), physical_batch):
        batch = generator.collate([items[r] for r in rows[lo: lo + physical_batch]])
        with generator.autocast():
            per_example = loss_module(**batch)
        (per_example.sum() / n_rows).backward()
        losses.append(per_example.detach().float())
    sum_gradients(list(generator.trainable_parameters().values()), group)
    return torch.cat(losses).mean().item() if losses else float("nan")
