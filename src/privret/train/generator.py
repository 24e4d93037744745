"""DP fine-tuning of a query generator (seed 4.1): DP-Adam over Poisson-sampled privacy units.

One step, for a private run with target (epsilon, delta):

1. every unit joins the batch with probability q = batch_size / n (Poisson sampling);
2. per-row gradients of the per-example loss come from Opacus's ``GradSampleModule`` hooks;
   rows are summed per unit and each unit gradient is clipped to norm C (see
   :mod:`privret.privacy.clipping`), micro-batching whole units so memory stays bounded;
3. the sum gets N(0, sigma^2 C^2) noise, is divided by the expected batch size q n, and Adam
   takes a step. sigma is calibrated by the accountant for T = ceil(epochs / q) steps.

``epsilon = inf`` trains the non-private reference with the same sampler and no clip/noise.
Checkpoints are written atomically every ``checkpoint_every`` steps; ``resume`` continues from
the last one with *fresh* noise (never replayed), and the ledger counts every step that
reached disk.

Crash safety (see ``docs/reliability.md``; the step log, checkpoints and the resume checks live in
:mod:`privret.train.checkpointing`, shared with the direct DP retriever). One process per output directory
(:class:`~privret.runlock.RunLock`). Before any write that may put updated parameters on disk
(a checkpoint or the final model), a record ``(branch, start, to)`` is appended and fsynced to
``steps.jsonl``: this process (a *branch*, started at step ``start`` from a checkpoint, or 0)
may have released its noisy updates ``start+1 .. to``. The distinct noisy updates that could
have reached disk number ``S = sum over branches (max to - start)``; a branch killed after
persisting step 30 and resumed from the checkpoint of step 20 thus charges its steps 21..30 as
well as the new branch's. Every ledger (checkpoint and final) reports ``steps = S`` and the
epsilon of S steps at (sigma, q), so it is never below the true count, and is above the plan
only after such a loss. A checkpoint the step log does not account for (log missing,
unreadable, or not naming the checkpoint's step) is refused. Non-private runs store the
sampler's RNG state with the checkpoint, so a resumed run equals an uninterrupted one.

Each private run is also recorded in the dataset's budget registry
(:mod:`privret.privacy.budget`) before its first update can reach disk, with a cap check.

``public=True`` marks ``pairs`` as public data (``data_hash`` is then its hash): the run is
non-private training on data that holds nothing of the private log, so its ledger is a public
one (epsilon = 0, mechanism ``public-pairs``; :meth:`PrivacyLedger.public`) and nothing is
recorded in the budget registry.

**Warm start.** ``warm_start`` (a saved generator) replaces the pretrained ``cfg.model`` as the
starting point. DP-SGD's guarantee holds for any starting point that does not depend on the
private log, so only a public warm start (a public ledger) is accepted; one trained on private
data would make the released model depend on the log outside the accounted mechanism. The
ledger records its provenance (mechanism, model, public data hash) and a copy of it is saved in
``warm_start/`` of the output (see :mod:`privret.models.generator`).
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from privret.data.pairs import UNIT_DEFINITIONS, PrivacyUnit, TrainingPairs
from privret.errors import InputError
from privret.io import atomic_path, write_json_atomic
from privret.models.generator import WARM_START_DIR, QueryGenerator, load_generator, load_trained_generator
from privret.models.registry import DEFAULT_GENERATOR
from privret.privacy import budget as budget_registry
from privret.privacy.accounting import calibrate_noise, check_budget, default_delta, spent_epsilon
from privret.privacy.clipping import clip_units
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.sampling import PoissonUnitSampler
from privret.privacy.secure_rng import SecurePoissonUnitSampler, SecureRandom, noise_like
from privret.progress import Progress
from privret.runlock import RunLock, recover_directory
from privret.train.checkpointing import CHECKPOINT_DIR, STEP_LOG, StepAccount, check_finished, load_checkpoint
from privret.train.checkpointing import save_checkpoint as _save_checkpoint


class GeneratorTrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = DEFAULT_GENERATOR
    epsilon: float = Field(8.0, description="target epsilon; inf = non-private")
    delta: float | None = Field(None, description="default 1/(2n), n = number of units")
    unit: PrivacyUnit = PrivacyUnit.query
    clip_norm: float = Field(1.0, gt=0, allow_inf_nan=False)
    batch_size: int = Field(64, gt=0, description="expected number of units per step")
    epochs: float = Field(3.0, gt=0, allow_inf_nan=False)
    learning_rate: float = Field(2e-3, gt=0, allow_inf_nan=False)
    trainable: str = Field("lora", pattern="^(lora|full)$")
    lora_rank: int = Field(8, gt=0)
    trained_layers: int | None = Field(8, gt=0, description="train only the top k layers (None: all)")
    max_doc_tokens: int = Field(128, gt=0)
    max_query_tokens: int = Field(48, gt=0)
    physical_batch: int = Field(16, gt=0, description="rows per forward pass (memory, not privacy)")
    bf16: bool = Field(True, description="bf16 autocast (faster on AMX CPUs and GPUs)")
    accountant: str = "prv"
    seed: int = 0
    checkpoint_every: int = Field(10, gt=0)
    secure_rng: bool = Field(False, description="DP noise and Poisson sampling from the OS CSPRNG (os.urandom)")


def _plan(cfg: GeneratorTrainConfig, n_units: int) -> tuple[float, int, float, float]:
    """(sample rate, steps, delta, sigma) for the run."""
    sample_rate = min(1.0, cfg.batch_size / n_units)
    steps = max(1, math.ceil(cfg.epochs / sample_rate))
    delta = cfg.delta if cfg.delta is not None else default_delta(n_units)
    check_budget(cfg.epsilon, delta, n_units)
    if not math.isfinite(cfg.epsilon):
        return sample_rate, steps, delta, 0.0
    sigma = calibrate_noise(target_epsilon=cfg.epsilon, delta=delta, sample_rate=sample_rate, steps=steps,
                            accountant=cfg.accountant)
    return sample_rate, steps, delta, sigma


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
    ledger = PrivacyLedger.load(directory)
    if not ledger.is_public:
        raise InputError(f"the warm start's ledger is not public ({ledger.mechanism}, epsilon = {ledger.epsilon:g}): "
                         "starting DP training from a model trained on the private data would void the guarantee",
                         path=directory, field="warm_start")
    if ledger.model != model:
        raise InputError(f"the warm start was made from {ledger.model}, not from the model {model}", path=directory,
                         field="warm_start")
    return {"mechanism": ledger.mechanism, "model": ledger.model, "trainable": ledger.trainable,
            "public_data_hash": ledger.provenance["public_data_hash"]}


def train_generator(pairs: TrainingPairs, out_dir: str | Path, cfg: GeneratorTrainConfig, *,
                    data_hash: str, dataset_id: str = "", resume: bool = False,
                    budget: budget_registry.BudgetPolicy | None = None, public: bool = False,
                    warm_start: str | Path | None = None) -> PrivacyLedger:
    """Fine-tune ``cfg.model`` (or the public generator ``warm_start``) on ``pairs`` into ``out_dir``; returns
    the ledger.

    ``dataset_id``: the dataset a DP run is charged to in the budget registry (default: that of
    ``pairs``, :func:`~privret.privacy.budget.dataset_id`). ``budget``: cap and registry location
    (default: record in ``$PRIVRET_BUDGET_DIR``, the default cap). ``public``: ``pairs`` are public
    data (see the module docstring).
    """
    if public and math.isfinite(cfg.epsilon):
        raise InputError("public pairs are trained on without DP; the epsilon must be inf", field="epsilon")
    dataset_id = dataset_id or budget_registry.dataset_id(pairs)
    with RunLock(out_dir, what="generator directory"):
        return _train_generator(pairs, Path(out_dir), cfg, data_hash=data_hash, dataset_id=dataset_id, resume=resume,
                                budget=budget, public=public,
                                warm_start=Path(warm_start) if warm_start is not None else None)


def _train_generator(pairs: TrainingPairs, out_dir: Path, cfg: GeneratorTrainConfig, *, data_hash: str,
                     dataset_id: str, resume: bool, budget: budget_registry.BudgetPolicy | None, public: bool,
                     warm_start: Path | None) -> PrivacyLedger:
    from opacus import GradSampleModule

    units = pairs.units(cfg.unit)
    n_units = len(units)
    sample_rate, steps, delta, sigma = _plan(cfg, n_units)
    private = math.isfinite(cfg.epsilon)
    provenance = {"warm_start": warm_start_provenance(warm_start, cfg.model)} if warm_start is not None else {}
    ckpt_dir = out_dir / CHECKPOINT_DIR
    log_path = out_dir / STEP_LOG
    recover_directory(out_dir)
    recover_directory(ckpt_dir)
    if (out_dir / "generator.json").exists() and not resume:
        raise InputError("already holds a trained generator (use another directory)", path=out_dir)
    if (ckpt_dir.exists() or log_path.exists()) and not resume:
        raise InputError("holds an interrupted run; pass --resume to continue it", path=out_dir)

    def ledger(done: int) -> PrivacyLedger:
        trainable = f"{cfg.trainable}:top{cfg.trained_layers or 'all'}"
        if public:
            return PrivacyLedger.public("public-pairs", model=cfg.model, public_data_hash=data_hash,
                                        unit=cfg.unit.value, n_units=n_units, n_pairs=len(pairs.pairs), steps=done,
                                        planned_steps=steps, sample_rate=sample_rate, trainable=trainable,
                                        provenance=provenance)
        eps = (spent_epsilon(noise_multiplier=sigma, sample_rate=sample_rate, steps=done, delta=delta,
                             accountant=cfg.accountant) if private else math.inf)
        return PrivacyLedger(mechanism="dp-sgd" if private else "none", epsilon=eps, delta=delta if private else 0.0,
                             noise_multiplier=sigma, sample_rate=sample_rate, steps=done, planned_steps=steps,
                             accountant=cfg.accountant if private else "none", unit=cfg.unit.value, n_units=n_units,
                             n_pairs=len(pairs.pairs), clip_norm=cfg.clip_norm if private else math.inf,
                             model=cfg.model, trainable=trainable, data_hash=data_hash, dataset_id=dataset_id,
                             secure_rng=secure, unit_definition=UNIT_DEFINITIONS[cfg.unit], provenance=provenance)

    secure = private and cfg.secure_rng
    if (out_dir / "generator.json").exists():  # finished earlier: nothing to resume, spend nothing more
        return _finished(out_dir, expected=ledger(steps))
    torch.manual_seed(cfg.seed)
    settings = dict(max_doc_tokens=cfg.max_doc_tokens, max_query_tokens=cfg.max_query_tokens,
                    trained_layers=cfg.trained_layers, bf16=cfg.bf16)
    if warm_start is not None:
        generator = load_trained_generator(warm_start, **settings)
        generator.examples = []  # fine-tuning always uses the zero-shot prompt
    else:
        generator = load_generator(cfg.model, **settings)
    generator.make_trainable(cfg.trainable, lora_rank=cfg.lora_rank, lora_alpha=2 * cfg.lora_rank)
    params = generator.trainable_parameters()
    optimizer = torch.optim.Adam(params.values(), lr=cfg.learning_rate)

    account = StepAccount.open(log_path, private=private, checkpoint=ckpt_dir, secure=secure)
    secure = account.secure

    start_step, rng_state = 0, None
    if resume and ckpt_dir.exists():
        start_step, rng_state = _load_checkpoint(ckpt_dir, params, optimizer, expected=ledger(0))
        account.resume_from(start_step, private=private)
    release_id, total, persist = account.release_id, account.total, account.persist

    if private:
        planned = budget_registry.Release.from_ledger(ledger(total(steps)), release_id=release_id, status="planned",
                                                      artefact=out_dir.absolute())
        budget_registry.check_and_record(planned, budget)
    # Fresh entropy for sampling and noise, also on resume: noise is never replayed.
    if secure:
        rng = SecureRandom()
        sampler = SecurePoissonUnitSampler(n_units, sample_rate, rng)
    else:
        rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") if private else cfg.seed)
        if rng_state is not None and not private:
            rng.set_state(rng_state)  # non-private: continue the very same sample sequence
        sampler = PoissonUnitSampler(n_units, sample_rate, rng)

    with Progress() as progress:
        examples = [generator.example(pairs.corpus[p.doc_id].full_text, p.query) for p in pairs.pairs]
        task = progress.add_task("caching frozen layers", total=len(examples))
        items = generator.prepare(examples, progress=lambda k: progress.advance(task, k))
        loss_module = generator.loss_module()
        if private:
            loss_module = GradSampleModule(loss_module, batch_first=True, loss_reduction="sum")
        loss_module.train()
        task = progress.add_task(f"training generator (epsilon={cfg.epsilon:g})", total=steps, completed=start_step)
        for step in range(start_step, steps):
            chosen = sampler.sample()
            loss = _dp_step(generator, loss_module, items, units, chosen, params, cfg, sigma, sample_rate * n_units,
                            rng) if private else _plain_step(generator, loss_module, items, units, chosen, params)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress.update(task, advance=1, stats=f"loss={loss:.3f}")  # not DP: terminal only
            if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < steps:
                persist(step + 1)
                _save_checkpoint(ckpt_dir, params, optimizer, ledger(total(step + 1)), step=step + 1,
                                 rng=None if private else rng)
    final = ledger(total(steps))
    persist(steps)
    with atomic_path(out_dir) as staged:
        generator.save(staged)
        if warm_start is not None:  # loading this generator applies the warm start first
            shutil.copytree(warm_start, staged / WARM_START_DIR)
        final.save(staged)
        write_json_atomic(staged / "train_config.json", cfg.model_dump(mode="json"))
    if private:
        budget_registry.record(budget_registry.Release.from_ledger(final, release_id=release_id, status="final",
                                                                   artefact=out_dir.absolute()), budget)
    return final


def _rows_of(units, group):
    rows, owner = [], []
    for k, u in enumerate(group):
        rows += units[u]
        owner += [k] * len(units[u])
    return rows, torch.tensor(owner)


def _dp_step(generator: QueryGenerator, loss_module, items, units, chosen, params, cfg, sigma, expected_batch,
             rng) -> float:
    """Set ``p.grad = (sum_u clip_C(G_u) + N(0, sigma^2 C^2)) / expected_batch`` over the chosen units ``u``.

    Returns the mean per-example loss of the batch, computed without noise: **not DP**. It may be shown on
    a live terminal (:class:`privret.progress.Progress` ``stats``) and must never be written to a file, a
    log or a report.
    """
    names = list(params)
    total = {n: torch.zeros_like(p, dtype=torch.float32) for n, p in params.items()}
    losses = []
    for group in micro_batches(units, chosen, cfg.physical_batch):
        rows, owner = _rows_of(units, group)
        batch = generator.collate([items[r] for r in rows])
        with generator.autocast():
            per_example = loss_module(**batch)
        per_example.sum().backward()
        losses.append(per_example.detach().float())
        grads = [params[n].grad_sample for n in names]
        clipped, _ = clip_units(grads, owner.to(grads[0].device), len(group), cfg.clip_norm)
        for n, g in zip(names, clipped):
            total[n] += g
            params[n].grad_sample = None
            params[n].grad = None
    for n, p in params.items():
        noisy = total[n] + noise_like(total[n], sigma * cfg.clip_norm, rng)
        p.grad = (noisy / expected_batch).to(p.dtype)
    return torch.cat(losses).mean().item() if losses else float("nan")


def _plain_step(generator, loss_module, items, units, chosen, params) -> float:
    rows = [r for u in chosen for r in units[u]]
    if not rows:
        return float("nan")
    losses = []
    for lo in range(0, len(rows), 16):
        batch = generator.collate([items[r] for r in rows[lo: lo + 16]])
        with generator.autocast():
            per_example = loss_module(**batch)
        (per_example.sum() / len(rows)).backward()
        losses.append(per_example.detach().float())
    return torch.cat(losses).mean().item()


def _finished(out_dir: Path, *, expected: PrivacyLedger) -> PrivacyLedger:
    return check_finished(out_dir, expected=expected, what="a generator")


def _load_checkpoint(ckpt_dir: Path, params, optimizer, *,
                     expected: PrivacyLedger) -> tuple[int, torch.Tensor | None]:
    """Restore params and optimizer; (step, sampler RNG state or None). Refuse another plan's checkpoint."""
    checkpoint = load_checkpoint(ckpt_dir, params, optimizer, expected=expected)
    return checkpoint.step, checkpoint.rng_state
