"""Canary exposure audit: exposure and ranks on hand-made scores, the epsilon lower bound, scoring, and a
tiny LM that memorised its canaries (caught) next to canaries it never saw (not caught)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import run_cli
from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.audit import canaries as construction
from privret.audit import canary_audit as audit
from privret.audit import canary_scoring as scoring
from privret.audit import canary_statistics as stats


WORDS = ("aspirin heart risk gene memory mice vitamin blood children sleep immune virus cancer drug trial cells "
         "protein brain diet exercise disease patients study effect increase reduce level high low treatment "
         "response adults what how does do why which the a of and in to is for with on").split()


def write_digit_llama(directory, *, seed: int = 0):
    """A 2-layer Llama whose word-level tokenizer splits numbers into single digits (so a 10-digit secret is
    10 tokens, as with SmolLM2's tokenizer); built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "</s>", "<s>"]
    vocab = {w: i for i, w in enumerate(specials + sorted(set(WORDS)) + list(".,:?-0123456789"))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(),
                                                     pre_tokenizers.Digits(individual_digits=True)])
    backend.decoder = decoders.WordPiece(prefix="##")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="</s>", bos_token="<s>")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=0, eos_token_id=2, bos_token_id=3)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # the generator trains the layers only; frozen (tied) embeddings of the default
        model.get_input_embeddings().weight.normal_(0.0, 0.5)  # 0.02 scale would cap every logit near 1
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def digit_llama(tmp_path_factory):
    return write_digit_llama(tmp_path_factory.mktemp("digit-llama"))


def toy_pairs(n_docs: int = 12) -> TrainingPairs:
    import random

    rng = random.Random(3)
    corpus = {f"d{i}": Document(f"d{i}", "", " ".join(rng.choice(WORDS) for _ in range(12))) for i in range(n_docs)}
    pairs = [QueryDocPair(" ".join(rng.choice(WORDS) for _ in range(4)), f"d{i}", query_id=f"q{i}")
             for i in range(n_docs)]
    return TrainingPairs(pairs, corpus)


# -- exposure on a hand-made ranking ----------------------------------------------------------------
def test_rank_and_exposure_on_a_hand_made_ranking():
    scores = [-5.0, -1.0, -3.0, -1.0, -9.0, -2.0, -4.0, -8.0]
    assert stats.secret_rank(scores, 4) == 8  # the worst of 8
    assert stats.secret_rank(scores, 2) == 4  # -1, -1, -2 are above it
    assert stats.secret_rank(scores, 1) == 2  # a tie counts against the secret
    assert stats.exposure(1, 8) == pytest.approx(3.0)
    assert stats.exposure(4, 8) == pytest.approx(1.0)
    assert stats.exposure(8, 8) == pytest.approx(0.0)
    # 100 candidates, secret 25th: log2(100) - log2(25) = 2 bits
    scores = [float(-i) for i in range(100)]
    assert stats.secret_rank(scores, 24) == 25 and stats.exposure(25, 100) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"rank must be in \[1, 100\], got 0"):
        stats.exposure(0, 100)


def test_clopper_pearson_matches_scipy():
    beta = pytest.importorskip("scipy.stats").beta
    for successes, trials in [(1, 10), (5, 10), (9, 10), (3, 7), (50, 100)]:
        assert stats.clopper_pearson_lower(successes, trials, 0.05) == pytest.approx(
            beta.ppf(0.05, successes, trials - successes + 1), rel=1e-9)
    assert stats.clopper_pearson_lower(0, 5, 0.05) == 0.0
    assert stats.clopper_pearson_lower(4, 4, 0.05) == pytest.approx(0.05 ** 0.25)


def test_epsilon_lower_bound_by_hand():
    # 3 trials, every canary of one kind at rank 1; 2 kinds x 3 thresholds -> alpha' = 0.05 / 6
    ranks = {"a": [1, 1, 1], "b": [40, 70, 12]}
    bound, threshold = stats.epsilon_lower_bound(ranks, 100, 1e-4, alpha=0.05)
    tpr = (0.05 / 6) ** (1 / 3)
    assert threshold == 1 and bound == pytest.approx(math.log((tpr - 1e-4) / 0.01))
    # chance-level ranks give nothing
    assert stats.epsilon_lower_bound({"a": [50, 20, 90], "b": [33, 61, 7]}, 100, 1e-4) == (0.0, None)
    # the complement direction: TPR near 1 at a threshold where FPR is large
    assert stats.epsilon_lower_bound_from_test(0.999, 0.5, 0.0) == pytest.approx(math.log(0.5 / 0.001))


