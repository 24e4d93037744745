"""Fault injection: SIGKILL each long command at random moments, resume it, check the artefact and that the ledger
never charges fewer DP steps than applied (--help). docs/results.md, "Speed and scale" (docs/reliability.md).
    python bench/fault_injection.py --verbose          # writes bench/results/fault_injection.json
    (the federated commands' trials: bench/README.md)
2 CPU cores, one thread: about 10 min (estimated: 4 trials a command, the generator-dp reference run 42 s)."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

torch.set_num_threads(1)

from helpers import TOY_DOCS, TOY_TEST, TOY_TRAIN, write_beir_dir, write_tiny_bert, write_tiny_llama  # noqa: E402

from privret.data.beir import Document, load_beir  # noqa: E402
from privret.data.pairs import pairs_from_beir  # noqa: E402
from privret.privacy import budget  # noqa: E402
from privret.privacy.ledger import PrivacyLedger  # noqa: E402

TRUTH_ENV = "PRIVRET_FI_TRUTH"


def _federated_fixtures():
    """tests/federated/conftest.py (the tiny Fed-SQuAD source and encoder), loaded as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("federated_fixtures", ROOT / "tests" / "federated" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
# dozens of DP runs on one toy dataset, in a registry of their own: measurements, not releases
OVER_BUDGET = budget.BudgetPolicy(allow_over=True)
warnings.simplefilter("ignore", budget.BudgetWarning)


# --- the commands -----------------------------------------------------------------------------

class Setup:
    def __init__(self, work: Path):
        self.work = work
        self.llama = write_tiny_llama(work / "tiny-llama")
        self.bert = write_tiny_bert(work / "tiny-bert")
        corpus = [{"_id": i, "title": t, "text": x} for i, t, x in TOY_DOCS]
        # more (private) training queries than the toy set, so DP runs take some steps
        train = [(q, t, ds) for q, t, ds in TOY_TRAIN]
        train += [(f"x{k}", f"{TOY_TRAIN[k % 5][1]} {w}", TOY_TRAIN[k % 5][2])
                  for k, w in enumerate(["study", "effect", "level", "risk", "trial", "cells", "brain", "diet"] * 3)]
        queries = [{"_id": q, "text": t} for q, t, _ in train + TOY_TEST]
        qrels = {"train": [(q, d, 1) for q, _, ds in train for d in ds],
                 "test": [(q, d, 1) for q, _, ds in TOY_TEST for d in ds]}
        self.data = write_beir_dir(work / "data", corpus, queries, qrels)
        self.dataset = load_beir(self.data)
        self.pairs = pairs_from_beir(self.dataset, "train")
        words = "aspirin heart risk gene memory mice vitamin blood children sleep immune virus cancer drug".split()
        self.docs = [Document(f"g{i}", "", " ".join(words[(i * 7 + j) % len(words)] for j in range(6)))
                     for i in range(40)]
        fed = _federated_fixtures()
        (work / "squad.json").write_text(json.dumps(fed.TINY_SQUAD))
        self.fed_encoder = fed.write_tiny_encoder(work / "tiny-fed-encoder")
        from privret.data.fed_squad import build_fed_squad

        self.fed_data = work / "fed-squad"
        build_fed_squad(work / "squad.json", self.fed_data, n_clients=2, seed=0)

    def federated_cfg(self, dp: bool):
        from privret.settings.federated import FedConfig

        private = {"dp": "server", "dp_noise_multiplier": 1.0, "dp_clip_norm": 0.5} if dp else {}
        return FedConfig(model=self.fed_encoder, rounds=4, warmup_rounds=1, remine_every=1, eval_every=2,
                         batch_size=2, n_negatives=1, hard_k=3, bm25_k=3, personal_batch_size=2, personal_negatives=1,
                         personal_hard_k=3, fed_negatives=2, bf16=False, learning_rate=1e-2, **private)

    def generator_cfg(self, epsilon: float):
        from privret.settings.training import GeneratorTrainConfig

        return GeneratorTrainConfig(model=str(self.llama), epsilon=epsilon, batch_size=8, epochs=4, trained_layers=1,
                                    lora_rank=4, bf16=False, checkpoint_every=1, physical_batch=8, accountant="rdp")

    def retriever_dp_cfg(self):
        from privret.settings.training import DPRetrieverConfig

        # 29 units, q = 4/29, 2 epochs: 15 steps, a checkpoint every 2 (a kill often loses announced steps)
        return DPRetrieverConfig(method="batch-clip", model=str(self.bert), epsilon=4.0, batch_size=4, epochs=2,
                                 trainable="top:1", learning_rate=1e-3, max_query_tokens=32, max_doc_tokens=32,
                                 checkpoint_every=2, accountant="rdp")

    def run(self, command: str, out: Path) -> None:
        """One attempt of ``command`` into ``out`` (resuming whatever is there)."""
        if command in ("generator-dp", "generator-plain"):
            from privret.train.generator import train_generator

            epsilon = 4.0 if command == "generator-dp" else math.inf
            train_generator(self.pairs, out, self.generator_cfg(epsilon), data_hash="fault-injection", resume=True,
                            budget=OVER_BUDGET)
        elif command == "retriever-dp":
            from privret.train.dp_retriever import train_dp_retriever

            train_dp_retriever(self.pairs, out, self.retriever_dp_cfg(), data_hash="fault-injection", resume=True,
                               budget=OVER_BUDGET)
        elif command in ("federated", "federated-dp"):
            from privret.federated.runner import run_federated_local

            run_federated_local(self.federated_cfg(command == "federated-dp"), self.fed_data, out, resume=True,
                                budget=OVER_BUDGET)
        elif command == "generate":
            from privret.synth.generate import generate_synthetic
            from privret.settings.synthesis import GenerateConfig

            if not out.exists():
                generate_synthetic(self.work / "plain-generator", self.docs, out,
                                   GenerateConfig(num_queries=2, max_new_tokens=6, batch_size=2, seed=1),
                                   private_copies={p.query for p in self.pairs.pairs}, resume=True)
        elif command == "retriever":
            from privret.train.retriever import non_private_ledger
            from privret.runlock import RunLock, recover_directory
            from privret.train.retriever import train_retriever
            from privret.settings.training import RetrieverTrainConfig

            with RunLock(out):
                recover_directory(out)
                if not out.exists():
                    train_retriever(self.pairs, out, RetrieverTrainConfig(model=str(self.bert), epochs=3, batch_size=4,
                                                                          bf16=False, seed=2),
                                    ledger=non_private_ledger(self.pairs, "tiny", "fault-injection", "query"))
        elif command == "pipeline":
            from privret.settings.pipeline import BudgetSettings, GeneratorStage, PipelineConfig
            from privret.pipeline.run import run_pipeline
            from privret.settings.synthesis import GenerateConfig
            from privret.settings.training import RetrieverTrainConfig

            cfg = PipelineConfig(
                name="fi", dataset=self.data, epsilons=[math.inf, 4.0], synthetic_documents="corpus",
                generator=GeneratorStage(model=str(self.llama), batch_size=8, epochs=2, trained_layers=1, lora_rank=4,
                                         bf16=False, checkpoint_every=1, physical_batch=8),
                generate=GenerateConfig(num_queries=2, max_new_tokens=5, batch_size=2),
                retriever=RetrieverTrainConfig(model=str(self.bert), epochs=1, batch_size=4, bf16=False),
                budget=BudgetSettings(allow_over=True))
            run_pipeline(cfg, out)
        else:
            raise ValueError(command)


# --- the independent truth counter (installed in each child) ------------------------------------

def install_truth_hooks(truth_file: Path) -> None:
    import safetensors.torch as st_torch
    from sentence_transformers import SentenceTransformer

    from privret.models import query_generator as genmod
    from privret.train import dp_retriever as rtrain
    from privret.train import generator as gtrain

    state = {"dp_steps": 0}
    original_step, original_save, original_gen_save = gtrain._dp_step, st_torch.save_file, genmod.QueryGenerator.save
    original_retriever_step, original_st_save = rtrain.dp_step, SentenceTransformer.save

    def counted_step(*a, **k):
        out = original_step(*a, **k)
        state["dp_steps"] += 1  # the optimizer applies it right after
        return out

    def counted_retriever_step(*a, **k):
        out = original_retriever_step(*a, **k)
        state["dp_steps"] += 1  # the optimizer applies it right after
        return out

    def note() -> None:
        if state["dp_steps"]:
            with open(truth_file, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "applied": state["dp_steps"]}) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def save_file(tensors, filename, *a, **k):
        if Path(filename).name == "params.safetensors":
            note()
        return original_save(tensors, filename, *a, **k)

    def gen_save(self, directory):
        note()
        return original_gen_save(self, directory)

    def st_save(self, *a, **k):  # the final DP retriever (non-private retrievers count no DP steps)
        note()
        return original_st_save(self, *a, **k)

    from privret.federated import server_app

    original_fed_save = server_app.save_arrays

    def fed_save(path, arrays, *, round_number=None):  # each noisy global model, before its write begins
        state["dp_steps"] += 1
        note()
        return original_fed_save(path, arrays, round_number=round_number)

    server_app.save_arrays = fed_save
    gtrain._dp_step = counted_step
    rtrain.dp_step = counted_retriever_step
    st_torch.save_file = save_file
    genmod.QueryGenerator.save = gen_save
    SentenceTransformer.save = st_save


