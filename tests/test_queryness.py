"""Query-ness of a synthetic set (privret.synth.queryness): planted good and degenerate outputs."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from privret.errors import InputError
from privret.models.decoding import first_sentence, sentence_settled
from privret.synth.queryness import MAX_QUERY_WORDS, degeneracy, is_query_like, measure, synthetic_queryness
from helpers import write_beir_dir

TITLE = "Cannot log in to the Travel and Expense Claims Portal"
BODY = "The portal signs you in with your normal network account. Locked accounts are reset by support."

GOOD = ["how do I reset my portal password", "Why is the expense portal showing a blank page?",
        "claims portal locked account"]
DEGENERATE = {
    "": "empty",
    "   ": "empty",
    "Therapisticious": "one-word",
    "hNEGBBCBOCCOBBBCBCCCCCCCC": "one-word",
    "cannot log in to the travel and expense claims portal!": "copy-of-document",
    "The portal signs you in with your normal network account.": "copy-of-document",
    "reset password reset password reset password": "repeated-run",
    "portal login hNEGBBCBOCCCCCCCC": "repeated-run",
    "what what what is the portal": "repeated-run",
}
RAMBLING = ("Although the aforementioned service was not confirmed yet, as of January 2023, you may still download "
            "news and stories about purchasing from this website.")


@pytest.mark.parametrize("text", GOOD)
def test_a_short_query_is_query_like_and_not_degenerate(text):
    assert degeneracy(text, TITLE, BODY) is None
    assert is_query_like(text)


@pytest.mark.parametrize("text,reason", DEGENERATE.items())
def test_planted_degenerate_outputs_are_named(text, reason):
    assert degeneracy(text, TITLE, BODY) == reason


def test_a_second_sentence_or_a_long_sentence_is_not_query_like():
    assert not is_query_like("how do I log in? It says my account is locked.")
    assert len(RAMBLING.split()) > MAX_QUERY_WORDS and not is_query_like(RAMBLING)
    assert is_query_like(RAMBLING, max_words=40)


def test_first_sentence_cuts_at_the_first_sentence_end_followed_by_text():
    assert first_sentence("Where is the portal? It moved. Then") == "Where is the portal?"
    assert first_sentence('Is it "down?" yes') == 'Is it "down?"'
    assert first_sentence("  version 2.5 of the app  ") == "version 2.5 of the app"
    assert first_sentence("no end at all") == "no end at all"


@pytest.mark.parametrize("text", ["Where is it? It", "Where is it?  x", 'Is it "down?" y', "a.b c. D", "x! \ufffd"])
def test_once_a_first_sentence_is_settled_no_text_appended_changes_it(text):
    assert sentence_settled(text)
    for more in ("", " more. Text", "\nnext line", "?! x"):
        assert first_sentence(text + more) == first_sentence(text)


@pytest.mark.parametrize("text", ["Where is it?", "ok.", "a.b", "no end", 'Is it "down?"', ""])
def test_an_unsettled_first_sentence_is_changed_by_one_more_word(text):
    assert not sentence_settled(text)
    assert first_sentence(text + "x more") != first_sentence(text)


def test_stopping_rows_at_their_first_sentence_end_keeps_the_same_first_sentences(tiny_llama_dir):
    from helpers import GENERATOR_DOCS
    from privret.models.generator import load_generator

    generator = load_generator(str(tiny_llama_dir), bf16=False)
    whole, stopped = (generator.generate(GENERATOR_DOCS, num_queries=2, max_new_tokens=12, seed=5,
                                         stop_at_sentence_end=stop) for stop in (False, True))
    assert [[first_sentence(q) for q in qs] for qs in whole] == [[first_sentence(q) for q in qs] for qs in stopped]


def test_measure_counts_shares_and_the_outputs_generation_dropped():
    outputs = [(t, TITLE, BODY) for t in GOOD + ["Therapisticious", RAMBLING]]
    result = measure(outputs, dropped=Counter({"empty": 1}))
    assert result.outputs == 6
    assert result.query_like == pytest.approx(3 / 6)
    assert result.degenerate == pytest.approx(2 / 6)
    assert result.reasons == {"one-word": 1, "empty": 1}
    assert "50% query-like" in result.text() and "33% degenerate" in result.text()
    assert measure([]).outputs == 0 and measure([]).query_like == 0.0


def test_synthetic_queryness_reads_a_synthetic_set_and_its_manifest(tmp_path):
    root = write_beir_dir(tmp_path / "syn", [{"_id": "d1", "title": TITLE, "text": BODY}],
                          [{"_id": "syn-d1-0", "text": GOOD[0]}, {"_id": "syn-d1-1", "text": "Therapisticious"}],
                          {"train": [("syn-d1-0", "d1", 1), ("syn-d1-1", "d1", 1)]})
    (root / "manifest.json").write_text(json.dumps({"dropped_empty": 1, "dropped_degenerate_repeated-run": 2}))
    result = synthetic_queryness(root)
    assert result.outputs == 5
    assert result.query_like == pytest.approx(1 / 5)
    assert result.reasons == {"empty": 1, "repeated-run": 2, "one-word": 1}
    (root / "manifest.json").write_text("[1]")
    with pytest.raises(InputError, match="JSON object"):
        synthetic_queryness(root)


def test_the_report_and_the_pipeline_summary_state_each_synthetic_sets_queryness(tmp_path):
    from privret.pipeline.summary import queryness_lines, synthetic_sets_queryness
    from privret.report.collect import collect
    from privret.report.render import render_html, render_markdown
    from test_report import write_fake_run

    run_dir = write_fake_run(tmp_path)
    run = collect(run_dir)
    assert "## Query-ness of the synthetic sets" in render_markdown(run)
    assert "| eps-8/synthetic | 100.0% | 0.0% | 4 | - |" in render_markdown(run)
    assert "id='queryness'" in render_html(run)
    rows = [{"stage": "eps-8", "row": "DP synthetic (epsilon=8)"}, {"stage": "zero_shot", "row": "zero-shot"}]
    measured = synthetic_sets_queryness(run_dir, rows)
    assert list(measured) == ["eps-8"] and measured["eps-8"].outputs == 4
    assert "| DP synthetic (epsilon=8) | 100.0% | 0.0% | 4 | - |" in queryness_lines(rows, measured, {})
    assert queryness_lines(rows, {}, {}) == []
