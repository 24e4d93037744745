"""One step's batch and the clipped gradient sum s(batch) of each direct-DP method, before noise.

The mechanisms, their sensitivities and the privacy argument are stated in :mod:`privret.train.dp_retriever`
(and proven in ``tests/test_dp_retriever.py``); this module computes s(batch) for each of them. Every clip
goes through :func:`privret.privacy.clipping.clip_factors` (the generator's too), whose norm margin keeps float
rounding from letting a clipped term exceed its bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from privret.data.beir import Document
from privret.errors import InputError
from privret.models.encoder import features
from privret.models.frozen_prefix import frozen_prefix
from privret.privacy.clipping import clip_factors
from privret.privacy.ghost_norms import GhostNorms
from privret.privacy.logit_dp import loss_logit_grads, pair_norm_bounds, reweighting, row_losses
from privret.settings.training import METHODS, DPRetrieverConfig


@dataclass
class StepBatch:
    """Rows of the sampled units: texts, the unit (0..m-1) and document id of each row; for
    public-negatives the step's sample of public negatives and, with ``hard_negatives`` K > 0, each row's K
    hard negatives (texts, :mod:`privret.train.hard_negatives`) and which of them are real (False: a row with
    no candidate, masked out of its softmax)."""

    queries: list[str]
    docs: list[str]
    unit_of_row: torch.Tensor
    doc_ids: list[str]
    n_units: int
    negatives: list[Document] | None = None
    hard: list[list[str]] | None = None
    hard_valid: torch.Tensor | None = None


def _encode(model, texts: list[str], max_length: int) -> torch.Tensor:
    """L2-normalised embeddings. When the embeddings and the lower layers are frozen (``top:K``, ``bias-top:K``)
    only the trainable top runs, on the kept output of the frozen prefix (:mod:`privret.models.frozen_prefix`:
    exact in eval mode; in training mode the frozen layers see no dropout). The per-unit norms and the clipped
    sum are unchanged by it: every parameter they involve is in the layers that run."""
    prefix = frozen_prefix(model)
    if prefix is not None:
        return prefix.embed(texts, max_length=max_length).float()
    return F.normalize(model(features(model, texts, max_length=max_length))["sentence_embedding"].float(), dim=-1)


def _encode_in_slot(tracker: GhostNorms, slot: str, model, texts: list[str], max_length: int) -> torch.Tensor:
    """:func:`_encode`, ``tracker`` recording its layer calls under ``slot`` for the ghost per-unit norms."""
    tracker.slot = slot
    try:
        return _encode(model, texts, max_length)
    finally:
        tracker.slot = None


def _encode_tracked(tracker: GhostNorms, model, batch: StepBatch, cfg: DPRetrieverConfig,
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's query and document embeddings under slots "q" and "d"."""
    return (_encode_in_slot(tracker, "q", model, batch.queries, cfg.max_query_tokens),
            _encode_in_slot(tracker, "d", model, batch.docs, cfg.max_doc_tokens))


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
    factors = clip_factors(norms, cfg.clip_norm)
    out = _grads((factors.detach() * unit_losses).sum(), params, retain=False)
    return out, {"loss": losses.mean().item(), "clipped": (norms > cfg.clip_norm).float().mean().item()}


def _batch_clip(model, params, batch, cfg):
    e_q = _encode(model, batch.queries, cfg.max_query_tokens)
    e_d = _encode(model, batch.docs, cfg.max_doc_tokens)
    losses = F.cross_entropy(_masked_logits(e_q, e_d, batch, cfg.tau),
                             torch.arange(len(batch.queries), device=e_q.device), reduction="none")
    grads = _grads(losses.sum(), params, retain=False)
    norm = _norm(grads)
    factor = clip_factors(norm, cfg.clip_norm).item()
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
    bounds = q_side + d_side
    lam = reweighting(tau, bounds, cfg.clip_norm)
    out = _grads((lam * logits).sum(), params, retain=False)
    loss = row_losses(logits.detach(), cfg.spreadout_weight).mean().item()
    return out, {"loss": loss, "clipped": (bounds > cfg.clip_norm).float().mean().item()}


