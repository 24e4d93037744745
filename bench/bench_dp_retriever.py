"""Step time and peak memory of the direct-DP retriever methods against non-private in-batch training.
Reproduces docs/results.md, "Speed and scale" (bench/results/dp_retriever_grid.json, logit_dp_vs_materialise.json).
    python bench/bench_dp_retriever.py --quick            # tiny: batch 8 and 16, top:1, short texts, 2 steps
    (the published grids' two commands: bench/README.md)
2 CPU cores, one thread: about 3 h for the grid of dp_retriever_grid.json; --quick about a minute."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "scifact"


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(args: dict, queue) -> None:
    import torch

    from privret.runtime import keep_freed_memory

    if args.get("keep_freed_memory"):  # as the privret CLI does
        keep_freed_memory()
    torch.set_num_threads(args["threads"])
    import torch.nn.functional as F

    from privret.data.beir import load_beir
    from privret.data.pairs import pairs_from_beir
    from privret.models.encoder import load_encoder
    from privret.train.clipped_sums import StepBatch, _encode, clipped_sum
    from privret.models.trainable import make_trainable
    from privret.settings.training import DPRetrieverConfig

    n, method = args["batch"], args["method"]
    pairs = pairs_from_beir(load_beir(args["data"], splits=["train"]), "train")
    seen, rows = set(), []
    for p in pairs.pairs:  # one row per query, distinct queries
        if p.query not in seen:
            seen.add(p.query)
            rows.append(p)
        if len(rows) == n:
            break
    negatives = list(pairs.corpus.values())[:args["negatives"]]
    batch = StepBatch(queries=[r.query for r in rows], docs=[pairs.corpus[r.doc_id].full_text for r in rows],
                      unit_of_row=torch.arange(len(rows)), doc_ids=[r.doc_id for r in rows], n_units=len(rows),
                      negatives=negatives)
    model = load_encoder("minilm-l6", max_seq_length=args["doc_tokens"])
    model.train()
    params = list(make_trainable(model, args["trainable"], lora_rank=8).values())
    cfg = DPRetrieverConfig(method=method if method in ("naive", "batch-clip", "logit-dp", "public-negatives")
                            else "logit-dp", clip_norm=1.0, max_query_tokens=args["query_tokens"],
                            max_doc_tokens=args["doc_tokens"], public_negatives=args["negatives"], temperature=0.05,
                            hard_negatives=0, physical_batch=None)  # the grid's random negatives, one pass
    cuda = torch.cuda.is_available()

    def non_private_step():
        e_q = _encode(model, batch.queries, cfg.max_query_tokens)
        e_d = _encode(model, batch.docs, cfg.max_doc_tokens)
        loss = F.cross_entropy(e_q @ e_d.T / cfg.tau, torch.arange(n, device=e_q.device))
        loss.backward()
        for p in params:
            p.grad = None

    def step():
        if method == "non-private":
            non_private_step()
        elif method == "materialise":
            materialise(model, params, batch, cfg)
        else:
            clipped_sum(method, model, params, batch, cfg)

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    # Interleaved: each step of the method is followed by a reference step (non-private, or the
    # materialising baseline) in the same process, so the ratio compares steps that ran under the same
    # load (the first pair warms up unless warmup is 0).
    interleave = args.get("interleave", False) and method != "non-private"
    reference_step = (lambda: materialise(model, params, batch, cfg)) if args.get("versus") == "materialise" \
        else non_private_step
    warmup = args.get("warmup", 1)
    base = _rss_mb()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times, reference = [], []
    for k in range(args["steps"] + warmup):
        t = timed(step)
        r = timed(reference_step) if interleave else None
        if k >= warmup:
            times.append(t)
            if r is not None:
                reference.append(r)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _peak_mb() - base
    result = {"seconds": statistics.median(times), "peak_mb": peak, "trainable_params": sum(p.numel() for p in params)}
    if reference:
        result["reference_seconds"] = statistics.median(reference)
    queue.put(result)


def materialise(model, params, batch, cfg):
    """Algorithm 1 with every g_ij materialised (one at a time): per-sequence graphs, n^2 backward passes."""
    import torch

    from privret.train.clipped_sums import _encode, _grads, _norm

    e_q = [_encode(model, [q], cfg.max_query_tokens)[0] for q in batch.queries]
    e_d = [_encode(model, [d], cfg.max_doc_tokens)[0] for d in batch.docs]
    n = len(e_q)
    with torch.no_grad():
        tau = torch.softmax(torch.stack(e_q) @ torch.stack(e_d).T / cfg.tau, 1) - torch.eye(n)
    total = [torch.zeros_like(p) for p in params]
    for i in range(n):
        for j in range(n):
            # logit_ij built on its own, so its backward walks only the graphs of q_i and d_j
            g = _grads((e_q[i] * e_d[j]).sum() / cfg.tau, params, retain=True)
            f = min(1.0, cfg.clip_norm / max(_norm(g).item(), 1e-12))
            for t, x in zip(total, g):
                t.add_(x, alpha=float(tau[i, j]) * f)
    return total


def measure(spec: dict) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, args=(spec, queue))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        return {"error": f"exit code {proc.exitcode}"}
    return queue.get()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="batch 8,16; top:1; 32/64 tokens; 2 steps")
    ap.add_argument("--batch-sizes", default=None)
    ap.add_argument("--trainable", default=None, help="comma list of all, top:K, lora")
    ap.add_argument("--methods", default="naive,batch-clip,logit-dp,public-negatives")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--materialise-batch", default=None, help="comma list; default 128 (quick: 8); 0: skip")
    ap.add_argument("--query-tokens", type=int, default=None, help="default 64 (quick: 32)")
    ap.add_argument("--doc-tokens", type=int, default=None, help="default 256 (quick: 64)")
    ap.add_argument("--negatives", type=int, default=None, help="public negatives; default 32 (quick: 16)")
    ap.add_argument("--max-batch", default="", help="per-method batch limits, e.g. naive=64,logit-dp=128")
    ap.add_argument("--interleave", action="store_true",
                    help="time each method step next to a non-private step in the same process (fair under load)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="untimed steps before the timed ones (0 for cells whose steps take minutes)")
    ap.add_argument("--default-malloc", action="store_true",
                    help="leave glibc's malloc settings alone (the CLI applies privret.runtime.keep_freed_memory)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--json", type=Path, default=None,
                    help="write the rows here after every cell; cells already in it are not measured again")
    a = ap.parse_args(argv)
    quick = a.quick
    batches = [int(b) for b in (a.batch_sizes or ("8,16" if quick else "32,64,128,256")).split(",")]
    trainables = (a.trainable or ("top:1" if quick else "all,top:2,lora")).split(",")
    steps = a.steps or (2 if quick else 3)
    mat_batches = [int(b) for b in (a.materialise_batch or ("8" if quick else "128")).split(",") if int(b) > 0]
    common = {"threads": a.threads, "data": str(a.data), "steps": steps,
              "query_tokens": a.query_tokens or (32 if quick else 64),
              "doc_tokens": a.doc_tokens or (64 if quick else 256),
              "negatives": a.negatives or (16 if quick else 32)}
    methods = a.methods.split(",")
    max_batch = {m: int(b) for m, b in (item.split("=") for item in a.max_batch.split(",") if item)}
    if a.interleave:
        common["interleave"] = True
    if a.warmup != 1:
        common["warmup"] = a.warmup
    if not a.default_malloc:
        common["keep_freed_memory"] = True
    done = json.loads(a.json.read_text()) if a.json and a.json.exists() else []
    rows = list(done)

    def cell(trainable: str, batch: int, method: str, **extra) -> dict:
        """Measure one cell, or take it from ``--json`` when a run with the same settings already did."""
        spec = {**common, "trainable": trainable, "batch": batch, "method": method, **extra}
        for row in done:
            if row.get("spec") == spec:
                return row
        row = {"trainable": trainable, "batch": batch, "method": method, "spec": spec, **measure(spec)}
        rows.append(row)
        if a.json:
            tmp = a.json.with_suffix(".tmp")
            tmp.write_text(json.dumps(rows, indent=1) + "\n")
            tmp.replace(a.json)
        return row

    print(f"config: {json.dumps({**common, 'batches': batches, 'trainable': trainables})}", flush=True)
    print("| trainable | batch | method | step s | peak MB | time / non-private | memory / non-private |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for tr in trainables:
        for n in batches:
            ref = cell(tr, n, "non-private")
            print(f"| {tr} | {n} | non-private | {ref['seconds']:.3f} | {ref['peak_mb']:.0f} | 1.00 | 1.00 |", flush=True)
            for m in methods:
                if n > max_batch.get(m, n):
                    continue
                r = cell(tr, n, m)
                if "error" in r:
                    print(f"| {tr} | {n} | {m} | {r['error']} | | | |", flush=True)
                    continue
                ratio = r["seconds"] / r.get("reference_seconds", ref["seconds"])
                print(f"| {tr} | {n} | {m} | {r['seconds']:.3f} | {r['peak_mb']:.0f} | "
                      f"{ratio:.2f} | {r['peak_mb'] / max(ref['peak_mb'], 1):.2f} |", flush=True)
    for mat_batch in mat_batches:
        print(f"\nlogit-dp vs materialising every g_ij, batch {mat_batch}:", flush=True)
        for tr in trainables:
            if a.interleave:  # one process, one step of each after no warm-up (steps take minutes)
                ours = cell(tr, mat_batch, "logit-dp", steps=1, versus="materialise", warmup=0)
                mat = {"seconds": ours["reference_seconds"]}
                memory = f"peak of the process running both {ours['peak_mb']:.0f} MB"
            else:
                ours = cell(tr, mat_batch, "logit-dp", steps=1)
                mat = cell(tr, mat_batch, "materialise", steps=1)
                memory = f"peak MB logit-dp {ours['peak_mb']:.0f}, materialise {mat['peak_mb']:.0f}"
            all_at_once = mat_batch ** 2 * ours.get("trainable_params", 0) * 4 / 2**30
            print(f"{tr}: logit-dp {ours['seconds']:.2f} s, materialise {mat['seconds']:.2f} s (streamed; {memory}; "
                  f"all n^2 g_ij at once would take {all_at_once:.1f} GiB); "
                  f"speed-up {mat['seconds'] / ours['seconds']:.1f}x", flush=True)


if __name__ == "__main__":
    sys.exit(main())
