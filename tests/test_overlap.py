"""The pretraining-overlap audit: verbatim matches in a streamed corpus, and the likelihood-gap test."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch
from helpers import WORDS, run_cli, write_beir_dir, write_tiny_llama
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from privret.cli import app
from privret.errors import InputError
from privret.audit.overlap import (ExactMatcher, corpus_overlap, iter_records, likelihood_statistic,
                                      likelihood_test, mann_whitney_auc, normalise, per_token_losses)

VOCAB = sorted(set(WORDS))


def test_normalisation():
    assert normalise("  Vitamin-D, DEFICIENCY!\t in  ﬁve   cases ") == "vitamin d deficiency in five cases"
    assert normalise("é_x") == "é x"


def _queries(rng: random.Random, n: int, length: int = 6) -> list[str]:
    return [" ".join(rng.choice(VOCAB) for _ in range(length)) for _ in range(n)]


@pytest.fixture()
def private(tmp_path):
    rng = random.Random(1)
    texts = _queries(rng, 30)
    docs = [" ".join(rng.choice(VOCAB) for _ in range(25)) for _ in range(30)]
    heldout = _queries(rng, 30)
    corpus = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(docs)]
    queries = [{"_id": f"q{i}", "text": t} for i, t in enumerate(texts)] + \
              [{"_id": f"h{i}", "text": t} for i, t in enumerate(heldout)]
    qrels = {"train": [(f"q{i}", f"d{i}", 1) for i in range(30)], "test": [(f"h{i}", f"d{i}", 1) for i in range(30)]}
    return write_beir_dir(tmp_path / "private", corpus, queries, qrels), texts, docs


def _stream(path: Path, lines: list[str], *, jsonl: bool = False) -> None:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        for line in lines:
            f.write((json.dumps({"text": line, "url": "x"}) if jsonl else line) + "\n")


def _background(rng: random.Random, n: int) -> list[str]:
    # filler drawn from a disjoint vocabulary, so that no private text occurs by chance
    filler = [f"w{i}" for i in range(300)]
    return [" ".join(rng.choice(filler) for _ in range(rng.randint(5, 40))) for _ in range(n)]


@pytest.mark.parametrize("fmt", ["txt", "jsonl", "txt.gz"])
def test_planted_queries_and_documents_are_found_and_nothing_else(private, tmp_path, fmt):
    root, texts, docs = private
    rng = random.Random(2)
    lines = _background(rng, 5000)
    planted_q = {3: 100, 7: 2500, 11: 4999}  # query index -> line index
    for qi, li in planted_q.items():
        # changed case and punctuation, surrounded by other words: still verbatim after normalisation
        lines[li] = f"w1 w2 {texts[qi].upper().replace(' ', ', ', 1)}! w3"
    lines[10] = "w9 " + docs[5] + " w9"  # a whole document inside a record
    # near misses that must not count: a query split over two records, one word changed, a prefix only
    words = texts[0].split()
    lines[200], lines[201] = " ".join(words[:3]), " ".join(words[3:])
    lines[300] = " ".join(texts[1].split()[:-1] + ["w5"])
    lines[400] = " ".join(texts[2].split()[:5])
    lines[500] = " ".join(docs[6].split()[:-1])  # a document minus its last word
    path = tmp_path / f"corpus.{fmt}"
    _stream(path, lines, jsonl=fmt == "jsonl")
    result = corpus_overlap(root, "train", [path])
    found_q = {m["id"] for m in result["queries"]["matches"]}
    assert found_q == {f"q{i}" for i in planted_q}
    assert result["queries"]["fraction"] == pytest.approx(3 / 30)
    assert {m["id"] for m in result["documents"]["matches"]} == {"d5"}
    where = {m["id"]: m["where"] for m in result["queries"]["matches"]}
    assert where["q7"].endswith(f":{2500 + 1}")
    assert result["corpus"]["records"] == 5000


def test_min_tokens_and_sample(private, tmp_path):
    root, texts, _ = private
    path = tmp_path / "c.txt"
    _stream(path, [texts[0], "w1"])
    result = corpus_overlap(root, "train", [path], min_tokens=7)
    assert result["queries"]["eligible"] == 0 and result["queries"]["fraction"] is None
    sampled = corpus_overlap(root, "train", [path], sample=10, seed=3)
    assert sampled["queries"]["total"] == 10


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from("a b c d e".split()), min_size=1, max_size=4), min_size=1, max_size=8),
       st.lists(st.lists(st.sampled_from("a b c d e f".split()), max_size=12), min_size=1, max_size=6))
def test_matcher_agrees_with_brute_force_substring_search(needles, records):
    texts = {str(i): " ".join(n) for i, n in enumerate(needles)}
    matcher = ExactMatcher(texts)
    for number, record in enumerate(records):
        matcher.scan(" ".join(record), str(number))
    padded = [f" {' '.join(r)} " for r in records]
    expected = {k for k, t in texts.items() if any(f" {t} " in line for line in padded)}
    assert set(matcher.found) == expected


def test_malformed_jsonl_names_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(InputError) as err:
        list(iter_records(path, field="text"))
    assert err.value.line == 2


def test_a_corpus_of_which_no_record_is_read_is_refused(private, tmp_path):
    """JSONL records without the text field are skipped one by one, and a shard without any is fine beside others;
    a corpus of which no record was read would report a clean 0% found, so it is refused."""
    root, texts, _ = private
    empty, some = tmp_path / "empty.jsonl", tmp_path / "some.jsonl"
    empty.write_text('{"body": "a"}\n{"body": "b"}\n')
    some.write_text(json.dumps({"text": texts[0]}) + "\n")
    assert corpus_overlap(root, "train", [empty, some])["queries"]["found"] == 1
    with pytest.raises(InputError, match="no record read from the corpus .*field 'text'") as err:
        corpus_overlap(root, "train", [empty])
    assert err.value.path == str(empty)


def test_cli_overlap_only_and_bad_corpus_exit_2(private, tmp_path):
    root, texts, _ = private
    path = tmp_path / "c.txt"
    _stream(path, ["w1 " + texts[4] + " w2"])
    out_json = tmp_path / "o.json"
    result = CliRunner().invoke(app, ["audit", "overlap", "--data", str(root), "--corpus", str(path),
                                      "--no-likelihood", "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out_json.read_text())
    assert saved["overlap"]["queries"]["found"] == 1 and "likelihood" not in saved
    proc = run_cli("audit", "overlap", "--data", str(root), "--corpus", str(tmp_path / "missing.txt"), "--no-likelihood")
    assert proc.returncode == 2 and "corpus file not found" in proc.stderr
    assert not (tmp_path / "missing.json").exists()
    # a flag of the part the run leaves out would be ignored: refused
    for args, flag in ((["--no-likelihood", "--corpus", str(path), "--max-queries", "5"], "--max-queries"),
                       (["--sample", "5"], "--sample")):
        proc = run_cli("audit", "overlap", "--data", str(root), *args)
        assert proc.returncode == 2 and f"field '{flag}'" in proc.stderr, proc.stderr


# -- likelihood test -----------------------------------------------------------------------------
def test_auc_matches_scipy_mann_whitney():
    from scipy.stats import mannwhitneyu

    rng = random.Random(0)
    a = [round(rng.gauss(0, 1), 1) for _ in range(40)]  # rounded: ties on purpose
    b = [round(rng.gauss(0.5, 1), 1) for _ in range(30)]
    u_a_greater = mannwhitneyu(a, b, alternative="two-sided").statistic  # U of the first sample
    assert mann_whitney_auc(a, b) == pytest.approx(1 - u_a_greater / (len(a) * len(b)))
    assert mann_whitney_auc([1.0, 2.0], [3.0, 4.0]) == 1.0 and mann_whitney_auc([3.0], [1.0]) == 0.0


def test_statistic_thresholds():
    members = [1.0 + 0.01 * i for i in range(50)]
    assert likelihood_statistic(members, [m + 5 for m in members]).flagged
    same = likelihood_statistic(members, [m + 0.005 for m in members])
    assert not same.flagged and 0.4 < same.auc < 0.6
    # significant but tiny effect: not flagged because AUC < auc_threshold
    rng = random.Random(0)
    big_m = [rng.gauss(0, 1) for _ in range(20000)]
    big_h = [rng.gauss(0.1, 1) for _ in range(20000)]
    verdict = likelihood_statistic(big_m, big_h)
    assert verdict.z > 3.09 and verdict.auc < 0.6 and not verdict.flagged


def _train_lm(base: Path, out: Path, texts: list[str], steps: int) -> Path:
    """Non-private full fine-tune of the tiny Llama on ``texts`` (full batch, Adam)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    ids = torch.tensor([[tok.bos_token_id] + tok(t, add_special_tokens=False).input_ids for t in texts])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def lms(tmp_path_factory):
    rng = random.Random(5)
    members, heldout, other = _queries(rng, 40), _queries(rng, 40), _queries(rng, 40)
    base = write_tiny_llama(tmp_path_factory.mktemp("base"))
    memoriser = _train_lm(base, tmp_path_factory.mktemp("memoriser"), members, steps=60)
    control = _train_lm(base, tmp_path_factory.mktemp("control"), other, steps=60)  # same distribution, not M
    return members, heldout, memoriser, control