# -- canaries and privacy units ----------------------------------------------------------------------
def test_canaries_and_their_privacy_units():
    pairs = toy_pairs()
    canaries = construction.make_canaries(pairs, trial=0, repetitions=(1, 10), n_candidates=100, seed=0)
    assert sorted({c.kind for c in canaries}) == sorted(construction.KINDS) and len(canaries) == 9  # 2 counts + controls
    for c in canaries:
        assert len(c.candidates) == 100 and c.candidates.count(c.secret) == 1 and len(set(c.candidates)) == 100
        assert all(len(s) == 10 and s.isdigit() for s in c.candidates)
        assert c.query().endswith(" " + c.secret)
    own = [c for c in canaries if c.kind == "own-document"][0]
    source = [p for p in pairs.pairs if p.query == own.prefix][0]
    assert own.document.id == source.doc_id
    assert construction.make_canaries(pairs, trial=1, repetitions=(1, 10), n_candidates=100, seed=0)[0].secret != \
        canaries[0].secret
    training = construction.insert_canaries(pairs, canaries)
    assert len(training.pairs) == len(pairs.pairs) + 3 * (1 + 10)
    # the canaries' own random documents are private (never public negatives), the corpus ones are not
    assert training.inline_doc_ids == {c.document.id for c in canaries if c.kind == "random-string"}
    # unit=query: the 10 copies of a canary are ONE unit; unit=pair: ten
    by_query = training.units("query")
    by_pair = training.units("pair")
    assert len(by_query) == len(pairs.units("query")) + 6
    assert len(by_pair) == len(training.pairs)
    ten = [c for c in canaries if c.repetitions == 10][0]
    rows = [i for i, p in enumerate(training.pairs) if p.query_id == ten.key]
    assert rows in by_query and len(rows) == 10


def test_queries_too_long_for_the_generator_are_replaced():
    """A canary whose secret would be cut off by the generator's query truncation could never be learnt."""
    pairs = toy_pairs(20)
    plain = construction.make_canaries(pairs, trial=0, repetitions=(1, 10), n_candidates=10, seed=0)
    banned = plain[0].prefix
    kept = construction.make_canaries(pairs, trial=0, repetitions=(1, 10), n_candidates=10, seed=0,
                           fits=lambda q: not q.startswith(banned))
    assert kept[0].prefix != banned and [c.prefix for c in kept[1:]] == [c.prefix for c in plain[1:]]
    assert [c.secret for c in kept] == [c.secret for c in plain]  # secrets do not depend on the tokenizer
    from privret.errors import InputError

    with pytest.raises(InputError, match="short enough"):
        construction.make_canaries(pairs, trial=0, repetitions=(1, 10), n_candidates=10, seed=0, fits=lambda q: False)


def test_fast_scoring_equals_the_loss_module(digit_llama):
    from privret.models.generator import load_generator

    gen = load_generator(str(digit_llama), trained_layers=1, bf16=False)
    doc = "aspirin can reduce the risk of heart disease"
    queries = [f"aspirin heart risk {s}" for s in ("0123456789", "9876543210", "5555555555", "0123456780")]
    slow = scoring.log_likelihoods(gen, doc, queries)
    fast = scoring.fast_log_likelihoods(gen, doc, queries, batch_size=3)
    assert fast == pytest.approx(slow, rel=1e-4, abs=1e-4)
    # and both are the plain sum of the model's log-probabilities of the query tokens (EOS included)
    ex = gen.example(doc, queries[1])
    ids = torch.tensor([ex.prompt_ids + ex.target_ids])
    with torch.no_grad():
        logp = torch.log_softmax(gen.model(input_ids=ids).logits[0].float(), dim=-1)
    n = len(ex.prompt_ids)
    direct = sum(float(logp[n - 1 + j, t]) for j, t in enumerate(ex.target_ids))
    assert fast[1] == pytest.approx(direct, rel=1e-4)


