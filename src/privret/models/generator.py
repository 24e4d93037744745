"""Query generators: a public pretrained LM fine-tuned to write a query for a document.

Two model families sit behind one interface, :class:`QueryGenerator`:

* causal LMs (Llama-style decoders such as SmolLM2, or any ``AutoModelForCausalLM``): the
  document is put in a prompt (the model's chat template when it has one) and the loss is the
  mean cross-entropy of the *query tokens only*;
* seq2seq models (T5 family; :mod:`privret.models.seq2seq_generator`): document in, query out (Carranza et al., section 4.1).

A causal generator may carry *few-shot examples* (``examples``: public (document, query) pairs)
that are put in every prompt before the document: earlier user/assistant turns under a chat
template, else ``Document: ... Query: ...`` lines. They are saved with the generator. Without
examples (every fine-tuned generator) the prompt is exactly the zero-shot one.

Sampling (:meth:`CausalQueryGenerator.generate`) reads each prompt once: the keys and values of a
document's prompt are computed once and repeated for its ``num_queries`` samples (a plain
``generate(num_return_sequences=n)`` computes them n times), and with examples those of the prompts'
shared prefix (instruction and examples) once per call, held once for all rows
(:mod:`privret.models.shared_prefix`); each row leaves the batch once its first line is written
(:mod:`privret.models.sampling`).

A generator fine-tuned from a *warm start* (another saved generator, see
:func:`privret.train.generator.train_generator`) keeps a copy of it in ``warm_start/``; loading
applies the warm start first, then the generator's own weights.

Training reads batches through :meth:`QueryGenerator.loss_module`, an ``nn.Module`` that maps a
padded batch to one loss per example (what per-example gradient hooks need), without dropout
(:func:`without_dropout`).

Speed (causal LMs with ``model.layers``): with ``trained_layers = k`` only the top ``k`` decoder
layers are trained (LoRA or full). The frozen lower layers are a fixed function of the input,
so their output is computed once per example and cached (:meth:`prepare`); each step then runs
only the top layers, and the LM head only at the positions that predict query tokens.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from privret.errors import InputError
from privret.models.device import bf16_autocast, resolve_device, uses_bf16
from privret.models.loading import load_pretrained
from privret.models.sampling import sample_rows
from privret.models.shared_prefix import attending_to_prefix

INSTRUCTION = "Write a short search query that this document answers."
GENERATOR_FILE = "generator.json"
WARM_START_DIR = "warm_start"


def without_dropout(module: nn.Module) -> nn.Module:
    """``module`` with every dropout off, ready for per-row gradient hooks: in eval mode (so ``nn.Dropout`` and the
    attention dropout a layer applies while it is training are off), except the modules that hold a trainable
    parameter themselves (linear, embedding and norm layers, LoRA's A and B), which are put in training mode
    because Opacus's hooks record activations only there; those compute the same in either mode. Training without
    dropout keeps each unit's gradient a function of the parameters and its own rows alone."""
    module.eval()
    for sub in module.modules():
        if any(p.requires_grad for p in sub.parameters(recurse=False)):
            sub.training = True
    return module


@dataclass
class Example:
    """One (document, query) pair as tokens: ``ids = prompt + target`` (seq2seq: kept apart)."""

    prompt_ids: list[int]
    target_ids: list[int]


class QueryGenerator:
    """Common interface; build with :func:`load_generator`."""

    kind: str

    def __init__(self, model, tokenizer, *, name: str, max_doc_tokens: int, max_query_tokens: int,
                 trained_layers: int | None = None, bf16: bool = True, device: str | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.max_doc_tokens = max_doc_tokens
        self.max_query_tokens = max_query_tokens
        self.trained_layers = trained_layers
        self.trainable = "none"
        self.examples: list[tuple[str, str]] = []  # few-shot (document, query) pairs shown in every prompt
        self.device = resolve_device(device)  # None: the command's --device
        # bf16 autocast (and bf16 activation cache) where native: ~2-3x faster on AMX CPUs and GPUs, far slower elsewhere
        self.bf16 = uses_bf16(self.device, bf16)
        self.model.to(self.device)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token

    def autocast(self):
        return bf16_autocast(self.device, self.bf16)

    # -- trainable parameters -------------------------------------------------------------
    def make_trainable(self, mode: str, *, lora_rank: int = 16, lora_alpha: int = 32) -> None:
        """``lora``: LoRA adapters on every linear layer of the trained layers; ``full``: their
        linear weights themselves. Everything else stays frozen."""
        layers = self._trained_layer_indices()
        if self.trained_layers is not None and layers is None:  # else all layers would train, the ledger saying k
            raise InputError(f"privret trains the top k layers of causal LMs with a decoder stack only; {self.name} "
                             "trains whole (give none: --trained-layers 0)", field="trained_layers")
        for p in self.model.parameters():
            p.requires_grad_(False)
        if mode == "lora":
            from peft import LoraConfig, get_peft_model

            targets = [name for name, module in self._base().named_modules()
                       if isinstance(module, nn.Linear) and self._in_trained_layer(name, layers)
                       and "lm_head" not in name]
            config = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=targets,
                                bias="none")
            self.model = get_peft_model(self.model, config)
        elif mode == "full":
            for name, module in self._base().named_modules():
                if isinstance(module, nn.Linear) and self._in_trained_layer(name, layers) and "lm_head" not in name:
                    module.weight.requires_grad_(True)
        else:
            raise ValueError(f"unknown trainable mode '{mode}' (lora or full)")
        self.trainable = mode

    def trainable_parameters(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def _base(self) -> nn.Module:
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def _trained_layer_indices(self) -> list[int] | None:
        return None

    @staticmethod
    def _in_trained_layer(name: str, layers: list[int] | None) -> bool:
        if layers is None:
            return True
        parts = name.split(".")
        return any(parts[i] == "layers" and int(parts[i + 1]) in layers
                   for i in range(len(parts) - 1) if parts[i + 1].isdigit())

    # -- data ------------------------------------------------------------------------------
    def truncate_doc(self, doc: str) -> str:
        ids = self.tokenizer(doc, add_special_tokens=False).input_ids[: self.max_doc_tokens]
        return self.tokenizer.decode(ids)

    def example(self, doc: str, query: str) -> Example:
        raise NotImplementedError

    def prepare(self, examples: list[Example], progress=None) -> list[dict[str, torch.Tensor]]:
        """Per-example tensors that :meth:`collate` batches (causal: cached frozen activations)."""
        raise NotImplementedError

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss_module(self) -> nn.Module:
        """Maps a collated batch to a vector of per-example losses (returned :func:`without_dropout`)."""
        raise NotImplementedError

    # -- sampling --------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, docs: list[str], *, num_queries: int = 1, top_p: float = 0.8, temperature: float = 1.0,
                 max_new_tokens: int = 48, seed: int | None = None) -> list[list[str]]:
        """Nucleus-sample ``num_queries`` queries for each document (one batched call, KV cache)."""
        raise NotImplementedError

    def _decode(self, ids) -> str:
        return first_line(self.tokenizer.decode(ids, skip_special_tokens=True))

    # -- persistence -----------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """Write the fine-tuned generator (LoRA: adapter only, merged at load) as safetensors; an untrained
        one (``trainable == "none"``, e.g. few-shot prompted) as its settings only."""
        directory.mkdir(parents=True, exist_ok=True)
        if self.trainable != "none":
            self.model.save_pretrained(directory / ("adapter" if self.trainable == "lora" else "model"),
                                       safe_serialization=True)
        self.tokenizer.save_pretrained(directory / "tokenizer")
        meta = {"base_model": self.name, "kind": self.kind, "trainable": self.trainable,
                "max_doc_tokens": self.max_doc_tokens, "max_query_tokens": self.max_query_tokens,
                "trained_layers": self.trained_layers,
                **({"examples": [list(pair) for pair in self.examples]} if self.examples else {})}
        (directory / GENERATOR_FILE).write_text(json.dumps(meta, indent=2) + "\n")


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
        if not self._layered:
            return items
        # Cache the input of the first trained layer: the frozen lower layers never change.
        base = self._base()
        start = self.first_trained_layer
        captured: list[torch.Tensor] = []

        def grab(_module, args, kwargs):
            captured.append(args[0] if args else kwargs["hidden_states"])
            raise _StopForward

        handle = base.model.layers[start].register_forward_pre_hook(grab, with_kwargs=True)
        try:
            for lo in range(0, len(items), batch_size):
                chunk = items[lo: lo + batch_size]
                ids, mask = right_pad([c["input_ids"] for c in chunk], self.tokenizer.pad_token_id)
                captured.clear()
                with self.autocast():
                    try:
                        base.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
                    except _StopForward:
                        pass
                hidden = captured[0].to(torch.bfloat16 if self.bf16 else torch.float32).cpu()
                for row, c in enumerate(chunk):
                    c["hidden"] = hidden[row, : len(c["input_ids"])].clone()
                if progress is not None:
                    progress(len(chunk))
        finally:
            handle.remove()
        return items

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
                 reuse_prefix=True):
        """``num_queries`` sampled queries for each of ``docs``. Each prompt's keys and values (all its tokens but
        the last) are computed once and repeated for its ``num_queries`` rows (:meth:`PromptBatch.own_cache`);
        sampling then starts from each row's last prompt token, so the draws are those of the whole prompts.
        With few-shot examples every prompt starts with the same tokens (instruction and examples): with
        ``reuse_prefix`` these are computed once per call and kept once for all rows (:meth:`PromptBatch.reading`).
        Without examples the batch is the plain left-padded one. A row leaves the batch once its first line is
        complete or it has ended (:func:`privret.models.sampling.sample_rows`: the draws are ``generate``'s)."""
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
                              temperature=temperature, settled=self._first_line_settled)
        texts = [self._decode(row) for row in new]
        return [texts[i * num_queries: (i + 1) * num_queries] for i in range(len(docs))]

    def _eos_token_ids(self) -> set[int]:
        """The tokens that end a sample: the model's generation config's (what ``generate`` stops at), else the
        tokenizer's end-of-text token."""
        eos = self.model.generation_config.eos_token_id
        eos = self.tokenizer.eos_token_id if eos is None else eos
        return set(eos) if isinstance(eos, (list, tuple)) else {eos}

    def _first_line_settled(self, ids: list[int]) -> bool:
        """Whether no further token can change what :meth:`_decode` keeps of ``ids`` (:func:`first_line_settled`;
        a line break ends any character still being spelled out in bytes, so the text before it is final)."""
        return first_line_settled(self.tokenizer.decode(ids, skip_special_tokens=True))

    def prompt_batch(self, docs: list[str], *, reuse_prefix: bool = True) -> PromptBatch:
        """The prompts of ``docs`` as one batch; with few-shot examples and ``reuse_prefix`` their common start
        is shared (:class:`PromptBatch`), else plain left padding."""
        prompts = [self.tokenizer(self.prompt(d), add_special_tokens=False).input_ids for d in docs]
        shared = shared_prefix_length(prompts) if self.examples and reuse_prefix else 0
        ids, mask = left_pad_after_prefix(prompts, shared, self.tokenizer.pad_token_id)
        return PromptBatch(ids=ids, mask=mask, shared=shared)


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


