"""The seq2seq query generator (T5 family): input ``generate_query: <document>``, target the query (Carranza et al., section 4.1).

The interface and its training contract are :class:`privret.models.query_generator.QueryGenerator`'s;
:func:`privret.models.generator.load_generator` picks this class for encoder-decoder models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from privret.models.query_generator import Example, QueryGenerator, right_pad, without_dropout


class _Seq2SeqLoss(nn.Module):
    def __init__(self, model: nn.Module):
        super().__init__()
        self.seq2seq = model

    def forward(self, input_ids, attention_mask, labels, target_mask):
        logits = self.seq2seq(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits.float()
        token_loss = F.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none") * target_mask
        return token_loss.sum(1) / target_mask.sum(1).clamp(min=1)


class Seq2SeqQueryGenerator(QueryGenerator):
    kind = "seq2seq"
    PREFIX = "generate_query: "

    def example(self, doc, query):
        source = self.tokenizer(self.PREFIX + doc, truncation=True, max_length=self.max_doc_tokens).input_ids
        target = self.tokenizer(query, truncation=True, max_length=self.max_query_tokens).input_ids
        return Example(source, target)

    def prepare(self, examples, progress=None):
        if progress is not None:
            progress(len(examples))
        return [{"input_ids": torch.tensor(e.prompt_ids), "labels": torch.tensor(e.target_ids)} for e in examples]

    def collate(self, items):
        ids, mask = right_pad([it["input_ids"] for it in items], self.tokenizer.pad_token_id)
        labels, target_mask = right_pad([it["labels"] for it in items], self.tokenizer.pad_token_id)
        labels = labels.masked_fill(target_mask == 0, -100)
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels, "target_mask": target_mask.float()}
        return {k: v.to(self.device) for k, v in batch.items()}

    def loss_module(self):
        return without_dropout(_Seq2SeqLoss(self.model))

    @torch.no_grad()
    def generate(self, docs, *, num_queries=1, top_p=0.8, temperature=1.0, max_new_tokens=48, seed=None,
                 stop_at_sentence_end=False, repetition_penalty=1.0):  # generate runs every row to its end
        if seed is not None:
            torch.manual_seed(seed)
        enc = self.tokenizer([self.PREFIX + d for d in docs], return_tensors="pt", padding=True, truncation=True,
                             max_length=self.max_doc_tokens).to(self.device)
        self.model.eval()
        with self.autocast():
            out = self.model.generate(**enc, do_sample=True, top_p=top_p, top_k=0, temperature=temperature,
                                      max_new_tokens=max_new_tokens, num_return_sequences=num_queries,
                                      repetition_penalty=repetition_penalty)  # on the decoder's tokens only
        texts = [self._decode(row) for row in out]
        return [texts[i * num_queries: (i + 1) * num_queries] for i in range(len(docs))]
