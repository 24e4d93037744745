"""Exact per-sequence gradient norms without per-sample gradients ("ghost" norms), and reweighted gradients.

For a linear layer called on sequence s, the weight gradient of any backward pass is
``G_s = sum_t delta_{s,t} x_{s,t}^T`` (delta: the gradient at the layer output, x: the layer input). For
a *group* of sequences (a privacy unit, or one sequence) ``||sum_s G_s||^2 = sum_{s,s'} sum_{t,t'}
(delta_{s,t} . delta_{s',t'}) (x_{s,t} . x_{s',t'})``: the squared norm comes from two Gram matrices
and never needs a parameter-sized tensor per sequence. Embeddings, biases and LayerNorm affine
parameters follow the same pattern (see :class:`GhostNorms`).

Privacy: this module computes norms and sums, nothing random. A DP mechanism that clips with these
norms (:mod:`privret.privacy.logit_dp`, :mod:`privret.train.dp_retriever`) is only as sound as they
are exact, so a trainable layer this engine cannot account for raises ``ValueError`` instead of being
left out, and :meth:`GhostNorms.weighted_grads` refuses a parameter it does not track.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn



WEIGHT_NORMS = ("auto", "ghost", "per-sample")


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

    Weight matrices of linear layers, two exact ways (``weight_norms``): "ghost" (the Gram matrices above, about
    ``T_a T_b (d_in + d_out)`` operations per pair of sequences of one group) or "per-sample" (each sequence's
    ``G_s`` formed, ``T d_in d_out`` per sequence, and summed per group before the norm). "auto" takes, per layer
    and pass, the one with fewer operations (Bu et al. 2022, "mixed ghost clipping"): per-sample for LoRA's
    rank-r factors (``d_in d_out = r d``, far below ``T (d_in + d_out)``), ghost for most full-width layers on
    short queries. Both give the same norm up to float rounding; the choice changes no guarantee.

    Repeated passes over the same recorded forward (``reuse_input_grams=True``, as in
    :func:`privret.privacy.logit_dp.pair_norm_bounds`): the input side ``x_{s,t} . x_{s',t'}`` does not
    depend on the cotangent, so it is computed on the first pass and kept (memory: one T x T matrix per sequence pair and layer,
    linear in the batch for one sequence per group).
    """

    def __init__(self, model: nn.Module, weight_norms: str = "auto"):
        if weight_norms not in WEIGHT_NORMS:
            raise ValueError(f"weight_norms must be one of {', '.join(WEIGHT_NORMS)}, got {weight_norms!r}")
        self.weight_norms = weight_norms
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
        # weights: per-sample gradients summed per group, or token-pair (ghost) parts for Linear / Embedding
        if kind == "linear" and module.weight.requires_grad and self._per_sample(module, seqs, reuse_input_grams):
            acc = torch.zeros(n_groups, *module.weight.shape, dtype=torch.float64, device=device)
            for rec, d3, g in seqs:
                keep = g >= 0
                x3 = self._x3(rec, kind)[keep]
                acc.index_add_(0, g[keep], torch.bmm(d3[keep].transpose(1, 2), x3).double())  # G_s per sequence
            total += acc.pow(2).sum(dim=(1, 2))
        elif kind in ("linear", "embedding") and module.weight.requires_grad:
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

    def _per_sample(self, module: nn.Linear, seqs, reuse_input_grams: bool) -> bool:
        """Whether to form the per-sequence weight gradients of ``module`` for this pass: always / never when
        ``weight_norms`` says so; under "auto" when that takes fewer multiply-adds than the ghost pairs (counted as
        one pair per sequence and pair of passes; with ``reuse_input_grams`` the ghost Grams are kept, so ghost)."""
        if self.weight_norms != "auto":
            return self.weight_norms == "per-sample"
        if reuse_input_grams:
            return False
        d_in, d_out = module.in_features, module.out_features
        rows_tokens = [(d3.shape[0], d3.shape[1]) for _, d3, _ in seqs]
        per_sample = sum(n * t for n, t in rows_tokens) * d_in * d_out
        ghost = sum(min(na, nb) * ta * tb for a, (na, ta) in enumerate(rows_tokens) for nb, tb in rows_tokens[a:])
        return per_sample < ghost * (d_in + d_out)

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
