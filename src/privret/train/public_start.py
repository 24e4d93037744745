"""Where DP fine-tuning of a generator starts: a public generator, by a stated rule, never chosen on the log.

Rule (training on public pairs, which teach the format themselves, starts pretrained): a public warm start
when given (a generator fine-tuned without DP on public pairs, or a prompted one); else, with ``start =
"prompted"`` (the default) and a causal LM, the pretrained model shown public few-shot examples in every prompt,
in training and in sampling (the caller's public examples, else :data:`GENERIC_EXAMPLES`); else the pretrained
model with the zero-shot prompt. Before any private step the prompted start writes what the epsilon-0 prompted
generator with the same examples writes (LoRA adapters start at zero, full fine-tuning at the pretrained
weights): DP training can only adapt it.

Privacy: the examples are public (written for the purpose or taken from public data) and fixed without the
log, so the start is a fixed function of public data, and DP-SGD's guarantee holds for any such starting
point. The ledger records it as provenance: mechanism ``public-prompted``, the examples' sha256.
"""

from __future__ import annotations

import hashlib
import json

PROMPTED_START = "public-prompted"

GENERIC_EXAMPLES: tuple[tuple[str, str], ...] = (
    ("Library opening hours. The central library opens from 9am to 8pm on weekdays and from 10am to 4pm on "
     "Saturdays; it is closed on Sundays and public holidays.", "when is the library open on saturday"),
    ("Resetting a forgotten password. Choose 'Forgot password' on the sign-in page and enter your email address: "
     "a reset link, valid for one hour, is sent to you.", "how to reset a forgotten password"),
    ("Vitamin D and bone health. Vitamin D helps the body absorb calcium; in children a lack of it can cause "
     "rickets, a softening of the bones.", "what does vitamin D deficiency cause in children"),
)
"""Public few-shot examples written for privret, in no particular domain: the prompted start's default."""


def examples_hash(examples: list[tuple[str, str]]) -> str:
    """sha256 of exactly the examples a prompted generator shows (canonical JSON)."""
    text = json.dumps([[doc, query] for doc, query in examples], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def start_examples(public_examples: list[tuple[str, str]] | None) -> list[tuple[str, str]]:
    """The examples a prompted start shows: ``public_examples`` when given, else :data:`GENERIC_EXAMPLES`."""
    return [tuple(pair) for pair in (public_examples or GENERIC_EXAMPLES)]


def prompted_provenance(model: str, examples: list[tuple[str, str]]) -> dict:
    """What a DP ledger records of a prompted start (the fields of a warm start's provenance)."""
    return {"mechanism": PROMPTED_START, "model": model, "trainable": "none",
            "public_data_hash": examples_hash(examples), "examples": len(examples)}