def test_likelihood_test_flags_a_model_trained_on_the_private_queries(lms):
    members, heldout, memoriser, control = lms
    caught = likelihood_test(members, heldout, model=str(memoriser), max_queries=None)
    assert caught["flagged"] and caught["auc"] > 0.9 and caught["mean_gap"] > 0
    clean = likelihood_test(members, heldout, model=str(control), max_queries=None)
    assert not clean["flagged"] and abs(clean["auc"] - 0.5) < 0.2


def test_heldout_copies_of_private_queries_are_dropped(lms):
    members, heldout, memoriser, _ = lms
    result = likelihood_test(members, heldout + [m.upper() for m in members[:10]], model=str(memoriser),
                             max_queries=None)
    assert result["heldout"]["n"] == len(heldout)


def test_per_token_losses_match_the_model_loss(lms):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    members, _, memoriser, _ = lms
    tok = AutoTokenizer.from_pretrained(memoriser)
    model = AutoModelForCausalLM.from_pretrained(memoriser)
    texts = [members[0], members[1] + " " + members[2]]  # different lengths: padding must not count
    ours = per_token_losses(model, tok, texts, batch_size=2)
    for text, value in zip(texts, ours):
        ids = torch.tensor([[tok.bos_token_id] + tok(text, add_special_tokens=False).input_ids])
        with torch.no_grad():
            assert value == pytest.approx(float(model(input_ids=ids, labels=ids).loss), rel=1e-4)