def _public_negatives(model, params, batch, cfg):
    """Per-unit clipped sum; the loss decomposes per unit, so the units are processed ``cfg.physical_batch``
    at a time (memory only: the sum is the same, up to float rounding)."""
    e_n = None  # --public-negatives 0: the rows' own hard negatives only
    if batch.negatives:
        with torch.no_grad():
            e_n = _encode(model, [d.full_text for d in batch.negatives], cfg.max_doc_tokens)
    mask = false_negative_mask(batch)
    total, losses, clipped = [torch.zeros_like(p, dtype=torch.float32) for p in params], [], 0
    step = cfg.physical_batch or batch.n_units
    for lo in range(0, batch.n_units, step):
        rows = ((batch.unit_of_row >= lo) & (batch.unit_of_row < lo + step)).nonzero().flatten().tolist()
        part = _unit_slice(batch, rows, lo, min(step, batch.n_units - lo))
        out, part_losses, part_clipped = _public_negatives_part(model, params, part, e_n, mask[rows], cfg)
        total = [t + o for t, o in zip(total, out)]
        losses.append(part_losses)
        clipped += part_clipped
    return total, {"loss": torch.cat(losses).mean().item(), "clipped": clipped / batch.n_units}


def _unit_slice(batch: StepBatch, rows: list[int], first_unit: int, n_units: int) -> StepBatch:
    """The rows ``rows`` of ``batch`` (units ``first_unit`` .. ``first_unit + n_units - 1``, renumbered from 0)."""
    return StepBatch(queries=[batch.queries[r] for r in rows], docs=[batch.docs[r] for r in rows],
                     unit_of_row=batch.unit_of_row[rows] - first_unit, doc_ids=[batch.doc_ids[r] for r in rows],
                     n_units=n_units, negatives=batch.negatives,
                     hard=None if batch.hard is None else [batch.hard[r] for r in rows],
                     hard_valid=None if batch.hard_valid is None else batch.hard_valid[rows])


def length_order(texts: list[str]) -> list[int]:
    """Indices of ``texts`` from the longest to the shortest (characters; ties keep their order)."""
    return sorted(range(len(texts)), key=lambda i: -len(texts[i]))


def _encode_documents_by_length(tracker: GhostNorms, model, batch: StepBatch, cfg: DPRetrieverConfig,
                                ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], dict[str, torch.Tensor]]:
    """The rows' positives ``[rows, dim]`` and hard negatives ``[rows, K, dim]`` (None without them), embedded
    with gradient in calls of ``rows`` documents of similar length (longest first), so that a call pads its
    documents to a length close to each one's own: on SQuAD's paragraphs about 38% of the computation of a
    call in row order is padding, on SciFact's abstracts cut at 256 tokens about 6%.

    Call j is recorded under slot ``"d<j>"``; returns, besides the embeddings in row order, the calls' outputs
    and, per slot, the unit of each of its rows, for :meth:`GhostNorms.group_sq_norms`. The order of the calls
    changes which documents share a padded batch, nothing else: a unit's gradient is the sum of its rows'
    terms wherever they were computed (up to float rounding), so the norms and the clipped sum are those of
    the unsorted pass."""
    rows = len(batch.docs)
    k = 0 if batch.hard is None else len(batch.hard[0])
    texts = list(batch.docs) + [t for texts in (batch.hard or []) for t in texts]
    units = torch.cat([batch.unit_of_row, batch.unit_of_row.repeat_interleave(k)])
    order = length_order(texts)
    outputs, groups = [], {}
    for j, lo in enumerate(range(0, len(texts), rows)):
        idx = order[lo:lo + rows]
        outputs.append(_encode_in_slot(tracker, f"d{j}", model, [texts[i] for i in idx], cfg.max_doc_tokens))
        groups[f"d{j}"] = units[idx]
    inverse = torch.argsort(torch.tensor(order)).to(outputs[0].device)  # position of each text among the calls
    embedded = torch.cat(outputs)[inverse]
    hard = None if k == 0 else embedded[rows:].view(rows, k, embedded.shape[-1])
    return embedded[:rows], hard, outputs, groups


