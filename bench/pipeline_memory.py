"""Resident memory (RSS) of `privret pipeline` after each stage, and after the release between stages.

Wraps the stage functions of privret.pipeline and prints the process's RSS (from /proc), its peak
(getrusage) and the number of live transformer / SentenceTransformer / GradSampleModule objects after
each one; with privret.pipeline.release_memory present, also after each release.

    python bench/pipeline_memory.py tiny RUN_DIR   # the tiny models of tests/test_pipeline.py
    python bench/pipeline_memory.py demo RUN_DIR   # the bundled demo data, a reduced demo config (~7 min, 2 cores)

Set PRIVRET_BUDGET_DIR to keep its DP runs out of your budget registry. Linux only (/proc).
"""
import gc, math, os, resource, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests"))
import torch
torch.set_num_threads(1)
import privret, privret.pipeline as P
print("privret from", privret.__file__, flush=True)

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

def live_modules():
    import torch.nn as nn
    return sum(1 for o in gc.get_objects() if isinstance(o, nn.Module) and type(o).__name__.endswith(("Model", "ForCausalLM", "SentenceTransformer", "GradSampleModule")))

T0 = time.time()
def wrap(name):
    fn = getattr(P, name)
    def inner(*a, **k):
        r = fn(*a, **k)
        # live models right now, before any collection of ours (gc.get_objects does not collect)
        print(f"[{time.time()-T0:7.1f}s] after {name:20s} rss={rss_mb():7.1f} MB  peak={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:7.1f} MB  live_models={live_modules()}", flush=True)
        return r
    setattr(P, name, inner)
for n in ("train_generator", "generate_synthetic", "filter_round_trip", "train_retriever", "train_dp_retriever", "evaluate_per_query"):
    wrap(n)
# stage boundaries of the new code (if present)
if hasattr(P, "release_memory"):
    rel = P.release_memory
    def rel2(*a, **k):
        rel(*a, **k)
        print(f"[{time.time()-T0:7.1f}s]   released            rss={rss_mb():7.1f} MB  live_models={live_modules()}", flush=True)
    P.release_memory = rel2

from privret.config import BudgetSettings, DirectDPGrid, GeneratorStage, PipelineConfig
from privret.synth.settings import GenerateConfig
from privret.synth.settings import RoundTripFilterConfig
from privret.train.settings import RetrieverTrainConfig
mode, run_dir = sys.argv[1], sys.argv[2]
if mode == "tiny":
    import helpers
    from pathlib import Path
    base = Path(run_dir + "-models"); base.mkdir(parents=True, exist_ok=True)
    llama = helpers.write_tiny_llama(base / "llama"); bert = helpers.write_tiny_bert(base / "bert")
    corpus = [{"_id": i, "title": t, "text": x} for i, t, x in helpers.TOY_DOCS]
    queries = [{"_id": q, "text": t} for q, t, _ in helpers.TOY_TRAIN + helpers.TOY_TEST]
    qrels = {"train": [(q, d, 1) for q, _, ds in helpers.TOY_TRAIN for d in ds],
             "test": [(q, d, 1) for q, _, ds in helpers.TOY_TEST for d in ds]}
    toy = helpers.write_beir_dir(base / "toy", corpus, queries, qrels)
    cfg = PipelineConfig(
        name="toy", dataset=toy, epsilons=[math.inf, 4.0], synthetic_documents="corpus",
        generator=GeneratorStage(model=str(llama), batch_size=2, epochs=1, trained_layers=1, lora_rank=4, bf16=False),
        generate=GenerateConfig(num_queries=2, max_new_tokens=6, batch_size=4),
        retriever=RetrieverTrainConfig(model=str(bert), epochs=1, batch_size=4, bf16=False),
        direct_dp=DirectDPGrid(methods=["public-negatives", "batch-clip"], epsilons=[4.0],
                               settings={"model": str(bert), "batch_size": 2, "public_negatives": 3},
                               per_method={"batch-clip": {"trainable": "top:1"}}),
        synthetic_filter=RoundTripFilterConfig(encoder=str(bert), top_k=2),
        budget=BudgetSettings(allow_over=True))  # a measurement, run again and again on the same data
else:
    from privret.data.demo import demo_dataset_dir
    cfg = PipelineConfig(
        name="demo-mem", dataset=demo_dataset_dir(), epsilons=[8.0], synthetic_documents="corpus",
        generator=GeneratorStage(batch_size=32, epochs=1, trained_layers=2, max_doc_tokens=64, learning_rate=2e-3,
                                 checkpoint_every=50),
        generate=GenerateConfig(num_queries=1, batch_size=32, max_new_tokens=12),
        retriever=RetrieverTrainConfig(epochs=1, batch_size=32),
        direct_dp=DirectDPGrid(methods=["batch-clip"], epsilons=[8.0], settings={"batch_size": 32, "epochs": 1}),
        budget=BudgetSettings(allow_over=True))  # a measurement, run again and again on the same data
print(f"start rss={rss_mb():.1f} MB", flush=True)
P.run_pipeline(cfg, run_dir)
gc.collect()
print(f"end rss={rss_mb():.1f} MB peak={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss/1024:.1f} MB total {time.time()-T0:.0f}s", flush=True)
