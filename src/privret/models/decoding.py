"""Nucleus sampling from a causal LM that drops each row from the batch as soon as its answer is settled.

Unlike ``transformers``' ``generate``, a row leaves the batch (its keys and values with it,
``DynamicCache.batch_select_indices``) once it has sampled end-of-text or once ``settled`` says no further token
can change what the caller keeps. The draws are ``generate(do_sample=True)``'s: softmax(top-p(logits /
temperature)), ``torch.multinomial`` over a full ``[rows, vocabulary]`` table in which a row that has left keeps
its last distribution, so with the same seed and logits every row gets ``generate``'s tokens until it leaves (a
smaller batch's logits may differ by float rounding; the distributions are unchanged). A repetition penalty r >= 1
(Keskar et al., "CTRL: A Conditional Transformer Language Model for Controllable Generation") comes first: for
each token the row has sampled (its output only; the prompt is never penalised, so queries may keep the
document's words) a positive logit l becomes l / r, a negative one l * r (``transformers``'
``RepetitionPenaltyLogitsProcessor`` on the output tokens); r = 1 skips it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

SENTENCE_END = re.compile(r"[.?!][\"')\]]*(?=\s+\S)")


def first_sentence(text: str) -> str:
    """``text`` up to and including its first sentence end (``.``, ``?`` or ``!``, closing quotes or brackets
    kept) that more text follows; all of it when there is none (stripped)."""
    text = text.strip()
    end = SENTENCE_END.search(text)
    return text[: end.end()] if end else text


def sentence_settled(text: str) -> bool:
    """Whether :func:`first_sentence` of ``text`` followed by anything is :func:`first_sentence` of ``text``: once
    a sentence end is followed by white space and more text (the characters that decide it are all there)."""
    return SENTENCE_END.search(text.strip()) is not None


def penalise_repeats(logits: torch.Tensor, previous: torch.Tensor, penalty: float) -> torch.Tensor:
    """``logits`` ``[rows, vocabulary]`` with the CTRL repetition penalty (module docstring) on the tokens of each
    row of ``previous`` ``[rows, steps]``: positive logits divided by ``penalty``, negative ones multiplied."""
    score = logits.gather(1, previous)
    return logits.scatter(1, previous, torch.where(score < 0, score * penalty, score / penalty))


@torch.no_grad()
def sample_rows(model, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache, *,
                eos_token_ids: set[int], max_new_tokens: int, top_p: float, temperature: float,
                settled: Callable[[list[int]], bool], repetition_penalty: float = 1.0) -> list[list[int]]:
    """The sampled tokens of each row, continuing from ``cache`` (the keys and values of every prompt token but
    the last) with each row's last prompt token ``ids[:, -1]`` at position ``positions[:, -1]``; ``mask`` is the
    prompts' attention mask. A row stops after an end-of-text token (kept) or once ``settled(its tokens)``.
    ``repetition_penalty``: on the row's sampled tokens (module docstring; 1: off)."""
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopPLogitsWarper)

    warpers = LogitsProcessorList([TopPLogitsWarper(top_p, min_tokens_to_keep=1)])
    if temperature != 1.0:
        warpers.insert(0, TemperatureLogitsWarper(temperature))
    rows = ids.shape[0]
    out: list[list[int]] = [[] for _ in range(rows)]
    active = torch.arange(rows, device=ids.device)  # the original index of each row still in the batch
    step_ids, step_positions = ids[:, -1:], positions[:, -1:]
    table = None  # [rows, vocabulary]: the active rows' distributions; a row that has left keeps a stale one, ignored
    sampled = ids.new_empty(rows, 0)  # [active rows, steps]: each active row's tokens so far (for the penalty)
    for _ in range(max_new_tokens):
        logits = model(input_ids=step_ids, attention_mask=mask, position_ids=step_positions, past_key_values=cache,
                       use_cache=True).logits[:, -1].float()
        if repetition_penalty != 1.0 and sampled.shape[1]:
            logits = penalise_repeats(logits, sampled, repetition_penalty)
        probs = torch.softmax(warpers(step_ids, logits), dim=-1)
        if table is None:
            table = torch.empty(rows, probs.shape[1], device=probs.device)
        table[active] = probs
        tokens = torch.multinomial(table, num_samples=1).squeeze(1)[active]
        going = []
        for local, (row, token) in enumerate(zip(active.tolist(), tokens.tolist())):
            out[row].append(token)
            if token not in eos_token_ids and not settled(out[row]):
                going.append(local)
        if not going:
            break
        if len(going) < len(active):
            keep = torch.tensor(going, device=ids.device)
            cache.batch_select_indices(keep)
            active, tokens, mask, step_positions = active[keep], tokens[keep], mask[keep], step_positions[keep]
            sampled = sampled[keep]
        step_ids = tokens[:, None]
        sampled = torch.cat([sampled, step_ids], dim=1)
        mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
        step_positions = step_positions + 1
    return out
