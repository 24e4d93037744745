"""A public subspace for the noisy update: the optimizer sees the DP step's noisy sum projected onto k directions
found on public data (``public_subspace``; the idea of PDP-SGD, Zhou, Wu and Banerjee 2021, "Bypassing the ambient
dimension: private SGD with gradient subspace identification", ICLR).

What a step releases is unchanged: ``r = s(batch) + z``, z ~ N(0, (sigma Delta)^2 I_d), accounted as before. The
optimizer is then given ``V V^T r / (q N)`` instead of ``r / (q N)``, where V (d x k, orthonormal columns) spans the
top k right singular vectors of the matrix whose rows are public units' gradients, each scaled to norm 1 (what
clipping does to a unit whose gradient exceeds C), taken at the initial public model, before the first step.

Privacy: V is a function of public pairs, the public corpus and the public initial model only (its draws of public
and hard negatives come from a generator seeded with ``seed``, not from the run's private randomness), fixed before
any private data is read, and the same on every start of the run. So ``V V^T r`` is post-processing of the released
``r``: the run's epsilon and delta are those of the unprojected run, and its ledger records the public data's hash,
k and the number of public units as provenance (a resume with other public data is refused).

Utility: the noise the optimizer sees shrinks from E||z||^2 = d (sigma Delta)^2 to E||V V^T z||^2 = k (sigma
Delta)^2, while the signal keeps only its part in span(V), ||V V^T s|| <= ||s||. It pays when the private units'
gradients lie mostly in the directions the public ones span; ``captured`` (the share of the public gradients' energy
in span(V)) says how well k directions hold the public ones, nothing about the private ones.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from privret.data.beir import Document, load_beir
from privret.data.pairs import TrainingPairs, load_pairs_jsonl, pairs_from_beir
from privret.errors import InputError

# the rows kept in memory at once: units x trainable parameters x 4 bytes must stay below this
MAX_GRADIENT_BYTES = 2 * 1024 ** 3


def load_public_pairs(path: str | Path, corpus: dict[str, Document]) -> TrainingPairs:
    """The public pairs a subspace is fitted on: a BEIR directory's ``train`` split, or a pairs JSONL whose
    ``doc_id`` rows name documents of ``corpus`` (the public corpus) and whose ``doc`` rows carry their own."""
    path = Path(path)
    if path.is_dir():
        return pairs_from_beir(load_beir(path), "train")
    if not path.is_file():
        raise InputError("no such public pairs file or BEIR directory", path=path, field="public_subspace")
    return load_pairs_jsonl(path, corpus)


def pairs_digest(pairs: TrainingPairs, units: list[list[int]]) -> str:
    """sha256 of the (query, document text) rows of ``units``, in order: what the subspace read."""
    rows = [[pairs.pairs[r].query, pairs.corpus[pairs.pairs[r].doc_id].full_text] for rows in units for r in rows]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PublicSubspace:
    """V (``basis``, d x k, orthonormal columns) over the trainable parameters flattened in their order."""

    basis: torch.Tensor
    captured: float  # share of the public gradients' squared norm in span(V)

    @property
    def rank(self) -> int:
        return self.basis.shape[1]

    def project_(self, params: list[torch.Tensor]) -> None:
        """``p.grad`` of every parameter in ``params`` replaced by its part of V V^T g, g the gradients flattened."""
        flat = flatten([p.grad for p in params])
        if flat.numel() != self.basis.shape[0]:
            raise ValueError(f"the subspace is over {self.basis.shape[0]} parameters, the gradient has {flat.numel()}")
        basis = self.basis.to(flat.device)
        projected = basis @ (basis.T @ flat)
        offset = 0
        for p in params:
            p.grad = projected[offset:offset + p.numel()].view_as(p).to(p.dtype)
            offset += p.numel()


def flatten(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The tensors as one float32 vector, in order: the layout V's rows index."""
    return torch.cat([t.reshape(-1).float() for t in tensors])


def fit_subspace(gradients: torch.Tensor, rank: int) -> PublicSubspace:
    """V from public unit gradients (``[n, d]``): each row scaled to norm 1 (a zero row stays zero), then the top
    ``rank`` right singular vectors of the matrix (uncentred: the mean direction is the one that matters most)."""
    if rank > min(gradients.shape):
        raise InputError(f"subspace rank {rank} exceeds what {gradients.shape[0]} public units over "
                         f"{gradients.shape[1]} parameters can span", field="subspace_rank")
    rows = gradients.float()
    rows = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-30)
    _, singular, vh = torch.linalg.svd(rows, full_matrices=False)
    energy = singular.pow(2)
    captured = float(energy[:rank].sum() / energy.sum().clamp_min(1e-30))
    return PublicSubspace(basis=vh[:rank].T.contiguous(), captured=captured)


def unit_gradients(batches: Iterable, gradient, n_params: int) -> torch.Tensor:
    """``[n, d]``: row i the flattened gradient ``gradient(batch_i)`` returns (a list of per-parameter tensors)
    for the i-th one-unit batch of ``batches``."""
    rows = []
    for batch in batches:
        rows.append(flatten(gradient(batch)))
        if rows[-1].numel() != n_params:
            raise ValueError("a unit's gradient does not cover every trainable parameter")
    return torch.stack(rows)


def check_size(n_units: int, n_params: int) -> None:
    """Refuse a subspace whose public gradients would not fit :data:`MAX_GRADIENT_BYTES`."""
    if n_units * n_params * 4 > MAX_GRADIENT_BYTES:
        raise InputError(f"{n_units} public units x {n_params} trainable parameters of gradients exceed "
                         f"{MAX_GRADIENT_BYTES // 1024 ** 3} GiB: lower subspace_units or train fewer parameters "
                         "(bias, bias-top:K)", field="subspace_units")