def first_line(text: str) -> str:
    """What a generator keeps of a sampled text: its first line once leading white space is dropped, stripped."""
    text = text.strip()
    return text.splitlines()[0].strip() if text else ""


def first_line_settled(text: str) -> bool:
    """Whether :func:`first_line` of ``text`` followed by anything is :func:`first_line` of ``text``: once a line
    break follows some text. Tight: while it is False, appending one letter changes the first line."""
    text = text.lstrip()
    return bool(text) and len((text + "x").splitlines()) > 1


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


def right_pad(seqs: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(s) for s in seqs)
    out = torch.full((len(seqs), length), pad, dtype=seqs[0].dtype)
    mask = torch.zeros(len(seqs), length, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = s
        mask[row, : len(s)] = 1
    return out, mask


def load_generator(name: str, *, max_doc_tokens: int = 128, max_query_tokens: int = 48,
                   trained_layers: int | None = None, bf16: bool = True,
                   device: str | None = None) -> QueryGenerator:
    """Load a pretrained generator by registry name, local path or hub id, onto ``device``
    (:func:`privret.models.device.resolve_device`; None: the command's ``--device``)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    def build(location: str) -> QueryGenerator:
        config = AutoConfig.from_pretrained(location, trust_remote_code=False)
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=False)
        if config.is_encoder_decoder:
            from privret.models.seq2seq_generator import Seq2SeqQueryGenerator

            cls, auto = Seq2SeqQueryGenerator, AutoModelForSeq2SeqLM
        else:
            cls, auto = CausalQueryGenerator, AutoModelForCausalLM
        model = auto.from_pretrained(location, trust_remote_code=False, dtype=torch.float32)
        return cls(model, tokenizer, name=name, max_doc_tokens=max_doc_tokens, max_query_tokens=max_query_tokens,
                   trained_layers=trained_layers, bf16=bf16, device=device)

    return load_pretrained(name, build)


def load_trained_generator(directory: str | Path, **settings) -> QueryGenerator:
    """Load what :meth:`QueryGenerator.save` wrote (LoRA adapters are merged for fast sampling).

    ``settings`` (``max_doc_tokens``, ``max_query_tokens``, ``trained_layers``, ``bf16``; ``device`` as in
    :func:`load_generator`) replace the saved ones: to train on from it (a warm start) with other settings.
    """
    directory = Path(directory)
    meta = json.loads((directory / GENERATOR_FILE).read_text())
    settings = {"max_doc_tokens": meta["max_doc_tokens"], "max_query_tokens": meta["max_query_tokens"],
                "trained_layers": meta["trained_layers"], **settings}
    if (directory / WARM_START_DIR).is_dir():
        generator = load_trained_generator(directory / WARM_START_DIR, **settings)
    else:
        generator = load_generator(meta["base_model"], **settings)
    generator.examples = [(doc, query) for doc, query in meta.get("examples", [])]
    if meta["trainable"] == "lora":
        from peft import PeftModel

        merged = PeftModel.from_pretrained(generator.model, str(directory / "adapter")).merge_and_unload()
        generator.model = merged.to(generator.device)
    elif meta["trainable"] == "full":
        from safetensors.torch import load_file

        state = {}
        for shard in sorted((directory / "model").glob("*.safetensors")):
            state.update(load_file(str(shard)))
        generator.model.load_state_dict(state, strict=False)
    return generator
