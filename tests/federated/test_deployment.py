"""A real Flower deployment on loopback: one SuperLink and two SuperNodes as separate processes.

``flwr run`` submits the privret Flower App (written by ``write_flower_app``) to the SuperLink; the
ServerApp runs FedAvg rounds (BM25 warm-up, then static hard negatives) through the SuperNodes'
ClientApps and evaluates, with a tiny encoder built in code. (Every message starts a ClientApp
process that imports torch, so the personalisation stage, which needs five more message rounds, is
exercised in-process by ``test_pipeline.py`` instead, with the same apps.) The second test kills a
SuperNode, then the ServerApp, with SIGKILL in the middle of a round and resumes the run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from privret.data.fed_squad import build_fed_squad  # noqa: E402
from privret.settings.federated import FedConfig  # noqa: E402
from privret.federated.runner import write_flower_app  # noqa: E402

BIN = Path(sys.executable).parent
needs_flower = pytest.mark.skipif(shutil.which("flower-superlink", path=str(BIN)) is None,
                                  reason="Flower executables missing")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args, log: Path, env) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)  # the group we started (SuperNode/SuperLink and their children)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (Flower starts the ServerApp in a process session of its own)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        found += children
        frontier = children
    return found


def _wait_for(condition, what: str, timeout: float = 600) -> float:
    """Poll ``condition`` until true; returns the seconds waited (fails after ``timeout``)."""
    start = time.time()
    while not condition():
        assert time.time() - start < timeout, f"waited {timeout:g} s for {what}"
        time.sleep(0.2)
    return time.time() - start


class Deployment:
    """A SuperLink and one SuperNode per Fed-SQuAD client on loopback, each a process group of its own."""

    def __init__(self, tmp_path: Path, data: Path, n_nodes: int = 2):
        self.tmp, self.data = tmp_path, data
        self.port = _free_port()
        home = tmp_path / "flwr-home"
        home.mkdir()
        (home / "config.toml").write_text(f'[superlink]\ndefault = "loop"\n\n[superlink.loop]\n'
                                          f'address = "127.0.0.1:{self.port}"\ninsecure = true\n')
        self.env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                    "OMP_NUM_THREADS": "1"}
        self.link = _start([str(BIN / "flower-superlink"), "--insecure", "--port", str(self.port),
                            "--disable-runtime-dependency-installation"], tmp_path / "superlink.log", self.env)
        self.nodes: dict[int, subprocess.Popen] = {}
        self.started = 0
        for i in range(n_nodes):
            self.start_node(i)
        _wait_for(lambda: "Uvicorn running" in (tmp_path / "superlink.log").read_text(), "the SuperLink", 60)

    def start_node(self, i: int) -> None:
        self.started += 1
        self.nodes[i] = _start([str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                                "--port", str(_free_port()),
                                "--node-config", f"data-dir='{self.data}' client='client_{i:02d}'"],
                               self.tmp / f"supernode{i}-{self.started}.log", self.env)

    def kill_node(self, i: int) -> None:
        """SIGKILL to the SuperNode and the ClientApp it runs."""
        _stop(self.nodes[i], signal.SIGKILL)

    def kill_server(self) -> int:
        """SIGKILL to every running ServerApp process; returns how many there were."""
        pids = [p for p in _descendants(self.link.pid)
                if b"flwr-serverapp" in Path(f"/proc/{p}/cmdline").read_bytes()]
        for p in pids:
            os.kill(p, signal.SIGKILL)
        return len(pids)

    def submit(self, app: Path, log: Path) -> subprocess.Popen:
        """``flwr run APP --stream``: exits when the run ends, with the ServerApp's log in ``log``."""
        return _start([str(BIN / "flwr"), "run", str(app), "loop", "--stream"], log, self.env)

    def close(self) -> None:
        server = _descendants(self.link.pid)
        for p in [*self.nodes.values(), self.link]:
            _stop(p)
        for pid in server:  # the ServerApp's process session, if it outlived the SuperLink
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _tiny_cfg(model: str, **kw) -> FedConfig:
    return FedConfig(**{**dict(model=model, rounds=2, warmup_rounds=1, batch_size=2, n_negatives=1, hard_k=3, bm25_k=3,
                               personalize=[], bf16=False), **kw})


