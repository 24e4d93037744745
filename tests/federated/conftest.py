"""Fixtures for the federated tests: a hand-made SQuAD file and a tiny encoder built in code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

# Three articles; the second paragraph of "Alpha" has an answer that spans a sentence break and an
# abbreviation ("Dr.") that must not break a sentence.
TINY_SQUAD = {"version": "1.1", "data": [
    {"title": "Alpha", "paragraphs": [
        {"context": "The red fox lives in the forest. It eats mice and berries. Foxes sleep in dens.",
         "qas": [{"id": "a1", "question": "What does the red fox eat?", "answers": ["mice and berries", "mice"]},
                 {"id": "a2", "question": "Where do foxes sleep?", "answers": ["in dens", "dens"]},
                 {"id": "a3", "question": "Where does the red fox live?", "answers": ["forest"]}]},
        {"context": "Dr. Smith studied the fox. She wrote a book. The book won a prize.",
         "qas": [{"id": "a4", "question": "Who studied the fox?", "answers": ["Dr. Smith"]},
                 {"id": "a5", "question": "What did she write and win?", "answers": ["a book. The book won"]},
                 {"id": "a6", "question": "Which cat flew?", "answers": ["purple cat"]}]}]},
    {"title": "Beta", "paragraphs": [
        {"context": "Rivers carry water to the sea. The Nile is a long river. Boats sail on the Nile.",
         "qas": [{"id": "b1", "question": "Which river is long?", "answers": ["The Nile", "Nile"]},
                 {"id": "b2", "question": "Where do rivers carry water?", "answers": ["to the sea"]},
                 {"id": "b3", "question": "What sails on the Nile?", "answers": ["Boats"]}]}]},
    {"title": "Gamma", "paragraphs": [
        {"context": "Stars shine at night. The sun is a star. Planets orbit the sun.",
         "qas": [{"id": "g1", "question": "When do stars shine?", "answers": ["at night"]},
                 {"id": "g2", "question": "What orbits the sun?", "answers": ["Planets"]},
                 {"id": "g3", "question": "What is the sun?", "answers": ["a star"]},
                 {"id": "g4", "question": "Is the sun a star?", "answers": ["star"]}]}]},
]}


@pytest.fixture()
def tiny_squad_obj() -> dict:
    return json.loads(json.dumps(TINY_SQUAD))


@pytest.fixture()
def tiny_squad(tmp_path) -> Path:
    path = tmp_path / "tiny-squad.json"
    path.write_text(json.dumps(TINY_SQUAD, indent=1))
    return path


def write_tiny_encoder(directory: Path, *, seed: int = 0) -> str:
    """A 2-layer BERT (hidden 32) with a word-level tokenizer, saved as a SentenceTransformer."""
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers import models as tok_models
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    texts = [p["context"] for a in TINY_SQUAD["data"] for p in a["paragraphs"]]
    texts += [q["question"] for a in TINY_SQUAD["data"] for p in a["paragraphs"] for q in p["qas"]]
    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    backend = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = __import__("tokenizers").normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                           special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128)
    hf = directory / "hf"
    BertModel(config).save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    word = models.Transformer(str(hf), max_seq_length=64)
    model = SentenceTransformer(modules=[word, models.Pooling(32, pooling_mode="mean"), models.Normalize()],
                                device="cpu")
    model.save(str(directory / "st"))
    return str(directory / "st")


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory) -> str:
    return write_tiny_encoder(tmp_path_factory.mktemp("tiny-encoder"))
