"""A batch of prompts laid out so that their common start is computed once.

Rows are ``[the first shared tokens][left padding][the rest]``: the padding is masked and positions count
unmasked tokens, so each row sees its own prompt. The shared tokens' keys and values are computed once
(batch 1) and held once for all rows (:mod:`privret.models.shared_prefix`); each row's own prompt tokens
are computed once and repeated for its sampled queries (a plain ``generate(num_return_sequences=n)``
computes them n times). ``shared = 0`` is plain left padding.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from privret.models.shared_prefix import attending_to_prefix


@dataclass(frozen=True, eq=False)
class PromptBatch:
    """Prompts laid out ``[the first shared tokens][left padding][the rest]`` (:func:`left_pad_after_prefix`):
    the padding is masked and positions count unmasked tokens, so each row sees its own prompt; ``shared = 0`` is
    plain left padding."""

    ids: torch.Tensor
    mask: torch.Tensor
    shared: int

    @property
    def positions(self) -> torch.Tensor:
        return (self.mask.cumsum(-1) - 1).clamp(min=0)

    def repeat(self, copies: int) -> "PromptBatch":
        """Each row ``copies`` times in a row (one per sampled query)."""
        return PromptBatch(self.ids.repeat_interleave(copies, dim=0), self.mask.repeat_interleave(copies, dim=0),
                           self.shared)

    def to(self, device) -> "PromptBatch":
        return PromptBatch(self.ids.to(device), self.mask.to(device), self.shared)

    @contextlib.contextmanager
    def reading(self, model):
        """While active, ``model`` attends to the shared prefix's keys and values, computed here once (batch 1) and
        held once for every row (:func:`privret.models.shared_prefix.attending_to_prefix`), before those of the cache
        it is given: a forward then runs over the rows' own tokens only, ``ids[:, shared:]`` under
        ``mask[:, shared:]``, at :attr:`positions` (which count the prefix). Nothing to do when nothing is shared."""
        if not self.shared:
            yield
            return
        from transformers import DynamicCache

        prefix = DynamicCache()
        model.get_decoder()(input_ids=self.ids[:1, :self.shared], past_key_values=prefix, use_cache=True)
        with attending_to_prefix(model, prefix):
            yield

    def own_cache(self, model):
        """Inside :meth:`reading`: the keys and values of each row's own prompt tokens but the last (under the
        padding mask and each row's own positions), what a forward of the last token continues from. Runs the
        decoder only: no logits are needed until the last token."""
        from transformers import DynamicCache

        cache = DynamicCache()
        rest = slice(self.shared, self.ids.shape[1] - 1)
        if rest.stop > rest.start:
            model.get_decoder()(input_ids=self.ids[:, rest], attention_mask=self.mask[:, self.shared:rest.stop],
                                position_ids=self.positions[:, rest], past_key_values=cache, use_cache=True)
        return cache


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, less one, so that each row keeps at least one token of its own."""
    shortest = min(len(p) for p in prompts)
    n = 0
    while n < shortest and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return max(0, min(n, shortest - 1))


def left_pad_after_prefix(prompts: list[list[int]], shared: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of ``[the first shared tokens][padding][the rest]`` for each prompt, every row as
    long as the longest; ``shared = 0`` is plain left padding (what a tokenizer with ``padding_side = "left"``
    builds)."""
    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), length, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, :shared], mask[row, :shared] = torch.tensor(p[:shared], dtype=torch.long), 1
        rest = p[shared:]
        ids[row, length - len(rest):], mask[row, length - len(rest):] = torch.tensor(rest, dtype=torch.long), 1
    return ids, mask
