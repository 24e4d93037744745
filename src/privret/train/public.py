"""Generators made without any private data: the epsilon = 0 rows that every DP row must beat.

* **prompted**: the public pretrained generator, untrained, with a few public (document, query)
  examples in its prompt (few-shot; :meth:`privret.models.causal_generator.CausalQueryGenerator.prompt`);
* **public pairs**: the generator fine-tuned *without* DP on a public pairs file (for SciFact,
  SQuAD questions -> paragraphs; docs/privacy.md shows how to make one).

Privacy argument: neither reads the private log. What they are made from (the public model, the
public examples or pairs) and what they are later run on (the public documents) do not depend on
it, so their outputs have the same distribution for any two logs: they are 0-DP, epsilon = delta =
0, for every privacy unit. Their ledgers say so (:meth:`PrivacyLedger.public`, mechanism
``public-prompted`` or ``public-pairs``) and record the sha256 of the public data they read. They
spend no budget and are never recorded in the budget registry. The functions here take no
private data as an argument; the pipeline gives them only public paths and documents.
"""

from __future__ import annotations

from pathlib import Path

from privret.data.pairs import load_pairs_jsonl
from privret.errors import InputError
from privret.io import atomic_path, file_sha256
from privret.models.generator import load_generator
from privret.privacy.ledger import PrivacyLedger
from privret.train.generator import train_generator
from privret.train.public_start import examples_hash
from privret.settings.training import GeneratorTrainConfig


def write_prompted_generator(model: str, examples: list[tuple[str, str]], out_dir: str | Path, *, unit: str,
                             max_doc_tokens: int = 128, max_query_tokens: int = 48) -> PrivacyLedger:
    """Save the untrained ``model`` with the few-shot ``examples`` as a generator directory; returns its ledger."""
    if not examples:
        raise InputError("a prompted generator needs at least one public example", field="public_examples")
    generator = load_generator(model, max_doc_tokens=max_doc_tokens, max_query_tokens=max_query_tokens)
    if generator.kind != "causal":
        raise InputError(f"few-shot prompts need a causal LM; {model} is {generator.kind}", field="model")
    generator.examples = list(examples)
    ledger = PrivacyLedger.public("public-prompted", model=model, public_data_hash=examples_hash(examples), unit=unit,
                                  n_pairs=len(examples))
    with atomic_path(out_dir) as staged:
        generator.save(staged)
        ledger.save(staged)
    return ledger


def train_public_generator(pairs_file: str | Path, out_dir: str | Path, cfg: GeneratorTrainConfig, *,
                           resume: bool = False) -> PrivacyLedger:
    """Fine-tune ``cfg.model`` without DP (``cfg.epsilon`` must be inf) on the public pairs in ``pairs_file``."""
    return train_generator(load_pairs_jsonl(pairs_file), out_dir, cfg, data_hash=file_sha256(pairs_file),
                           resume=resume, public=True)
