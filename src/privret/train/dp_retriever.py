"""Direct DP training of the dual encoder on the private pairs: four honest mechanisms side by side.

Every method is DP-SGD over Poisson-sampled privacy units (each of the N units joins a step
independently with probability q = batch_size / N, as the accountant assumes); a step releases
``s(batch) + N(0, (sigma * Delta)^2 I)`` where ``s`` is the method's clipped gradient sum, ``Delta``
its L2 sensitivity to adding or removing one unit (stated below, proven in
``tests/test_dp_retriever.py``) and sigma is calibrated by the accountant for T = ceil(epochs / q)
steps. The noisy sum, divided by the expected batch q N, goes to Adam. Logits are
``cos(q_i, d_j) / temperature``.

* ``naive`` (seed ``dp-synthetic-queries-retrieval.txt`` 3.3.2, 5.3.2): unit u's gradient is the
  gradient of its own rows' in-batch softmax losses, G_u = grad sum_{i in u} l_i(batch), clipped to C.
  Its pair is a negative of every other unit, so adding a unit changes *every* clipped term: each by
  at most 2C. The batch is capped at K units (a uniformly random K of the sampled units; K =
  ``max_batch_units``, default ``batch_size + ceil(4 sqrt(batch_size))``) and, since the cap can make an
  added unit evict another one, **Delta = 2 K C** (add: C + 2C (K-1); swap: 2C + 2C (K-1)).
  Cost: one backward pass per unit (exact norms) plus one reweighted pass.
* ``batch-clip`` ("Naive-DP" of the Logit-DP seed, 2.3): the whole batch gradient clipped to C. Any
  two batches give outputs of norm <= C, so **Delta = 2 C**, whatever the batch size. One backward.
* ``logit-dp`` (Logit-DP seed, Algorithm 1, Theorem 4.2, section 5.3): one row per sampled unit, every
  similarity gradient g_ij clipped to B = ``clip_norm`` through the reweighting lambda_ij, **Delta =
  B * f** with f = :func:`privret.privacy.logit_dp.logit_dp_factor` (f = 2 (1 + e^{2/t}) for the
  contrastive loss with temperature t, + 6/t per unit of spreadout weight; with the cap, 2 f(K) if that
  is smaller). No false-negative masking: masking would shrink rows and break the constants.
  Cost: n backward passes without weight gradients (per-side pair norms, exact) plus one backward of F.
* ``public-negatives``: unit u's loss is its own pairs against ``public_negatives`` documents drawn
  uniformly from the public corpus (``public_corpus``, required; documents that came inline with the
  private pairs, ``TrainingPairs.inline_doc_ids``, are never in the pool), independently of the
  private data, embedded without gradient (constants for the step). In a row's softmax a sampled
  negative that is one of the positive documents of the row's unit (same id or identical text) is
  masked out (:func:`false_negative_mask`), a function of u's own pairs and the public sample only.
  The loss decomposes per unit, so ordinary per-unit clipping applies: **Delta = C**, independent of
  the batch. It protects the same unit as the others (a query with all its clicked documents, a pair,
  or a user); the public documents themselves are not protected (they are public by assumption).
  Cost: one backward pass to the layer outputs (per-unit ghost norms), then the clipped sum by
  book-keeping (one weighted contraction per layer from the same output gradients,
  :meth:`GhostNorms.weighted_grads`; no second backward), plus a no-grad forward of the negatives.

Trainable parameters (``trainable``): ``all`` (every encoder parameter except the position embeddings,
which broadcast over the batch and cannot be clipped per sample, and the unused pooler), ``top:K``
(the top K transformer layers; lower layers are frozen and their backward is skipped), ``lora`` (LoRA
adapters of rank ``lora_rank`` on the attention query/key/value projections, merged before saving).

Crash safety and resumption (``docs/reliability.md``) are those of every DP run, with the same code
(:mod:`privret.train.dp_run`): one process per output directory; every ``checkpoint_every`` steps an
atomic checkpoint (trainable parameters + Adam state + ledger + the settings of
:func:`resume_settings`), each announced first in ``<out>/steps.jsonl``, so every ledger counts every
noisy update that could have reached disk, lost ones included. ``resume=True`` continues from the last
checkpoint with fresh noise and sampling (never replayed); a checkpoint the step log does not account
for, or one made with other settings, is refused. The final SentenceTransformer replaces the directory
atomically. The release is recorded in the budget registry before any update can reach disk (one
release id across resumes) and again when done. ``secure_rng`` draws the noise, the Poisson sampling
and the batch truncation / row choice from the OS CSPRNG (:mod:`privret.privacy.secure_rng`).

Under ``torchrun`` (:mod:`privret.train.dp_parallel`) only the methods of :data:`PARALLEL_METHODS` run: each
rank clips the units of its shard and rank 0 draws the step's public negatives for all; the other methods'
clipped sums couple the units of a batch and are refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from privret import distributed
from privret.data.beir import Document
from privret.data.pairs import UNIT_DEFINITIONS, TrainingPairs
from privret.errors import InputError
from privret.io import write_json_atomic
from privret.models.encoder import features, load_encoder
from privret.models.model_card import write_model_card
from privret.privacy import budget as budget_registry
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.ghost_norms import GhostNorms
from privret.privacy.logit_dp import logit_dp_factor, loss_logit_grads, pair_norm_bounds, reweighting, row_losses
from privret.privacy.secure_rng import SecureRandom
from privret.progress import Progress
from privret.train.dp_parallel import set_noisy_mean
from privret.train.dp_run import DPRun, plan_run, run_training
from privret.train.settings import METHODS, DPRetrieverConfig

# Norms are inflated by this relative margin before clipping, so float rounding in a computed norm
# can never let a clipped term exceed its bound.
NORM_MARGIN = 1e-5
MECHANISM_FILE = "dp_mechanism.json"  # only a finished output holds it (with the model and ledger)
# config fields that do not change what is trained: free to differ on resume, and left out of pipeline
# fingerprints (secure_rng only when off: see privret.pipeline.stages.direct_dp_fingerprint)
RESUME_FREE = ("checkpoint_every", "secure_rng")
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
# One step's batch and the four clipped sums


@dataclass
class StepBatch:
    """Rows of the sampled units: texts, the unit (0..m-1) and document id of each row; for
    public-negatives the step's sample of public negatives."""

    queries: list[str]
    docs: list[str]
    unit_of_row: torch.Tensor
    doc_ids: list[str]
    n_units: int
    negatives: list[Document] | None = None


