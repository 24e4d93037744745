"""Logit-DP (seed ``logit-dp-non-decomposable-losses.txt``): sensitivity constants, per-pair reweighting.

Notation (seed section 2). A batch holds ``n`` pairs (x_i, x'_i); ``Z_ij = S(Phi(x_i), Phi(x'_j))`` is the
similarity of query i and document j, here ``Z_ij = cos(e_i, e'_j) / temperature`` so every logit lies in
``[-a, a]`` with ``a = 1 / temperature``. Row i's loss is ``l^(i,n)(Z_i)`` and ``L = sum_i l^(i,n)(Z_i)``.

Lemma 4.1: ``grad L = sum_ij tau_ij g_ij`` with ``tau_ij = d l^(i,n) / d Z_ij`` and ``g_ij = grad_w Z_ij``.
Algorithm 1 clips every ``g_ij`` to norm ``B`` and releases ``sum_ij tau_ij Clip_B(g_ij) + N(0, (sigma Delta)^2)``.
Theorem 4.2 bounds the L2 sensitivity of that sum by ``(G1 + G2 + (n - 1) L) B`` whenever

    sum_j |d l^(i,n)/d z_j - d l^(i,n-1)/d z_j| <= L,   sum_j |d l^(i,n)/d z_j| <= G1,
    sum_i |d l^(i,n)/d z_n| <= G2.

Section 5.3: with the weights ``lambda_ij = tau_ij min(1, B / ||g_ij||)`` held fixed, the clipped sum is
the gradient of ``F = sum_ij lambda_ij Z_ij``: one backward pass, never n^2 parameter-sized gradients.
Using an *upper bound* ``u_ij >= ||g_ij||`` in place of ``||g_ij||`` keeps every clipped term within
norm B (``min(1, B/u) ||g|| <= B``), so the sensitivity bound still holds; an estimate that could
undershoot would not. :func:`pair_norm_bounds` gives such a bound, exact per side:
``g_ij = J_i^T (e'_j / t) + J'_j^T (e_i / t)`` (query side plus document side, J the Jacobian of the
normalised embedding), and ``||g_ij|| <= ||J_i^T e'_j / t|| + ||J'_j^T e_i / t||``. Each side is computed
exactly with per-sequence gradient norms (:class:`GhostNorms`): one backward pass per batch column k
gives ``||J_i^T e'_k / t||`` for every query i and ``||J'_k^T ... ||`` for every document at once.

The per-row constants. Lemma 4.5 of the seed states ``G1 + G2 + (n-1) L <= 2 (1 + (n-2) e^2 / (e^2 + n-1))``
for logits in [-1, 1]; its proof evaluates G1, G2 and L at one and the same logit vector. In a batch
every row has its *own* logits (row n's positive can be small while every other row puts its mass on
column n), and the constants that hold uniformly over such batches are, with ``E = e^{2a}``:

    G1 = 2 (1 - 1 / (1 + (n-1) E)),   L = E / (E + n - 1),   G2 = (n - 1) L,

so ``G1 + G2 + (n-1) L`` increases with n towards ``2 (1 + E)``: bounded, whatever the batch size. We
use this uniform bound (``contrastive_factor``); tests check it on random per-row logits and show
batches on which the seed's same-vector constant is exceeded. Spreadout (Lemma 4.6): with logits in
[-c, c], ``G1 + G2 + (n-1) L <= 6 c`` (the seed's 6 is c = 1), which already holds per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------------------------------
# Sensitivity constants


def lemma45_constant(n: int, a: float = 1.0) -> float:
    """The seed's Lemma 4.5 value ``2 (1 + (n-2) e^{2a} / (e^{2a} + n - 1))`` (a = 1 in the seed).

    Valid when G1, G2 and L are evaluated on one shared logit vector (Theorem 4.2 as written); see the
    module docstring for why a batch needs :func:`contrastive_factor` instead.
    """
    big = math.exp(2 * a)
    return 2.0 * (1.0 + (n - 2) * big / (big + n - 1))


def contrastive_constants(n: int, a: float) -> tuple[float, float, float]:
    """Uniform (G1, G2, L) of the canonical contrastive loss for n rows with logits in [-a, a].

    ``d l^(i,n)/d z_j = p_j - [j = i]`` with p = softmax(z): ``sum_j |.| = 2 (1 - p_i)``, largest when the
    positive is at -a and every other logit at +a. Column n's probability in another row is at most
    ``E / (E + n - 1)`` (E = e^{2a}); the change of row i's gradient when column n is removed sums to
    exactly that probability (``p_j = p°_j (1 - p_n)``), which gives L; G2 sums it over n - 1 rows.
    """
    if n <= 1:
        return 0.0, 0.0, 0.0
    big = math.exp(2 * a)
    p_max = big / (big + n - 1)
    g1 = 2.0 * (1.0 - 1.0 / (1.0 + (n - 1) * big))
    return g1, (n - 1) * p_max, p_max


def contrastive_factor(a: float, n: int | None = None) -> float:
    """``G1 + G2 + (n - 1) L`` for batches of at most ``n`` rows (None: any size; the limit 2 (1 + e^{2a}))."""
    if n is None:
        return 2.0 * (1.0 + math.exp(2 * a))
    g1, g2, lip = contrastive_constants(n, a)
    return g1 + g2 + (n - 1) * lip


def spreadout_factor(c: float) -> float:
    """Lemma 4.6 with logits in [-c, c]: ``G1 + G2 + (n - 1) L <= 6 c`` for every n."""
    return 6.0 * c


def logit_dp_factor(*, temperature: float, spreadout_weight: float = 0.0, max_rows: int | None = None) -> float:
    """The multiplier of B in the sensitivity of Algorithm 1 (one row per privacy unit).

    The loss is contrastive + ``spreadout_weight`` * spreadout; all three conditions of Theorem 4.2 are
    sums of absolute partial derivatives, so the constants of a weighted sum add up. Without a cap on
    the batch (``max_rows=None``) the bound is the supremum over all batch sizes, which Poisson sampling
    needs. With a cap the batch is truncated to ``max_rows`` units, adding a unit can evict another
    (a swap), and the bound doubles: ``2 f(max_rows)``.
    """
    a = 1.0 / temperature
    if max_rows is None:
        return contrastive_factor(a) + spreadout_weight * spreadout_factor(a)
    return 2.0 * (contrastive_factor(a, max_rows) + spreadout_weight * spreadout_factor(a))


# ---------------------------------------------------------------------------------------------------------------
# Loss and weights


def row_losses(logits: torch.Tensor, spreadout_weight: float = 0.0) -> torch.Tensor:
    """``l^(i,n)(Z_i)`` for every row: -log softmax(Z_i)_i (+ weight * sum_{j != i} Z_ij^2 / (n - 1))."""
    n = logits.shape[0]
    target = torch.arange(n, device=logits.device)
    loss = F.cross_entropy(logits, target, reduction="none")
    if spreadout_weight and n > 1:
        off = ~torch.eye(n, dtype=torch.bool, device=logits.device)
        loss = loss + spreadout_weight * (logits.pow(2) * off).sum(dim=1) / (n - 1)
    return loss


def loss_logit_grads(logits: torch.Tensor, spreadout_weight: float = 0.0) -> torch.Tensor:
    """``tau_ij = d l^(i,n) / d Z_ij`` (closed form): softmax - identity (+ 2 w Z_ij / (n - 1) off the diagonal)."""
    n = logits.shape[0]
    eye = torch.eye(n, dtype=logits.dtype, device=logits.device)
    tau = torch.softmax(logits, dim=1) - eye
    if spreadout_weight and n > 1:
        tau = tau + spreadout_weight * 2.0 * logits * (1 - eye) / (n - 1)
    return tau


def reweighting(tau: torch.Tensor, norm_bounds: torch.Tensor, clip: float) -> torch.Tensor:
    """Section 5.3's ``lambda_ij = tau_ij min(1, B / ||g_ij||)`` (with a proven upper bound of ||g_ij||)."""
    return tau * (clip / norm_bounds.clamp_min(1e-12)).clamp(max=1.0)


