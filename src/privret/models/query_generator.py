"""The query generator's interface: a public pretrained LM fine-tuned to write a query for a document.

:class:`QueryGenerator` is what training and sampling use; its two model families are
:class:`privret.models.causal_generator.CausalQueryGenerator` and
:class:`privret.models.seq2seq_generator.Seq2SeqQueryGenerator`, built by :mod:`privret.models.generator`.
Training reads batches through :meth:`QueryGenerator.loss_module`, an ``nn.Module`` that maps a padded
batch to one loss per example (what per-example gradient hooks need), without dropout
(:func:`without_dropout`): each unit's gradient is then a function of the parameters and its own rows
alone. A saved generator is its settings (``generator.json``), its tokenizer and, once fine-tuned, its
trained weights (LoRA: the adapter only) as safetensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from privret.errors import InputError
from privret.models.device import bf16_autocast, resolve_device, uses_bf16

GENERATOR_FILE = "generator.json"


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
    """Common interface; build with :func:`privret.models.generator.load_generator`."""

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
        # bf16 autocast (and bf16 activation cache) where native: faster on AMX CPUs and GPUs, far slower elsewhere
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
                             "trains whole (give none: trained_layers: null)", field="trained_layers")
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
                 max_new_tokens: int = 48, seed: int | None = None, stop_at_sentence_end: bool = False,
                 repetition_penalty: float = 1.0) -> list[list[str]]:
        """Nucleus-sample ``num_queries`` queries for each document (one batched call, KV cache); each query's
        first line. ``stop_at_sentence_end``: a row may stop once its first sentence is complete (for a caller that
        keeps only that, :func:`privret.models.decoding.first_sentence`). ``repetition_penalty``: the CTRL penalty
        on the tokens the row has sampled (:mod:`privret.models.decoding`; 1: off)."""
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



def first_line(text: str) -> str:
    """What a generator keeps of a sampled text: its first line once leading white space is dropped, stripped."""
    text = text.strip()
    return text.splitlines()[0].strip() if text else ""


def first_line_settled(text: str) -> bool:
    """Whether :func:`first_line` of ``text`` followed by anything is :func:`first_line` of ``text``: once a line
    break follows some text. Tight: while it is False, appending one letter changes the first line."""
    text = text.lstrip()
    return bool(text) and len((text + "x").splitlines()) > 1


def right_pad(seqs: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(s) for s in seqs)
    out = torch.full((len(seqs), length), pad, dtype=seqs[0].dtype)
    mask = torch.zeros(len(seqs), length, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = s
        mask[row, : len(s)] = 1
    return out, mask