def test_cli_likelihood_on_beir_splits(lms, tmp_path):
    members, heldout, memoriser, _ = lms
    corpus = [{"_id": "d0", "title": "", "text": "a document"}]
    queries = [{"_id": f"q{i}", "text": t} for i, t in enumerate(members)] + \
              [{"_id": f"h{i}", "text": t} for i, t in enumerate(heldout)]
    root = write_beir_dir(tmp_path / "ds", corpus, queries,
                          {"train": [(f"q{i}", "d0", 1) for i in range(len(members))],
                           "test": [(f"h{i}", "d0", 1) for i in range(len(heldout))]})
    out_json = tmp_path / "lik.json"
    result = CliRunner().invoke(app, ["audit", "overlap", "--data", str(root), "--model", str(memoriser),
                                      "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out_json.read_text())["likelihood"]
    assert saved["flagged"] and saved["private"]["n"] == 40 and saved["heldout_split"] == "test"


def test_cli_json_says_first_that_it_holds_private_data_and_stays_out_of_run_directories(private, tmp_path):
    """The JSON holds the id and text of every private query found (a one-token query is found almost anywhere)
    and statistics of the private queries: its first key says so, the terminal shows counts only, and a file in
    a run directory (where the report that is meant to be shared reads) is refused unless asked for."""
    from privret.io import PRIVATE_DATA_KEY

    root, texts, _ = private
    corpus = tmp_path / "c.txt"
    _stream(corpus, [f"w1 {texts[4]} w2"])
    audit = ("audit", "overlap", "--data", str(root), "--corpus", str(corpus), "--no-likelihood")
    out = tmp_path / "overlap.json"
    result = run_cli(*audit, "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text().splitlines()[1].startswith(f'  "{PRIVATE_DATA_KEY}": "PRIVATE DATA')
    saved = json.loads(out.read_text())
    assert list(saved)[0] == PRIVATE_DATA_KEY and saved["overlap"]["queries"]["matches"][0]["text"] == texts[4]
    assert texts[4] not in result.stdout and "q4" not in result.stdout  # counts only on the terminal
    run = tmp_path / "run"
    (run / "zero_shot").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    (run / "zero_shot" / "metrics.json").write_text('{"ndcg@10": 0.5}')
    inside = run / "audits" / "overlap.json"
    refused = run_cli(*audit, "--json", str(inside))
    assert refused.returncode == 2 and "--allow-private-output-in-run" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not inside.exists()
    allowed = run_cli(*audit, "--json", str(inside), "--allow-private-output-in-run")
    assert allowed.returncode == 0 and list(json.loads(inside.read_text()))[0] == PRIVATE_DATA_KEY
