"""The generator and synthesis commands end to end on the tiny fixtures: `generator train` fine-tunes without DP
(on the private log: an epsilon inf ledger; on public pairs: an epsilon 0 ledger), `generator train-dp` with DP,
`synth generate --model` samples any of them, `audit canaries` audits one; the rarely changed settings come from
--config."""

from __future__ import annotations

import json
import math

import pytest

from helpers import run_cli
from privret.privacy.ledger import PrivacyLedger


def _tiny_fine_tune(tmp_path):
    """A --config file that keeps the tiny Llama's fine-tune small, and the flags of a one-epoch run."""
    config = tmp_path / "generator.yaml"
    config.write_text("trained_layers: 1\nlora_rank: 4\nbf16: false\n")
    return ["--config", str(config), "--batch-size", "2", "--epochs", "1"]


def test_generator_train_on_a_private_log_needs_non_private(toy_beir, tmp_path):
    """generator train fine-tunes without DP: on a private log it runs only with --non-private (an old DP call of
    generator train, which had no DP flag, must not become a non-private fine-tune unnoticed); --non-private with
    public pairs is refused too. One line naming the flag, exit 2, nothing written."""
    refused = run_cli("generator", "train", "--data", str(toy_beir), "--out", str(tmp_path / "g"))
    assert refused.returncode == 2 and "--non-private" in refused.stderr and "train-dp" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "g").exists()
    pairs = tmp_path / "public.jsonl"
    pairs.write_text(json.dumps({"query": "q", "doc": "d"}) + "\n")
    refused = run_cli("generator", "train", "--non-private", "--public-pairs", str(pairs), "--out", str(tmp_path / "g"))
    assert refused.returncode == 2 and "--non-private" in refused.stderr and not (tmp_path / "g").exists()


def test_generator_train_without_dp_then_synth_generate(tiny_llama_dir, toy_beir, tmp_path):
    fine_tune = _tiny_fine_tune(tmp_path)
    done = run_cli("generator", "train", "--non-private", "--data", str(toy_beir), "--model", str(tiny_llama_dir),
                   "--out", str(tmp_path / "ceiling"), *fine_tune)
    assert done.returncode == 0, done.stderr
    ceiling = PrivacyLedger.load(tmp_path / "ceiling")
    assert (ceiling.mechanism, ceiling.epsilon, ceiling.steps) == ("none", math.inf, ceiling.planned_steps)
    pairs = tmp_path / "public.jsonl"
    pairs.write_text("".join(json.dumps({"query": q, "doc": d}) + "\n" for q, d in
                             (("aspirin heart risk", "aspirin and the heart"), ("sleep memory", "sleep and memory"))))
    done = run_cli("generator", "train", "--public-pairs", str(pairs), "--model", str(tiny_llama_dir), "--out",
                   str(tmp_path / "public"), *fine_tune)
    assert done.returncode == 0, done.stderr
    assert PrivacyLedger.load(tmp_path / "public").epsilon == 0
    done = run_cli("synth", "generate", "--model", str(tmp_path / "public"), "--data", str(toy_beir), "--out",
                   str(tmp_path / "synthetic"), "--sample", "3")
    assert done.returncode == 0, done.stderr
    assert PrivacyLedger.load(tmp_path / "synthetic").epsilon == 0 and "synthetic queries for 3 documents" in done.stdout
    # the rarely changed generation fields from --config, a flag over the file's field; a bad field names the file
    settings = tmp_path / "generate.yaml"
    settings.write_text("first_sentence: false\ndrop_degenerate: false\nmax_new_tokens: 6\nnum_queries: 3\n")
    done = run_cli("synth", "generate", "--model", str(tmp_path / "public"), "--data", str(toy_beir), "--out",
                   str(tmp_path / "configured"), "--sample", "2", "--num-queries", "2", "--config", str(settings))
    assert done.returncode == 0, done.stderr
    config = json.loads((tmp_path / "configured" / "manifest.json").read_text())["config"]
    assert (config["first_sentence"], config["drop_degenerate"], config["max_new_tokens"], config["num_queries"]) == (
        False, False, 6, 2)
    settings.write_text("max_new_tokns: 6\n")
    done = run_cli("synth", "generate", "--model", str(tmp_path / "public"), "--data", str(toy_beir), "--out",
                   str(tmp_path / "refused"), "--config", str(settings))
    assert done.returncode == 2 and str(settings) in done.stderr and "max_new_tokns" in done.stderr
    assert not (tmp_path / "refused").exists()


def test_generator_train_dp_writes_a_dp_ledger(tiny_llama_dir, toy_beir, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVRET_BUDGET_DIR", str(tmp_path / "budget"))
    done = run_cli("generator", "train-dp", "--data", str(toy_beir), "--model", str(tiny_llama_dir), "--epsilon", "4",
                   "--accountant", "rdp", "--out", str(tmp_path / "dp"), *_tiny_fine_tune(tmp_path))
    assert done.returncode == 0, done.stderr
    ledger = PrivacyLedger.load(tmp_path / "dp")
    assert ledger.mechanism == "dp-sgd" and ledger.epsilon <= 4 and ledger.accountant == "rdp"
    assert ledger.trainable == "lora:top1"


@pytest.mark.slow
def test_audit_canaries_on_the_tiny_llama(tiny_llama_dir, tmp_path, monkeypatch):
    """One epsilon by flag, the generator's and the audit's rarely changed fields from --config: the audit trains
    and scores one trial on 20 pairs of the bundled demo log and writes canaries.json at that epsilon."""
    from privret.data.demo import demo_dataset_dir

    monkeypatch.setenv("PRIVRET_BUDGET_DIR", str(tmp_path / "budget"))
    config = tmp_path / "audit.yaml"
    config.write_text("candidates: 10\ngenerator:\n  trained_layers: 1\n  lora_rank: 4\n  bf16: false\n")
    done = run_cli("audit", "canaries", "--data", str(demo_dataset_dir()), "--out", str(tmp_path / "audit"), "--model",
                   str(tiny_llama_dir), "--epsilon", "4", "--trials", "1", "--repetitions", "1,5", "--samples", "1",
                   "--subsample", "20", "--epochs", "1", "--batch-size", "8", "--config", str(config))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "audit" / "canaries.json").read_text())
    assert {row["epsilon"] for row in report["results"]} == {"4"} and report["candidates"] == 10
    assert (report["generator"]["trained_layers"], report["generator"]["batch_size"]) == (1, 8)