def _encode(model, texts: list[str], max_length: int) -> torch.Tensor:
    return F.normalize(model(features(model, texts, max_length=max_length))["sentence_embedding"].float(), dim=-1)


def _encode_tracked(tracker: GhostNorms, model, batch: StepBatch, cfg: DPRetrieverConfig,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's query and document embeddings, ``tracker`` recording the layer calls of each
    under its slot ("q", "d") for the ghost per-unit norms."""
    tracker.slot = "q"
    e_q = _encode(model, batch.queries, cfg.max_query_tokens)
    tracker.slot = "d"
    e_d = _encode(model, batch.docs, cfg.max_doc_tokens)
    tracker.slot = None
    return e_q, e_d


def _masked_logits(e_q, e_d, batch: StepBatch, temperature: float) -> torch.Tensor:
    """In-batch logits with off-diagonal false negatives (same unit or same document) masked out."""
    logits = e_q @ e_d.T / temperature
    u = batch.unit_of_row.to(logits.device)
    same_doc = torch.tensor([[a == b for b in batch.doc_ids] for a in batch.doc_ids], device=logits.device)
    mask = ((u[:, None] == u[None, :]) | same_doc) & ~torch.eye(len(u), dtype=torch.bool, device=logits.device)
    return logits.masked_fill(mask, float("-inf"))


def _grads(scalar: torch.Tensor, params: list[torch.Tensor], *, retain: bool) -> list[torch.Tensor]:
    got = torch.autograd.grad(scalar, params, retain_graph=retain, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(got, params)]


def _norm(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum(g.float().pow(2).sum() for g in grads))


def clipped_sum(method: str, model, params: list[torch.Tensor], batch: StepBatch, cfg: DPRetrieverConfig,
                ) -> tuple[list[torch.Tensor], dict]:
    """The method's clipped gradient sum s(batch) (before noise) and step statistics.

    The statistics (``loss``: mean loss of the batch; ``clipped``: fraction of clipped units, pairs or
    batches) are computed from the private batch without noise, so they are **not DP**: they may be shown
    on a live terminal (:class:`privret.progress.Progress` ``stats``) and must never be written to a file,
    a log or a report.
    """
    if not batch.queries:
        return [torch.zeros_like(p) for p in params], {"loss": float("nan")}
    if method == "naive":
        return _naive(model, params, batch, cfg)
    if method == "batch-clip":
        return _batch_clip(model, params, batch, cfg)
    if method == "logit-dp":
        return _logit_dp(model, params, batch, cfg)
    if method == "public-negatives":
        return _public_negatives(model, params, batch, cfg)
    raise InputError(f"unknown method '{method}' (choose from {', '.join(METHODS)})", field="method")


def _naive(model, params, batch, cfg):
    e_q = _encode(model, batch.queries, cfg.max_query_tokens)
    e_d = _encode(model, batch.docs, cfg.max_doc_tokens)
    losses = F.cross_entropy(_masked_logits(e_q, e_d, batch, cfg.tau),
                             torch.arange(len(batch.queries), device=e_q.device), reduction="none")
    u = batch.unit_of_row.to(losses.device)
    unit_losses = torch.zeros(batch.n_units, device=losses.device).index_add(0, u, losses)
    norms = torch.stack([_norm(_grads(unit_losses[k], params, retain=True)) for k in range(batch.n_units)])
    factors = (cfg.clip_norm / (norms * (1 + NORM_MARGIN)).clamp_min(1e-12)).clamp(max=1.0)
    out = _grads((factors.detach() * unit_losses).sum(), params, retain=False)
    return out, {"loss": losses.mean().item(), "clipped": (norms > cfg.clip_norm).float().mean().item()}


def _batch_clip(model, params, batch, cfg):
    e_q = _encode(model, batch.queries, cfg.max_query_tokens)
    e_d = _encode(model, batch.docs, cfg.max_doc_tokens)
    losses = F.cross_entropy(_masked_logits(e_q, e_d, batch, cfg.tau),
                             torch.arange(len(batch.queries), device=e_q.device), reduction="none")
    grads = _grads(losses.sum(), params, retain=False)
    norm = _norm(grads)
    factor = min(1.0, cfg.clip_norm / max(norm.item() * (1 + NORM_MARGIN), 1e-12))
    return [g * factor for g in grads], {"loss": losses.mean().item(), "clipped": float(norm > cfg.clip_norm)}


def _logit_dp(model, params, batch, cfg):
    if batch.n_units != len(batch.queries):
        raise ValueError("logit-dp takes exactly one row per unit")
    tracker = GhostNorms(model)
    try:
        e_q, e_d = _encode_tracked(tracker, model, batch, cfg)
        logits = e_q @ e_d.T / cfg.tau
        tau = loss_logit_grads(logits.detach(), cfg.spreadout_weight)
        q_side, d_side = pair_norm_bounds(tracker, e_q, e_d, cfg.tau)
    finally:
        tracker.remove()
    bounds = (q_side + d_side) * (1 + NORM_MARGIN)
    lam = reweighting(tau, bounds, cfg.clip_norm)
    out = _grads((lam * logits).sum(), params, retain=False)
    loss = row_losses(logits.detach(), cfg.spreadout_weight).mean().item()
    return out, {"loss": loss, "clipped": (bounds > cfg.clip_norm).float().mean().item()}


def _public_negatives(model, params, batch, cfg):
    with torch.no_grad():
        e_n = _encode(model, [d.full_text for d in batch.negatives], cfg.max_doc_tokens)
    tracker = GhostNorms(model)
    try:
        e_q, e_d = _encode_tracked(tracker, model, batch, cfg)
        losses = public_negative_losses(e_q, e_d, e_n, cfg.tau, mask=false_negative_mask(batch))
        cot = torch.autograd.grad(losses.sum(), [e_q, e_d], retain_graph=True)
        u = batch.unit_of_row
        sq = tracker.group_sq_norms([e_q, e_d], list(cot), {"q": u, "d": u}, batch.n_units, keep_deltas=True)
        norms = sq.clamp_min(0).sqrt() * (1 + NORM_MARGIN)
        factors = (cfg.clip_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
        # book-keeping: sum_u factor_u grad_u from the output gradients already computed for the norms
        # (row b's gradient belongs to unit u[b] only), no second backward pass
        row_factor = factors[u.to(factors.device)].detach()
        out = tracker.weighted_grads(params, {"q": row_factor, "d": row_factor})
    finally:
        tracker.remove()
    return out, {"loss": losses.mean().item(), "clipped": (norms > cfg.clip_norm).float().mean().item()}


def false_negative_mask(batch: StepBatch) -> torch.Tensor:
    """[rows x negatives], True where public negative j is one of the positive documents of row i's unit
    (the same document id or identical text): that negative is no negative for the row.

    Row i's mask is a function of its own unit's pairs and the step's public sample only, so masking
    keeps each unit's loss independent of the other units (Delta = C still holds)."""
    units = batch.unit_of_row.tolist()
    ids: list[set[str]] = [set() for _ in range(batch.n_units)]
    texts: list[set[str]] = [set() for _ in range(batch.n_units)]
    for u, doc_id, text in zip(units, batch.doc_ids, batch.docs):
        ids[u].add(doc_id)
        texts[u].add(text)
    return torch.tensor([[n.id in ids[u] or n.full_text in texts[u] for n in batch.negatives] for u in units],
                        dtype=torch.bool)


def public_negative_losses(e_q: torch.Tensor, e_d: torch.Tensor, e_n: torch.Tensor, temperature: float, *,
                           mask: torch.Tensor) -> torch.Tensor:
    """Row i: l_i = -log( e^{s_i} / (e^{s_i} + sum_{j: not mask_ij} e^{s_ij}) ), s_i = cos(q_i, d_i) / t,
    s_ij = cos(q_i, n_j) / t: the positive against the public negatives n_1..n_M (constants: no gradient)
    that ``mask`` (:func:`false_negative_mask`) does not exclude for row i."""
    pos = (e_q * e_d).sum(dim=1, keepdim=True)
    neg = (e_q @ e_n.detach().T).masked_fill(mask.to(e_q.device), float("-inf"))
    logits = torch.cat([pos, neg], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(e_q), dtype=torch.long, device=e_q.device), reduction="none")


