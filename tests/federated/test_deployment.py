"""A real Flower deployment on loopback: one SuperLink and two SuperNodes as separate processes.

``flwr run`` submits the privret Flower App (written by ``write_flower_app``) to the SuperLink; the
ServerApp runs two FedAvg rounds (BM25 warm-up, then static hard negatives) through the SuperNodes'
ClientApps and evaluates, with a tiny encoder built in code. (Every message starts a ClientApp
process that imports torch, so the personalisation stage, which needs five more message rounds, is
exercised in-process by ``test_pipeline.py`` instead, with the same apps.)
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

import pytest

pytest.importorskip("flwr")

from privret.data.fed_squad import build_fed_squad  # noqa: E402
from privret.federated.config import FedConfig  # noqa: E402
from privret.federated.runner import write_flower_app  # noqa: E402

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args, log: Path, env) -> subprocess.Popen:
    return subprocess.Popen(args, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group we started (SuperNode/SuperLink and their children)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("flower-superlink", path=str(BIN)) is None, reason="Flower executables missing")
def test_superlink_and_two_supernodes_run_two_rounds(tiny_squad, tiny_encoder, tmp_path):
    data = tmp_path / "fed"
    build_fed_squad(tiny_squad, data, n_clients=2, seed=0)
    cfg = FedConfig(model=tiny_encoder, rounds=2, warmup_rounds=1, batch_size=2, n_negatives=1, hard_k=3, bm25_k=3,
                    personalize=[], bf16=False)
    out = tmp_path / "out"
    app = write_flower_app(tmp_path / "app", cfg, out_dir=str(out), num_clients=2)
    link_port = _free_port()
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "loop"\n\n[superlink.loop]\n'
                                      f'address = "127.0.0.1:{link_port}"\ninsecure = true\n')
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1"}
    procs = []
    try:
        procs.append(_start([str(BIN / "flower-superlink"), "--insecure", "--port", str(link_port),
                             "--disable-runtime-dependency-installation"], tmp_path / "superlink.log", env))
        for i in range(2):
            procs.append(_start([str(BIN / "flower-supernode"), "--insecure", "--superlink",
                                 f"127.0.0.1:{link_port}", "--port", str(_free_port()),
                                 "--node-config", f"data-dir='{data}' client='client_{i:02d}'"],
                                tmp_path / f"supernode{i}.log", env))
        deadline = time.time() + 60
        while "Uvicorn running" not in (tmp_path / "superlink.log").read_text() and time.time() < deadline:
            time.sleep(0.5)
        run = subprocess.run([str(BIN / "flwr"), "run", str(app), "loop", "--stream"], env=env, capture_output=True,
                             text=True, timeout=1200)  # generous: CI machines may be loaded
        logs = run.stdout[-3000:] + run.stderr[-3000:]
        assert run.returncode == 0, logs
        for _ in range(60):  # the ServerApp writes results.json atomically when it is done
            if (out / "results.json").is_file() and "pdd-as2" in \
                    json.loads((out / "results.json").read_text())["evaluations"]:
                break
            time.sleep(1)
        results = json.loads((out / "results.json").read_text())
    finally:
        for p in reversed(procs):
            _stop(p)
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