# -- the audit catches a memorising model and not a model that never saw the canary -----------------
@pytest.mark.slow
def test_memorised_canaries_are_caught_unseen_ones_are_not(digit_llama, tmp_path):
    cfg = audit.CanaryAuditConfig(epsilons=[math.inf], trials=2, repetitions=[50], candidates=100, samples=4,
                              seed=0,
                              unit="pair", generator={"model": str(digit_llama), "trainable": "full",
                                         "trained_layers": None, "epochs": 12, "batch_size": 32,
                                         "learning_rate": 0.01, "max_doc_tokens": 32, "physical_batch": 64,
                                         "bf16": False})
    report = audit.run_canary_audit(toy_pairs(), tmp_path / "audit", cfg, data_hash="toy")
    (result,) = report["results"]
    assert report["generator"]["model"] == str(digit_llama) and report["generator"]["unit"] == "pair"
    assert "epsilon" not in report["generator"]
    rows = {r["repetitions"]: r for r in result["rows"]}
    inserted = [c for c in result["canaries"] if c["repetitions"] == 50]
    controls = [c for c in result["canaries"] if c["repetitions"] == 0]
    assert len(inserted) == 6 and len(controls) == 6
    # memorised: the secret is the most likely of 100 candidates, maximal exposure, and it is sampled
    assert all(c["rank"] == 1 for c in inserted), [c["rank"] for c in inserted]
    assert rows[50]["exposure_mean"] == pytest.approx(math.log2(100))
    assert rows[50]["leaked_fraction"] >= 0.5
    assert rows[50]["epsilon_lower_bound"] > 1.0  # the attack proves this model is not private
    # never inserted: ranked like chance, never extracted
    assert rows[0]["extracted_fraction"] == 0.0 and rows[0]["leaked_fraction"] == 0.0
    assert rows[0]["exposure_mean"] < 3.0 and rows[0]["epsilon_lower_bound"] is None
    # no private query text in the output
    text = (tmp_path / "audit" / "canaries.json").read_text()
    assert all(p.query not in text for p in toy_pairs().pairs)
    # a re-run reuses the finished trials; other settings in the same directory are refused
    again = audit.run_canary_audit(toy_pairs(), tmp_path / "audit", cfg, data_hash="toy")
    assert again["results"][0]["canaries"] == result["canaries"]
    from privret.errors import InputError

    with pytest.raises(InputError, match="other settings"):
        audit.run_canary_audit(toy_pairs(), tmp_path / "audit", cfg.model_copy(update={"trials": 3}), data_hash="toy")


def test_audit_settings_match_directories_written_before_the_generator_was_typed():
    """Audits written by a privret older than the typed generator settings kept the generator's fields as given
    (unit included) under ``audit``; they must still resume, and only with the same settings."""
    cfg = audit.CanaryAuditConfig(trials=2, unit="pair", generator={"model": "tiny", "learning_rate": 0.01})
    current = audit.audit_settings(cfg, "data", 10)
    assert "generator" not in current["audit"] and current["generator"]["unit"] == "pair"
    old_audit = {**current["audit"], "generator": {"model": "tiny", "unit": "pair", "learning_rate": 0.01}}
    assert audit.same_settings({**current, "audit": old_audit}, current)
    assert audit.same_settings(current, current)
    for changed in (cfg.model_copy(update={"unit": "query"}), cfg.model_copy(update={"trials": 3}),
                    cfg.model_copy(update={"generator": cfg.generator.model_copy(update={"learning_rate": 0.02})})):
        assert not audit.same_settings({**current, "audit": old_audit}, audit.audit_settings(changed, "data", 10))
    assert not audit.same_settings(current, audit.audit_settings(cfg, "other data", 10))
    # trial t trains with seed generator.seed + t, at the unit of the audit
    assert cfg.generator_config(8.0, trial=1).seed == 1 and cfg.generator_config(8.0).unit == "pair"


def test_cli_rejects_bad_lists(tmp_path, toy_beir):
    result = run_cli("audit", "canaries", "--data", str(toy_beir), "--out", str(tmp_path / "a"), "--repetitions",
                     "1,abc")
    assert result.returncode == 2 and "--repetitions" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()
    for flag, value in (("--epochs", "-1"), ("--epsilon", "-1"), ("--unit", "group")):
        result = run_cli("audit", "canaries", "--data", str(toy_beir), "--out", str(tmp_path / "a"), flag, value)
        assert result.returncode == 2 and f"'{flag}'" in result.stderr, result.stderr
    config = tmp_path / "audit.yaml"
    for text, field in (("candidates: 1\n", "candidates"), ("generator:\n  lora_rank: 0\n", "generator.lora_rank"),
                        ("candidate: 10\n", "candidate")):
        config.write_text(text)
        result = run_cli("audit", "canaries", "--data", str(toy_beir), "--out", str(tmp_path / "a"), "--config",
                         str(config))
        assert result.returncode == 2 and f"{config}, field '{field}'" in result.stderr, result.stderr
    assert not (tmp_path / "a").exists()
    # a generator that cannot be loaded is found before the audit's settings are written
    result = run_cli("audit", "canaries", "--data", str(toy_beir), "--out", str(tmp_path / "a"),
                     "--model", str(tmp_path / "no-such-model"))
    assert result.returncode == 2 and "model directory not found" in result.stderr, result.stderr
    assert not (tmp_path / "a" / "settings.json").exists()


