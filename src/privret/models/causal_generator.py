"""The causal-LM query generator (Llama-style decoders such as SmolLM2, or any ``AutoModelForCausalLM``).

The document is put in a prompt (the model's chat template when it has one) and the loss is the mean
cross-entropy of the *query tokens only*. A generator may carry *few-shot examples* (``examples``: public
(document, query) pairs) put in every prompt before the document: earlier user/assistant turns under a
chat template, else ``Document: ... Query: ...`` lines. Without examples the prompt is the zero-shot one.

Sampling reads each prompt once (:class:`privret.models.prompt_batch.PromptBatch`); each row leaves the
batch once its first line is written (:mod:`privret.models.decoding`).

Speed (models with ``model.layers``): with ``trained_layers = k`` only the top ``k`` decoder layers are
trained (LoRA or full). The frozen lower layers are a fixed function of the input, so their output is
computed once per example and cached (:meth:`CausalQueryGenerator.prepare`, the prompts' common start once for
all); each step then runs only the top layers, and the LM head only at the positions that predict query tokens.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from privret.models.decoding import sample_rows, sentence_settled
from privret.models.prompt_batch import PromptBatch, left_pad_after_prefix, shared_prefix_length
from privret.models.shared_prefix import attending_to_prefix
from privret.models.query_generator import Example, QueryGenerator, first_line_settled, right_pad, without_dropout

INSTRUCTION = "Write a short search query that this document answers."


# ------------------------------------------------------------------------------------------
class _TopLayersLoss(nn.Module):
    """Top decoder layers + final norm + LM head at target positions -> per-example loss.

    Input ``hidden`` is the (cached) input of layer ``start``; positions are 0..T-1 (right padding).
    """

    def __init__(self, causal_lm: nn.Module, start: int):
        super().__init__()
        body = causal_lm.model
        self.config = causal_lm.config
        self.layers = nn.ModuleList(list(body.layers)[start:])
        self.norm = body.norm
        self.rotary_emb = body.rotary_emb
        self.lm_head = causal_lm.lm_head

    def forward(self, hidden, attention_mask, predict_positions, target_ids, target_mask):
        from transformers.masking_utils import create_causal_mask

        batch, length, _ = hidden.shape
        position_ids = torch.arange(length, device=hidden.device).unsqueeze(0).expand(batch, -1)
        mask = create_causal_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask,
                                  past_key_values=None, position_ids=position_ids)
        position_embeddings = self.rotary_emb(hidden, position_ids=position_ids)
        for layer in self.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=position_embeddings,
                           position_ids=position_ids)
        hidden = self.norm(hidden)
        index = predict_positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
        logits = self.lm_head(hidden.gather(1, index)).float()
        token_loss = F.cross_entropy(logits.transpose(1, 2), target_ids, reduction="none") * target_mask
        return token_loss.sum(1) / target_mask.sum(1).clamp(min=1)


class _CausalFullLoss(nn.Module):
    """Any causal LM without a Llama-style layer stack: whole model, loss on target tokens."""

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        self.lm = causal_lm

    def forward(self, input_ids, attention_mask, predict_positions, target_ids, target_mask):
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits
        index = predict_positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
        logits = logits.gather(1, index).float()
        token_loss = F.cross_entropy(logits.transpose(1, 2), target_ids, reduction="none") * target_mask
        return token_loss.sum(1) / target_mask.sum(1).clamp(min=1)


class _StopForward(Exception):
    pass


class CausalQueryGenerator(QueryGenerator):
    kind = "causal"

    @property
    def _layered(self) -> bool:
        body = getattr(self._base(), "model", None)
        return all(hasattr(body, a) for a in ("layers", "norm", "rotary_emb"))

    @property
    def num_layers(self) -> int:
        return len(self._base().model.layers) if self._layered else 0

    @property
    def first_trained_layer(self) -> int:
        if not self._layered or self.trained_layers is None:
            return 0
        return max(0, self.num_layers - self.trained_layers)

    def _trained_layer_indices(self) -> list[int] | None:
        if not self._layered or self.trained_layers is None:
            return None
        return list(range(self.first_trained_layer, self.num_layers))

    def prompt(self, doc: str) -> str:
        """The instruction, the few-shot examples (if any) and ``doc``, ready for the query to follow."""
        shots = [(self.truncate_doc(d), q) for d, q in self.examples]
        doc = self.truncate_doc(doc)
        if self.tokenizer.chat_template:
            messages = [{"role": "system", "content": INSTRUCTION}]
            for shot_doc, shot_query in shots:
                messages += [{"role": "user", "content": shot_doc}, {"role": "assistant", "content": shot_query}]
            messages.append({"role": "user", "content": doc})
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        shown = "".join(f"Document: {shot_doc}\nQuery: {shot_query}\n" for shot_doc, shot_query in shots)
        return f"{INSTRUCTION}\n{shown}Document: {doc}\nQuery:"

    def example(self, doc: str, query: str) -> Example:
        prompt_ids = self.tokenizer(self.prompt(doc), add_special_tokens=False).input_ids
        text = query if self.tokenizer.chat_template else " " + query
        target = self.tokenizer(text, add_special_tokens=False).input_ids[: self.max_query_tokens]
        return Example(prompt_ids, target + [self.tokenizer.eos_token_id])

    @torch.no_grad()
    def prepare(self, examples: list[Example], progress=None, batch_size: int = 16) -> list[dict[str, torch.Tensor]]:
        items = []
        for ex in examples:
            ids = torch.tensor(ex.prompt_ids + ex.target_ids)
            n_prompt = len(ex.prompt_ids)
            items.append({"input_ids": ids, "predict_positions": torch.arange(n_prompt - 1, len(ids) - 1),
                          "target_ids": torch.tensor(ex.target_ids)})
        if not self._layered or not items:
            return items
        # Cache the input of the first trained layer: the frozen lower layers never change. The prompts' common
        # start (instruction and few-shot examples) is computed once; each example then runs only its own tokens,
        # attending to that start's keys and values (privret.models.shared_prefix).
        base = self._base()
        shared = shared_prefix_length([ex.prompt_ids for ex in examples])
        with self._frozen_layers_output(base) as frozen:
            prefix_hidden, prefix_cache = frozen(items[0]["input_ids"][None, :shared]) if shared else (None, None)
            reading = attending_to_prefix(base, prefix_cache) if shared else contextlib.nullcontext()
            with reading:
                for lo in range(0, len(items), batch_size):
                    chunk = items[lo: lo + batch_size]
                    ids, mask = right_pad([c["input_ids"][shared:] for c in chunk], self.tokenizer.pad_token_id)
                    hidden, _ = frozen(ids, mask, first_position=shared)
                    for row, c in enumerate(chunk):
                        own = hidden[row, : len(c["input_ids"]) - shared]
                        c["hidden"] = own.clone() if prefix_hidden is None else torch.cat([prefix_hidden[0], own])
                    if progress is not None:
                        progress(len(chunk))
        return items

    @contextlib.contextmanager
    def _frozen_layers_output(self, base):
        """While active, a function of ``(ids[, mask], first_position=0)`` returning (the input of the first
        trained layer for those tokens, at positions counted from ``first_position``, on the CPU; the cache of
        the frozen layers' keys and values the forward filled)."""
        captured: list[torch.Tensor] = []

        def grab(_module, args, kwargs):
            captured.append(args[0] if args else kwargs["hidden_states"])
            raise _StopForward

        def run(ids: torch.Tensor, mask: torch.Tensor | None = None, first_position: int = 0):
            from transformers import DynamicCache

            captured.clear()
            cache = DynamicCache()
            positions = torch.arange(first_position, first_position + ids.shape[1]).expand(ids.shape[0], -1)
            with self.autocast():
                try:
                    base.model(input_ids=ids.to(self.device), position_ids=positions.to(self.device),
                               attention_mask=None if mask is None else mask.to(self.device),
                               past_key_values=cache, use_cache=True)
                except _StopForward:
                    pass
            return captured[0].to(torch.bfloat16 if self.bf16 else torch.float32).cpu(), cache

        handle = base.model.layers[self.first_trained_layer].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            yield run
        finally:
            handle.remove()

    def collate(self, items):
        pad = self.tokenizer.pad_token_id
        ids, mask = right_pad([it["input_ids"] for it in items], pad)
        predict, target_mask = right_pad([it["predict_positions"] for it in items], 0)
        targets, _ = right_pad([it["target_ids"] for it in items], pad)
        batch = {"attention_mask": mask, "predict_positions": predict, "target_ids": targets,
                 "target_mask": target_mask.float()}
        if "hidden" in items[0]:
            length = ids.shape[1]
            first = items[0]["hidden"]
            hidden = torch.zeros(len(items), length, first.shape[-1], dtype=first.dtype)
            for row, it in enumerate(items):
                hidden[row, : len(it["hidden"])] = it["hidden"]
            batch["hidden"] = hidden
        else:
            batch["input_ids"] = ids
        return {k: v.to(self.device) for k, v in batch.items()}

    def loss_module(self) -> nn.Module:
        base = self._base()
        module = _TopLayersLoss(base, self.first_trained_layer) if self._layered else _CausalFullLoss(base)
        return without_dropout(module)

    @torch.no_grad()
    def generate(self, docs, *, num_queries=1, top_p=0.8, temperature=1.0, max_new_tokens=48, seed=None,
                 reuse_prefix=True, stop_at_sentence_end=False, repetition_penalty=1.0):
        """``num_queries`` sampled queries for each of ``docs``. Each prompt's keys and values (all its tokens but
        the last) are computed once and repeated for its ``num_queries`` rows (:meth:`PromptBatch.own_cache`);
        sampling then starts from each row's last prompt token, so the draws are those of the whole prompts.
        With few-shot examples every prompt starts with the same tokens (instruction and examples): with
        ``reuse_prefix`` these are computed once per call and kept once for all rows (:meth:`PromptBatch.reading`).
        Without examples the batch is the plain left-padded one. A row leaves the batch once its first line is
        complete or it has ended (:func:`privret.models.decoding.sample_rows`: the draws are ``generate``'s), and
        with ``stop_at_sentence_end`` once its first sentence is (for a caller that keeps only that,
        :func:`~privret.models.decoding.first_sentence`: what it keeps is unchanged). ``repetition_penalty`` acts on
        the row's sampled tokens, never the prompt's."""
        if not docs:
            return []
        if seed is not None:
            torch.manual_seed(seed)
        batch = self.prompt_batch(docs, reuse_prefix=reuse_prefix).to(self.device)
        self.model.eval()
        with self.autocast(), batch.reading(self.model):
            cache = batch.own_cache(self.model)
            cache.batch_repeat_interleave(num_queries)
            rows, own = batch.repeat(num_queries), slice(batch.shared, None)
            new = sample_rows(self.model, rows.ids[:, own], rows.mask[:, own], rows.positions[:, own], cache,
                              eos_token_ids=self._eos_token_ids(), max_new_tokens=max_new_tokens, top_p=top_p,
                              temperature=temperature, repetition_penalty=repetition_penalty,
                              settled=lambda ids: self._first_line_settled(ids, sentence=stop_at_sentence_end))
        texts = [self._decode(row) for row in new]
        return [texts[i * num_queries: (i + 1) * num_queries] for i in range(len(docs))]

    def _eos_token_ids(self) -> set[int]:
        """The tokens that end a sample: the model's generation config's (what ``generate`` stops at), else the
        tokenizer's end-of-text token."""
        eos = self.model.generation_config.eos_token_id
        eos = self.tokenizer.eos_token_id if eos is None else eos
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def _first_line_settled(self, ids: list[int], *, sentence: bool = False) -> bool:
        """Whether no further token can change what :meth:`_decode` keeps of ``ids`` (:func:`first_line_settled`;
        a line break ends any character still being spelled out in bytes, so the text before it is final), or with
        ``sentence`` the first sentence of that (:func:`~privret.models.decoding.sentence_settled`)."""
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return first_line_settled(text) or (sentence and sentence_settled(text))

    def prompt_batch(self, docs: list[str], *, reuse_prefix: bool = True) -> PromptBatch:
        """The prompts of ``docs`` as one batch; with few-shot examples and ``reuse_prefix`` their common start
        is shared (:class:`PromptBatch`), else plain left padding."""
        prompts = [self.tokenizer(self.prompt(d), add_special_tokens=False).input_ids for d in docs]
        shared = shared_prefix_length(prompts) if self.examples and reuse_prefix else 0
        ids, mask = left_pad_after_prefix(prompts, shared, self.tokenizer.pad_token_id)
        return PromptBatch(ids=ids, mask=mask, shared=shared)
