"""What a stop at the first sentence end would save a batched sampler: decode steps from a synthetic set's queries.

A small prompted generator writes one claim and runs on into abstract-like text until ``max_new_tokens``
(docs/benchmarks.md, "A stop at the first sentence end"). Stopping a row once it has ended a sentence saves decode
steps only when the whole batch has stopped: in ``transformers``' ``generate`` a finished row stays in the batch
(padded) until the last row finishes or the cap is reached. From the stored queries (as generated, uncut) this
counts, per query, the decode steps up to and including the token after its first sentence end (the cut's rule,
:func:`privret.synth.public_proxy.first_sentence`), the cap when it never ends one, or its length + 1 (the EOS) when
it stopped by itself; then the mean steps of a batch of B rows drawn at random (its longest row) for a few B.
Token counts re-tokenize the stored text, so they are approximate to a token.

    .venv/bin/python bench/sentence_stop_steps.py --queries runs/proxy/proxy-claims/queries.jsonl \\
        --tokenizer runs/proxy/gen-prompted/tokenizer
"""

from __future__ import annotations

import argparse
import json
import random

from transformers import AutoTokenizer

from privret.synth.public_proxy import SENTENCE_END


def decode_steps(text: str, tokenizer, cap: int) -> int:
    """The decode steps a row takes under a first-sentence stop (see the module docstring)."""
    text = text.strip()
    n_tokens = len(tokenizer(text, add_special_tokens=False).input_ids)
    end = SENTENCE_END.search(text)
    if end:
        return min(cap, len(tokenizer(text[: end.end()], add_special_tokens=False).input_ids) + 1)
    return cap if n_tokens >= cap - 4 else n_tokens + 1  # near the cap: cut by it (re-tokenizing is approximate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", required=True, help="a synthetic set's queries.jsonl (uncut)")
    parser.add_argument("--tokenizer", required=True, help="the generator's tokenizer directory")
    parser.add_argument("--cap", type=int, default=48, help="max_new_tokens of the generation")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 32, 8, 1])
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    with open(args.queries, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    steps = [decode_steps(t, tokenizer, args.cap) for t in texts]
    never = sum(1 for t, s in zip(texts, steps) if s == args.cap and not SENTENCE_END.search(t.strip()))
    print(f"{len(texts)} queries; no sentence end within the cap: {never} ({never / len(texts):.1%}); "
          f"mean decode steps of a row that leaves at its stop: {sum(steps) / len(steps):.1f} of {args.cap}")
    rng = random.Random(0)
    for b in args.batches:
        longest = [max(rng.sample(steps, b)) for _ in range(2000)]
        print(f"a batch of {b} rows stops after {sum(longest) / len(longest):.1f} steps on average (its longest row)")


if __name__ == "__main__":
    main()