def truth_steps(truth_file: Path) -> int:
    if not truth_file.exists():
        return 0
    best: dict[int, int] = {}
    for line in truth_file.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            best[row["pid"]] = max(best.get(row["pid"], 0), row["applied"])
    return sum(best.values())


# --- running, killing, comparing ----------------------------------------------------------------

def attempt(setup: Setup, command: str, out: Path, truth_file: Path, kill_after: float | None) -> tuple[str, float]:
    """Fork one attempt; SIGKILL it after ``kill_after`` s (None: let it finish). ('killed'|'ok'|'failed', s)."""
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            install_truth_hooks(truth_file)
            with open(os.devnull, "w") as sink:
                os.dup2(sink.fileno(), 1)
                setup.run(command, out)
        except BaseException:  # noqa: BLE001 - report anything, the parent counts it
            traceback.print_exc()
            code = 1
        os._exit(code)
    deadline = None if kill_after is None else started + kill_after
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return ("ok" if os.waitstatus_to_exitcode(status) == 0 else "failed"), time.perf_counter() - started
        if deadline is not None and time.perf_counter() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "killed", time.perf_counter() - started
        time.sleep(0.01)


def artefact_files(command: str, out: Path) -> dict[str, bytes]:
    """The deterministic part of an artefact, as {relative path: bytes}."""
    if command == "generator-plain":
        roots = [out]
    elif command in ("generate", "retriever"):
        roots = [out]
    elif command == "pipeline":
        roots = [out / "original" / "retriever", out / "eps-inf" / "generator", out / "eps-inf" / "synthetic",
                 out / "eps-inf" / "retriever"]
    elif command == "federated":  # the final global model and every evaluation (the history records kills)
        results = json.loads((out / "results.json").read_text())
        return {"global.npz": (out / "global.npz").read_bytes(),
                "evaluations": json.dumps(results["evaluations"], sort_keys=True).encode()}
    else:
        return {}
    files = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.name not in ("privacy_ledger.json",):
                data = path.read_bytes().replace(str(out).encode(), b"<OUT>")
                # the ledger copied into a synthetic set's manifest carries its creation time
                files[str(path.relative_to(out))] = re.sub(rb'"created_at": "[^"]*"', b'"created_at": ""', data)
    if command == "pipeline":
        for name in ("zero_shot/metrics.json", "original/metrics.json", "eps-inf/metrics.json"):
            metrics = json.loads((out / name).read_text())
            metrics.pop("eval_seconds", None)
            files[name] = json.dumps(metrics, sort_keys=True).encode()
    return files


