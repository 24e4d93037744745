"""One crash-safe DP-SGD training run for both DP trainers, the query generator (:mod:`privret.train.generator`) and
the direct DP retriever (:mod:`privret.train.dp_retriever`); a :class:`Trainer` supplies its model, its step and
its artefact, this module the rest.

Plan (:func:`plan_run`): ``q = min(1, B / N)``, ``T = max(1, ceil(epochs / q))`` steps, ``delta = 1 / (2N)`` unless
given, sigma calibrated so that T Poisson-subsampled Gaussian steps spend at most epsilon. A step samples every unit
independently with probability q (an empty batch is a step too) and applies ``(s(batch) + N(0, (sigma Delta)^2 I))
/ (q N)``, the division by a constant. Every ledger charges the accountant's epsilon for S steps, S counting every
noisy update that may have reached disk, in every process (:mod:`privret.train.checkpointing`): a crash never
under-counts. A resume draws fresh randomness, keeps the run's one release id in the budget registry, and refuses a
checkpoint the step log does not account for or one made under another plan or :func:`resume_settings`.

One process per output directory; an existing one is refused without ``resume``, and a finished one is returned
as it is if its plan and settings match. Under ``torchrun`` the run is rank 0's: it alone samples, draws the noise,
logs, checkpoints and records (:mod:`privret.train.dp_parallel`). Crash safety: docs/reliability.md, section 1.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from privret import distributed
from privret.errors import InputError
from privret.io import atomic_path, write_json_atomic
from privret.privacy import budget as budget_registry
from privret.privacy.accounting import calibrate_noise, check_budget, default_delta, spent_epsilon
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.poisson import PoissonUnitSampler
from privret.privacy.secure_rng import CSPRNG, SEEDED_FROM_OS, SecurePoissonUnitSampler, SecureRandom
from privret.progress import Progress
from privret.runlock import recover_directory
from privret.train.checkpointing import (CHECKPOINT_DIR, STEP_LOG, Checkpoint, StepAccount, check_finished,
                                         load_checkpoint, save_checkpoint)
from privret.train.dp_parallel import sync_from_main

# Settings a resumed or re-entered run may change: they change nothing trained beyond float rounding
# (checkpoint_every, physical_batch) or only where the randomness comes from (secure_rng).
RESUME_FREE = ("checkpoint_every", "secure_rng", "physical_batch")
# Direct DP retriever settings that a record written by another privret version may hold (a checkpoint's settings,
# train_config.json, a pipeline stage's fingerprint), each with the one value every run of this version has: a
# record holding that value matches; one holding another value is a run this version cannot make.
RETIRED_SETTINGS = {"optimizer": "adam", "public_subspace": None, "lr_scales": None, "subspace_rank": None,
                    "subspace_units": None}


def without_retired(saved: dict) -> dict:
    """``saved`` (recorded settings) less the :data:`RETIRED_SETTINGS` it holds at the value every run has."""
    return {k: v for k, v in saved.items() if k not in RETIRED_SETTINGS or RETIRED_SETTINGS[k] != v}


def resume_settings(config) -> dict:
    """The settings of ``config`` (a trainer's pydantic config) that a resume of its run, or a re-run on its
    finished output, must have again: all but :data:`RESUME_FREE`."""
    return {k: v for k, v in config.model_dump(mode="json").items() if k not in RESUME_FREE}


STAGE_FILE = "stage.json"  # the settings a caller pins before it starts a run (a pipeline stage's record)
# What the directory of an interrupted run may hold: its checkpoint, its step log and the caller's record.
RUN_FILES = (CHECKPOINT_DIR, STEP_LOG, STAGE_FILE)

Random = torch.Generator | SecureRandom


# --- the plan and its accounting ---------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    """The privacy plan of a run over ``n_units`` units (see the module docstring); sigma = 0 when not private."""

    epsilon: float  # the target; inf: a non-private run
    n_units: int
    sample_rate: float
    steps: int
    delta: float
    sigma: float
    accountant: str

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)

    @property
    def expected_batch(self) -> float:
        """q N: what every step's noisy sum is divided by."""
        return self.sample_rate * self.n_units

    def spent(self, steps: int) -> float:
        """The epsilon the accountant charges for ``steps`` noisy updates at (sigma, q, delta); inf if not private."""
        if not self.private:
            return math.inf
        return spent_epsilon(noise_multiplier=self.sigma, sample_rate=self.sample_rate, steps=steps, delta=self.delta,
                             accountant=self.accountant)


def plan_run(cfg, n_units: int) -> RunPlan:
    """The plan of a run over ``n_units`` units for a trainer config with ``epsilon``, ``delta`` (None: 1/(2N)),
    ``batch_size`` (expected units per step), ``epochs`` and ``accountant``; refuses a meaningless budget."""
    sample_rate = min(1.0, cfg.batch_size / n_units)
    steps = max(1, math.ceil(cfg.epochs / sample_rate))
    delta = cfg.delta if cfg.delta is not None else default_delta(n_units)
    check_budget(cfg.epsilon, delta, n_units)
    sigma = (calibrate_noise(target_epsilon=cfg.epsilon, delta=delta, sample_rate=sample_rate, steps=steps,
                             accountant=cfg.accountant) if math.isfinite(cfg.epsilon) else 0.0)
    return RunPlan(epsilon=cfg.epsilon, n_units=n_units, sample_rate=sample_rate, steps=steps, delta=delta, sigma=sigma,
                   accountant=cfg.accountant)


# --- what a trainer supplies -------------------------------------------------------------------


class Trainer(Protocol):
    """A loaded model ready for a run: what its checkpoints hold, one step, and the saved artefact."""

    params: Mapping[str, torch.Tensor]  # the trainable parameters, by name (checkpointed)
    optimizer: torch.optim.Optimizer  # checkpointed

    def prepare(self, progress: Progress) -> None:
        """Get ready for the first step (once, after any resume; may show its own progress)."""

    def step(self, chosen: list[int], rng: Random | None) -> float:
        """Set ``p.grad`` of every trainable parameter for the sampled units ``chosen`` (a private run: the
        noisy clipped sum divided by q N, its noise from ``rng``). Under torchrun every rank gets the same
        ``chosen``, computes on its own shard of it and combines through :mod:`privret.train.dp_parallel`;
        on every rank but 0 ``rng`` serves only the draws of the rank's own rows (hard negatives): the CSPRNG
        with ``secure_rng``, else None (torch's global generator). Returns the (shard's) mean loss, computed
        without noise: **not DP**, for the live terminal only, never for a file, a log or a report."""

    def save(self, staged: Path, *, resumed_at_step: int) -> None:
        """Write the trained artefact into ``staged``, the output directory before its atomic rename."""


@dataclass(frozen=True)
class DPRun:
    """One run into ``out_dir``: its plan and everything about it that is not the model."""

    out_dir: Path
    plan: RunPlan
    describe: Callable[..., PrivacyLedger]  # (steps=, epsilon=, secure_rng=): the ledger after ``steps`` updates
    what: str  # "generator", "retriever": names the run in messages
    finished_marker: str  # a file only a finished output holds
    label: str  # of the progress bar
    train_config: dict  # saved as train_config.json with the artefact
    seed: int  # a non-private run's seed (torch's global generator, the sampler); a private run: fresh entropy
    checkpoint_every: int
    secure_rng: bool  # the mechanism's draws (sampling, noise, ``draws``) from the OS CSPRNG (private runs)
    settings: dict  # resume_settings: saved with each checkpoint; a resume or re-run with others is refused
    budget: budget_registry.BudgetPolicy | None = None
    draws: tuple[str, ...] = ()  # what a step draws from the run's random source besides the sample and the noise
    dropout: bool = False  # a step's forward passes apply dropout (masks from torch's global generator)

    def ledger(self, steps: int, *, secure: bool) -> PrivacyLedger:
        """The run's ledger once ``steps`` noisy updates may have been released; a private one names the source of
        each random draw (:meth:`random_sources`)."""
        ledger = self.describe(steps=steps, epsilon=self.plan.spent(steps), secure_rng=secure)
        if not self.plan.private:
            return ledger
        return ledger.model_copy(update={"random_sources": self.random_sources(secure=secure)})

    def random_sources(self, *, secure: bool) -> dict[str, str]:
        """Each random draw of a private run and its source. The sample, the noise and the trainer's ``draws``
        come from the run's random source (:func:`_random_source`; on the other ranks of torchrun the CSPRNG or
        torch's global generator, :func:`run_training`): the OS CSPRNG when ``secure``, else a torch generator
        seeded from os.urandom. Dropout masks come from torch's global generator (:func:`_global_seed`) whatever
        ``secure`` says."""
        source = CSPRNG if secure else SEEDED_FROM_OS
        sources = {draw: source for draw in ("sampling", "noise", *self.draws)}
        return {**sources, "dropout": SEEDED_FROM_OS} if self.dropout else sources

    def release(self, ledger: PrivacyLedger, *, release_id: str, status: str) -> budget_registry.Release:
        return budget_registry.Release.from_ledger(ledger, release_id=release_id, status=status,
                                                   artefact=self.out_dir.absolute())


# --- the run -----------------------------------------------------------------------------------


def run_training(run: DPRun, load: Callable[[], Trainer], *, resume: bool) -> PrivacyLedger:
    """Train the model ``load()`` returns as ``run`` plans, into ``run.out_dir``; returns the final ledger
    (see the module docstring). Call it while holding the directory's lock
    (:func:`privret.distributed.main_lock`).

    Under ``torchrun`` (:mod:`privret.train.dp_parallel`) every rank calls it: rank 0 alone reads and writes
    the directory, the step log and the budget registry, draws the sampling and the noise, and hands the
    others its parameters and Adam state, each step's sampled units and the final ledger."""
    plan, out_dir = run.plan, run.out_dir
    ckpt_dir = out_dir / CHECKPOINT_DIR
    group = distributed.current()
    finished = group.from_main(lambda: _finished(run, resume=resume))
    if finished is not None:  # nothing to resume, spend nothing more
        return finished
    torch.manual_seed(_global_seed(plan, run.seed))
    trainer = load()
    opened: dict = {}  # rank 0's step account and checkpoint; the other ranks learn only the step to start at

    def open_run() -> tuple[int, bool]:
        opened["account"], opened["checkpoint"] = _open_account(run, trainer, ckpt_dir)
        return (opened["checkpoint"].step if opened["checkpoint"] is not None else 0), opened["account"].secure

    start, secure = group.from_main(open_run)
    account, checkpoint = opened.get("account"), opened.get("checkpoint")
    sync_from_main(trainer.params, trainer.optimizer, group)
    # the other ranks draw neither the sample nor the noise; the CSPRNG (or torch's global generator) for their rows
    rng, sampler = (_random_source(plan, secure=secure, seed=run.seed,
                                   state=checkpoint.rng_state if checkpoint is not None else None)
                    if group.main else (SecureRandom() if secure else None, None))
    with Progress() as progress:
        trainer.prepare(progress)
        task = progress.add_task(run.label, total=plan.steps, completed=start)
        for step in range(start, plan.steps):
            loss = trainer.step(group.from_main(lambda: sampler.sample()), rng)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
            progress.update(task, advance=1, stats=f"loss={loss:.3f}")  # not DP: terminal only
            done = step + 1
            if done % run.checkpoint_every == 0 and done < plan.steps and group.main:
                account.persist(done)
                save_checkpoint(ckpt_dir, trainer.params, trainer.optimizer,
                                run.ledger(account.total(done), secure=account.secure), step=done,
                                rng=None if plan.private else rng,
                                extra={"config": run.settings})
    return group.from_main(lambda: _save(run, trainer, account, start))


def _finished(run: DPRun, *, resume: bool) -> PrivacyLedger | None:
    """Recover the directory after a kill and refuse it if it is not this run's (:func:`_refuse_directory`);
    a finished run's ledger, or None to train."""
    out_dir = run.out_dir
    recover_directory(out_dir)
    recover_directory(out_dir / CHECKPOINT_DIR)
    finished = (out_dir / run.finished_marker).exists()
    _refuse_directory(out_dir, run.what, finished=finished, resume=resume)
    if not finished:
        return None
    ledger = check_finished(out_dir, expected=run.ledger(run.plan.steps, secure=run.plan.private and run.secure_rng),
                            what=f"a {run.what}")
    _check_finished_settings(out_dir, run)
    return ledger


def _check_finished_settings(out_dir: Path, run: DPRun) -> None:
    """Refuse a finished output trained with other settings than this run's, as saved in its ``train_config.json``
    (a setting the saved file lacks, one added to privret since, is not compared)."""
    saved = without_retired(json.loads((out_dir / "train_config.json").read_text()))
    for key in sorted(set(saved) & (set(run.settings) | set(RETIRED_SETTINGS))):
        if saved[key] != run.settings.get(key):
            raise InputError(f"already holds a {run.what} trained with {key}={saved[key]!r} (this run has "
                             f"{run.settings.get(key)!r}); use another directory", path=out_dir)


def _open_account(run: DPRun, trainer: Trainer, ckpt_dir: Path) -> tuple[StepAccount, Checkpoint | None]:
    """The step log's account and the restored checkpoint (if any); a private run's release is recorded as
    ``planned`` in the budget registry here, before the first noisy update."""
    plan = run.plan
    account = StepAccount.open(run.out_dir / STEP_LOG, private=plan.private, checkpoint=ckpt_dir,
                               secure=plan.private and run.secure_rng)
    checkpoint = _resume(run, trainer, account, ckpt_dir)
    if plan.private:
        budget_registry.check_and_record(run.release(run.ledger(account.total(plan.steps), secure=account.secure),
                                                     release_id=account.release_id, status="planned"), run.budget)
    return account, checkpoint


def _save(run: DPRun, trainer: Trainer, account: StepAccount, start: int) -> PrivacyLedger:
    """Announce the last update, write the ledger and the artefact atomically, record the release ``final``."""
    plan = run.plan
    final = run.ledger(account.total(plan.steps), secure=account.secure)
    account.persist(plan.steps)
    with atomic_path(run.out_dir) as staged:  # the ledger first: the trainer's save may describe it (model card)
        final.save(staged)
        write_json_atomic(staged / "train_config.json", run.train_config)
        trainer.save(staged, resumed_at_step=start)
    if plan.private:
        budget_registry.record(run.release(final, release_id=account.release_id, status="final"), run.budget)
    return final


def _refuse_directory(out_dir: Path, what: str, *, finished: bool, resume: bool) -> None:
    """Without ``resume`` an existing directory; with it, one holding more than an interrupted run's files."""
    if not out_dir.exists():
        return
    if not resume:
        if (out_dir / CHECKPOINT_DIR).exists() or (out_dir / STEP_LOG).exists():
            raise InputError("holds an interrupted run; resume it to continue", path=out_dir, field="resume")
        raise InputError("already exists (remove it or choose another output)", path=out_dir)
    foreign = [] if finished else sorted(p.name for p in out_dir.iterdir() if p.name not in RUN_FILES)
    if foreign:
        raise InputError(f"holds files that are not an interrupted {what} run ({', '.join(foreign[:3])}); "
                         "choose another output", path=out_dir)


def _resume(run: DPRun, trainer: Trainer, account: StepAccount, ckpt_dir: Path) -> Checkpoint | None:
    """Restore the last checkpoint, if any (only a resume gets here with one: see :func:`_refuse_directory`),
    into ``trainer``; refuse one made under another plan or settings, or one the step log does not account for."""
    if not ckpt_dir.exists():
        return None
    checkpoint = load_checkpoint(ckpt_dir, trainer.params, trainer.optimizer,
                                 expected=run.ledger(0, secure=account.secure))
    _check_settings(checkpoint.state.get("config"), run.settings, ckpt_dir)
    account.resume_from(checkpoint.step, private=run.plan.private)
    return checkpoint


def _check_settings(saved: dict | None, settings: dict, ckpt_dir: Path) -> None:
    """Refuse a checkpoint made with other training settings than this run's."""
    if saved is None:
        raise InputError("checkpoint without its training settings; cannot resume it safely, start again in a new "
                         "directory", path=ckpt_dir)
    saved = without_retired(saved)
    for key in sorted(set(saved) | set(settings)):
        if saved.get(key) != settings.get(key):
            raise InputError(f"checkpoint was made with {key}={saved.get(key)!r}, this run has "
                             f"{settings.get(key)!r}; cannot resume", path=ckpt_dir)


def _global_seed(plan: RunPlan, seed: int) -> int:
    """torch's global seed for the run (this process). Besides the run's random source, a step draws from
    torch's global generator: dropout in the trained layers (when the trainer applies it), and, without
    ``secure_rng``, a hard-negative draw on a rank other than 0. In a private run that randomness must be
    secret: with a known seed each unit's dropout masks would be a fixed function of which other units were
    sampled before it, so adding a unit would change the others' clipped terms. Secret and i.i.d., every
    unit's masks have the same distribution whatever the others, and Delta holds.
    So a private run seeds it from ``os.urandom`` on every start (each rank its own); a non-private run with
    ``seed`` (reproducible)."""
    return int.from_bytes(os.urandom(8), "little") if plan.private else seed


def _random_source(plan: RunPlan, *, secure: bool, seed: int, state: torch.Tensor | None,
                   ) -> tuple[Random, PoissonUnitSampler | SecurePoissonUnitSampler]:
    """The run's random source and its Poisson sampler at rate q. A private run draws fresh entropy on
    every start, resumes included (noise and sampling are never replayed): the OS CSPRNG if ``secure``,
    else a generator seeded from ``os.urandom``. A non-private run seeds it with ``seed`` and continues
    a checkpoint's sampler ``state``, so a resumed run equals an uninterrupted one."""
    if secure:
        secure_rng = SecureRandom()
        return secure_rng, SecurePoissonUnitSampler(plan.n_units, plan.sample_rate, secure_rng)
    rng = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") if plan.private else seed)
    if state is not None and not plan.private:
        rng.set_state(state)
    return rng, PoissonUnitSampler(plan.n_units, plan.sample_rate, rng)