# ---------------------------------------------------------------------------------------------------------------
# Trainable parameters


def make_trainable(model, spec: str, *, lora_rank: int = 8) -> dict[str, torch.nn.Parameter]:
    """Freeze all but the chosen parameters of a SentenceTransformer (see module docstring)."""
    auto = model[0].auto_model
    for p in model.parameters():
        p.requires_grad_(False)
    if spec == "lora":
        from peft import LoraConfig, get_peft_model

        targets = [n for n in ("query", "key", "value") if any(name.endswith("." + n) for name, _ in
                                                                 auto.named_modules())] or ["q_proj", "v_proj"]
        peft_model = get_peft_model(auto, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0,
                                                     target_modules=targets))
        _replace_auto_model(model[0], peft_model)
        return {n: p for n, p in model.named_parameters() if "lora_" in n}
    layers = _layer_list(auto)
    if spec == "all":
        chosen = [p for n, p in auto.named_parameters() if "pooler" not in n and "position_embeddings" not in n]
    else:
        k = int(spec.split(":")[1])
        if k > len(layers):
            raise InputError(f"the encoder has {len(layers)} layers, cannot train the top {k}", field="trainable")
        chosen = [p for layer in layers[-k:] for p in layer.parameters()]
    for p in chosen:
        p.requires_grad_(True)
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _layer_list(auto) -> torch.nn.ModuleList:
    for name, module in auto.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layer", "layers"):
            return module
    raise InputError("cannot find the transformer layers of this encoder", field="trainable")