def final_ledger(command: str, out: Path) -> PrivacyLedger | None:
    if command in ("generator-dp", "retriever-dp", "federated-dp"):
        return PrivacyLedger.load(out)
    if command == "pipeline":
        return PrivacyLedger.load(out / "eps-4" / "generator")
    return None


def complete(command: str, out: Path) -> bool:
    if command in ("federated", "federated-dp"):
        results = out / "results.json"
        return results.is_file() and "+query-encoders+fed-negative" in json.loads(results.read_text())["evaluations"]
    marker = {"generator-dp": "generator.json", "generator-plain": "generator.json", "generate": "manifest.json",
              "retriever": "privacy_ledger.json", "retriever-dp": "dp_mechanism.json",
              "pipeline": "summary.json"}[command]
    return (out / marker).is_file()


def main() -> None:
    parser = argparse.ArgumentParser(description=(
        "SIGKILL each command after a delay drawn from [0, 1.1 x its uninterrupted time], resume it until an attempt "
        "finishes, then check: the artefact is complete; a deterministic run equals the uninterrupted one byte for "
        "byte; a DP run's ledger and budget record charge at least the noisy updates that may have reached disk "
        "(counted by a hook that fsyncs before each parameter write). Tiny models built in code, CPU, one thread."))
    parser.add_argument("--commands", default="generator-dp,generator-plain,generate,retriever,retriever-dp,pipeline,"
                                              "federated,federated-dp")
    parser.add_argument("--trials", type=int, default=4, help="trials per command (pipeline: half)")
    parser.add_argument("--kills", type=int, default=4, help="at most this many kills per trial")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "fault_injection.json")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="privret-fi-"))
    os.environ["PRIVRET_BUDGET_DIR"] = str(work / "budget")
    setup = Setup(work)
    from privret.train.generator import train_generator

    train_generator(setup.pairs, work / "plain-generator", setup.generator_cfg(math.inf), data_hash="fi")
    summary = {}
    try:
        for command in args.commands.split(","):
            ref = work / f"ref-{command}"
            status, ref_seconds = attempt(setup, command, ref, work / f"truth-ref-{command}", None)
            assert status == "ok", f"reference run of {command} failed"
            reference = artefact_files(command, ref)
            row = {"reference_seconds": round(ref_seconds, 1), "trials": 0, "kills": 0, "attempts": 0,
                   "resumed": 0, "failed_attempts": 0, "identical": 0, "compared": 0, "ledger_checks": 0,
                   "ledger_ge_truth": 0, "min_ledger_minus_truth": None, "extra_steps_charged": []}
            trials = max(1, args.trials // 2) if command == "pipeline" else args.trials
            for trial in range(trials):
                out = work / f"{command}-{trial}"
                truth_file = work / f"truth-{command}-{trial}"
                kills = 0
                while True:
                    kill_after = rng.uniform(0.0, 1.1 * ref_seconds) if kills < args.kills else None
                    status, seconds = attempt(setup, command, out, truth_file, kill_after)
                    if args.verbose:
                        print(f"  {command} trial {trial}: {status} after {seconds:.1f} s (kill at {kill_after})",
                              flush=True)
                    row["attempts"] += 1
                    if status == "killed":
                        kills += 1
                        continue
                    if status == "failed":
                        row["failed_attempts"] += 1
                        if row["failed_attempts"] > 3 * trials:
                            raise SystemExit(f"{command}: attempts keep failing")
                        continue
                    if complete(command, out):
                        break
                row["trials"] += 1
                row["kills"] += kills
                row["resumed"] += int(complete(command, out))
                if reference:
                    row["compared"] += 1
                    got = artefact_files(command, out)
                    row["identical"] += int(got == reference)
                    if got != reference and args.verbose:
                        print("  differs:", sorted(k for k in set(got) | set(reference) if got.get(k) != reference.get(k)))
                ledger = final_ledger(command, out)
                if ledger is not None:
                    truth = truth_steps(truth_file)
                    registry = ledger.steps if command.startswith("federated") else max(  # not in the registry
                        r.steps for r in budget.releases(ledger.dataset_id)
                        if r.artefact == str(out) or r.artefact.startswith(str(out) + "/"))
                    row["ledger_checks"] += 1
                    row["ledger_ge_truth"] += int(ledger.steps >= truth and registry >= truth)
                    gap = ledger.steps - truth
                    row["min_ledger_minus_truth"] = gap if row["min_ledger_minus_truth"] is None else min(
                        row["min_ledger_minus_truth"], gap)
                    row["extra_steps_charged"].append(ledger.steps - ledger.planned_steps)
                print(json.dumps({"command": command, "trial": trial, "kills": kills}), flush=True)
                shutil.rmtree(out, ignore_errors=True)
            summary[command] = row
            print(json.dumps({command: row}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    totals = {k: sum(r[k] for r in summary.values()) for k in ("kills", "attempts", "resumed", "trials", "identical",
                                                               "compared", "ledger_checks", "ledger_ge_truth")}
    result = {"seed": args.seed, "max_kills_per_trial": args.kills, "commands": summary, "totals": totals}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(totals))


if __name__ == "__main__":
    main()
