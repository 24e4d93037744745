"""Direct DP training of the dual encoder on the private pairs: DP-SGD over Poisson-sampled privacy units, four
mechanisms (Carranza et al., section 3.3.2; Kong, Muñoz Medina and Ribero, Algorithm 1).

A step releases ``s(batch) + N(0, (sigma Delta)^2 I)``: ``s`` is the method's clipped gradient sum, ``Delta`` its L2
sensitivity to adding or removing one unit, sigma calibrated for T = ceil(epochs / q) steps; Adam gets the noisy sum
divided by the expected batch q N. Logits are ``cos(q_i, d_j) / temperature``.

* ``naive``: each unit's in-batch softmax gradient clipped to C, the batch capped at K units: ``Delta = 2 K C``;
* ``batch-clip``: the whole batch's gradient clipped to C: ``Delta = 2 C``;
* ``logit-dp``: each pair's similarity gradient clipped to B, reweighted: ``Delta = B f`` (:func:`logit_dp_factor`);
* ``public-negatives``: each unit's own pairs against public (and hard public) negatives: ``Delta = C``.

Why these bounds hold: docs/direct-dp.md, section "What every method releases". The sums:
:mod:`privret.train.clipped_sums`; the run, checkpoints and ledger: :mod:`privret.train.dp_run`. Under ``torchrun``
only :data:`PARALLEL_METHODS` run (:mod:`privret.train.dp_parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from privret import distributed
from privret.data.beir import Document
from privret.data.pairs import UNIT_DEFINITIONS, TrainingPairs
from privret.errors import InputError
from privret.io import write_json_atomic
from privret.models.encoder import load_encoder
from privret.models.model_card import write_model_card
from privret.privacy import budget as budget_registry
from privret.privacy.ledger import PrivacyLedger, require_public
from privret.privacy.logit_dp import logit_dp_factor
from privret.privacy.hold_out import LogPart, fit_part
from privret.privacy.secure_rng import SecureRandom
from privret.progress import Progress
from privret.train.clipped_sums import StepBatch, clipped_sum
from privret.train.dp_parallel import set_noisy_mean
from privret.train.dp_run import DPRun, plan_run, resume_settings, run_training
from privret.train.hard_negatives import mine_candidates
from privret.settings.training import DPRetrieverConfig
from privret.models.trainable import make_trainable, merge_adapters

MECHANISM_FILE = "dp_mechanism.json"  # only a finished output holds it (with the model and ledger)
# the methods whose clipped sum is a sum of per-unit terms, so it can be split across processes (torchrun)
PARALLEL_METHODS = ("public-negatives",)


@dataclass(frozen=True)
class Mechanism:
    """Per-step privacy mechanism: sensitivity Delta, the unit cap (None: no truncation), the noise std."""

    sensitivity: float
    cap: int | None
    sigma: float

    @property
    def noise_std(self) -> float:
        return self.sensitivity * self.sigma


def sensitivity(cfg: DPRetrieverConfig) -> tuple[float, int | None]:
    """(Delta, cap) of one step of ``cfg.method``; cap None means the batch is never truncated."""
    c = cfg.clip_norm
    if cfg.method == "naive":
        return 2.0 * cfg.cap * c, cfg.cap
    if cfg.method == "batch-clip":
        return 2.0 * c, None
    if cfg.method == "public-negatives":
        return c, None
    free = logit_dp_factor(temperature=cfg.tau, spreadout_weight=cfg.spreadout_weight)
    capped = logit_dp_factor(temperature=cfg.tau, spreadout_weight=cfg.spreadout_weight, max_rows=cfg.cap)
    return (capped * c, cfg.cap) if capped < free else (free * c, None)


# ---------------------------------------------------------------------------------------------------------------
# Training


def plan(cfg: DPRetrieverConfig, n_units: int) -> tuple[float, int, float, Mechanism]:
    """(sample rate q, steps T, delta, mechanism) for a run over ``n_units`` units (:func:`~privret.train.dp_run.plan_run`)."""
    cfg = cfg.scheduled(n_units)
    run_plan = plan_run(cfg, n_units)
    return run_plan.sample_rate, run_plan.steps, run_plan.delta, mechanism(cfg, run_plan.sigma)


def mechanism(cfg: DPRetrieverConfig, sigma: float) -> Mechanism:
    """The per-step mechanism of ``cfg.method`` at noise multiplier ``sigma``."""
    sens, cap = sensitivity(cfg)
    return Mechanism(sensitivity=sens, cap=cap, sigma=sigma)


def step_draws(cfg: DPRetrieverConfig, cap: int | None) -> tuple[str, ...]:
    """What a step of ``cfg.method`` draws from the run's random source besides the sample and the noise (the
    ledger's ``random_sources``): the truncation to ``cap`` units, logit-dp's row per unit, public-negatives' shared
    and hard negatives."""
    drawn = {"batch truncation": cap is not None, "row choice": cfg.method == "logit-dp",
             "public negatives": cfg.method == "public-negatives" and cfg.public_negatives > 0,
             "hard negatives": cfg.hard_negatives > 0}
    return tuple(draw for draw, taken in drawn.items() if taken)


def draw_negatives(public: list[Document], cfg: DPRetrieverConfig, rng: torch.Generator | SecureRandom,
                   ) -> list[Document]:
    """A step's public negatives: ``cfg.public_negatives`` documents drawn uniformly (with replacement) from
    ``public`` (:func:`negative_pool`), whatever the private data."""
    return [public[i] for i in _randint(len(public), cfg.public_negatives, rng).tolist()]


def build_batch(pairs: TrainingPairs, units: list[list[int]], chosen: list[int], cfg: DPRetrieverConfig,
                rng: torch.Generator | SecureRandom | None, negatives: list[Document] | None,
                cap: int | None, *, hard: tuple[list[Document], list[list[int]]] | None = None) -> StepBatch:
    """Rows of the chosen units: truncated to ``cap`` units (uniformly), one random row each for logit-dp;
    ``negatives``: the step's public negatives (public-negatives, :func:`draw_negatives`), else None;
    ``hard``: (the public pool, each row's candidate positions in it, :func:`~privret.train.hard_negatives.
    mine_candidates`), from which every row draws ``cfg.hard_negatives`` uniformly with replacement."""
    if cap is not None and len(chosen) > cap:
        keep = _permutation(len(chosen), rng)[:cap].sort().values.tolist()
        chosen = [chosen[k] for k in keep]
    rows, owner = [], []
    for k, u in enumerate(chosen):
        unit_rows = units[u]
        if cfg.method == "logit-dp":
            unit_rows = [unit_rows[int(_randint(len(unit_rows), 1, rng)[0])]]
        rows += unit_rows
        owner += [k] * len(unit_rows)
    chosen_pairs = [pairs.pairs[r] for r in rows]
    batch = StepBatch(queries=[p.query for p in chosen_pairs],
                      docs=[pairs.corpus[p.doc_id].full_text for p in chosen_pairs],
                      unit_of_row=torch.tensor(owner, dtype=torch.long), doc_ids=[p.doc_id for p in chosen_pairs],
                      n_units=len(chosen), negatives=negatives)
    if hard is not None and cfg.hard_negatives:
        batch.hard, batch.hard_valid = _draw_hard(hard, rows, cfg.hard_negatives, rng)
    return batch


def _draw_hard(hard: tuple[list[Document], list[list[int]]], rows: list[int], k: int,
               rng: torch.Generator | SecureRandom) -> tuple[list[list[str]], torch.Tensor]:
    """Each row's ``k`` hard negatives (texts), drawn uniformly with replacement from its candidates, and
    which are real: a row without candidates gets ``k`` placeholders marked False (masked out of its loss)."""
    pool, candidates = hard
    texts, valid = [], []
    for r in rows:
        cands = candidates[r]
        if cands:
            texts.append([pool[cands[i]].full_text for i in _randint(len(cands), k, rng).tolist()])
        else:
            texts.append([pool[0].full_text] * k)
        valid.append([bool(cands)] * k)
    return texts, torch.tensor(valid, dtype=torch.bool)


def _permutation(n: int, rng: torch.Generator | SecureRandom) -> torch.Tensor:
    """A uniformly random permutation of 0..n-1 (from the CSPRNG: argsort of n uniforms)."""
    if isinstance(rng, SecureRandom):
        return torch.argsort(rng.uniform(n))
    return torch.randperm(n, generator=rng)


def _randint(high: int, size: int, rng: torch.Generator | SecureRandom) -> torch.Tensor:
    """``size`` uniform draws from 0..high-1 (from the CSPRNG: floor((1 - u) high), u in (0, 1])."""
    if isinstance(rng, SecureRandom):
        return ((1.0 - rng.uniform(size)) * high).floor().long().clamp(max=high - 1)
    return torch.randint(high, (size,), generator=rng)


def dp_step(model, params: list[torch.Tensor], batch: StepBatch, cfg: DPRetrieverConfig, mech: Mechanism,
            expected_batch: float, rng: torch.Generator | SecureRandom | None,
            group: distributed.Group = distributed.SINGLE) -> dict:
    """Set ``p.grad = (s(batch) + N(0, (sigma Delta)^2)) / (q N)`` for every trainable parameter (under
    torchrun ``batch`` holds this rank's shard of the units, the sum runs over every rank's and the noise is
    drawn once: :func:`~privret.train.dp_parallel.set_noisy_mean`); return the step statistics of
    :func:`clipped_sum` (not DP: terminal display only)."""
    summed, stats = clipped_sum(cfg.method, model, params, batch, cfg)
    set_noisy_mean(params, summed, std=mech.noise_std, expected_batch=expected_batch, rng=rng, group=group)
    return stats


def train_dp_retriever(pairs: TrainingPairs, out_dir: str | Path, cfg: DPRetrieverConfig, *, data_hash: str,
                       dataset_id: str = "", public_corpus: dict[str, Document] | None = None,
                       budget: budget_registry.BudgetPolicy | None = None, resume: bool = False,
                       embedding_cache: str | Path | None = None) -> PrivacyLedger:
    """Train ``cfg.model`` on ``pairs`` with ``cfg.method``; save a SentenceTransformer + ledger (atomic).

    ``public_corpus`` (required for public-negatives) is where public-negatives draws its negatives,
    less ``pairs.inline_doc_ids`` (:func:`negative_pool`).
    The release is recorded in the budget registry (:mod:`privret.privacy.budget`, checked against
    ``budget``) of ``dataset_id`` (default: that of ``pairs``) with all its planned steps before any
    update can reach disk, and again when done. ``resume``: continue an interrupted run in
    ``out_dir`` (:mod:`privret.train.dp_run`); a finished one is returned as it is, spending nothing more.
    ``embedding_cache``: where the hard-negative mining keeps the public encoder's embeddings of the public pool
    (:func:`~privret.train.hard_negatives.mine_candidates`); changes nothing trained. ``cfg.model`` must be public:
    one with a privacy ledger that is not an epsilon = 0 one is refused. ``cfg.hold_out``: train on that partition's
    fit part only (its ledger records the part; :mod:`privret.privacy.hold_out`), keeping the held-out part for a
    DP choice (``retriever select`` with the same partition) that composes with this run in parallel.
    """
    dataset_id = dataset_id or budget_registry.dataset_id(pairs)  # the whole log's: its budget, also with hold_out
    part, pairs = fit_part(cfg.hold_out, pairs, cfg.unit)
    cfg = cfg.scheduled(len(pairs.units(cfg.unit)))  # an unset batch size or epochs: the rule of the units trained on
    require_public(cfg.model, field="model", use="direct DP training (its hard negatives and cached embeddings)")
    if distributed.launched().distributed and cfg.method not in PARALLEL_METHODS:
        raise InputError(f"{cfg.method} couples the units of a batch (in-batch negatives or a batch-wide clip), so "
                         f"its clipped sum cannot be split across processes; under torchrun use "
                         f"{' or '.join(PARALLEL_METHODS)}", field="method")
    with distributed.main_lock(Path(out_dir), what="retriever directory"):
        return _train_dp_retriever(pairs, Path(out_dir), cfg, data_hash=data_hash, dataset_id=dataset_id,
                                   public_corpus=public_corpus, budget=budget, resume=resume,
                                   embedding_cache=embedding_cache, part=part)


def negative_pool(pairs: TrainingPairs, public_corpus: dict[str, Document] | None) -> list[Document]:
    """The documents public-negatives draws from: ``public_corpus`` less ``pairs.inline_doc_ids``.

    Delta = C needs the negatives to be independent of the private data. Documents that came inline with
    the private pairs are private (one unit's own document), so they are left out even when
    ``public_corpus`` is a mix (such as ``pairs.corpus``); ``inline_doc_ids`` holds only documents the
    public corpus did not already have, so the pool of a genuinely public corpus does not depend on the
    private pairs. There is no fallback to ``pairs.corpus``: without a public corpus there is no pool.
    """
    if public_corpus is None:
        raise InputError("public-negatives needs a public corpus to draw negatives from (the documents of the "
                         "private pairs are not public)", field="public_corpus")
    pool = [doc for doc_id, doc in public_corpus.items() if doc_id not in pairs.inline_doc_ids]
    if not pool:
        raise InputError("public-negatives needs a public corpus with documents that did not come inline with "
                         "the private pairs", field="public_corpus")
    return pool


def _train_dp_retriever(pairs: TrainingPairs, out_dir: Path, cfg: DPRetrieverConfig, *, data_hash: str,
                        dataset_id: str, public_corpus, budget, resume: bool, embedding_cache,
                        part: LogPart | None) -> PrivacyLedger:
    units = pairs.units(cfg.unit)
    run_plan = plan_run(cfg, len(units))
    mech = mechanism(cfg, run_plan.sigma)
    public = negative_pool(pairs, public_corpus) if cfg.method == "public-negatives" else None

    def describe(*, steps: int, epsilon: float, secure_rng: bool) -> PrivacyLedger:
        return PrivacyLedger(
            mechanism=f"direct-{cfg.method}", delta=run_plan.delta, noise_multiplier=run_plan.sigma,
            sample_rate=run_plan.sample_rate, epsilon=epsilon, steps=steps, planned_steps=run_plan.steps,
            accountant=cfg.accountant, unit=cfg.unit.value, n_units=run_plan.n_units, n_pairs=len(pairs.pairs),
            clip_norm=cfg.clip_norm, model=cfg.model, trainable=cfg.trainable, data_hash=data_hash,
            dataset_id=dataset_id, secure_rng=secure_rng, unit_definition=UNIT_DEFINITIONS[cfg.unit], part=part)

    def load() -> _RetrieverTrainer:
        model = load_encoder(cfg.model, max_seq_length=cfg.max_doc_tokens)
        hard = None
        if cfg.hard_negatives:  # ranked by the initial (public) encoder, before any update
            hard = (public, mine_candidates(model, pairs, units, public, cfg.hard_negative_depth,
                                            cache_dir=embedding_cache))
        named = make_trainable(model, cfg.trainable, lora_rank=cfg.lora_rank)
        optimizer = torch.optim.Adam(list(named.values()), lr=cfg.learning_rate)
        return _RetrieverTrainer(model=model, params=named, optimizer=optimizer,
                                 pairs=pairs, units=units, cfg=cfg, mech=mech, public=public, hard=hard,
                                 expected_batch=run_plan.expected_batch, group=distributed.current())

    run = DPRun(out_dir=out_dir, plan=run_plan, describe=describe, what="retriever", finished_marker=MECHANISM_FILE,
                label=f"DP retriever ({cfg.method}, epsilon={cfg.epsilon:g})", train_config=cfg.model_dump(mode="json"),
                seed=cfg.seed, checkpoint_every=cfg.checkpoint_every, secure_rng=cfg.secure_rng,
                settings=resume_settings(cfg), budget=budget, draws=step_draws(cfg, mech.cap), dropout=cfg.dropout)
    return run_training(run, load, resume=resume)


@dataclass
class _RetrieverTrainer:
    """The encoder in a DP run (:class:`privret.train.dp_run.Trainer`): one step is :func:`build_batch` (of
    this rank's shard of the sampled units, with the negatives rank 0 drew) and :func:`dp_step`; the artefact
    is the SentenceTransformer (LoRA merged) and :data:`MECHANISM_FILE`."""

    model: object
    params: dict[str, torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    pairs: TrainingPairs
    units: list[list[int]]
    cfg: DPRetrieverConfig
    mech: Mechanism
    public: list[Document] | None
    hard: tuple[list[Document], list[list[int]]] | None
    expected_batch: float
    group: distributed.Group = distributed.SINGLE

    def prepare(self, progress: Progress) -> None:
        self.model.train(self.cfg.dropout)  # eval mode (no dropout) when the run trains without it

    def step(self, chosen: list[int], rng: torch.Generator | SecureRandom | None) -> float:
        negatives = (self.group.from_main(lambda: draw_negatives(self.public, self.cfg, rng))
                     if self.cfg.method == "public-negatives" else None)
        batch = build_batch(self.pairs, self.units, self.group.shard(chosen), self.cfg, rng, negatives,
                            self.mech.cap, hard=self.hard)
        params = list(self.params.values())
        return dp_step(self.model, params, batch, self.cfg, self.mech, self.expected_batch, rng, self.group)["loss"]

    def save(self, staged: Path, *, resumed_at_step: int) -> None:
        self.model.eval()
        merge_adapters(self.model)
        self.model.save(str(staged), safe_serialization=True)
        mech = self.mech
        write_json_atomic(staged / MECHANISM_FILE, {
            "method": self.cfg.method, "sensitivity": mech.sensitivity, "noise_std": mech.noise_std,
            "noise_multiplier": mech.sigma, "batch_cap": mech.cap, "temperature": self.cfg.tau,
            "resumed_at_step": resumed_at_step})  # no duration: it depends on the private batches
        write_model_card(staged)