def _replace_auto_model(transformer, new) -> None:
    """Put ``new`` where ``transformer`` (a sentence-transformers Transformer module) keeps its HF model.

    sentence-transformers >= 5 keeps it in ``model`` and ``auto_model`` is a read-only alias: assigning
    to the alias would only register a second, unused submodule (and the saved file would miss the
    adapters' merge)."""
    if isinstance(getattr(type(transformer), "auto_model", None), property):
        transformer.model = new
    else:
        transformer.auto_model = new


def _finalise(model) -> None:
    """Merge LoRA adapters so the saved model is a plain SentenceTransformer."""
    auto = model[0].auto_model
    if hasattr(auto, "merge_and_unload"):
        _replace_auto_model(model[0], auto.merge_and_unload())


# ---------------------------------------------------------------------------------------------------------------
# Training


def plan(cfg: DPRetrieverConfig, n_units: int) -> tuple[float, int, float, Mechanism]:
    """(sample rate q, steps T, delta, mechanism) for a run over ``n_units`` units (:func:`~privret.train.dp_run.plan_run`)."""
    run_plan = plan_run(cfg, n_units)
    return run_plan.sample_rate, run_plan.steps, run_plan.delta, mechanism(cfg, run_plan.sigma)


def mechanism(cfg: DPRetrieverConfig, sigma: float) -> Mechanism:
    """The per-step mechanism of ``cfg.method`` at noise multiplier ``sigma``."""
    sens, cap = sensitivity(cfg)
    return Mechanism(sensitivity=sens, cap=cap, sigma=sigma)


