"""DP training over several processes (torch.distributed, gloo on loopback): the guarantee of one process.

Each test starts 2 ranks of tests/distributed_worker.py (or of the CLI under torchrun) with the environment
torchrun sets, on tiny models. Marked ``distributed`` (``-m "not distributed"`` deselects them) and ``slow`` (15 to
42 s each on 2 shared cores, 190 s together with a DP run beside them: ``make check`` leaves them to ``make test``)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from privret.privacy.accounting import spent_epsilon
from privret.privacy.ledger import PrivacyLedger
from privret.train.checkpointing import CHECKPOINT_DIR, STEP_LOG, distinct_steps
from privret.train.generator import train_generator

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
WORKER = TESTS / "distributed_worker.py"
TIMEOUT = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int | None, world: int, port: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=f"{SRC}{os.pathsep}{TESTS}", **extra)
    if rank is not None:
        env.update(WORLD_SIZE=str(world), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
    return env


def _start(args: list[str], tmp_path: Path, *, world: int, tag: str, **extra) -> list[subprocess.Popen]:
    """``world`` ranks of the worker (one plain process if ``world`` is 1), output in tmp_path/tag-RANK.log."""
    port = _free_port()
    procs = []
    for rank in range(world):
        log = open(tmp_path / f"{tag}-{rank}.log", "w")  # noqa: SIM115 (closed with the process)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), *args], stdout=log, stderr=subprocess.STDOUT,
                                      env=_env(rank if world > 1 else None, world, port, **extra)))
    return procs


def _wait(procs: list[subprocess.Popen], tmp_path: Path, tag: str) -> None:
    for rank, proc in enumerate(procs):
        rc = proc.wait(timeout=TIMEOUT)
        assert rc == 0, (tmp_path / f"{tag}-{rank}.log").read_text()[-3000:]


def test_clipped_sum_and_noise_of_a_generator_step_over_two_processes(tiny_llama_dir, tmp_path):
    """Noise off: the sum the two ranks release for all 8 units (each clipping its own shard) equals the
    one-process clipped sum. Noise alone: its std over 262144 coordinates is sigma x Delta, not sqrt(2) times."""
    _wait(_start(["generator-step", str(tiny_llama_dir), str(tmp_path)], tmp_path, world=2, tag="g"), tmp_path, "g")
    _check_step(torch.load(tmp_path / "step.pt"))


@pytest.mark.parametrize("public_negatives", ["5", "0"])
def test_clipped_sum_and_noise_of_a_retriever_step_over_two_processes(tiny_bert_dir, tmp_path, public_negatives):
    """The same for the direct DP retriever (public-negatives: rank 0 draws the negatives for both; with 0 of
    them it sends an empty sample and each row's own hard negatives are its only ones)."""
    _wait(_start(["retriever-step", str(tiny_bert_dir), str(tmp_path), public_negatives], tmp_path, world=2, tag="r"),
          tmp_path, "r")
    _check_step(torch.load(tmp_path / "step.pt"))


def _check_step(result: dict) -> None:
    from distributed_worker import DELTA, SIGMA

    assert sum(g.abs().sum().item() for g in result["single"]) > 0
    # float rounding only: each rank runs (and, for top:K, keeps the frozen prefix of) a different set of texts, so
    # matrix shapes differ; a dropped or doubly counted unit moves elements by the gradient's scale
    scale = max(g.abs().max().item() for g in result["single"])
    for shared, single in zip(result["distributed"], result["single"], strict=True):
        torch.testing.assert_close(shared, single, rtol=1e-4, atol=1e-6 * scale)
    noise = result["noise"].flatten()
    # the sample std of n normals has relative standard error 1/sqrt(2n): allow 5 of them (about 0.7%)
    assert noise.std().item() == pytest.approx(SIGMA * DELTA, rel=5 / math.sqrt(2 * noise.numel()))


def test_with_secure_rng_every_rank_draws_its_hard_negatives_from_the_csprng(tiny_bert_dir, tmp_path):
    """Rank 0 draws the sample, the noise and the shared negatives; each rank draws the hard negatives of its own
    shard's rows. With ``secure_rng`` those come from os.urandom on rank 1 too (not from torch's global generator),
    in every step, as the ledger says."""
    _wait(_start(["secure-hard-negatives", str(tiny_bert_dir), str(tmp_path)], tmp_path, world=2, tag="h"),
          tmp_path, "h")
    ledger = PrivacyLedger.load(tmp_path / "r")
    draws = [json.loads((tmp_path / f"draws-{rank}.json").read_text()) for rank in range(2)]
    assert draws == [["SecureRandom"] * ledger.steps] * 2 and ledger.steps >= 1
    assert ledger.random_sources["hard negatives"] == "os.urandom"


GUARANTEE = ("mechanism", "epsilon", "delta", "noise_multiplier", "sample_rate", "steps", "planned_steps",
             "accountant", "unit", "n_units", "n_pairs", "clip_norm", "model", "trainable", "data_hash",
             "dataset_id", "secure_rng", "random_sources", "unit_definition", "part", "parts", "composition",
             "provenance")


def _guarantee(directory: Path) -> str:
    ledger = PrivacyLedger.load(directory).model_dump(mode="json")
    assert set(ledger) == set(GUARANTEE) | {"created_at"}  # every field but the time defines the guarantee
    return json.dumps({k: ledger[k] for k in GUARANTEE}, sort_keys=True)


def test_the_cli_under_torchrun_writes_the_ledger_of_one_process(tiny_llama_dir, toy_beir, tmp_path):
    """``torchrun --nproc_per_node 2 -m privret.cli generator train-dp ...`` trains, writes the same ledger
    (every field that defines the guarantee, byte for byte) as the one-process command, records one release
    in the budget registry, and rank 1 prints nothing."""
    config = tmp_path / "generator.yaml"
    config.write_text("trained_layers: 1\nlora_rank: 4\n")
    args = ["generator", "train-dp", "--data", str(toy_beir), "--model", str(tiny_llama_dir), "--epsilon", "8",
            "--batch-size", "2", "--epochs", "1", "--config", str(config), "--accountant", "rdp"]
    outputs = {}
    for world in (1, 2):
        out, budget = tmp_path / f"gen{world}", tmp_path / f"budget{world}"
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                     str(_free_port()), "--log-dir", str(tmp_path / "logs"), "--redirects", "3", "-m", "privret.cli"]
                    if world == 2 else [sys.executable, "-m", "privret.cli"])
        done = subprocess.run(launcher + args + ["--out", str(out)], capture_output=True, text=True, timeout=TIMEOUT,
                              env=_env(None, 1, 0, PRIVRET_BUDGET_DIR=str(budget),
                                       PRIVRET_LOG_FILE=str(tmp_path / "privret.log")))
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        outputs[world] = _guarantee(out)
        releases = [json.loads(line) for f in sorted(budget.rglob("*.jsonl")) for line in f.read_text().splitlines()]
        assert len({r["release_id"] for r in releases}) == 1 and releases[-1]["status"] == "final"
    assert outputs[2] == outputs[1]
    stdout = {p.parent.name: p.read_text() for p in (tmp_path / "logs").rglob("stdout.log")}
    assert set(stdout) == {"0", "1"} and "generator written to" in stdout["0"] and stdout["1"] == ""


