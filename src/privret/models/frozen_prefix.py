"""Run only the trainable top of an encoder: what its frozen lower layers compute is kept per text.

With the embeddings and the lower ``F = L - K`` layers frozen (``trainable = top:K`` or ``bias-top:K``,
:mod:`privret.models.trainable`), their output for a text never changes. :class:`FrozenPrefix` computes it once
per ``(text, max_length)`` (eval mode, no gradient) and runs ``[inject, layer F+1, ..., layer L]`` in place of the
encoder's layers, ``inject`` handing the kept states, padded to the batch, to the first trainable layer: a step
costs the forward and backward of ``K`` layers.

In eval mode the result equals the full forward pass up to float rounding (``tests/test_frozen_prefix.py``); in
training the frozen layers see no dropout. A kept text costs ``tokens x hidden x 4`` bytes, in memory only (the
texts may be private); past ``PRIVRET_FROZEN_PREFIX_GIB`` GiB (default 4) the least recently used are dropped and
computed again. The frozen weights must not change while the cache is in use.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from privret.errors import InputError
from privret.models.encoder import features


def cache_limit_bytes() -> int:
    """The kept states' bound in bytes, from ``PRIVRET_FROZEN_PREFIX_GIB`` (default 4 GiB)."""
    raw = os.environ.get("PRIVRET_FROZEN_PREFIX_GIB", "4")
    try:
        gib = float(raw)
    except ValueError:
        gib = -1.0
    if not gib > 0:
        raise InputError(f"PRIVRET_FROZEN_PREFIX_GIB: expected a positive number of GiB, got {raw!r}")
    return int(gib * 2**30)


def _layer_holder(auto) -> tuple[torch.nn.Module, str]:
    """The module holding the transformer layers' ModuleList, and its attribute name."""
    for name, module in auto.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layer", "layers"):
            parent = auto.get_submodule(name.rsplit(".", 1)[0]) if "." in name else auto
            return parent, name.split(".")[-1]
    raise ValueError("cannot find the transformer layers of this encoder")


@contextmanager
def _eval_mode(model: torch.nn.Module):
    """``model`` in eval mode, then every submodule back in the mode it had (not ``model.train(flag)``, which would
    switch on dropout in submodules a loader left in eval mode under a top module in training mode)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


class _Inject(torch.nn.Module):
    """Stands in for the frozen layers: returns the kept states of the batch, whatever it is given."""

    def __init__(self, states: torch.Tensor):
        super().__init__()
        self.states = states

    def forward(self, hidden_states, *args, **kwargs):
        return self.states.to(hidden_states.dtype)


class FrozenPrefix:
    """The kept outputs of ``model``'s frozen prefix (see the module docstring); ``n_frozen`` layers."""

    def __init__(self, model, *, limit_bytes: int | None = None):
        self.model = model
        self.transformer = model[0]
        self.holder, self.attr = _layer_holder(self.transformer.auto_model)
        self.n_frozen = self.frozen_layers()
        self.limit_bytes = cache_limit_bytes() if limit_bytes is None else limit_bytes
        self._states: OrderedDict[tuple[str, int | None], torch.Tensor] = OrderedDict()  # least recent first
        self.kept_bytes = 0

    def frozen_layers(self) -> int:
        """How many of the lowest layers are frozen now (0 when any embedding parameter trains)."""
        layers = getattr(self.holder, self.attr)
        if any(p.requires_grad for n, p in self.transformer.auto_model.named_parameters() if "embeddings" in n):
            return 0
        n = 0
        while n < len(layers) and not any(p.requires_grad for p in layers[n].parameters()):
            n += 1
        return n

    @property
    def useful(self) -> bool:
        return self.n_frozen > 0

    @contextmanager
    def _layers(self, modules: list[torch.nn.Module]):
        original = getattr(self.holder, self.attr)
        setattr(self.holder, self.attr, torch.nn.ModuleList(modules))
        try:
            yield
        finally:
            setattr(self.holder, self.attr, original)

    def _kept(self, texts: list[str], max_length: int | None, batch_size: int = 64) -> list[torch.Tensor]:
        """The frozen prefix's output of each text: from the cache, or computed (and kept, within the bound)."""
        computed: dict[str, torch.Tensor] = {}
        missing = list(dict.fromkeys(t for t in texts if (t, max_length) not in self._states))
        layers = getattr(self.holder, self.attr)
        with _eval_mode(self.model), torch.no_grad(), self._layers(list(layers[:self.n_frozen])):
            for lo in range(0, len(missing), batch_size):
                chunk = missing[lo:lo + batch_size]
                feats = features(self.model, chunk, max_length=max_length)
                hidden = self.transformer(feats)["token_embeddings"]
                for text, h, m in zip(chunk, hidden, feats["attention_mask"]):
                    n = int(m.sum())
                    if not bool(m[:n].all()):
                        raise ValueError("the frozen-prefix cache needs right padding (tokens first)")
                    computed[text] = h[:n].detach().clone()
        kept = [computed[t] if t in computed else self._states[t, max_length] for t in texts]
        for t in dict.fromkeys(texts):  # this batch's texts become the most recent, the new ones are kept
            key = (t, max_length)
            if t in computed:
                self._states[key] = computed[t]
                self.kept_bytes += computed[t].nbytes
            self._states.move_to_end(key)
        while self.kept_bytes > self.limit_bytes and self._states:  # drop the least recently used
            _, dropped = self._states.popitem(last=False)
            self.kept_bytes -= dropped.nbytes
        return kept

    def embed(self, texts: list[str], *, max_length: int | None = None) -> torch.Tensor:
        """L2-normalised embeddings, with gradients through the trainable layers only."""
        kept = self._kept(texts, max_length)
        feats = features(self.model, texts, max_length=max_length)
        length = feats["attention_mask"].shape[1]
        states = torch.zeros(len(texts), length, kept[0].shape[-1], device=kept[0].device, dtype=kept[0].dtype)
        for i, h in enumerate(kept):
            states[i, : h.shape[0]] = h
        layers = getattr(self.holder, self.attr)
        with self._layers([_Inject(states), *layers[self.n_frozen:]]):
            out = self.model(feats)["sentence_embedding"]
        return F.normalize(out, dim=-1)

    def encode(self, texts: list[str], *, max_length: int | None = None, batch_size: int = 64) -> np.ndarray:
        """float32 L2-normalised embeddings without gradients (eval mode), texts batched by length."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.model.get_embedding_dimension()), dtype=np.float32)
        with _eval_mode(self.model), torch.no_grad():
            for lo in range(0, len(texts), batch_size):
                idx = order[lo:lo + batch_size]
                out[idx] = self.embed([texts[i] for i in idx], max_length=max_length).float().cpu().numpy()
        return out


def frozen_prefix(model) -> FrozenPrefix | None:
    """The :class:`FrozenPrefix` kept on ``model`` (made on first use, and anew when the frozen layers changed
    since), or None when nothing below the
    trainable layers is frozen (``all``, ``layers``, ``lora``: no layer to skip) or the cache was switched
    off for this model (:func:`disable_frozen_prefix`)."""
    prefix = getattr(model, "_privret_frozen_prefix", None)
    if prefix is False:
        return None
    if prefix is None or prefix.frozen_layers() != prefix.n_frozen:  # first use, or the trainable set changed
        prefix = FrozenPrefix(model)
        model._privret_frozen_prefix = prefix
    return prefix if prefix.useful else None


def disable_frozen_prefix(model) -> None:
    """Run ``model``'s frozen layers on every call, as if there were no cache (to measure what it saves)."""
    model._privret_frozen_prefix = False
