"""Attention over a prompt prefix every row shares, kept once instead of once per row.

A few-shot prompt starts with the same instruction and examples in every row (about 470 of 600 tokens for the
prompted SciFact row). A plain cache repeats that prefix's keys and values for each of the batch's rows, and every
sampling step then copies and reads all of them, row by row (most of the sampling time: docs/benchmarks.md,
"Generator speed" (e)). Inside :func:`attending_to_prefix` a causal LM's attention (a ``transformers`` attention
function registered as :data:`NAME`) instead sees, for each layer, the prefix's keys and values held once (batch 1)
plus the row's own ones (those in the model's cache, which then holds only what follows the prefix), and computes

    softmax([q K_p^T, q K_r^T] * scale + [0, mask_r]) [V_p; V_r]

the same attention as over the concatenated keys: the prefix precedes every row's tokens, so causality and padding
never mask it, and ``mask_r`` is the model's own mask over the cache (the padding after the prefix, causality among
the row's tokens). Grouped-query heads are folded into the rows of one matrix product per key/value head, so the
prefix is read once per step for the whole batch. Positions are the caller's (they count the prefix).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch

NAME = "privret_shared_prefix"
_PREFIX: ContextVar[list[tuple[torch.Tensor, torch.Tensor]] | None] = ContextVar("privret_shared_prefix", default=None)


def shared_prefix_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """A ``transformers`` attention function: ``query`` ``[B, H, q, D]`` over the shared prefix of
    :func:`attending_to_prefix` followed by ``key``/``value`` ``[B, Hkv, R, D]`` (the rows' own); returns
    ``([B, q, H, D], None)``."""
    prefix = _PREFIX.get()
    if prefix is None:
        raise RuntimeError(f"the {NAME} attention runs only inside privret.models.shared_prefix.attending_to_prefix")
    if dropout:
        raise ValueError(f"the {NAME} attention is for sampling: no dropout")
    prefix_key, prefix_value = prefix[module.layer_idx]
    batch, heads, q_len, dim = query.shape
    kv_heads, own = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    # [B, Hkv, g, q, D] -> [Hkv, B g q, D]: query head h reads key/value head h // g (as repeat_kv lays them out)
    q = query.reshape(batch, kv_heads, groups, q_len, dim).permute(1, 0, 2, 3, 4).reshape(kv_heads, -1, dim) * scale
    scores_prefix = q @ prefix_key[0].transpose(1, 2)  # [Hkv, B g q, P]
    rows = query.reshape(batch, kv_heads, groups * q_len, dim) * scale
    scores_own = rows @ key.transpose(2, 3)  # [B, Hkv, g q, R]
    if attention_mask is None:  # the model left causality among the row's own tokens to the kernel
        attention_mask = (torch.arange(own, device=query.device)[None, :]
                          <= torch.arange(own - q_len, own, device=query.device)[:, None])[None, None]
    mask = attention_mask[:, :, :, -own:].repeat(1, 1, groups, 1)  # [B or 1, 1, g q, R]
    if mask.dtype == torch.bool:
        scores_own = scores_own.masked_fill(~mask, torch.finfo(scores_own.dtype).min)
    else:
        scores_own = scores_own + mask
    scores_prefix = scores_prefix.reshape(kv_heads, batch, groups * q_len, -1).transpose(0, 1)  # [B, Hkv, g q, P]
    probs = torch.softmax(torch.cat([scores_prefix, scores_own], dim=-1), dim=-1, dtype=torch.float32)
    probs = probs.to(query.dtype)
    p_len = prefix_key.shape[2]
    probs_prefix = probs[..., :p_len].transpose(0, 1).reshape(kv_heads, -1, p_len)  # [Hkv, B g q, P]
    out = (probs_prefix @ prefix_value[0]).reshape(kv_heads, batch, groups * q_len, dim).transpose(0, 1)
    out = out + probs[..., p_len:] @ value  # [B, Hkv, g q, D]
    out = out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous()
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, shared_prefix_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


@contextlib.contextmanager
def attending_to_prefix(model, prefix_cache):
    """While active, ``model``'s attention reads ``prefix_cache`` (a cache of batch 1 holding the shared prefix) before
    the keys and values of the cache it is given."""
    _register()
    config = model.config
    layers = [(layer.keys, layer.values) for layer in prefix_cache.layers]
    token, before = _PREFIX.set(layers), config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before
        _PREFIX.reset(token)