def test_a_rank_killed_mid_run_then_resumed_counts_every_step_once(tiny_llama_dir, tmp_path):
    """kill -9 of rank 1 after the checkpoint of step 2 is announced; rank 0 stops; a resume on 2 processes
    finishes. The ledger counts what one process would: the planned steps plus those announced and lost
    (after the last checkpoint), each once; the step log of the killed start has one branch (rank 0 alone
    writes it)."""
    out, budget = tmp_path / "gen", tmp_path / "budget"
    args = ["generator-train", str(tiny_llama_dir), str(out), "8"]
    procs = _start(args + ["1.0"], tmp_path, world=2, tag="killed", PRIVRET_BUDGET_DIR=str(budget))
    deadline = time.monotonic() + TIMEOUT
    while not ((out / STEP_LOG).exists() and (out / STEP_LOG).read_text().strip()):
        assert time.monotonic() < deadline and procs[0].poll() is None, (tmp_path / "killed-0.log").read_text()
        time.sleep(0.05)
    os.kill(procs[1].pid, signal.SIGKILL)
    try:
        assert procs[0].wait(timeout=120) != 0  # the peer is gone: its next collective fails
    except subprocess.TimeoutExpired:  # torchrun would end it; so does the test
        procs[0].kill()
        procs[0].wait()
    procs[1].wait()
    assert not (out / "generator.json").exists()
    records = [json.loads(line) for line in (out / STEP_LOG).read_text().splitlines()]
    assert len({r["branch"] for r in records}) == 1 and distinct_steps(records) == max(r["to"] for r in records)
    checkpoint_step = json.loads((out / CHECKPOINT_DIR / "state.json").read_text())["step"]
    lost = max(r["to"] for r in records) - checkpoint_step
    assert checkpoint_step >= 2 and lost >= 0

    _wait(_start(args, tmp_path, world=2, tag="resumed", PRIVRET_BUDGET_DIR=str(budget)), tmp_path, "resumed")
    ledger = PrivacyLedger.load(out)
    assert ledger.steps == ledger.planned_steps + lost
    assert ledger.epsilon == spent_epsilon(noise_multiplier=ledger.noise_multiplier, sample_rate=ledger.sample_rate,
                                           steps=ledger.steps, delta=ledger.delta, accountant="rdp")
    releases = [json.loads(line) for f in sorted(budget.rglob("*.jsonl")) for line in f.read_text().splitlines()]
    assert len({r["release_id"] for r in releases}) == 1 and releases[-1]["status"] == "final"
    assert releases[-1]["steps"] == ledger.steps


