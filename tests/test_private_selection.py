"""DP choice of a retriever on the private log (privret.privacy.private_selection, privret.train.private_selection)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import run_cli
from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.models.encoder import load_encoder
from privret.models.wise_ft import interpolate
from privret.privacy import budget
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.private_selection import MECHANISM, choose, selection_ledger, selection_probabilities
from privret.retrieval.search import search
from privret.train.private_selection import (
    SELECTION_FILE,
    Candidate,
    build_candidates,
    public_corpus,
    select_retriever,
    unit_queries,
    unit_scores,
)
from privret.settings.training import PrivateSelectionConfig


class SeededUniforms:
    """The interface of SecureRandom that choose() uses, from a seeded generator (reproducible tests)."""

    def __init__(self, seed: int):
        self.gen = np.random.default_rng(seed)

    def uniform(self, n: int) -> torch.Tensor:
        return torch.from_numpy(1.0 - self.gen.random(n))  # (0, 1]


def test_the_sampler_draws_the_exponential_mechanism_distribution():
    scores = np.array([[0.9, 0.5, 0.1, 0.6], [0.7, 0.8, 0.0, 0.6], [1.0, 0.2, 0.3, 0.6]])
    epsilon = 1.5
    # by hand: U = (2.6, 1.5, 0.4, 1.8), p_j proportional to exp(epsilon U_j / 2)
    weights = np.exp(epsilon * np.array([2.6, 1.5, 0.4, 1.8]) / 2)
    np.testing.assert_allclose(selection_probabilities(scores, epsilon), weights / weights.sum())
    rng, draws = SeededUniforms(0), 20_000
    counts = np.bincount([choose(scores, epsilon, rng=rng) for _ in range(draws)], minlength=4)
    p = weights / weights.sum()
    assert np.all(np.abs(counts / draws - p) < 4 * np.sqrt(p * (1 - p) / draws))


@settings(deadline=None)
@given(st.integers(2, 5), st.integers(1, 6), st.floats(0.1, 4.0), st.integers(0, 10_000))
def test_a_neighbouring_log_moves_no_probability_by_more_than_e_to_the_epsilon(k, n, epsilon, seed):
    """Add, remove or replace one unit (a row of scores in [0, 1]); the worst case for candidate j raises its
    score and lowers every other one."""
    rng = np.random.default_rng(seed)
    scores = rng.random((n, k))
    bound = math.exp(epsilon) * (1 + 1e-9)
    for j in range(k):
        worst = np.zeros(k)
        worst[j] = 1.0
        neighbours = [scores[1:], np.vstack([scores, worst]), np.vstack([scores[1:], worst]),
                      np.vstack([scores[1:], rng.random(k)])]
        base = selection_probabilities(scores, epsilon)
        for other in neighbours:
            ratio = selection_probabilities(other, epsilon) / base
            assert ratio.max() <= bound and 1 / ratio.min() <= bound


def test_replacing_one_unit_can_use_the_whole_epsilon():
    """The factor 2 of the mechanism is needed: a replacement that lifts one candidate and lowers the others
    moves its probability by nearly e^epsilon (half as much would be the add/remove-only bound)."""
    scores = np.array([[0.0, 1.0, 1.0, 1.0]] * 50)
    replaced = np.vstack([scores[1:], [1.0, 0.0, 0.0, 0.0]])
    ratio = selection_probabilities(replaced, 1.0)[0] / selection_probabilities(scores, 1.0)[0]
    assert math.exp(0.9) < ratio <= math.exp(1.0)


def test_scores_outside_the_unit_interval_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        choose(np.array([[0.5, 1.2]]), 1.0, rng=SeededUniforms(0))


def test_the_ledger_is_pure_dp_and_refuses_an_infinite_epsilon():
    ledger = selection_ledger(epsilon=0.5, n_units=807, unit="query", n_pairs=919, data_hash="h", dataset_id="d")
    assert (ledger.mechanism, ledger.epsilon, ledger.delta, ledger.noise_multiplier) == (MECHANISM, 0.5, 0.0, 4.0)
    assert not budget.Release.from_ledger(ledger, release_id="r", status="final").gaussian
    with pytest.raises(InputError, match="positive finite"):
        selection_ledger(epsilon=math.inf, n_units=1, unit="query", n_pairs=1, data_hash="h", dataset_id="d")


def test_interpolation_is_the_weighted_mean_of_every_weight(tiny_bert_dir):
    base = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    tuned = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    with torch.no_grad():
        for p in tuned.parameters():
            p.add_(torch.randn_like(p))
    b, t = base.state_dict(), tuned.state_dict()
    for alpha in (0.0, 0.25, 1.0):
        mixed = interpolate(base, tuned, alpha).state_dict()
        for key, value in mixed.items():
            expected = (1 - alpha) * b[key] + alpha * t[key] if value.is_floating_point() else b[key]
            torch.testing.assert_close(value, expected)
    assert torch.equal(next(iter(base.state_dict().values())), next(iter(b.values())))  # base left untouched


def test_interpolation_refuses_another_architecture(tiny_bert_dir):
    base = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    with pytest.raises(InputError, match="not a fine-tune of the base model"):
        interpolate(base, torch.nn.Linear(2, 2), 0.5, name="other")


DOCS = {d: Document(d, "", text) for d, text in [
    ("d1", "aspirin can reduce the risk of heart disease"), ("d2", "mice with the gene show low memory"),
    ("d3", "vitamin levels in blood of children"), ("d4", "sleep and exercise increase the immune response"),
    ("d5", "the drug trial in patients with cancer")]}


def _log(extra: list[QueryDocPair] = (), inline: frozenset = frozenset()) -> TrainingPairs:
    rows = [QueryDocPair("aspirin heart risk", "d1", "q1", "u1"), QueryDocPair("gene memory mice", "d2", "q2", "u1"),
            QueryDocPair("vitamin blood children", "d3", "q3", "u2"),
            QueryDocPair("vitamin blood children", "d4", "q3", "u2"),
            QueryDocPair("cancer drug trial", "d5", "q4", "u3")]
    return TrainingPairs(pairs=rows + list(extra), corpus=dict(DOCS), inline_doc_ids=inline)


def test_units_ask_one_query_per_distinct_text_with_their_documents_relevant():
    texts, qrels, per_unit = unit_queries(_log(), "user")
    assert [[texts[q] for q in ids] for ids in per_unit] == [["aspirin heart risk", "gene memory mice"],
                                                              ["vitamin blood children"], ["cancer drug trial"]]
    assert [qrels[q] for q in per_unit[1]] == [{"d3": 1, "d4": 1}]
    assert len(unit_queries(_log(), "pair")[2]) == 5 and len(unit_queries(_log(), "query")[2]) == 4


def test_a_unit_scores_the_mean_ndcg_of_its_queries_by_hand(tiny_bert_dir):
    model = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    log = _log()
    run = search(model, DOCS, {"a": "aspirin heart risk", "g": "gene memory mice", "v": "vitamin blood children"}, k=10)

    def rank(query, doc):
        return sorted(run[query], key=lambda d: -run[query][d]).index(doc) + 1

    one = [1 / math.log2(1 + rank(q, d)) for q, d in (("a", "d1"), ("g", "d2"))]
    ranks = sorted([rank("v", "d3"), rank("v", "d4")])
    two = sum(1 / math.log2(1 + r) for r in ranks) / (1 + 1 / math.log2(3))
    scores = unit_scores(model, log, "user", DOCS)
    assert scores[0] == pytest.approx(np.mean(one)) and scores[1] == pytest.approx(two)


def test_a_units_score_depends_on_its_own_rows_only(tiny_bert_dir):
    """The sensitivity bound needs it: adding a unit (here with a private inline document that copies another
    unit's query, so that it would outrank that unit's document) leaves every other unit's score as it was."""
    model = load_encoder(str(tiny_bert_dir), max_seq_length=32)
    before = unit_scores(model, _log(), "query", DOCS)
    inline = Document("doc-private", "", "aspirin heart risk")
    log = _log([QueryDocPair("a new private query", "doc-private", "q9")], frozenset({"doc-private"}))
    log.corpus["doc-private"] = inline
    after = unit_scores(model, log, "query", public_corpus(log))
    np.testing.assert_array_equal(after[:-1], before)
    assert after[-1] == 0.0  # its own document is not public, so it is never found


