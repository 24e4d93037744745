"""Scoring of canary candidates: ``log p(prefix + " " + candidate | document)`` under a trained generator,
for every generator kind (:func:`log_likelihoods`), and with a shared-prefix key/value cache for causal
LMs (:func:`fast_log_likelihoods`, same numbers, far faster)."""

from __future__ import annotations

import copy

import torch

from privret.models.device import bf16_autocast


def _autocast(generator):
    maker = getattr(generator, "autocast", None)
    if callable(maker):
        return maker()
    return bf16_autocast(generator.device)


@torch.no_grad()
def log_likelihoods(generator, document: str, queries: list[str], *, batch_size: int = 50) -> list[float]:
    """``log p(query | document)`` (summed over the query's target tokens, end-of-query included)
    for each query, via the generator's own loss module (per-example mean NLL x target length).

    Works for every generator kind; :func:`fast_log_likelihoods` gives the same numbers for causal
    LMs far faster when the queries share a long prefix.
    """
    examples = [generator.example(document, q) for q in queries]
    lengths = [len(e.target_ids) for e in examples]
    items = generator.prepare(examples)
    module = generator.loss_module()
    module.eval()
    out: list[float] = []
    for lo in range(0, len(items), batch_size):
        batch = generator.collate(items[lo: lo + batch_size])
        with _autocast(generator):
            mean_nll = module(**batch).float().cpu()
        out += [-float(v) * n for v, n in zip(mean_nll, lengths[lo: lo + batch_size])]
    return out


@torch.no_grad()
def fast_log_likelihoods(generator, document: str, queries: list[str], *, batch_size: int = 50) -> list[float]:
    """Same quantity as :func:`log_likelihoods` for causal LMs, in float32: the prompt and the part
    of the query shared by all candidates run once; the cache is reused for every candidate's tail."""
    if getattr(generator, "kind", None) != "causal":
        return log_likelihoods(generator, document, queries, batch_size=batch_size)
    examples = [generator.example(document, q) for q in queries]
    seqs = [e.prompt_ids + e.target_ids for e in examples]
    n_prompt = len(examples[0].prompt_ids)
    if any(len(e.prompt_ids) != n_prompt for e in examples):
        return log_likelihoods(generator, document, queries, batch_size=batch_size)
    common = min(len(s) for s in seqs) - 1  # every sequence keeps at least one token of its own
    for pos in range(n_prompt, common):
        if any(s[pos] != seqs[0][pos] for s in seqs):
            common = pos
            break
    device = generator.device
    model = generator.model
    model.eval()
    prefix = torch.tensor([seqs[0][:common]], device=device)
    out = model(input_ids=prefix, use_cache=True)
    logp = torch.log_softmax(out.logits[0].float(), dim=-1)
    # target tokens inside the shared prefix: positions n_prompt .. common-1, predicted at p-1
    shared = sum(float(logp[p - 1, seqs[0][p]]) for p in range(n_prompt, common))
    last = logp[-1]
    pad = generator.tokenizer.pad_token_id or 0
    scores: list[float] = []
    for lo in range(0, len(seqs), batch_size):
        tails = [s[common:] for s in seqs[lo: lo + batch_size]]
        width = max(len(t) for t in tails)
        ids = torch.full((len(tails), width), pad, dtype=torch.long)
        mask = torch.zeros(len(tails), width, dtype=torch.long)
        for row, t in enumerate(tails):
            ids[row, : len(t)] = torch.tensor(t)
            mask[row, : len(t)] = 1
        cache = copy.deepcopy(out.past_key_values)
        cache.batch_repeat_interleave(len(tails))
        attention = torch.cat([torch.ones(len(tails), common, dtype=torch.long), mask], dim=1)
        tail_out = model(input_ids=ids.to(device), attention_mask=attention.to(device), past_key_values=cache,
                         use_cache=True)
        tail_logp = torch.log_softmax(tail_out.logits.float(), dim=-1)
        for row, t in enumerate(tails):
            total = shared + float(last[t[0]])
            for j in range(1, len(t)):
                total += float(tail_logp[row, j - 1, t[j]])
            scores.append(total)
    return scores