def test_cli_audits_the_generator_train_dp_makes(tmp_path, toy_beir, monkeypatch):
    """With no generator setting given, the audit fine-tunes what `privret generator train-dp` does; the flags and
    the --config file's `generator` section set the audited fine-tune, an --epsilon the one epsilon audited."""
    from privret.settings.training import GeneratorSettings

    seen = {}

    def stop(training, out_dir, cfg, **_):
        seen["cfg"] = cfg
        raise SystemExit(0)

    monkeypatch.setattr("privret.audit.canary_audit.run_canary_audit", stop)
    run_cli("audit", "canaries", "--data", str(toy_beir), "--out", str(tmp_path / "a"))
    assert seen["cfg"].generator == GeneratorSettings() and seen["cfg"].epsilons == [math.inf, 16.0]
    config = tmp_path / "audit.yaml"
    config.write_text("candidates: 50\ngenerator:\n  lora_rank: 16\n  learning_rate: 1.0e-3\n")
    run_cli("audit", "canaries", "--data", str(toy_beir), "--out", str(tmp_path / "a"), "--config", str(config),
            "--lr", "2e-3", "--epsilon", "16", "--seed", "4")
    cfg = seen["cfg"]
    assert (cfg.candidates, cfg.generator.lora_rank, cfg.generator.learning_rate, cfg.epsilons) == (50, 16, 2e-3, [16])
    assert cfg.seed == cfg.generator.seed == 4


# -- what the audit writes holds private data ---------------------------------------------------------
def _run_directory(root):
    """What ``privret report`` reads as a run: a config and a row's metrics."""
    (root / "zero_shot").mkdir(parents=True)
    (root / "config.json").write_text("{}")
    (root / "zero_shot" / "metrics.json").write_text('{"ndcg@10": 0.5}')
    return root


def test_the_audit_says_first_that_it_holds_private_data_and_stays_out_of_run_directories(tmp_path, monkeypatch):
    """Per canary, canaries.json (and its trial's result.json) holds a private query's id, that query's own document
    (a private pair), the likelihood of the private query with the secret; canaries.json and settings.json hold
    the log's pair count. Each file says so in its first key. An audit directory inside a run directory, where the
    report that is meant to be shared reads it, is refused before anything is written, unless asked for."""
    import json

    from privret.errors import InputError
    from privret.io import PRIVATE_DATA_KEY
    from privret.privacy.ledger import PrivacyLedger

    ledger = PrivacyLedger(mechanism="none", epsilon=math.inf, delta=0.0, noise_multiplier=0.0, sample_rate=0.5,
                           steps=2, planned_steps=2, accountant="none", unit="query", n_units=15, n_pairs=15,
                           clip_norm=math.inf, model="tiny", trainable="all", data_hash="toy")

    def trained(training, out_dir, cfg, **_):
        ledger.save(out_dir)
        (out_dir / "generator.json").write_text("{}")

    def scored(generator, canaries, cfg):
        return [{"trial": c.trial, "kind": c.kind, "repetitions": c.repetitions, "secret": c.secret,
                 "document_id": c.document.id, "source_query_id": c.source_query_id, "log_likelihood": -3.0,
                 "rank": 1, "exposure": math.log2(cfg.candidates), "leaked": False, "samples": 1} for c in canaries]

    monkeypatch.setattr(audit, "_query_fits", lambda model, cap: lambda query: True)
    monkeypatch.setattr(audit, "train_generator", trained)
    monkeypatch.setattr(audit, "load_trained_generator", lambda directory: None)
    monkeypatch.setattr(audit, "_trial_result", scored)
    cfg = audit.CanaryAuditConfig(epsilons=[math.inf], trials=1, repetitions=[2], candidates=10, samples=1,
                                  generator={"model": "tiny"})
    run = _run_directory(tmp_path / "run")
    with pytest.raises(InputError, match="--allow-private-output-in-run") as refused:
        audit.run_canary_audit(toy_pairs(), run / "canaries", cfg, data_hash="toy")
    assert refused.value.path is not None and not (run / "canaries").exists()

    audit.run_canary_audit(toy_pairs(), tmp_path / "audit", cfg, data_hash="toy")
    for name in ("canaries.json", "settings.json", "eps-inf/trial-0/result.json"):
        text = (tmp_path / "audit" / name).read_text()
        assert text.splitlines()[1].startswith(f'  "{PRIVATE_DATA_KEY}": "PRIVATE DATA'), name
        assert list(json.loads(text))[0] == PRIVATE_DATA_KEY
    audit.run_canary_audit(toy_pairs(), tmp_path / "audit", cfg, data_hash="toy")  # its own settings: resumed
    audit.run_canary_audit(toy_pairs(), run / "canaries", cfg, data_hash="toy", allow_private_output_in_run=True)
    assert (run / "canaries" / "canaries.json").is_file()


def test_cli_refuses_an_audit_directory_in_a_run_directory(tmp_path, toy_beir, monkeypatch):
    run = _run_directory(tmp_path / "run")
    result = run_cli("audit", "canaries", "--data", str(toy_beir), "--out", str(run / "canaries"))
    assert result.returncode == 2 and "--allow-private-output-in-run" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (run / "canaries").exists()
    monkeypatch.setenv("COLUMNS", "200")  # --help's options table, wide enough for the whole flag
    assert "--allow-private-output-in-run" in run_cli("audit", "canaries", "--help").stdout
