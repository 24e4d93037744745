"""Nucleus sampling from a causal LM that drops each row from the batch as soon as its answer is settled.

``transformers``' ``generate`` keeps a finished row in the batch until every row is done. Here a row leaves the
batch, its keys and values with it (``DynamicCache.batch_select_indices``), once it has sampled the end-of-text
token or once ``settled`` says no further token can change what the caller keeps (a query generator keeps the
first line), so each step runs only the rows still going.

The draws are those of ``generate(do_sample=True)``: each row's next token comes from
softmax(top-p(logits / temperature)) (``transformers``' own warpers, ``top_k`` off) by ``torch.multinomial`` over a
full ``[rows, vocabulary]`` table in which a row that has left keeps its last distribution. So each step consumes
the same random numbers as ``generate``, and with the same seed and logits every row gets ``generate``'s tokens
until it leaves. Logits of a smaller batch may differ by float rounding, which can move a draw now and then; the
distributions are unchanged.
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


@torch.no_grad()
def sample_rows(model, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache, *,
                eos_token_ids: set[int], max_new_tokens: int, top_p: float, temperature: float,
                settled: Callable[[list[int]], bool]) -> list[list[int]]:
    """The sampled tokens of each row, continuing from ``cache`` (the keys and values of every prompt token but
    the last) with each row's last prompt token ``ids[:, -1]`` at position ``positions[:, -1]``; ``mask`` is the
    prompts' attention mask. A row stops after an end-of-text token (kept) or once ``settled(its tokens)``."""
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
    for _ in range(max_new_tokens):
        logits = model(input_ids=step_ids, attention_mask=mask, position_ids=step_positions, past_key_values=cache,
                       use_cache=True).logits[:, -1].float()
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
        step_ids = tokens[:, None]
        mask = torch.cat([mask, mask.new_ones(len(active), 1)], dim=1)
        step_positions = step_positions + 1
    return out