def test_generation_sharded_over_two_processes_resumes_and_equals_one_process(tiny_llama_dir, tmp_path):
    """Synthetic generation on 2 ranks (batches 0, 2, 4 on rank 0; 1, 3 on rank 1) writes byte for byte the
    dataset one process writes with the same seed; so does a 2-rank run whose rank 0 dies at its second batch,
    resumed by 1 process (its shards are kept and merged in document order)."""
    from distributed_worker import generation_config, generation_docs
    from helpers import generator_pairs
    from privret.synth.generate import generate_synthetic
    from test_reliability import cfg_for

    train_generator(generator_pairs(), tmp_path / "gen", cfg_for(tiny_llama_dir, epsilon=math.inf, epochs=1),
                    data_hash="h")
    generate_synthetic(tmp_path / "gen", generation_docs(), tmp_path / "one", generation_config())
    args = ["generate", str(tmp_path / "gen")]
    _wait(_start(args + [str(tmp_path / "two")], tmp_path, world=2, tag="two"), tmp_path, "two")
    procs = _start(args + [str(tmp_path / "cut"), "2"], tmp_path, world=2, tag="cut")
    assert [p.wait(timeout=TIMEOUT) != 0 for p in procs] == [True, True]  # rank 1 fails at the barrier
    shards = sorted(p.name for p in (tmp_path / "cut.partial").glob("generated*.jsonl"))
    assert shards == ["generated.jsonl", "generated.rank1.jsonl"] and not (tmp_path / "cut").exists()
    _wait(_start(args + [str(tmp_path / "cut")], tmp_path, world=1, tag="resumed"), tmp_path, "resumed")
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv"):
        expected = (tmp_path / "one" / name).read_bytes()
        assert (tmp_path / "two" / name).read_bytes() == expected and (tmp_path / "cut" / name).read_bytes() == expected
    assert len((tmp_path / "one" / "queries.jsonl").read_text().splitlines()) >= 9


def test_a_dp_retriever_over_two_processes_is_the_one_process_run(tiny_bert_dir, tmp_path):
    """A whole direct DP run on 2 ranks and on one process with the same entropy: the same ledger (every field of
    the guarantee) and the same trained encoder up to float sums in another order."""
    from privret.models.encoder import load_encoder

    for world in (1, 2):
        args = ["dp-retriever-train", str(tiny_bert_dir), str(tmp_path / f"r{world}")]
        _wait(_start(args, tmp_path, world=world, tag=f"dp{world}",
                     PRIVRET_BUDGET_DIR=str(tmp_path / f"budget{world}")), tmp_path, f"dp{world}")
    assert _guarantee(tmp_path / "r2") == _guarantee(tmp_path / "r1")
    one, two, initial = (dict(load_encoder(str(d), max_seq_length=32).named_parameters())
                         for d in (tmp_path / "r1", tmp_path / "r2", tiny_bert_dir))
    assert max((one[n] - initial[n]).abs().max().item() for n in one) > 1e-4  # the noisy steps moved the weights
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-6, msg=name)


def test_non_private_retriever_over_two_processes_matches_one_process(tmp_path):
    """fit_retriever on 2 ranks (each embedding half of every batch, embeddings all-gathered, gradients summed)
    ends at the parameters one process reaches (12 pairs, batches of 5, 2 epochs, AdamW at lr 1e-3) within
    the stated tolerance: |difference| <= 1e-5 + 1e-4 |value| (float sums in another order). The encoder has
    no dropout, so both runs are the same computation."""
    from helpers import write_tiny_bert
    from privret.models.encoder import load_encoder

    bert = write_tiny_bert(tmp_path / "bert")
    config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.0,
                                                  "attention_probs_dropout_prob": 0.0}))
    args = ["fit-retriever", str(bert)]
    _wait(_start(args + [str(tmp_path / "one.pt")], tmp_path, world=1, tag="one"), tmp_path, "one")
    _wait(_start(args + [str(tmp_path / "two.pt")], tmp_path, world=2, tag="two"), tmp_path, "two")
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    initial = dict(load_encoder(str(bert)).named_parameters())
    assert one.keys() == two.keys() == initial.keys()
    assert max((one[n] - initial[n]).abs().max().item() for n in one) > 1e-3  # training moved the weights
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)