def _candidate(base_dir, out, *, epsilon: float = 7.0, noise: float = 0.0, part=None):
    model = load_encoder(str(base_dir), max_seq_length=32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise * torch.randn_like(p))
    model.save(str(out))
    PrivacyLedger(mechanism="dp-sgd", epsilon=epsilon, delta=1e-3, noise_multiplier=1.0, sample_rate=0.1, steps=10,
                  planned_steps=10, accountant="prv", unit="query", n_units=4, n_pairs=5, clip_norm=1.0,
                  model="gen", trainable="lora", data_hash="h", dataset_id="d", part=part).save(out)
    return out


def test_select_retriever_writes_the_choice_with_a_composed_ledger_and_no_scores(tiny_bert_dir, tmp_path):
    tuned = _candidate(tiny_bert_dir, tmp_path / "tuned", noise=0.05)
    cfg = PrivateSelectionConfig(epsilon=0.5, base=str(tiny_bert_dir), candidates=[str(tuned)], weights=[0.5, 1],
                                 max_seq_length=32)
    assert [c.name for c in build_candidates(cfg)] == ["base", f"{tuned}@0.5", str(tuned)]
    record = select_retriever(_log(), tmp_path / "chosen", cfg, data_hash="h", dataset_id="d")
    out = tmp_path / "chosen"
    assert record == json.loads((out / SELECTION_FILE).read_text())
    assert set(record) == {"mechanism", "epsilon", "unit", "n_units", "part", "base", "candidates", "chosen",
                           "chosen_source", "chosen_weight"}  # never the candidates' scores
    assert record["chosen"] in record["candidates"] and record["n_units"] == 4 and record["part"] is None
    ledger = PrivacyLedger.load(out)
    assert ledger.mechanism == "dp-sgd + exponential-mechanism" and ledger.epsilon == pytest.approx(7.5)
    assert ledger.delta == pytest.approx(1e-3)
    (release,) = [r for r in budget.releases("d") if r.mechanism == MECHANISM]
    assert release.epsilon == 0.5 and release.status == "final"
    assert "exponential mechanism" in (out / "README.md").read_text()
    chosen = Candidate(None if record["chosen"] == "base" else str(tuned), record["chosen_weight"])
    from privret.train.private_selection import materialise
    expected = materialise(chosen, cfg).state_dict()
    for key, value in load_encoder(str(out), max_seq_length=32).state_dict().items():
        torch.testing.assert_close(value, expected[key])