def draw_negatives(public: list[Document], cfg: DPRetrieverConfig, rng: torch.Generator | SecureRandom,
                   ) -> list[Document]:
    """A step's public negatives: ``cfg.public_negatives`` documents drawn uniformly (with replacement) from
    ``public`` (:func:`negative_pool`), whatever the private data."""
    return [public[i] for i in _randint(len(public), cfg.public_negatives, rng).tolist()]


def build_batch(pairs: TrainingPairs, units: list[list[int]], chosen: list[int], cfg: DPRetrieverConfig,
                rng: torch.Generator | SecureRandom | None, negatives: list[Document] | None,
                cap: int | None) -> StepBatch:
    """Rows of the chosen units: truncated to ``cap`` units (uniformly), one random row each for logit-dp;
    ``negatives``: the step's public negatives (public-negatives, :func:`draw_negatives`), else None."""
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
    return StepBatch(queries=[p.query for p in chosen_pairs],
                     docs=[pairs.corpus[p.doc_id].full_text for p in chosen_pairs],
                     unit_of_row=torch.tensor(owner, dtype=torch.long), doc_ids=[p.doc_id for p in chosen_pairs],
                     n_units=len(chosen), negatives=negatives)


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
                       budget: budget_registry.BudgetPolicy | None = None, resume: bool = False) -> PrivacyLedger:
    """Train ``cfg.model`` on ``pairs`` with ``cfg.method``; save a SentenceTransformer + ledger (atomic).

    ``public_corpus`` (required for public-negatives) is where public-negatives draws its negatives,
    less ``pairs.inline_doc_ids`` (:func:`negative_pool`).
    The release is recorded in the budget registry (:mod:`privret.privacy.budget`, checked against
    ``budget``) of ``dataset_id`` (default: that of ``pairs``) with all its planned steps before any
    update can reach disk, and again when done. ``resume``: continue an interrupted run in
    ``out_dir`` (see the module docstring); a finished one is returned as it is, spending nothing more.
    """
    dataset_id = dataset_id or budget_registry.dataset_id(pairs)
    if distributed.launched().distributed and cfg.method not in PARALLEL_METHODS:
        raise InputError(f"{cfg.method} couples the units of a batch (in-batch negatives or a batch-wide clip), so "
                         f"its clipped sum cannot be split across processes; under torchrun use "
                         f"{' or '.join(PARALLEL_METHODS)}", field="method")
    with distributed.main_lock(Path(out_dir), what="retriever directory"):
        return _train_dp_retriever(pairs, Path(out_dir), cfg, data_hash=data_hash, dataset_id=dataset_id,
                                   public_corpus=public_corpus, budget=budget, resume=resume)


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


