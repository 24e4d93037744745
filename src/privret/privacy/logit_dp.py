"""Logit-DP: sensitivity constants and per-pair reweighting (Kong, Muñoz Medina and Ribero, *Differentially
private optimization for non-decomposable objective functions*).

A batch of n pairs has logits ``Z_ij = cos(e_i, e'_j) / t`` in [-a, a], ``a = 1 / t``. Algorithm 1 releases
``sum_ij tau_ij Clip_B(g_ij) + N(0, (sigma Delta)^2)``, ``tau_ij = d l_i / d Z_ij``, ``g_ij = grad_w Z_ij``, and
Theorem 4.2 gives ``Delta = (G1 + G2 + (n - 1) L) B``. The constants that hold when every row has its own logits,
with ``E = e^{2a}``: ``G1 = 2 (1 - 1 / (1 + (n - 1) E))``, ``L = E / (E + n - 1)``, ``G2 = (n - 1) L``; their sum
increases with n towards ``2 (1 + E)`` (``contrastive_factor``), whatever the batch size. Spreadout (Lemma 4.6)
adds ``6 c`` for logits in [-c, c]. Why the paper's Lemma 4.5 constant is not used: docs/direct-dp.md, section
"What every method releases".

Reweighting (section 5.3): with ``lambda_ij = tau_ij min(1, B / u_ij)`` held fixed, the clipped sum is the gradient
of ``sum_ij lambda_ij Z_ij``, one backward pass. ``u_ij`` must be a proven upper bound of ``||g_ij||``, never an
estimate: :func:`pair_norm_bounds` adds the exact query-side and document-side norms (triangle inequality), both from
per-sequence ghost norms (:class:`~privret.privacy.ghost_norms.GhostNorms`), one backward pass per batch column.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from privret.privacy.clipping import clip_factors
from privret.privacy.ghost_norms import GhostNorms

# ---------------------------------------------------------------------------------------------------------------
# Sensitivity constants


def lemma45_constant(n: int, a: float = 1.0) -> float:
    """The paper's Lemma 4.5 value ``2 (1 + (n-2) e^{2a} / (e^{2a} + n - 1))`` (a = 1 in the paper).

    Valid when G1, G2 and L are evaluated on one shared logit vector (Theorem 4.2 as written); why a batch needs
    :func:`contrastive_factor` instead: docs/direct-dp.md, section "What every method releases".
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
    """Section 5.3's ``lambda_ij = tau_ij min(1, B / ||g_ij||)`` (with a proven upper bound of ||g_ij||, and the
    clip's float margin: :func:`~privret.privacy.clipping.clip_factors`)."""
    return tau * clip_factors(norm_bounds, clip)


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