def test_with_a_large_epsilon_the_best_candidate_is_chosen(tiny_bert_dir, tmp_path, monkeypatch):
    """Scores computed, then the argmax: a candidate whose weights are scrambled ranks worse than the base on
    this log, and at epsilon 1e4 the base wins (the two candidates' scores are checked to differ)."""
    from privret.train import private_selection

    seen = []
    real = private_selection.unit_scores
    monkeypatch.setattr(private_selection, "unit_scores", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    bad = _candidate(tiny_bert_dir, tmp_path / "bad", noise=3.0)
    cfg = PrivateSelectionConfig(epsilon=1e4, base=str(tiny_bert_dir), candidates=[str(bad)], weights=[1],
                                 max_seq_length=32)
    record = select_retriever(_log(), tmp_path / "chosen", cfg, data_hash="h", dataset_id="d",
                              budget=budget.BudgetPolicy(allow_over=True))  # 1e4 is past the default cap
    totals = [s.sum() for s in seen]
    assert totals[0] != totals[1]
    assert record["chosen"] == ["base", str(bad)][int(np.argmax(totals))]


def test_a_held_out_choice_scores_the_held_out_units_only_and_costs_the_larger_epsilon(tiny_bert_dir, tmp_path,
                                                                                       monkeypatch):
    """With ``hold_out`` only the held-out units are scored, and a candidate trained on the fit part of the same
    partition composes with the choice in parallel: max(7, 0.5), in the ledger and in the registry."""
    from privret.privacy.hold_out import FIT, HELDOUT, UnitPartition
    from privret.train import private_selection

    partition = UnitPartition(salt="c", heldout_fraction=0.5)
    fit, held = partition.split(_log(), "query")
    assert fit.pairs and held.pairs  # this salt splits the 4 units both ways
    scored = []
    real = private_selection.unit_scores
    monkeypatch.setattr(private_selection, "unit_scores",
                        lambda model, pairs, *a: scored.append({p.query for p in pairs.pairs}) or real(model, pairs, *a))
    tuned = _candidate(tiny_bert_dir, tmp_path / "tuned", noise=0.05, part=partition.part(FIT))
    cfg = PrivateSelectionConfig(epsilon=0.5, base=str(tiny_bert_dir), candidates=[str(tuned)], weights=[1],
                                 max_seq_length=32, hold_out=partition)
    record = select_retriever(_log(), tmp_path / "chosen", cfg, data_hash="h", dataset_id="d")
    assert scored == [{p.query for p in held.pairs}] * 2
    assert record["n_units"] == len(held.units("query")) and record["part"]["side"] == HELDOUT
    ledger = PrivacyLedger.load(tmp_path / "chosen")
    assert (ledger.epsilon, ledger.delta) == (7.0, 1e-3) and "parallel" in ledger.composition
    (release,) = [r for r in budget.releases("d") if r.mechanism == MECHANISM]
    assert release.part == partition.part(HELDOUT)
    # the same candidate chosen on the whole log: the two add
    whole = select_retriever(_log(), tmp_path / "whole", cfg.model_copy(update={"hold_out": None}), data_hash="h",
                             dataset_id="d2")
    assert whole["n_units"] == 4 and PrivacyLedger.load(tmp_path / "whole").epsilon == 7.5


def test_cli_select_refuses_bad_weights_naming_the_flag(toy_beir, tmp_path):
    result = run_cli("retriever", "select", "--data", str(toy_beir), "--candidate", str(tmp_path / "x"),
                     "--weights", "0.5,2", "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "--weights" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_cli_interpolate_writes_the_weighted_model_with_the_models_ledger(tiny_bert_dir, tmp_path):
    """Post-processing with a fixed weight: the output's ledger is the tuned model's, unchanged (no new
    release), and its weights are (1 - w) base + w tuned."""
    tuned = _candidate(tiny_bert_dir, tmp_path / "tuned", noise=0.5)
    result = run_cli("retriever", "interpolate", "--model", str(tuned), "--weight", "0.25", "--base",
                     str(tiny_bert_dir), "--out", str(tmp_path / "mixed"))
    assert result.returncode == 0, result.stderr
    out = tmp_path / "mixed"
    assert PrivacyLedger.load(out) == PrivacyLedger.load(tuned)
    assert json.loads((out / "interpolation.json").read_text())["weight"] == 0.25
    assert "WiSE-FT" in (out / "README.md").read_text()
    base, t = (load_encoder(str(p), max_seq_length=32).state_dict() for p in (tiny_bert_dir, tuned))
    for key, value in load_encoder(str(out), max_seq_length=32).state_dict().items():
        expected = 0.75 * base[key] + 0.25 * t[key] if value.is_floating_point() else base[key]
        torch.testing.assert_close(value, expected)


@pytest.mark.parametrize("weight, flag", [("0", "--weight"), ("1.5", "--weight"), ("0.5", "--model")])
def test_cli_interpolate_refuses_a_bad_weight_or_a_model_without_ledger(tiny_bert_dir, tmp_path, weight, flag):
    tuned = _candidate(tiny_bert_dir, tmp_path / "tuned")
    model = tiny_bert_dir if flag == "--model" else tuned  # the tiny base has no privret ledger
    result = run_cli("retriever", "interpolate", "--model", str(model), "--weight", weight, "--base",
                     str(tiny_bert_dir), "--out", str(tmp_path / "mixed"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert (flag in result.stderr) if flag == "--weight" else ("privacy_ledger.json" in result.stderr)
    assert not (tmp_path / "mixed").exists()


@pytest.mark.parametrize("flags, named", [(["--hold-out", "0"], "--hold-out"), (["--hold-out-salt", "s"],
                                                                                 "--hold-out-salt")])
def test_cli_select_refuses_a_bad_hold_out_naming_the_flag(toy_beir, tmp_path, flags, named):
    result = run_cli("retriever", "select", "--data", str(toy_beir), "--candidate", str(tmp_path / "x"), *flags,
                     "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and named in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_cli_select_with_hold_out_prints_how_the_ledger_composed(toy_beir, tiny_bert_dir, tmp_path):
    """The printed composition keeps its [bracketed] parts (rich would read them as markup and drop them)."""
    from helpers import TOY_TRAIN
    from privret.privacy.hold_out import FIT, UnitPartition

    texts = [text for _, text, _ in TOY_TRAIN]
    salt = next(s for s in map(str, range(100))  # a salt that splits the toy log's units both ways
                if 0 < sum(UnitPartition(salt=s, heldout_fraction=0.5).side_of(f"query\x00{t}") == "heldout"
                           for t in texts) < len(texts))
    tuned = _candidate(tiny_bert_dir, tmp_path / "tuned", part=UnitPartition(salt=salt, heldout_fraction=0.5).part(FIT))
    result = run_cli("retriever", "select", "--data", str(toy_beir), "--candidate", str(tuned), "--base",
                     str(tiny_bert_dir), "--epsilon", "1", "--weights", "1", "--hold-out", "0.5", "--hold-out-salt",
                     salt, "--out", str(tmp_path / "o"))
    assert result.returncode == 0, result.stderr
    assert "epsilon 7, delta 0.001" in " ".join(result.stdout.split())
    assert "fit [dp-sgd] and heldout [exponential-mechanism]" in " ".join(result.stdout.split())


def test_unstamped_copies_of_a_ledger_count_once_per_file(tmp_path):
    """Two candidates whose ledgers are equal but unstamped (written before releases were stamped) may be two runs
    with the same plan: both count; one file named by two candidates (two weights) counts once."""
    import json

    from privret.train.private_selection import Candidate, composed_ledger

    ledger = PrivacyLedger(mechanism="dp-sgd", epsilon=3.0, delta=1e-3, noise_multiplier=1.0, sample_rate=0.1,
                           steps=10, planned_steps=10, accountant="prv", unit="query", n_units=4, n_pairs=5,
                           clip_norm=1.0, model="gen", trainable="lora", data_hash="h", dataset_id="d")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        text = json.loads(ledger.model_dump_json())
        (tmp_path / name / "privacy_ledger.json").write_text(json.dumps({**text, "created_at": ""}))
    choice = ledger.model_copy(update={"mechanism": "exponential-mechanism", "epsilon": 1.0, "delta": 0.0})
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    twice = composed_ledger([Candidate(a, 1.0), Candidate(b, 1.0)], choice)
    assert [p.epsilon for p in twice.parts] == [3.0, 3.0, 1.0]
    once = composed_ledger([Candidate(a, 0.5), Candidate(a, 1.0)], choice)
    assert [p.epsilon for p in once.parts] == [3.0, 1.0]