@pytest.mark.slow
@needs_flower
def test_superlink_and_two_supernodes_run_two_rounds(tiny_squad, tiny_encoder, tmp_path):
    data = tmp_path / "fed"
    build_fed_squad(tiny_squad, data, n_clients=2, seed=0)
    cfg = _tiny_cfg(tiny_encoder)
    out = tmp_path / "out"
    app = write_flower_app(tmp_path / "app", cfg, out_dir=str(out), num_clients=2)
    deployment = Deployment(tmp_path, data)
    try:
        run = deployment.submit(app, tmp_path / "run.log")
        run.wait(timeout=1200)  # generous: CI machines may be loaded
        assert run.returncode == 0, (tmp_path / "run.log").read_text()[-6000:]
        _wait_for(lambda: (out / "results.json").is_file() and "pdd-as2" in
                  json.loads((out / "results.json").read_text())["evaluations"], "results.json", 60)
        results = json.loads((out / "results.json").read_text())
    finally:
        deployment.close()
    assert [r["round"] for r in results["rounds"]] == [1, 2]
    assert [r["stage"] for r in results["rounds"]] == ["bm25", "hard"]
    from privret.federated.arrays import new_encoder, trainable_parameters

    params = trainable_parameters(new_encoder(cfg))  # the default wire: trainable layers as float16
    payload = 2 * 2 * sum(p.numel() for p in params.values())  # 2 clients x 2 bytes
    for r in results["rounds"]:  # weights down, updates (+ a scale per tensor) up, through the real SuperLink
        assert payload <= r["bytes_down"] <= payload + 2 * 200 * len(params)
        assert payload <= r["bytes_up"] <= payload + 4 * 200 * len(params)
    ev = results["evaluations"]
    assert set(ev["pdd-as2"]["per_client"]) == {"client_00", "client_01"}
    assert all(0 <= m["sentence"]["recall@1"] <= 1 for m in ev["pdd-as2"]["per_client"].values())
    assert (out / "privacy_ledger.json").is_file()


def _rounds_done(out: Path) -> int:
    try:
        return int(json.loads((out / "state.json").read_text())["rounds_done"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.slow
@needs_flower
def test_a_supernode_then_the_server_killed_mid_round_resume_without_losing_or_repeating_a_round(
        tiny_squad, tiny_encoder, tmp_path):
    """SIGKILL a SuperNode while round 2 runs: the server stops with "client failure" (Flower answers for a node
    that misses its heartbeats) and keeps round 1. With the node back, a new ``flwr run`` resumes at round 2;
    SIGKILL its ServerApp while round 3 runs; a third ``flwr run`` finishes. Each round is aggregated once: the
    ledger and history count 3, and the global model is the uninterrupted in-process run's (up to the order in
    which the SuperLink delivered the two replies to FedAvg's sum), not the one of 2 rounds or of a repeated one."""
    from privret.federated.arrays import checkpoint_round, load_arrays
    from privret.federated.runner import run_federated_local

    data = tmp_path / "fed"
    build_fed_squad(tiny_squad, data, n_clients=2, seed=0)
    cfg = _tiny_cfg(tiny_encoder, rounds=3, learning_rate=1e-2, wire_dtype="float32", round_timeout=300)
    run_federated_local(cfg.model_copy(update={"rounds": 2}), data, tmp_path / "ref2", resume=False)
    run_federated_local(cfg, data, tmp_path / "ref3", resume=False)
    out = tmp_path / "out"
    app = write_flower_app(tmp_path / "app", cfg, out_dir=str(out), num_clients=2)
    deployment = Deployment(tmp_path, data)
    try:
        first = deployment.submit(app, tmp_path / "run1.log")
        _wait_for(lambda: _rounds_done(out) >= 1, "round 1")
        deployment.kill_node(1)  # round 2's messages are out: its ClientApp is starting or training
        stopped_after = _wait_for(lambda: first.poll() is not None, "the server to stop", 400)
        log = (tmp_path / "run1.log").read_text()
        assert "client failure" in log, log[-6000:]
        state = json.loads((out / "state.json").read_text())
        assert (state["rounds_done"], state["aggregates_written"], checkpoint_round(out / "global.npz")) == (1, 1, 1)

        deployment.start_node(1)
        second = deployment.submit(app, tmp_path / "run2.log")
        _wait_for(lambda: _rounds_done(out) >= 2, "round 2")
        assert deployment.kill_server() == 1  # round 3's messages are out
        _stop(second)  # the log stream of a run whose ServerApp is gone
        state = json.loads((out / "state.json").read_text())
        assert (state["rounds_done"], state["aggregates_written"], checkpoint_round(out / "global.npz")) == (2, 2, 2)

        third = deployment.submit(app, tmp_path / "run3.log")
        third.wait(timeout=1200)
        assert third.returncode == 0, (tmp_path / "run3.log").read_text()[-6000:]
        _wait_for(lambda: (out / "results.json").is_file(), "results.json", 60)
    finally:
        deployment.close()
    results = json.loads((out / "results.json").read_text())
    print(f"server stopped {stopped_after:.0f} s after the SuperNode's SIGKILL: "
          + next(line for line in log.splitlines() if line.startswith("RuntimeError: client failure")))
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3]
    assert not any(r.get("recovered") for r in results["rounds"])
    assert results["ledger"]["steps"] == 3 and json.loads((out / "privacy_ledger.json").read_text())["steps"] == 3
    got, ref3, ref2 = (load_arrays(p / "global.npz") for p in (out, tmp_path / "ref3", tmp_path / "ref2"))
    off = max(float(np.abs(got[k].numpy() - ref3[k].numpy()).max()) for k in ref3)
    one_round = max(float(np.abs(ref3[k].numpy() - ref2[k].numpy()).max()) for k in ref3)
    print(f"global model: {off:.2e} from the uninterrupted run's, {one_round:.2e} between its rounds 2 and 3")
    assert off < 1e-3 * one_round, (off, one_round)