# ---------------------------------------------------------------------------------------------------------------
# Exact per-sequence gradient norms without per-sample gradients ("ghost" norms)


@dataclass
class _Record:
    module: nn.Module
    kind: str  # linear | layernorm | embedding
    slot: str
    x: torch.Tensor  # layer input (detached); token ids for embeddings
    out: torch.Tensor  # layer output (in the graph)


class GhostNorms:
    """Per-group squared norms of parameter gradients, from layer inputs and output gradients only.

    For a linear layer called on sequence s, the weight gradient of any backward pass is
    ``G_s = sum_t delta_{s,t} x_{s,t}^T`` (delta: gradient at the layer output). For a *group* of
    sequences (a privacy unit; or one sequence) ``||sum_s G_s||^2 = sum_{s,s'} sum_{t,t'}
    (delta_{s,t} . delta_{s',t'}) (x_{s,t} . x_{s',t'})``, computed exactly without ever forming a
    parameter-sized tensor per sequence. Embeddings use ``x . x' = [id = id']`` (padding index
    excluded, as PyTorch's backward does); biases and LayerNorm affine parameters are summed per
    group directly. Supported trainable modules: ``nn.Linear`` (also LoRA's A/B), ``nn.LayerNorm``,
    ``nn.Embedding``; anything else with trainable parameters raises ``ValueError``.

    Usage: set ``tracker.slot = "q"`` (any name) around a forward pass whose layer calls should be
    recorded, then call :meth:`group_sq_norms` with a cotangent for the outputs.

    Book-keeping (Bu, Wang, Zha, Karypis 2023, "BK"): the output gradients of that pass are all a
    reweighted gradient needs. With ``keep_deltas=True``, :meth:`weighted_grads` returns
    ``sum_b w_b grad_b`` (grad_b: row b's share of the pass's parameter gradient, w_b a weight per
    row, e.g. the clipping factor of its unit), one contraction per layer, instead of a second
    backward pass of the reweighted loss.

    Repeated passes over the same recorded forward (``reuse_input_grams=True``, as in
    :func:`pair_norm_bounds`): the input side ``x_{s,t} . x_{s',t'}`` does not depend on the cotangent,
    so it is computed on the first pass and kept (memory: one T x T matrix per sequence pair and layer,
    linear in the batch for one sequence per group).
    """

    def __init__(self, model: nn.Module):
        self.records: list[_Record] = []
        self.slot: str | None = None
        self._handles = []
        self._kept: list[tuple[_Record, torch.Tensor | None]] | None = None
        self._unrecorded = False  # a tracked layer ran with gradients outside a slot
        self._grams: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]] = {}
        self._owners: dict[int, list[tuple[nn.Module, str]]] = {}  # id(param) -> [(module, "weight"|"bias")]
        for module in model.modules():
            direct = [p for p in module.parameters(recurse=False) if p.requires_grad]
            if not direct:
                continue
            if isinstance(module, nn.Linear):
                kind = "linear"
            elif isinstance(module, nn.LayerNorm):
                kind = "layernorm"
            elif isinstance(module, nn.Embedding):
                kind = "embedding"
            else:
                raise ValueError(f"per-sample norms are not implemented for trainable {type(module).__name__}")
            for attr in ("weight", "bias"):
                p = getattr(module, attr, None)
                if isinstance(p, nn.Parameter) and p.requires_grad:
                    self._owners.setdefault(id(p), []).append((module, attr))
            self._handles.append(module.register_forward_hook(self._hook(kind)))

    def _hook(self, kind):
        def hook(module, inputs, output):
            if not torch.is_grad_enabled():
                return
            if self.slot is None:
                self._unrecorded = True
                return
            self.records.append(_Record(module, kind, self.slot, inputs[0].detach(), output))
        return hook

    def clear(self) -> None:
        self.records = []
        self._kept = None
        self._unrecorded = False
        self._grams = {}

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self.records = []
        self._kept = None
        self._grams = {}

    def group_sq_norms(self, outputs, grad_outputs, groups: dict[str, torch.Tensor], n_groups: int,
                       *, keep_deltas: bool = False, reuse_input_grams: bool = False) -> torch.Tensor:
        """``||grad of <grad_outputs, outputs> restricted to group g||^2`` for every group g.

        ``groups[slot][b]`` is the group of row b of that slot's forward pass (-1: ignore the row).
        ``keep_deltas``: keep this pass's output gradients for :meth:`weighted_grads`.
        ``reuse_input_grams``: keep the layer-input Gram matrices for the next pass over the same records
        (kept until :meth:`clear`; reused only for the same pairs of rows).
        """
        records = [r for r in self.records if r.out.requires_grad]
        device = outputs[0].device
        self._kept = None
        if not records:
            if keep_deltas:
                self._kept = []
            return torch.zeros(n_groups, device=device)
        deltas = torch.autograd.grad(outputs, [r.out for r in records], grad_outputs, retain_graph=True,
                                     allow_unused=True)
        if keep_deltas:
            self._kept = list(zip(records, deltas))
        total = torch.zeros(n_groups, dtype=torch.float64, device=device)
        by_module: dict[int, list[tuple[_Record, torch.Tensor]]] = {}
        for rec, delta in zip(records, deltas):
            if delta is not None:
                by_module.setdefault(id(rec.module), []).append((rec, delta))
        for entries in by_module.values():
            total += self._module_sq_norms(entries, groups, n_groups, reuse_input_grams)
        return total.float()

    def weighted_grads(self, params, row_weights: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """``sum_b w_b grad_b`` for every parameter in ``params`` (same order), from the kept pass.

        grad_b is row b's share of the parameter gradient of the pass kept by the last
        ``group_sq_norms(..., keep_deltas=True)`` (the gradient of ``<grad_outputs, outputs>``), and
        ``row_weights[slot][b]`` is w_b for row b of that slot's forward pass. With w_b the clipping
        factor of row b's unit this is the clipped per-unit gradient sum, which otherwise needs the
        backward pass of ``sum_b w_b loss_b``: per layer, linear ``W: sum_{b,t} w_b delta_{b,t}
        x_{b,t}^T`` and ``bias: sum w_b delta``, LayerNorm ``weight: sum w_b delta * xhat`` (xhat the
        normalised input) and ``bias: sum w_b delta``, embedding ``weight[id] += w_b delta`` (padding
        index excluded). Raises ``ValueError`` for a parameter this tracker does not see (never a
        silent zero) and when a tracked layer ran with gradients outside a recorded slot (its share
        would be missing). A tracked parameter whose layer got no output gradient gets zeros, as autograd.
        """
        if self._kept is None:
            raise RuntimeError("weighted_grads needs a preceding group_sq_norms(..., keep_deltas=True)")
        if self._unrecorded:
            raise ValueError("a tracked layer ran with gradients outside a recorded slot; its gradient share "
                             "would be missing from weighted_grads")
        acc: dict[int, torch.Tensor] = {}
        for p in params:
            if id(p) not in self._owners:
                raise ValueError(f"parameter of shape {tuple(p.shape)} is not in a layer this GhostNorms tracks "
                                 "(not trainable when the tracker was built, or not in the model)")
            acc[id(p)] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)

        def add(param, value):
            if param is not None and id(param) in acc:
                acc[id(param)] += value

        for rec, delta in self._kept:
            if delta is None:
                continue
            module, kind = rec.module, rec.kind
            w = row_weights[rec.slot].to(device=delta.device, dtype=torch.float32)
            if w.shape != (delta.shape[0],):
                raise ValueError(f"{len(w)} row weights for slot '{rec.slot}' but the pass has "
                                 f"{delta.shape[0]} rows")
            d = delta.float() * w.reshape(-1, *([1] * (delta.dim() - 1)))
            width = delta.shape[-1]
            d2 = d.reshape(-1, width)
            bias = getattr(module, "bias", None)
            if kind == "linear":
                if id(module.weight) in acc:
                    add(module.weight, d2.T @ rec.x.float().reshape(-1, rec.x.shape[-1]))
                if bias is not None:
                    add(bias, d2.sum(dim=0))
            elif kind == "layernorm":
                shape = tuple(module.normalized_shape)
                if module.weight is not None and id(module.weight) in acc:
                    xhat = F.layer_norm(rec.x.float(), shape, eps=module.eps)
                    add(module.weight, (d * xhat).reshape(-1, *shape).sum(dim=0))
                if bias is not None:
                    add(bias, d.reshape(-1, *shape).sum(dim=0))
            elif kind == "embedding":
                if module.scale_grad_by_freq or module.sparse or module.max_norm is not None:
                    raise ValueError("weighted_grads supports plain embeddings only (no scale_grad_by_freq, "
                                     "sparse or max_norm)")
                if id(module.weight) in acc:
                    ids = rec.x.reshape(-1)
                    keep = ids != module.padding_idx if module.padding_idx is not None else slice(None)
                    acc[id(module.weight)].index_add_(0, ids[keep], d2[keep])
        return [acc[id(p)].to(p.dtype) for p in params]

    # -- per module ---------------------------------------------------------------------------------------------
    def _module_sq_norms(self, entries, groups, n_groups, reuse_input_grams: bool) -> torch.Tensor:
        module, kind = entries[0][0].module, entries[0][0].kind
        device = entries[0][1].device
        total = torch.zeros(n_groups, dtype=torch.float64, device=device)
        seqs = []  # (record, delta 3-d, group ids)
        for rec, delta in entries:
            g = groups[rec.slot].to(device)
            if delta.shape[0] != g.shape[0]:
                raise ValueError(f"{type(module).__name__} output has batch {delta.shape[0]} but the pass has "
                                 f"{g.shape[0]} rows (a broadcast parameter cannot be clipped per sample)")
            d3 = delta.float().reshape(delta.shape[0], -1, delta.shape[-1])
            seqs.append((rec, d3, g))
        # summed-over-tokens parts: biases, LayerNorm weights
        vec_parts = []
        if getattr(module, "bias", None) is not None and module.bias.requires_grad:
            vec_parts.append(lambda rec, d3: d3.sum(dim=1))
        if kind == "layernorm" and module.weight is not None and module.weight.requires_grad:
            def ln_weight(rec, d3):
                xhat = F.layer_norm(rec.x.float(), module.normalized_shape, eps=module.eps)
                return (d3 * xhat.reshape(d3.shape)).sum(dim=1)
            vec_parts.append(ln_weight)
        for part in vec_parts:
            acc = torch.zeros(n_groups, seqs[0][1].shape[-1], dtype=torch.float64, device=device)
            for rec, d3, g in seqs:
                keep = g >= 0
                acc.index_add_(0, g[keep], part(rec, d3)[keep].double())
            total += acc.pow(2).sum(dim=1)
        # token-pair parts: Linear / Embedding weights
        if kind in ("linear", "embedding") and module.weight.requires_grad:
            for a_idx, (ra, da, ga) in enumerate(seqs):
                for rb, db, gb in seqs[a_idx:]:
                    both = (ga[:, None] == gb[None, :]) & (ga[:, None] >= 0)
                    ia, ib = both.nonzero(as_tuple=True)
                    if ia.numel() == 0:
                        continue
                    vals = self._pair_inner(kind, module, ra, da, ia, rb, db, ib, reuse_input_grams)
                    weight = 1.0 if ra is rb else 2.0
                    # rows of the same record: off-diagonal pairs appear twice in ``both`` already
                    total.index_add_(0, ga[ia], weight * vals.double())
        return total

    @staticmethod
    def _x3(rec: _Record, kind: str) -> torch.Tensor:
        if kind == "embedding":
            return rec.x.reshape(rec.x.shape[0], -1)
        return rec.x.float().reshape(rec.x.shape[0], -1, rec.x.shape[-1])

    def _pair_inner(self, kind, module, ra, da, ia, rb, db, ib, reuse_input_grams: bool) -> torch.Tensor:
        """``sum_{t,t'} (delta_{a,t} . delta_{b,t'}) (x_{a,t} . x_{b,t'})`` for every row pair (ia[k], ib[k])."""
        ta, tb = da.shape[1], db.shape[1]
        chunk = max(1, (1 << 24) // max(1, ta * tb))
        starts = range(0, ia.numel(), chunk)
        key = (id(ra), id(rb))
        kept = self._grams.get(key) if reuse_input_grams else None
        if kept is not None and torch.equal(kept[0], ia) and torch.equal(kept[1], ib):
            grams = kept[2]
        else:
            grams = [self._input_gram(kind, module, ra, _rows(ia[lo: lo + chunk]), rb, _rows(ib[lo: lo + chunk]))
                     for lo in starts]
            if reuse_input_grams:
                self._grams[key] = (ia, ib, grams)
        out = torch.empty(ia.numel(), device=da.device)
        for lo, xx in zip(starts, grams):
            a, b = _rows(ia[lo: lo + chunk]), _rows(ib[lo: lo + chunk])
            dd = torch.bmm(da[a], db[b].transpose(1, 2))
            out[lo: lo + chunk] = torch.linalg.vecdot(dd.flatten(1), xx)
        return out

    def _input_gram(self, kind, module, ra, a, rb, b) -> torch.Tensor:
        """``x_{a,t} . x_{b,t'}`` flattened over (t, t'): token equality for embeddings (padding excluded)."""
        xa, xb = self._x3(ra, kind)[a], self._x3(rb, kind)[b]
        if kind == "embedding":
            xx = (xa[:, :, None] == xb[:, None, :]).float()
            if module.padding_idx is not None:
                xx = xx * (xa != module.padding_idx).float()[:, :, None]
        else:
            xx = torch.bmm(xa, xb.transpose(1, 2))
        return xx.flatten(1)


def _rows(idx: torch.Tensor) -> torch.Tensor | slice:
    """``idx`` as a slice when it is a run of consecutive rows (the usual one-row-per-group case): indexing
    with it is then a view instead of a gathered copy of the activations."""
    n = idx.numel()
    if n and int(idx[-1]) - int(idx[0]) + 1 == n and (n == 1 or bool((idx[1:] > idx[:-1]).all())):
        return slice(int(idx[0]), int(idx[0]) + n)
    return idx


def pair_norm_bounds(tracker: GhostNorms, e_q: torch.Tensor, e_d: torch.Tensor, temperature: float,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-side norms ``(||J_i^T e'_j/t||, ||J'_j^T e_i/t||)`` for all (i, j), exact; their sum bounds ||g_ij||.

    ``e_q`` and ``e_d`` are the (n, d) normalised embeddings of the recorded passes (slots "q", "d").
    Pass k uses the cotangent ``e'_k / t`` on every query row and ``e_k / t`` on every document row,
    which are the similarity gradients of column k (queries) and of row k (documents): n backward
    passes without weight gradients, memory linear in n. The layer-input Grams are computed on the
    first pass and reused by the others.
    """
    n = e_q.shape[0]
    groups = {"q": torch.arange(n), "d": torch.arange(n, 2 * n)}
    q_side = torch.zeros(n, n, device=e_q.device)
    d_side = torch.zeros(n, n, device=e_q.device)
    eq, ed = e_q.detach() / temperature, e_d.detach() / temperature
    for k in range(n):
        sq = tracker.group_sq_norms([e_q, e_d], [ed[k].expand(n, -1), eq[k].expand(n, -1)], groups, 2 * n,
                                    reuse_input_grams=True)
        q_side[:, k] = sq[:n].clamp_min(0).sqrt()
        d_side[k, :] = sq[n:].clamp_min(0).sqrt()
    return q_side, d_side
