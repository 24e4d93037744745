"""Embedding inversion check (Wang's thesis, section 4.3.3): how much of a sentence can be read back from its
embedding?

Fed-Negative sends sentence embeddings to other clients. The attack: a decoder (the default generator with LoRA
adapters) is conditioned on an embedding ``e`` through ``k`` soft prompt vectors ``P(e) = reshape(W e + b)`` and
trained to generate the sentence (teacher forcing) on one half of the sentences; on the other half it generates
greedily from ``P(e)`` alone, scored by corpus BLEU (sacrebleu) and token recall. The control is the same decoder
trained with ``e = 0``, what a language model of these sentences writes without the embedding; the gap between
the two is what the embeddings leak.

Assumption: the attacker sees the exchanged embeddings and knows the encoder's output space (it trains on
embeddings of its own public sentences). The result shows a few test sentences (the clients' own text), so it is
marked private (:func:`privret.audit.private_output.mark_private`). See docs/federated.md, section "Embedding
inversion check".
"""

from __future__ import annotations

import random
import re
from collections import Counter

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from privret.audit.private_output import mark_private
from privret.data.fed_squad import ClientData
from privret.models.registry import DEFAULT_ENCODER, DEFAULT_GENERATOR


EXAMPLES = 5  # test sentences shown beside their generations, per decoder
HOLDS = f"{EXAMPLES} sentences of the clients (the examples), each beside what was generated from its embedding"


class InversionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generator: str = DEFAULT_GENERATOR
    encoder: str = DEFAULT_ENCODER
    sentences: int = Field(120, ge=4, description="sampled from all clients; half train, half test")
    prefix_tokens: int = Field(4, ge=1)
    epochs: int = Field(3, ge=1)
    batch_size: int = Field(8, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    max_tokens: int = Field(40, ge=4)
    lora_rank: int = Field(16, ge=1)
    seed: int = 0


def token_recall(reference: str, hypothesis: str) -> float:
    """Share of the reference's word tokens (lower-cased, with multiplicity) found in the hypothesis."""
    ref = Counter(re.findall(r"\w+", reference.lower()))
    hyp = Counter(re.findall(r"\w+", hypothesis.lower()))
    total = sum(ref.values())
    return sum(min(c, hyp[w]) for w, c in ref.items()) / total if total else 0.0


class _Inverter(torch.nn.Module):
    def __init__(self, lm, emb_dim: int, prefix: int):
        super().__init__()
        self.lm = lm
        self.prefix = prefix
        self.hidden = lm.get_input_embeddings().embedding_dim
        self.proj = torch.nn.Linear(emb_dim, prefix * self.hidden)

    def prompt(self, e: torch.Tensor) -> torch.Tensor:
        return self.proj(e).view(e.shape[0], self.prefix, self.hidden)

    def loss(self, e: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        tok = self.lm.get_input_embeddings()(ids)
        inputs = torch.cat([self.prompt(e).to(tok.dtype), tok], dim=1)
        attn = torch.cat([torch.ones(ids.shape[0], self.prefix, dtype=mask.dtype, device=mask.device), mask], dim=1)
        labels = torch.cat([torch.full((ids.shape[0], self.prefix), -100, device=ids.device),
                            ids.masked_fill(mask == 0, -100)], dim=1)
        return self.lm(inputs_embeds=inputs, attention_mask=attn, labels=labels).loss

    @torch.no_grad()
    def generate(self, e: torch.Tensor, max_tokens: int, eos_id: int, pad_id: int) -> torch.Tensor:
        prompt = self.prompt(e)
        attn = torch.ones(e.shape[0], self.prefix, dtype=torch.long, device=e.device)
        return self.lm.generate(inputs_embeds=prompt, attention_mask=attn, max_new_tokens=max_tokens,
                                do_sample=False, eos_token_id=eos_id, pad_token_id=pad_id)


def _train_and_generate(cfg: InversionConfig, train_e, train_text, test_e, *, use_embedding: bool) -> list[str]:
    from privret.models.generator import load_generator

    torch.manual_seed(cfg.seed)
    gen = load_generator(cfg.generator, max_query_tokens=cfg.max_tokens)
    gen.make_trainable("lora", lora_rank=cfg.lora_rank)
    tok = gen.tokenizer
    inv = _Inverter(gen.model, train_e.shape[1], cfg.prefix_tokens).to(gen.device)
    params = [p for p in inv.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.learning_rate)
    eos = tok.eos_token_id
    rng = random.Random(cfg.seed)
    order = list(range(len(train_text)))
    inv.train()
    for _ in range(cfg.epochs):
        rng.shuffle(order)
        for lo in range(0, len(order), cfg.batch_size):
            idx = order[lo: lo + cfg.batch_size]
            enc = tok([train_text[i] + tok.eos_token for i in idx], return_tensors="pt", padding=True,
                      truncation=True, max_length=cfg.max_tokens, add_special_tokens=False).to(gen.device)
            e = torch.from_numpy(train_e[idx]).to(gen.device)
            if not use_embedding:
                e = torch.zeros_like(e)
            with gen.autocast():
                loss = inv.loss(e, enc["input_ids"], enc["attention_mask"])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    inv.eval()
    outs = []
    for lo in range(0, len(test_e), 16):
        e = torch.from_numpy(test_e[lo: lo + 16]).to(gen.device)
        if not use_embedding:
            e = torch.zeros_like(e)
        with gen.autocast():
            ids = inv.generate(e, cfg.max_tokens, eos, tok.pad_token_id)
        outs += [tok.decode(row, skip_special_tokens=True).strip() for row in ids]
    return outs


def inversion_check(clients: list[ClientData], cfg: InversionConfig | None = None, *, encoder=None) -> dict:
    """BLEU and token recall of sentences generated from their embeddings vs. without them."""
    import sacrebleu

    from privret.retrieval.embedding import encode
    from privret.models.encoder import load_encoder

    cfg = cfg or InversionConfig()
    pool = sorted({s for c in clients for s in c.sentences})
    rng = random.Random(cfg.seed)
    texts = rng.sample(pool, min(cfg.sentences, len(pool)))
    half = len(texts) // 2
    train_text, test_text = texts[:half], texts[half:]
    encoder = encoder or load_encoder(cfg.encoder)
    emb = encode(encoder, texts, bf16=False).astype(np.float32)
    out = {"config": cfg.model_dump(mode="json"), "train_sentences": len(train_text),
           "test_sentences": len(test_text)}
    for name, use in (("with_embedding", True), ("without_embedding", False)):
        hyps = _train_and_generate(cfg, emb[:half], train_text, emb[half:], use_embedding=use)
        out[name] = {"bleu": sacrebleu.corpus_bleu(hyps, [test_text]).score,
                     "token_recall": float(np.mean([token_recall(r, h) for r, h in zip(test_text, hyps)])),
                     "examples": [{"sentence": r, "generated": h} for r, h in list(zip(test_text, hyps))[:EXAMPLES]]}
    return mark_private(out, HOLDS)
