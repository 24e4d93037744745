"""Reliability: locks, crash recovery, honest ledgers after crashes, budget registry, CSPRNG noise,
safe loading, reproducibility. Tiny models built in code (tests/helpers.py)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from unittest import mock

import pytest
import torch

from helpers import generator_pairs
from privret.errors import InputError
from privret.privacy import budget
from privret.privacy.accounting import spent_epsilon
from privret.privacy.ledger import PrivacyLedger
from privret.runlock import RunLock, recover_directory, recover_tree
from privret.train import checkpointing, dp_run
from privret.train.generator import train_generator
from privret.settings.training import GeneratorTrainConfig

SRC = str(Path(__file__).resolve().parents[1] / "src")


def cfg_for(model_dir, **kw) -> GeneratorTrainConfig:
    values = dict(model=str(model_dir), epsilon=4.0, batch_size=4, epochs=3, trained_layers=1, lora_rank=4, bf16=False,
                  checkpoint_every=2, physical_batch=4)
    return GeneratorTrainConfig(**{**values, **kw})


def tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def adapter(out: Path) -> dict[str, torch.Tensor]:
    return tensors(out / "adapter" / "adapter_model.safetensors")


# --- the run-directory lock -----------------------------------------------------------------------

def test_second_lock_fails_at_once_and_a_killed_holder_frees_it(tmp_path):
    target = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from privret.runlock import RunLock; "
        "RunLock(sys.argv[2]).acquire(); print('held', flush=True); time.sleep(600)"), SRC, str(target)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.perf_counter()
        with pytest.raises(InputError, match=f"another privret process \\(pid {holder.pid}\\)"):
            RunLock(target).acquire()
        assert time.perf_counter() - started < 1.0  # fails at once, never waits
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with RunLock(target):  # the kernel released the dead holder's lock
        with pytest.raises(InputError, match="already holds"):
            RunLock(target).acquire()
    RunLock(target).acquire().release()


def test_pipeline_and_generator_refuse_a_locked_directory(tmp_path, tiny_llama_dir):
    from privret.settings.pipeline import PipelineConfig
    from privret.pipeline.run import run_pipeline

    with RunLock(tmp_path / "gen"):
        with pytest.raises(InputError, match="already holds the lock"):
            train_generator(generator_pairs(), tmp_path / "gen", cfg_for(tiny_llama_dir), data_hash="x")
    assert not (tmp_path / "gen").exists()  # nothing written
    cfg = PipelineConfig(name="x", dataset=tmp_path / "nowhere", epsilons=[1.0])
    with RunLock(tmp_path / "run"):
        with pytest.raises(InputError, match="lock"):
            run_pipeline(cfg, tmp_path / "run")


def test_cli_second_process_exits_2(tmp_path, toy_beir):
    target = tmp_path / "gen"
    with RunLock(target):
        result = subprocess.run([sys.executable, "-m", "privret.cli", "generator", "train", "--non-private", "--data", str(toy_beir),
                                 "--out", str(target), "--model", "/nonexistent-but-never-loaded"],
                                capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "another privret process" in result.stderr and "Traceback" not in result.stderr


# --- recovery of what a killed process left -------------------------------------------------------

def test_recover_a_cut_directory_swap_and_stale_staging(tmp_path):
    target = tmp_path / "gen"
    target.mkdir()
    (target / "weights").write_text("old, complete")
    os.replace(target, tmp_path / ".gen.old")  # killed between the two renames of atomic_path
    (tmp_path / ".gen.ab12cd34.tmp" / "gen").mkdir(parents=True)
    (tmp_path / ".gen.partial.ab12cd34.tmp").mkdir()  # another target's staging: not ours to remove
    actions = recover_directory(target)
    assert (target / "weights").read_text() == "old, complete" and len(actions) == 2
    assert not (tmp_path / ".gen.ab12cd34.tmp").exists() and (tmp_path / ".gen.partial.ab12cd34.tmp").exists()
    (tmp_path / "run" / "eps-1" / ".retriever.zz99zz99.tmp").mkdir(parents=True)
    assert recover_tree(tmp_path / "run") and not (tmp_path / "run" / "eps-1" / ".retriever.zz99zz99.tmp").exists()


# --- generator training: ledgers after crashes ----------------------------------------------------

@contextlib.contextmanager
def _crash_when(predicate):
    """Make the checkpoint write of the steps where ``predicate`` holds die (after the step log
    announced it, before any byte of it is written), like a kill at that moment."""
    original = dp_run.save_checkpoint

    def save(ckpt_dir, params, optimizer, ledger, *, step, rng=None, extra=None):
        if predicate(step):
            raise KeyboardInterrupt(f"killed while writing the checkpoint of step {step}")
        return original(ckpt_dir, params, optimizer, ledger, step=step, rng=rng, extra=extra)

    with mock.patch.object(dp_run, "save_checkpoint", save), pytest.raises(KeyboardInterrupt):
        yield


def test_steps_lost_in_a_cut_checkpoint_write_are_charged(tiny_llama_dir, tmp_path, monkeypatch):
    """Killed after announcing the checkpoint of step 4 (its bytes may be on disk), resumed from step 2:
    the final ledger counts the 2 abandoned noisy updates on top of the plan."""
    pairs = generator_pairs()
    cfg = cfg_for(tiny_llama_dir)
    with _crash_when(lambda step: step == 4):
        train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc")
    log = [json.loads(line) for line in (tmp_path / "gen" / "steps.jsonl").read_text().splitlines()]
    assert [r["to"] for r in log] == [2, 4]
    ledger = train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc", resume=True)
    planned = ledger.planned_steps
    assert ledger.steps == planned + 2
    assert ledger.epsilon == pytest.approx(spent_epsilon(noise_multiplier=ledger.noise_multiplier,
                                                         sample_rate=ledger.sample_rate, steps=planned + 2,
                                                         delta=ledger.delta), rel=1e-6)
    assert ledger.epsilon > cfg.epsilon
    recorded = budget.releases(ledger.dataset_id)
    assert len(recorded) == 1 and recorded[0].steps == planned + 2  # the registry agrees
    assert recorded[0].artefact == str((tmp_path / "gen").absolute())


def test_distinct_steps_over_branches():
    records = [{"branch": "a", "start": 0, "to": 2}, {"branch": "a", "start": 0, "to": 4},
               {"branch": "b", "start": 2, "to": 6}, {"branch": "c", "start": 6, "to": 10}]
    assert checkpointing.distinct_steps(records) == 4 + 4 + 4


DAMAGES = [
    (lambda d: (d / "steps.jsonl").unlink(), "without a step log"),
    (lambda d: (d / "steps.jsonl").write_text('{"oops"\n' + (d / "steps.jsonl").read_text()), "unreadable step log"),
    (lambda d: (d / "steps.jsonl").write_text(json.dumps({"release": "r", "branch": "b", "start": 0, "to": 1}) + "\n"),
     "does not account for the checkpoint"),
]


def test_a_run_that_cannot_prove_its_spend_refuses_to_resume(tiny_llama_dir, tmp_path):
    pairs = generator_pairs()
    cfg = cfg_for(tiny_llama_dir)
    with _crash_when(lambda step: step == 4):
        train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc")
    for k, (damage, message) in enumerate(DAMAGES):
        copy = tmp_path / f"copy{k}"
        shutil.copytree(tmp_path / "gen", copy)
        damage(copy)
        with pytest.raises(InputError, match=message):
            train_generator(pairs, copy, cfg, data_hash="abc", resume=True)


def test_torn_step_log_tail_is_dropped(tmp_path):
    path = tmp_path / "steps.jsonl"
    checkpointing.append_step_log(path, {"release": "r", "branch": "b", "start": 0, "to": 2})
    with open(path, "ab") as f:
        f.write(b'{"release": "r", "bra')
    assert [r["to"] for r in checkpointing.read_step_log(path, private=True, checkpoint=path.parent / "none")] == [2]
    checkpointing.append_step_log(path, {"release": "r", "branch": "b", "start": 0, "to": 4})
    assert [r["to"] for r in checkpointing.read_step_log(path, private=True, checkpoint=path.parent / "none")] == [2, 4]


def test_non_private_resume_equals_uninterrupted_and_private_resume_draws_fresh_noise(tiny_llama_dir, tmp_path,
                                                                                     monkeypatch):
    pairs = generator_pairs()
    plain = cfg_for(tiny_llama_dir, epsilon=math.inf, epochs=3)
    train_generator(pairs, tmp_path / "a", plain, data_hash="h")
    train_generator(pairs, tmp_path / "b", plain, data_hash="h")  # same seed, same machine: same bytes
    with _crash_when(lambda step: step == 4):
        train_generator(pairs, tmp_path / "c", plain, data_hash="h")
    train_generator(pairs, tmp_path / "c", plain, data_hash="h", resume=True)
    a = (tmp_path / "a" / "adapter" / "adapter_model.safetensors").read_bytes()
    assert (tmp_path / "b" / "adapter" / "adapter_model.safetensors").read_bytes() == a
    assert (tmp_path / "c" / "adapter" / "adapter_model.safetensors").read_bytes() == a
    # private: two resumptions of one checkpoint continue with different noise
    private = cfg_for(tiny_llama_dir, epochs=3)
    with _crash_when(lambda step: step == 4):
        train_generator(pairs, tmp_path / "p", private, data_hash="h")
    shutil.copytree(tmp_path / "p", tmp_path / "q")
    train_generator(pairs, tmp_path / "p", private, data_hash="h", resume=True)
    train_generator(pairs, tmp_path / "q", private, data_hash="h", resume=True)
    p, q = adapter(tmp_path / "p"), adapter(tmp_path / "q")
    assert any(not torch.equal(p[k], q[k]) for k in p)
    # resuming a finished run trains nothing and returns its ledger
    again = train_generator(pairs, tmp_path / "p", private, data_hash="h", resume=True)
    assert again.steps == PrivacyLedger.load(tmp_path / "p").steps


# --- the budget registry --------------------------------------------------------------------------

def release(steps=50, sigma=1.0, q=0.1, delta=1e-3, rid=None, **kw) -> budget.Release:
    eps = spent_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta)
    values = dict(release_id=rid or budget.new_release_id(), status="planned", data_hash="data", unit="query",
                  n_units=100, mechanism="dp-sgd", accountant="prv", noise_multiplier=sigma, sample_rate=q, steps=steps,
                  delta=delta, epsilon=eps)
    return budget.Release(**{**values, **kw})


def test_composition_is_the_accountant_over_the_joint_history():
    one = release()
    assert budget.compose([one]).epsilon == pytest.approx(one.epsilon, rel=0.02)
    two = budget.compose([release(), release()])
    joint = spent_epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=100, delta=1e-3)
    assert two.epsilon == pytest.approx(joint, rel=0.02) and two.epsilon < 2 * one.epsilon
    assert two.delta == 1e-3 and "accountant" in two.method
    odd = release(accountant="fedavg", mechanism="dp-fedavg", epsilon=1.5, delta=1e-5)
    mixed = budget.compose([release(), odd])
    assert mixed.epsilon == pytest.approx(one.epsilon + 1.5, rel=0.02) and mixed.delta == pytest.approx(1e-3 + 1e-5)
    assert budget.compose([release(), release(unit="user")], unit="user").releases == 1


def test_cap_refuses_then_warns_with_override_and_resumes_are_not_double_counted(tmp_path):
    policy = budget.BudgetPolicy(cap=1.2 * release().epsilon)
    first = release(rid="run-1")
    budget.check_and_record(first, policy)
    budget.check_and_record(first.model_copy(update={"steps": 60}), policy)  # the same release, resumed
    assert [r.steps for r in budget.releases("data")] == [60]
    with pytest.raises(InputError, match="past the budget cap"):
        budget.check_and_record(release(rid="run-2"), policy)
    assert len(budget.releases("data")) == 1  # refused: nothing recorded
    with pytest.warns(budget.BudgetWarning, match="running anyway, as the budget policy.s `allow_over` allows"):
        total = budget.check_and_record(release(rid="run-2"), policy.model_copy(update={"allow_over": True}))
    assert total.releases == 2 and len(budget.releases("data")) == 2


def test_registry_torn_tail_ignored_corruption_refused():
    budget.record(release(rid="a"))
    path = budget.registry_file("data")
    with open(path, "ab") as f:
        f.write(b'{"release_id": "b", "sta')
    assert [r.release_id for r in budget.releases("data")] == ["a"]
    budget.record(release(rid="c"))  # the torn tail is replaced, not buried
    assert [r.release_id for r in budget.releases("data")] == ["a", "c"]
    path.write_bytes(b"not json\n" + path.read_bytes())
    with pytest.raises(InputError, match="cannot be proven"):
        budget.releases("data")
    assert budget.registry_file("../../etc/passwd").parent == budget.budget_dir()  # no path traversal


def test_generator_training_records_and_enforces_the_cap(tiny_llama_dir, tmp_path):
    pairs = generator_pairs()
    cfg = cfg_for(tiny_llama_dir, epochs=1, epsilon=2.0)
    first = train_generator(pairs, tmp_path / "g1", cfg, data_hash="same-data")
    with pytest.raises(InputError, match="set `allow_over` to run anyway"):
        train_generator(pairs, tmp_path / "g2", cfg, data_hash="same-data", budget=budget.BudgetPolicy(cap=3.0))
    assert not (tmp_path / "g2" / "steps.jsonl").exists()  # refused before any update could reach disk
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", budget.BudgetWarning)
        train_generator(pairs, tmp_path / "g2", cfg, data_hash="same-data",
                        budget=budget.BudgetPolicy(cap=3.0, allow_over=True))
    total = budget.compose(budget.releases(first.dataset_id))
    assert total.releases == 2 and first.epsilon < total.epsilon < 2 * first.epsilon + 0.05


def test_direct_dp_retriever_records_and_enforces_the_cap(tiny_bert_dir, tmp_path):
    from test_dp_retriever import _cfg, _pairs

    from privret.train.dp_retriever import train_dp_retriever

    pairs, cfg = _pairs(), _cfg("batch-clip", tiny_bert_dir, epsilon=2.0, epochs=1.0, batch_size=4, trainable="top:1")
    first = train_dp_retriever(pairs, tmp_path / "r1", cfg, data_hash="same-data")
    recorded = budget.releases(first.dataset_id)
    assert [(r.status, r.steps, r.mechanism) for r in recorded] == [("final", first.steps, "direct-batch-clip")]
    with pytest.raises(InputError, match="set `allow_over` to run anyway"):
        train_dp_retriever(pairs, tmp_path / "r2", cfg, data_hash="same-data", budget=budget.BudgetPolicy(cap=3.0))
    assert not (tmp_path / "r2").exists() and len(budget.releases(first.dataset_id)) == 1  # refused before training


def test_run_composition_counts_generators_once_and_flags_non_private_rows(tmp_path):
    from privret.pipeline.summary import run_releases
    from privret.privacy.ledger_composition import run_composition, run_composition_sentence

    base = dict(mechanism="dp-sgd", delta=1e-3, noise_multiplier=1.0, sample_rate=0.1, steps=50, planned_steps=50,
                accountant="prv", unit="query", n_units=100, n_pairs=100, clip_norm=1.0, model="m", trainable="lora",
                data_hash="h")
    eps = spent_epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=50, delta=1e-3)
    for stage in ("eps-a", "eps-b"):
        for part in ("generator", "synthetic", "retriever"):
            (tmp_path / stage / part).mkdir(parents=True)
            PrivacyLedger(epsilon=eps, **base).save(tmp_path / stage / part)
    (tmp_path / "eps-inf" / "generator").mkdir(parents=True)
    PrivacyLedger(**{**base, "epsilon": math.inf, "mechanism": "none"}).save(tmp_path / "eps-inf" / "generator")
    joint = run_composition(run_releases(tmp_path))
    assert joint["releases"] == ["eps-a", "eps-b"] and joint["non_private"] == ["eps-inf"]
    assert joint["composition"]["query"]["epsilon"] == pytest.approx(
        spent_epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=100, delta=1e-3), rel=0.02)
    sentence = run_composition_sentence(joint)
    assert "Releasing all 2 DP models" in sentence and "voids the privacy" in sentence


# --- CSPRNG noise ---------------------------------------------------------------------------------

def test_secure_noise_is_standard_gaussian_and_sampling_has_rate_q():
    from scipy import stats

    from privret.privacy.secure_rng import SecurePoissonUnitSampler, SecureRandom

    rng = SecureRandom()
    z = rng.normal_like(torch.zeros(200_001), 2.0)
    assert z.dtype == torch.float32 and z.shape == (200_001,)
    assert abs(z.mean().item()) < 0.03 and z.std().item() == pytest.approx(2.0, rel=0.01)
    assert stats.kstest(z.double().numpy() / 2.0, "norm").pvalue > 1e-4
    assert not torch.equal(rng.normal_like(torch.zeros(8), 1.0), rng.normal_like(torch.zeros(8), 1.0))
    sampler = SecurePoissonUnitSampler(10_000, 0.3)
    sizes = [len(sampler.sample()) for _ in range(20)]
    assert abs(sum(sizes) / 20 - 3000) < 60


def test_secure_poisson_sampler_includes_each_unit_independently_at_rate_q():
    """What the accountant assumes of SecurePoissonUnitSampler (as test_poisson_sampler_matches_accountant_assumption
    checks for the seeded one): every unit joins with probability q, each at most once, batch sizes vary as
    Binomial(n, q) and can be zero. The CSPRNG cannot be seeded, so the bounds are chosen for a false alarm rate
    below 1e-4: 5 standard errors per unit (50 units: < 3e-5), the size variance (relative standard error
    sqrt(2.1 / draws) = 1.4%) within 15%, and P(no empty batch) = (1 - 0.9^50)^draws ~ e^-50."""
    from privret.privacy.secure_rng import SecurePoissonUnitSampler

    n, q, draws = 50, 0.1, 10_000
    sampler = SecurePoissonUnitSampler(n, q)
    counts, sizes = torch.zeros(n), []
    for _ in range(draws):
        batch = sampler.sample()
        assert len(set(batch)) == len(batch) and all(0 <= u < n for u in batch)
        counts[batch] += 1
        sizes.append(len(batch))
    assert ((counts / draws) - q).abs().max() < 5 * math.sqrt(q * (1 - q) / draws)  # not always the first units
    sizes = torch.tensor(sizes, dtype=torch.float)
    assert sizes.var().item() == pytest.approx(n * q * (1 - q), rel=0.15)  # not fixed-size batches
    assert (sizes == 0).any()  # empty batches happen and are not skipped


def test_secure_rng_training_records_it_in_the_ledger(tiny_llama_dir, tmp_path, monkeypatch):
    """A secure-rng generator run draws every step's noise from the CSPRNG, at the std the ledger's guarantee
    needs: sigma C, the ledger's noise multiplier times the per-unit clip norm C of the config (the generator
    clips each unit's gradient to C, so Delta = C)."""
    from privret.privacy import secure_rng

    stds = []
    original = secure_rng.SecureRandom.normal_like

    def recording(self, tensor, std):
        stds.append(std)
        return original(self, tensor, std)

    monkeypatch.setattr(secure_rng.SecureRandom, "normal_like", recording)
    cfg = cfg_for(tiny_llama_dir, epochs=1, secure_rng=True, clip_norm=0.37)  # C != 1: a lost C would show
    ledger = train_generator(generator_pairs(), tmp_path / "gen", cfg, data_hash="h")
    assert ledger.secure_rng and PrivacyLedger.load(tmp_path / "gen").secure_rng
    assert len(stds) == ledger.steps * 14  # one draw per trainable tensor (7 LoRA linears x A, B) per step
    assert ledger.clip_norm == cfg.clip_norm and ledger.noise_multiplier > 0.1
    assert stds == pytest.approx([ledger.noise_multiplier * cfg.clip_norm] * len(stds), rel=1e-9)