def resume_settings(cfg: DPRetrieverConfig) -> dict:
    """The settings an interrupted run must be resumed with (all but :data:`RESUME_FREE`)."""
    return {k: v for k, v in cfg.model_dump(mode="json").items() if k not in RESUME_FREE}


def _train_dp_retriever(pairs: TrainingPairs, out_dir: Path, cfg: DPRetrieverConfig, *, data_hash: str,
                        dataset_id: str, public_corpus, budget, resume: bool) -> PrivacyLedger:
    units = pairs.units(cfg.unit)
    run_plan = plan_run(cfg, len(units))
    mech = mechanism(cfg, run_plan.sigma)

    def describe(*, steps: int, epsilon: float, secure_rng: bool) -> PrivacyLedger:
        return PrivacyLedger(
            mechanism=f"direct-{cfg.method}", delta=run_plan.delta, noise_multiplier=run_plan.sigma,
            sample_rate=run_plan.sample_rate, epsilon=epsilon, steps=steps, planned_steps=run_plan.steps,
            accountant=cfg.accountant, unit=cfg.unit.value, n_units=run_plan.n_units, n_pairs=len(pairs.pairs),
            clip_norm=cfg.clip_norm, model=cfg.model, trainable=cfg.trainable, data_hash=data_hash,
            dataset_id=dataset_id, secure_rng=secure_rng, unit_definition=UNIT_DEFINITIONS[cfg.unit])

    def load() -> _RetrieverTrainer:
        public = negative_pool(pairs, public_corpus) if cfg.method == "public-negatives" else None
        model = load_encoder(cfg.model, max_seq_length=cfg.max_doc_tokens)
        named = make_trainable(model, cfg.trainable, lora_rank=cfg.lora_rank)
        return _RetrieverTrainer(model=model, params=named, optimizer=torch.optim.Adam(named.values(),
                                                                                      lr=cfg.learning_rate),
                                 pairs=pairs, units=units, cfg=cfg, mech=mech, public=public,
                                 expected_batch=run_plan.expected_batch, group=distributed.current())

    run = DPRun(out_dir=out_dir, plan=run_plan, describe=describe, what="retriever", finished_marker=MECHANISM_FILE,
                label=f"DP retriever ({cfg.method}, epsilon={cfg.epsilon:g})", train_config=cfg.model_dump(mode="json"),
                seed=cfg.seed, checkpoint_every=cfg.checkpoint_every, secure_rng=cfg.secure_rng,
                settings=resume_settings(cfg), budget=budget)
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
    expected_batch: float
    group: distributed.Group = distributed.SINGLE
    started: float = 0.0

    def prepare(self, progress: Progress) -> None:
        self.model.train()
        self.started = time.perf_counter()

    def step(self, chosen: list[int], rng: torch.Generator | SecureRandom | None) -> float:
        negatives = (self.group.from_main(lambda: draw_negatives(self.public, self.cfg, rng))
                     if self.cfg.method == "public-negatives" else None)
        batch = build_batch(self.pairs, self.units, self.group.shard(chosen), self.cfg, rng, negatives,
                            self.mech.cap)
        return dp_step(self.model, list(self.params.values()), batch, self.cfg, self.mech, self.expected_batch,
                       rng, self.group)["loss"]

    def save(self, staged: Path, *, resumed_at_step: int) -> None:
        self.model.eval()
        _finalise(self.model)
        self.model.save(str(staged), safe_serialization=True)
        mech = self.mech
        write_json_atomic(staged / MECHANISM_FILE, {
            "method": self.cfg.method, "sensitivity": mech.sensitivity, "noise_std": mech.noise_std,
            "noise_multiplier": mech.sigma, "batch_cap": mech.cap, "temperature": self.cfg.tau,
            "seconds": round(time.perf_counter() - self.started, 1), "resumed_at_step": resumed_at_step})
        write_model_card(staged)
