"""Loading a query generator: a pretrained model by name, or one that :meth:`QueryGenerator.save` wrote.

Encoder-decoder models load as :class:`privret.models.seq2seq_generator.Seq2SeqQueryGenerator` (Carranza
et al., section 4.1), all others as :class:`privret.models.causal_generator.CausalQueryGenerator`. A
generator fine-tuned from a *warm start* (another saved generator, see
:func:`privret.train.generator.train_generator`) keeps a copy of it in ``warm_start/``; loading applies
the warm start first, then the generator's own weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from privret.models.causal_generator import CausalQueryGenerator
from privret.models.loading import load_pretrained
from privret.models.query_generator import GENERATOR_FILE, QueryGenerator
from privret.models.seq2seq_generator import Seq2SeqQueryGenerator

WARM_START_DIR = "warm_start"


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
            cls, auto = Seq2SeqQueryGenerator, AutoModelForSeq2SeqLM
        else:
            cls, auto = CausalQueryGenerator, AutoModelForCausalLM
        model = auto.from_pretrained(location, trust_remote_code=False, dtype=torch.float32)
        return cls(model, tokenizer, name=name, max_doc_tokens=max_doc_tokens, max_query_tokens=max_query_tokens,
                   trained_layers=trained_layers, bf16=bf16, device=device)

    return load_pretrained(name, build)


def saved_examples(directory: str | Path) -> list[tuple[str, str]]:
    """The few-shot (document, query) examples the prompts of the generator saved in ``directory`` show (none for
    a zero-shot prompt), read from its settings without loading the model."""
    meta = json.loads((Path(directory) / GENERATOR_FILE).read_text())
    return [(doc, query) for doc, query in meta.get("examples", [])]


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
    generator.examples = saved_examples(directory)
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
