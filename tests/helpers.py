"""Shared test helpers: tiny models built in code (no download), small datasets written by the tests.

Imported by name (`from helpers import ...`); `conftest.py` re-exports the fixtures. Not named
`conftest` so that it cannot be confused with tests/federated/conftest.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def load_script(relative: str):
    """The module of a script outside the package (``bench/...``, ``tools/...``), loaded from the repository
    and registered in ``sys.modules`` under its file's stem (dataclasses look their module up there)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


WORDS = ("the a of and in to is for with on what how does do why which cell cells gene genes protein mice "
         "cancer risk heart brain blood drug trial patients study effect increase reduce memory aspirin vitamin "
         "sleep diet exercise virus immune response treatment disease children adults level levels high low "
         "query document answer write short search this that it are was be by as at from").split()


def write_tiny_llama(directory: Path, *, layers: int = 2, seed: int = 0) -> Path:
    """A 2-layer Llama with a word-level tokenizer: a real HF causal LM, small enough for unit tests."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "</s>", "<s>"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(WORDS)) + list(".,:?-0123456789"))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="</s>", bos_token="<s>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, bos_token_id=3)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_tiny_bert(directory: Path, *, layers: int = 2, seed: int = 0) -> Path:
    """A BERT encoder (2 layers by default) with a word-level tokenizer, as a plain HF directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(WORDS)) + list(".,:?-0123456789"))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2),
                                                                                                   ("[SEP]", 3)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=4, max_position_embeddings=128)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def write_beir_dir(root: Path, corpus: list[dict], queries: list[dict], qrels: dict[str, list[tuple]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels").mkdir(exist_ok=True)
    for split, rows in qrels.items():
        lines = ["query-id\tcorpus-id\tscore"] + ["\t".join(map(str, r)) for r in rows]
        (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return root


TOY_DOCS = [
    ("d1", "Aspirin", "aspirin can reduce the risk of heart disease in adults"),
    ("d2", "Memory", "mice with the gene show low memory in the brain"),
    ("d3", "Vitamin", "vitamin levels in blood are high in children with a good diet"),
    ("d4", "Sleep", "sleep and exercise increase the immune response to a virus"),
    ("d5", "Cancer", "the drug trial in patients with cancer was a study of treatment"),
    ("d6", "Cells", "cells of the immune system do respond to the virus"),
]
TOY_TRAIN = [("q1", "aspirin heart risk", ["d1"]), ("q2", "gene memory mice", ["d2"]),
             ("q3", "vitamin blood children", ["d3", "d6"]), ("q4", "sleep immune virus", ["d4"]),
             ("q5", "cancer drug trial", ["d5"])]
TOY_TEST = [("t1", "what does aspirin reduce", ["d1"]), ("t2", "immune cells virus", ["d6"])]


GENERATOR_DOCS = ["aspirin can reduce the risk of heart disease in adults", "mice with the gene show low memory",
                  "vitamin levels in blood are high in children", "sleep and exercise increase the immune response",
                  "the drug trial in patients with cancer", "cells of the immune system respond to the virus"]
GENERATOR_QUERIES = ["aspirin heart risk", "gene memory mice", "vitamin blood children", "sleep immune",
                     "cancer drug trial", "immune cells virus", "what does aspirin reduce", "how do mice memory"]


def generator_pairs():
    """11 (query, document) rows of 8 queries: query 0 has 3 rows and query 6 has 2, so query units and pair
    units differ (the generator's unit-grouping tests rely on it)."""
    from privret.data.beir import Document
    from privret.data.pairs import QueryDocPair, TrainingPairs

    corpus = {f"d{i}": Document(f"d{i}", "", t) for i, t in enumerate(GENERATOR_DOCS)}
    rows = [(0, 0), (0, 4), (0, 5), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 0), (6, 1), (7, 1)]
    pairs = [QueryDocPair(GENERATOR_QUERIES[q], f"d{d}", query_id=f"q{q}") for q, d in rows]
    return TrainingPairs(pairs, corpus)


@pytest.fixture()
def toy_beir(tmp_path) -> Path:
    corpus = [{"_id": i, "title": t, "text": x} for i, t, x in TOY_DOCS]
    queries = [{"_id": q, "text": t} for q, t, _ in TOY_TRAIN + TOY_TEST]
    qrels = {"train": [(q, d, 1) for q, _, ds in TOY_TRAIN for d in ds],
             "test": [(q, d, 1) for q, _, ds in TOY_TEST for d in ds]}
    return write_beir_dir(tmp_path / "toy", corpus, queries, qrels)


def write_tiny_t5(directory: Path, *, seed: int = 0) -> Path:
    """A 1-layer T5 with a word-level tokenizer (seq2seq generator family)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

    specials = ["[PAD]", "</s>", "[UNK]"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(WORDS)) + ["generate_query"] + list(".,:?-_"))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.WordPiece(prefix="##")
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="</s>")
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(vocab), d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1,
                      num_heads=4, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    T5ForConditionalGeneration(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_t5_dir(tmp_path_factory) -> Path:
    return write_tiny_t5(tmp_path_factory.mktemp("tiny-t5"))


def record_updates(monkeypatch, chosen: list[int]) -> list[list[torch.Tensor]]:
    """Make the DP steps of both trainers (:mod:`privret.train.generator`, :mod:`privret.train.dp_retriever`)
    exact and observable: the run's sampler (:mod:`privret.train.dp_run`) returns the units ``chosen`` at
    every step, the DP noise (:mod:`privret.train.dp_parallel`) is zero (so the noise calibration, slow
    for tiny n, is skipped: sigma = 1), and the gradients every Adam step is about to apply are recorded (the
    returned list gets one list of tensors per step, in the optimizer's parameter order)."""
    from privret.train import dp_parallel, dp_run

    monkeypatch.setattr(dp_run, "calibrate_noise", lambda **plan: 1.0)
    monkeypatch.setattr(dp_run, "PoissonUnitSampler",
                        lambda n_units, sample_rate, rng: SimpleNamespace(sample=lambda: list(chosen)))
    monkeypatch.setattr(dp_parallel, "noise_like",
                        lambda tensor, std, rng: torch.zeros_like(tensor, dtype=torch.float32))
    applied: list[list[torch.Tensor]] = []
    adam_step = torch.optim.Adam.step

    def recording_step(self, *args, **kwargs):
        applied.append([p.grad.detach().clone() for group in self.param_groups for p in group["params"]])
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", recording_step)
    return applied


def record_first_results(monkeypatch, module, name: str) -> list:
    """Wrap ``module.name`` (a function returning a tuple) so that each call's first result is appended to
    the returned list."""
    results, function = [], getattr(module, name)

    def recording(*args, **kwargs):
        result = function(*args, **kwargs)
        results.append(result[0])
        return result

    monkeypatch.setattr(module, name, recording)
    return results


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    """``privret ARGS`` in this process, through the entry point :func:`privret.cli.main` (so bad input
    ends as it does for a user: a one-line message on stderr and exit code 2); stdout, stderr and the exit
    code come back as a CompletedProcess. An exception main() does not handle propagates to the test.
    One test per file that needs it runs the real executable in a subprocess instead."""
    from privret.cli import main

    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    argv = sys.argv
    sys.argv = ["privret", *args]
    try:
        with contextlib.chdir(cwd or os.getcwd()), contextlib.redirect_stdout(stdout), \
                contextlib.redirect_stderr(stderr):
            main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(["privret", *args], code, stdout.getvalue(), stderr.getvalue())
