"""Sampling that drops settled rows from the batch (privret.models.decoding), the first-line rule it stops on, and
the attention over a few-shot prefix held once (privret.models.shared_prefix)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers.generation.logits_process import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from helpers import TOY_DOCS
from privret.models.generator import load_generator
from privret.models.query_generator import first_line, first_line_settled
from privret.models.decoding import sample_rows
from privret.models.shared_prefix import NAME, shared_prefix_attention

TEXT = st.text(alphabet="ab .\n\r\t\x0b\u2028", max_size=12)
SAMPLING = {"top_p": 0.9, "temperature": 0.7, "max_new_tokens": 10}


@given(TEXT, TEXT)
def test_a_settled_first_line_is_final_and_an_unsettled_one_is_not(text, more):
    if first_line_settled(text):
        assert first_line(text + more) == first_line(text)
    else:  # the rule is tight: stopping here could lose what one more letter would add
        assert first_line(text + "z") != first_line(text)


def test_the_first_line_rule_on_examples():
    assert first_line("\n  Aspirin helps.\nMore text") == "Aspirin helps."
    assert first_line_settled("\n  Aspirin helps.\n") and not first_line_settled("\n \n ")
    assert not first_line_settled("Aspirin helps. More on the same line")


def _rows_and_cache(generator, docs, copies):
    batch = generator.prompt_batch(docs)  # no examples: plain left padding, every prompt token in the cache
    cache = batch.own_cache(generator.model)
    cache.batch_repeat_interleave(copies)
    return batch.repeat(copies), cache


def _sampled(generator, docs, penalty: float, settled) -> list[list[int]]:
    """:func:`sample_rows` of two rows per document, seed 11."""
    rows, cache = _rows_and_cache(generator, docs, 2)
    torch.manual_seed(11)
    return sample_rows(generator.model, rows.ids, rows.mask, rows.positions, cache, settled=settled,
                       eos_token_ids={generator.tokenizer.eos_token_id}, repetition_penalty=penalty, **SAMPLING)


@pytest.mark.parametrize("penalty, sharpen", [(1.0, 1.0), (4.0, 10.0)])
def test_rows_that_leave_the_batch_keep_the_draws_of_transformers_generate(tiny_llama_dir, penalty, sharpen):
    """Same seed, same prompts: each row's tokens are those ``generate`` samples for it, up to the step where it
    settles; rows settle at different steps, so the batch shrinks while the others go on. A cache or mask not cut
    to the rows still going, or a draw table of the wrong rows, would change the tokens after the first exit.
    A repetition penalty is that of ``generate`` with transformers' processor on the sampled tokens only (the
    prompt ignored): a row's own tokens, cut with it as it leaves; penalty 1 is ``generate`` without one. The
    penalised case sharpens the logits (final norm x 10), so that without the penalty every row repeats one token
    to the end."""
    generator = load_generator(str(tiny_llama_dir), bf16=False)
    generator.model.eval()
    with torch.no_grad():
        generator.model.model.norm.weight.mul_(sharpen)
    docs = [d for _, _, d in TOY_DOCS[:4]]
    eos = generator.tokenizer.eos_token_id

    def settled(ids: list[int]) -> bool:  # a rule on the content, as the first-line rule is
        return ids[-1] % 5 == 0

    with torch.no_grad():
        rows, cache = _rows_and_cache(generator, docs, 2)
        penalised = {} if penalty == 1.0 else {"repetition_penalty": penalty, "logits_processor": LogitsProcessorList(
            [RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=rows.ids.shape[1])])}
        torch.manual_seed(11)
        reference = generator.model.generate(input_ids=rows.ids, attention_mask=rows.mask, past_key_values=cache,
                                             do_sample=True, top_k=0, pad_token_id=generator.tokenizer.pad_token_id,
                                             **SAMPLING, **penalised)[:, rows.ids.shape[1]:].tolist()
        ours = _sampled(generator, docs, penalty, settled)
        if penalty != 1.0:
            unpenalised = _sampled(generator, docs, 1.0, settled)
            assert all(len(set(row)) == 1 for row in unpenalised) and ours != unpenalised
    expected = []
    for row in reference:
        cut = next((i + 1 for i in range(len(row)) if row[i] == eos or settled(row[:i + 1])), len(row))
        expected.append(row[:cut])
    assert ours == expected
    lengths = sorted(len(row) for row in ours)
    assert lengths[0] < lengths[-1] == SAMPLING["max_new_tokens"]  # some left early while others went on


def test_the_shared_prefix_attention_is_on_only_inside_its_context(tiny_llama_dir):
    """The model attends to the held prefix only while :meth:`PromptBatch.reading` is active (its own attention is
    back afterwards, an error included), and the attention refuses to run without a prefix to read."""
    generator = load_generator(str(tiny_llama_dir), bf16=False)
    generator.examples = [(d, "a query") for _, _, d in TOY_DOCS[:2]]
    batch = generator.prompt_batch([d for _, _, d in TOY_DOCS[2:5]])
    config, before = generator.model.config, generator.model.config._attn_implementation
    assert batch.shared > 0
    with pytest.raises(KeyError):
        with batch.reading(generator.model):
            assert config._attn_implementation == NAME
            raise KeyError("inside")
    assert config._attn_implementation == before
    q = torch.zeros(1, 4, 1, 8)
    with pytest.raises(RuntimeError, match="only inside"):
        shared_prefix_attention(generator.model.model.layers[0].self_attn, q, q[:, :2], q[:, :2], None)
