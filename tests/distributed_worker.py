"""One rank of the multi-process tests (tests/test_distributed.py starts W of these with the environment torchrun
sets: WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Not a test module itself.

    python distributed_worker.py generator-step LLAMA_DIR OUT_DIR
        rank 0 saves OUT_DIR/step.pt: the gradients one DP step of the generator sets on every rank (noise off,
        each rank clipping its shard of all units), the one-process gradients for the same units, and the noise
        one noisy step of 4096 x 64 zero coordinates sets (std sigma Delta = 1.5 x 0.7).
    python distributed_worker.py retriever-step BERT_DIR OUT_DIR [PUBLIC_NEGATIVES]
        the same for the direct DP retriever (public-negatives, rank 0's 5 negatives; with PUBLIC_NEGATIVES 0,
        none: rank 0 sends an empty sample and each row meets its 2 hard negatives alone).
    python distributed_worker.py generator-train LLAMA_DIR OUT_DIR EPSILON [SLEEP]
        train the generator on tests/test_dp_generator.py's toy pairs into OUT_DIR (resuming if it holds an
        interrupted run), each step slowed by SLEEP seconds; the budget registry is $PRIVRET_BUDGET_DIR.
    python distributed_worker.py generate GENERATOR_DIR OUT_DIR [DIE_ON_CALL]
        write the synthetic dataset of :func:`generation_docs` (resuming an interrupted one); with DIE_ON_CALL,
        rank 0 dies (os._exit) at its DIE_ON_CALL-th batch.
    python distributed_worker.py dp-retriever-train BERT_DIR OUT_DIR
        a whole direct DP run (public-negatives, epsilon 8) into OUT_DIR; the run's entropy (os.urandom in
        privret.train.dp_run) is fixed, so a one-process run and a two-rank run draw the same samples and noise.
    python distributed_worker.py secure-hard-negatives BERT_DIR OUT_DIR
        a whole direct DP run (public-negatives with hard negatives, ``secure_rng``) into OUT_DIR/r; every rank
        writes to OUT_DIR/draws-RANK.json the class of the random source each of its hard-negative draws used.
    python distributed_worker.py fit-retriever BERT_DIR OUT_FILE
        non-private retriever training (:func:`privret.train.retriever.fit_retriever`) on :func:`retrieval_pairs`;
        rank 0 saves the trained parameters to OUT_FILE.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch

from privret import distributed
from privret.data.beir import Document
from privret.privacy.budget import BudgetPolicy
from privret.train import generator as gtrain
from privret.settings.training import GeneratorTrainConfig

torch.set_num_threads(1)

NOISE_SHAPE, SIGMA, DELTA = (4096, 64), 1.5, 0.7
GENERATION_TEXTS = ["aspirin heart risk", "gene memory mice", "vitamin blood", "sleep immune", "cancer drug trial",
                    "immune cells", "the brain", "diet and exercise", "a virus"]


def generation_config():
    from privret.settings.synthesis import GenerateConfig

    return GenerateConfig(num_queries=2, max_new_tokens=5, batch_size=2, seed=3)


def generation_docs() -> list[Document]:
    return [Document(f"d{i}", "", t) for i, t in enumerate(GENERATION_TEXTS)]


def _generator_setup(llama_dir: str):
    from opacus import GradSampleModule

    from privret.models.generator import load_generator
    from helpers import generator_pairs

    torch.manual_seed(0)
    gen = load_generator(llama_dir, trained_layers=1, bf16=False)
    gen.make_trainable("lora", lora_rank=4)
    pairs = generator_pairs()
    items = gen.prepare([gen.example(pairs.corpus[p.doc_id].full_text, p.query) for p in pairs.pairs])
    module = GradSampleModule(gen.loss_module(), batch_first=True, loss_reduction="sum")
    return gen, pairs, items, module


def _grads(params) -> list[torch.Tensor]:
    out = [p.grad.detach().clone() for p in params]
    for p in params:
        p.grad = None
    return out


def _noise(group: distributed.Group) -> torch.Tensor:
    """What one noisy step of an all-zero clipped sum releases (times the expected batch 2): noise alone."""
    from privret.train.dp_parallel import set_noisy_mean

    param = torch.nn.Parameter(torch.zeros(NOISE_SHAPE))
    rng = torch.Generator().manual_seed(7) if group.main else None
    set_noisy_mean([param], [torch.zeros(NOISE_SHAPE)], std=SIGMA * DELTA, expected_batch=2.0, rng=rng, group=group)
    return param.grad * 2.0


def generator_step(llama_dir: str, out_dir: str) -> None:
    group = distributed.current()
    gen, pairs, items, module = _generator_setup(llama_dir)
    units = pairs.units("query")
    chosen = list(range(len(units)))
    params = gen.trainable_parameters()
    cfg = GeneratorTrainConfig(clip_norm=0.05, physical_batch=3, bf16=False)  # most units clipped
    rng = torch.Generator().manual_seed(0) if group.main else None  # sigma = 0: no noise
    gtrain._dp_step(gen, module, items, units, group.shard(chosen), params, cfg, 0.0, 4.0, rng, group)
    shared = _grads(params.values())
    result = {"distributed": shared, "noise": _noise(group)}
    if group.main:
        gtrain._dp_step(gen, module, items, units, chosen, params, cfg, 0.0, 4.0, rng)
        result["single"] = _grads(params.values())
        torch.save(result, Path(out_dir) / "step.pt")
    group.barrier()


def retriever_step(bert_dir: str, out_dir: str, public_negatives: str = "5") -> None:
    from helpers import WORDS
    from privret.data.pairs import QueryDocPair, TrainingPairs
    from privret.models.encoder import load_encoder
    from privret.train import dp_retriever as dptrain
    from privret.settings.training import DPRetrieverConfig
    from privret.models.trainable import make_trainable

    group = distributed.current()
    torch.manual_seed(0)
    model = load_encoder(bert_dir, max_seq_length=32)
    params = list(make_trainable(model, "top:1").values())
    corpus = {f"d{i}": Document(f"d{i}", "", f"{w} {WORDS[i + 20]} of the {WORDS[i + 40]}")
              for i, w in enumerate(WORDS[:12])}
    rows = [QueryDocPair(query=f"what {WORDS[i + 30]} {w}", doc_id=f"d{i}", query_id=f"q{i % 9}")
            for i, w in enumerate(WORDS[:12])]
    pairs = TrainingPairs(pairs=rows, corpus=corpus)
    units = pairs.units("query")
    cfg = DPRetrieverConfig(method="public-negatives", model=bert_dir, clip_norm=0.05,
                            public_negatives=int(public_negatives), hard_negatives=2 if public_negatives == "0" else 0,
                            max_query_tokens=16, max_doc_tokens=16)
    mech = dptrain.mechanism(cfg, 0.0)
    chosen = list(range(len(units)))
    rng = torch.Generator().manual_seed(0) if group.main else None
    pool = list(corpus.values())
    negatives = group.from_main(lambda: dptrain.draw_negatives(pool, cfg, rng))
    # one candidate a row (none for row 0, masked out): the hard draws are the same whatever each rank's generator
    hard = (pool, [[] if i == 0 else [(i + 3) % len(pool)] for i in range(len(rows))])
    batch = dptrain.build_batch(pairs, units, group.shard(chosen), cfg, rng, negatives, None, hard=hard)
    dptrain.dp_step(model, params, batch, cfg, mech, 4.0, rng, group)
    result = {"distributed": _grads(params), "noise": _noise(group)}
    if group.main:
        whole = dptrain.build_batch(pairs, units, chosen, cfg, rng, negatives, None, hard=hard)
        dptrain.dp_step(model, params, whole, cfg, mech, 4.0, rng)
        result["single"] = _grads(params)
        torch.save(result, Path(out_dir) / "step.pt")
    group.barrier()


def generator_train(llama_dir: str, out_dir: str, epsilon: str, sleep: str = "0") -> None:
    from helpers import generator_pairs

    if float(sleep) > 0:
        step = gtrain._dp_step

        def slowed(*args, **kwargs):
            time.sleep(float(sleep))
            return step(*args, **kwargs)

        gtrain._dp_step = slowed
    cfg = GeneratorTrainConfig(model=llama_dir, epsilon=float(epsilon), batch_size=3, epochs=2.0,
                                      trained_layers=1, lora_rank=4, bf16=False, checkpoint_every=2,
                                      accountant="rdp")
    gtrain.train_generator(generator_pairs(), out_dir, cfg, data_hash="h", resume=True,
                           budget=BudgetPolicy(allow_over=True))

def dp_retriever_train(bert_dir: str, out_dir: str) -> None:
    from types import SimpleNamespace

    from helpers import WORDS
    from privret.data.pairs import QueryDocPair, TrainingPairs
    from privret.train import dp_run
    from privret.train.dp_retriever import train_dp_retriever
    from privret.settings.training import DPRetrieverConfig

    dp_run.os = SimpleNamespace(urandom=lambda n: bytes(range(n)))  # the same "fresh" entropy in every run
    corpus = {f"d{i}": Document(f"d{i}", "", f"document {w}") for i, w in enumerate(WORDS[:14])}
    pairs = TrainingPairs(pairs=[QueryDocPair(query=f"what {WORDS[i]}", doc_id=f"d{i}") for i in range(10)],
                          corpus=corpus)
    cfg = DPRetrieverConfig(method="public-negatives", model=bert_dir, clip_norm=0.02, batch_size=4, epochs=1.0,
                            max_query_tokens=32, max_doc_tokens=32, temperature=0.5, trainable="top:1",
                            public_negatives=3, hard_negatives=0, learning_rate=1e-3, dropout=False, epsilon=8.0)
    train_dp_retriever(pairs, out_dir, cfg, data_hash="h", public_corpus=corpus)


def secure_hard_negatives(bert_dir: str, out_dir: str) -> None:
    import json

    from helpers import WORDS
    from privret.data.pairs import QueryDocPair, TrainingPairs
    from privret.train import dp_retriever as dptrain
    from privret.settings.training import DPRetrieverConfig

    sources, draw_hard = [], dptrain._draw_hard

    def recording(hard, rows, k, rng):
        sources.append(type(rng).__name__)
        return draw_hard(hard, rows, k, rng)

    dptrain._draw_hard = recording
    corpus = {f"d{i}": Document(f"d{i}", "", f"document {w}") for i, w in enumerate(WORDS[:14])}
    pairs = TrainingPairs(pairs=[QueryDocPair(query=f"what {WORDS[i]}", doc_id=f"d{i}") for i in range(10)],
                          corpus=corpus)
    cfg = DPRetrieverConfig(method="public-negatives", model=bert_dir, clip_norm=0.02, batch_size=4, epochs=1.0,
                            max_query_tokens=32, max_doc_tokens=32, temperature=0.5, trainable="top:1",
                            public_negatives=1, hard_negatives=1, hard_negative_depth=3, epsilon=8.0, secure_rng=True)
    dptrain.train_dp_retriever(pairs, Path(out_dir) / "r", cfg, data_hash="h", public_corpus=corpus,
                               budget=BudgetPolicy(allow_over=True))
    (Path(out_dir) / f"draws-{distributed.current().rank}.json").write_text(json.dumps(sources))


def retrieval_pairs():
    from helpers import WORDS
    from privret.data.pairs import QueryDocPair, TrainingPairs

    corpus = {f"d{i}": Document(f"d{i}", "", f"{w} {WORDS[i + 20]} of the {WORDS[i + 40]}")
              for i, w in enumerate(WORDS[:12])}
    rows = [QueryDocPair(query=f"what {WORDS[i + 30]} {w}", doc_id=f"d{i}", query_id=f"q{i}")
            for i, w in enumerate(WORDS[:12])]
    return TrainingPairs(pairs=rows, corpus=corpus)


def retriever_config(bert_dir: str):
    from privret.settings.training import RetrieverTrainConfig

    return RetrieverTrainConfig(model=bert_dir, epochs=2, batch_size=5, learning_rate=1e-3, max_query_tokens=16,
                                max_doc_tokens=16, bf16=False, seed=1)


def fit_retriever(bert_dir: str, out_file: str) -> None:
    from privret.train import retriever

    model = retriever.fit_retriever(retrieval_pairs(), retriever_config(bert_dir))
    if distributed.launched().main:
        torch.save({n: p.detach() for n, p in model.named_parameters()}, out_file)


def generate(generator_dir: str, out_dir: str, die_on_call: str = "0") -> None:
    from privret.models import causal_generator as genmod
    from privret.synth.generate import generate_synthetic

    if int(die_on_call) and distributed.launched().main:
        original, calls = genmod.CausalQueryGenerator.generate, []

        def dies(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == int(die_on_call):
                os._exit(9)
            return original(self, *args, **kwargs)

        genmod.CausalQueryGenerator.generate = dies
    generate_synthetic(generator_dir, generation_docs(), out_dir, generation_config(), resume=True)


if __name__ == "__main__":
    {"generator-step": generator_step, "retriever-step": retriever_step,
     "generator-train": generator_train, "generate": generate,
     "dp-retriever-train": dp_retriever_train, "secure-hard-negatives": secure_hard_negatives,
     "fit-retriever": fit_retriever}[sys.argv[1]](*sys.argv[2:])
