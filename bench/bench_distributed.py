"""DP generator training throughput, 2 processes x 1 thread against 1 process x 1 thread, alternated.
Reproduces docs/results.md, "Speed and scale" (bench/results/distributed.json; --batch 16: distributed_batch16.json).
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/bench_distributed.py --batch 32 \\
        --data ../shared/data/scifact --out bench/results/distributed.json
2 CPU cores: about 15 min (3 repeats of each side, 4 steps of 7 to 14 s after a warm-up and the frozen-layer cache)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch


def worker(args) -> None:
    """One rank: time the steps and (rank 0) print one JSON line."""
    from opacus import GradSampleModule

    from privret import distributed
    from privret.data.beir import load_beir
    from privret.data.pairs import pairs_from_beir
    from privret.models.generator import load_generator
    from privret.train import generator as gtrain

    torch.set_num_threads(1)
    group = distributed.current()
    pairs = pairs_from_beir(load_beir(args.data), "train")
    units = pairs.units("query")
    g = torch.Generator().manual_seed(0)
    batches = [torch.randperm(len(units), generator=g)[: args.batch].tolist() for _ in range(args.steps + 1)]
    torch.manual_seed(0)
    gen = load_generator(args.model, trained_layers=args.trained_layers, bf16=False)
    gen.make_trainable("lora", lora_rank=8, lora_alpha=16)
    needed = sorted({r for chosen in batches for u in group.shard(chosen) for r in units[u]})
    examples = [gen.example(pairs.corpus[pairs.pairs[r].doc_id].full_text, pairs.pairs[r].query) for r in needed]
    start = time.perf_counter()
    items = dict(zip(needed, gen.prepare(examples)))
    prepare_s = (time.perf_counter() - start) / max(1, len(needed))
    cache_bytes = sum(t.numel() * t.element_size() for item in items.values() for t in _tensors(item))
    module = GradSampleModule(gen.loss_module(), batch_first=True, loss_reduction="sum")
    params = gen.trainable_parameters()
    optimizer = torch.optim.Adam(params.values(), lr=1e-3)
    cfg = gtrain.GeneratorTrainConfig(clip_norm=1.0, physical_batch=args.physical_batch, bf16=False)
    rng = torch.Generator().manual_seed(1) if group.main else None
    rows, elapsed = 0, 0.0
    for k, chosen in enumerate(batches):
        group.barrier()
        start = time.perf_counter()
        gtrain._dp_step(gen, module, items, units, group.shard(chosen), params, cfg, 1.0, float(args.batch), rng,
                        group)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if k > 0:  # the first step warms up
            elapsed += time.perf_counter() - start
            rows += sum(len(units[u]) for u in chosen)
    peak = group.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if group.main:
        print(json.dumps({"processes": group.world_size, "examples_per_s": rows / elapsed,
                          "seconds_per_step": elapsed / args.steps, "rows": rows,
                          "prepare_seconds_per_example": prepare_s,
                          "cache_bytes_per_example": cache_bytes / max(1, len(needed)),
                          "peak_rss_bytes_per_process": max(peak)}))


def _tensors(item):
    if isinstance(item, torch.Tensor):
        return [item]
    if isinstance(item, dict):
        return [t for v in item.values() for t in _tensors(v)]
    if isinstance(item, (list, tuple)):
        return [t for v in item for t in _tensors(v)]
    return [t for v in getattr(item, "__dict__", {}).values() for t in _tensors(v)]


def measure(args, processes: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, __file__, "--worker", "--data", args.data, "--model", args.model, "--batch",
               str(args.batch), "--steps", str(args.steps), "--trained-layers", str(args.trained_layers),
               "--physical-batch", str(args.physical_batch)]
    procs = []
    for rank in range(processes):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if processes > 1:
            env.update(WORLD_SIZE=str(processes), RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"a worker failed: {[p.returncode for p in procs]}")
    return json.loads(outputs[0].strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="../shared/data/scifact")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=16, help="units per step (global)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--trained-layers", type=int, default=8)
    parser.add_argument("--physical-batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    runs = []
    for repeat in range(args.repeats):
        for processes in (1, 2):
            result = measure(args, processes)
            result["repeat"] = repeat
            runs.append(result)
            print(json.dumps(result), flush=True)
    speedups = [b["examples_per_s"] / a["examples_per_s"] for a, b in zip(runs[::2], runs[1::2])]
    summary = {"setup": {k: v for k, v in vars(args).items() if k not in ("out", "worker")},
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "loadavg_at_end": os.getloadavg()},
               "runs": runs, "speedup_per_repeat": speedups}
    print(json.dumps({"speedup_per_repeat": speedups}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