# --- safe loading ---------------------------------------------------------------------------------

def test_pickle_only_weights_need_explicit_trust(tmp_path, tiny_bert_dir, monkeypatch):
    from privret.models.encoder import load_encoder
    from privret.models.safety import TRUST_PICKLE_ENV

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_bert_dir, pickled)
    state = tensors(pickled / "model.safetensors")
    (pickled / "model.safetensors").unlink()
    torch.save(state, pickled / "pytorch_model.bin")
    with pytest.raises(InputError, match="pickle") as refused:
        load_encoder(str(pickled))
    assert refused.value.field == "trust_remote_pickle"  # the CLI shows it as --trust-remote-pickle
    monkeypatch.setenv(TRUST_PICKLE_ENV, "1")
    trusted, reference = load_encoder(str(pickled)), load_encoder(str(tiny_bert_dir))  # safetensors: never asks
    a, b = trusted.state_dict(), reference.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # the pickled weights, not a fresh init


def test_offline_mode_never_opens_a_socket(tmp_path, tiny_bert_dir, monkeypatch):
    import socket

    from huggingface_hub import constants

    from privret.errors import ModelUnavailableError
    from privret.models.encoder import load_encoder

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", constants.HF_HUB_OFFLINE)  # restored afterwards
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    def no_network(*_a, **_k):
        raise AssertionError("network access in offline mode")

    monkeypatch.setenv("PRIVRET_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    load_encoder(str(tiny_bert_dir))
    with pytest.raises(ModelUnavailableError):
        load_encoder("some-org/not-cached-model")


# --- generation -----------------------------------------------------------------------------------

def test_generation_resumed_equals_uninterrupted_and_settings_are_pinned(tiny_llama_dir, tmp_path, monkeypatch):
    from privret.data.beir import Document, load_beir
    from privret.models import causal_generator as genmod
    from privret.synth.generate import generate_synthetic
    from privret.settings.synthesis import GenerateConfig

    train_generator(generator_pairs(), tmp_path / "gen", cfg_for(tiny_llama_dir, epsilon=math.inf, epochs=1),
                    data_hash="h")
    docs = [Document(f"d{i}", "", t) for i, t in enumerate(["aspirin heart risk", "gene memory mice", "vitamin blood",
                                                            "sleep immune", "cancer drug trial", "immune cells"])]
    cfg = GenerateConfig(num_queries=2, max_new_tokens=5, batch_size=2, seed=3)
    generate_synthetic(tmp_path / "gen", docs, tmp_path / "whole", cfg)
    original = genmod.CausalQueryGenerator.generate
    calls = {"n": 0}

    def dies_on_third_batch(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, *a, **k)

    with mock.patch.object(genmod.CausalQueryGenerator, "generate", dies_on_third_batch), \
            pytest.raises(KeyboardInterrupt):
        generate_synthetic(tmp_path / "gen", docs, tmp_path / "cut", cfg)
    with pytest.raises(InputError, match="another config"):
        generate_synthetic(tmp_path / "gen", docs, tmp_path / "cut", cfg.model_copy(update={"seed": 4}), resume=True)
    with pytest.raises(InputError, match="another documents"):
        generate_synthetic(tmp_path / "gen", docs[:5], tmp_path / "cut", cfg, resume=True)
    generate_synthetic(tmp_path / "gen", docs, tmp_path / "cut", cfg, resume=True)
    assert load_beir(tmp_path / "cut").queries == load_beir(tmp_path / "whole").queries
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv"):
        assert (tmp_path / "cut" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    assert (tmp_path / "cut" / "privacy_ledger.json").exists() and not (tmp_path / "cut.partial").exists()


def test_same_seed_same_retriever(tiny_bert_dir, tmp_path):
    from privret.train.retriever import train_retriever
    from privret.settings.training import RetrieverTrainConfig

    pairs = generator_pairs()
    ledger = PrivacyLedger(mechanism="none", epsilon=math.inf, delta=0.0, noise_multiplier=0.0, sample_rate=1.0,
                           steps=0, planned_steps=0, accountant="none", unit="query", n_units=8, n_pairs=11,
                           clip_norm=math.inf, model="m", trainable="all", data_hash="h")
    cfg = RetrieverTrainConfig(model=str(tiny_bert_dir), epochs=2, batch_size=4, bf16=False, seed=5)
    for name in ("r1", "r2"):
        train_retriever(pairs, tmp_path / name, cfg, ledger=ledger)
    a, b = tensors(tmp_path / "r1" / "model.safetensors"), tensors(tmp_path / "r2" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    initial = tensors(tiny_bert_dir / "model.safetensors")
    changed = [k for k in a if not torch.equal(a[k], initial[k])]
    assert len(changed) > len(a) // 2, changed  # training moved the weights: equal runs are not two no-ops