def public_negative_unit_norms(tracker: GhostNorms, model, batch: StepBatch, e_n: torch.Tensor, mask: torch.Tensor,
                               cfg: DPRetrieverConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """(||grad_u|| of each unit of ``batch`` by ghost norms, the unit of each row of every output slot, the
    rows' losses) for :func:`public_negative_losses` against the step's public negatives ``e_n`` and each
    row's own hard negatives (documents embedded by :func:`_encode_documents_by_length`, slots "d<j>"; the
    queries under slot "q"). One backward pass to the outputs; ``tracker`` keeps what
    :meth:`GhostNorms.weighted_grads` needs for sum_u w_u grad_u."""
    e_q = _encode_in_slot(tracker, "q", model, batch.queries, cfg.max_query_tokens)
    e_d, e_h, doc_outputs, doc_groups = _encode_documents_by_length(tracker, model, batch, cfg)
    hard_mask = None if e_h is None else ~batch.hard_valid
    losses = public_negative_losses(e_q, e_d, e_n, cfg.tau, mask=mask, hard=e_h, hard_mask=hard_mask)
    outputs, groups = [e_q, *doc_outputs], {"q": batch.unit_of_row, **doc_groups}
    cot = torch.autograd.grad(losses.sum(), outputs, retain_graph=True)
    sq = tracker.group_sq_norms(outputs, list(cot), groups, batch.n_units, keep_deltas=True)
    return sq.clamp_min(0).sqrt(), groups, losses


def _public_negatives_part(model, params, batch, e_n, mask, cfg):
    """sum_u clip_C(grad_u) over the units of ``batch`` (:func:`public_negative_unit_norms`)."""
    tracker = GhostNorms(model)
    try:
        norms, groups, losses = public_negative_unit_norms(tracker, model, batch, e_n, mask, cfg)
        factors = clip_factors(norms, cfg.clip_norm)
        # book-keeping: sum_u factor_u grad_u from the output gradients already computed for the norms
        # (row b's gradient belongs to unit u[b] only), no second backward pass
        weights = {slot: factors[g.to(factors.device)].detach() for slot, g in groups.items()}
        out = tracker.weighted_grads(params, weights)
    finally:
        tracker.remove()
    return out, losses.detach(), int((norms > cfg.clip_norm).sum().item())


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


def public_negative_losses(e_q: torch.Tensor, e_d: torch.Tensor, e_n: torch.Tensor | None, temperature: float, *,
                           mask: torch.Tensor, hard: torch.Tensor | None = None,
                           hard_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Row i: l_i = -log( e^{s_i} / (e^{s_i} + sum_{j: not mask_ij} e^{s_ij} + sum_{k: not hard_mask_ik}
    e^{h_ik}) ), s_i = cos(q_i, d_i) / t, s_ij = cos(q_i, n_j) / t: the positive against the step's public
    negatives n_1..n_M (constants: no gradient) that ``mask`` (:func:`false_negative_mask`) does not exclude
    for row i, and h_ik = cos(q_i, hard_ik) / t against row i's own hard negatives ``hard[i]`` (``[rows, K,
    dim]``, with gradient), if given. ``e_n`` None: no public negatives (M = 0; ``hard`` must then be given)."""
    pos = (e_q * e_d).sum(dim=1, keepdim=True)
    parts = [pos]
    if e_n is not None:
        parts.append((e_q @ e_n.detach().T).masked_fill(mask.to(e_q.device), float("-inf")))
    if hard is not None:
        own = torch.einsum("bd,bkd->bk", e_q, hard)
        parts.append(own if hard_mask is None else own.masked_fill(hard_mask.to(e_q.device), float("-inf")))
    logits = torch.cat(parts, dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(e_q), dtype=torch.long, device=e_q.device), reduction="none")
