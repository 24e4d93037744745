"""Generator speed, each ratio side by side: (a) DP / non-private step, (b) training throughput, (c) batched
generation, (d)-(f) few-shot prefix and sampling (--only). docs/results.md, "Speed and scale" (results/generator.json).
    .venv/bin/python bench/bench_generator.py --data ../shared/data/scifact --out bench/results/generator.json \\
        --steps 2 --pairs 128                                          # (a)-(c); the others: bench/README.md
2 CPU cores: (a)-(c) about 10 min, each of (d)-(f) 10 to 20 min (estimated from the per-step and per-document times)."""

from __future__ import annotations

import argparse
import json
import platform
import time
from functools import partial
from pathlib import Path

import torch
from opacus import GradSampleModule

from privret.data.beir import load_beir
from privret.data.pairs import pairs_from_beir
from privret.models.generator import load_generator
from privret.train import generator as gtrain
from privret.settings.training import GeneratorTrainConfig


def sampled_batches(units, batch_units: int, count: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(len(units), generator=g)[:batch_units].tolist() for _ in range(count)]


def time_steps(gen, pairs, cfg, batches, private: bool) -> float:
    """Seconds per step (mean over ``batches`` after one warm-up step)."""
    units = pairs.units("query")
    items = gen.prepare([gen.example(pairs.corpus[p.doc_id].full_text, p.query) for p in pairs.pairs])
    module = gen.loss_module()
    if private:
        module = GradSampleModule(module, batch_first=True, loss_reduction="sum")
    params = gen.trainable_parameters()
    rng = torch.Generator().manual_seed(0)
    times = []
    for k, chosen in enumerate(batches):
        start = time.perf_counter()
        if private:
            gtrain._dp_step(gen, module, items, units, chosen, params, cfg, 1.0, float(len(chosen)), rng)
        else:
            gtrain._plain_step(gen, module, items, units, chosen, cfg.physical_batch)
        for p in params.values():
            p.grad = None
        if k > 0:
            times.append(time.perf_counter() - start)
    return sum(times) / len(times)


class StraightforwardLoRA:
    """The baseline of (b): PEFT LoRA on every linear layer, full forward with labels (LM head on every
    position), fp32, no caching, non-private."""

    def __init__(self, pairs, max_doc_tokens: int):
        from peft import LoraConfig, get_peft_model

        gen = load_generator("smollm2-135m", max_doc_tokens=max_doc_tokens, bf16=False)
        self.pad = gen.tokenizer.pad_token_id
        self.model = get_peft_model(gen.model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
        self.examples = [gen.example(pairs.corpus[p.doc_id].full_text, p.query) for p in pairs.pairs]

    def step(self, rows: list[int]) -> None:
        for lo in range(0, len(rows), 16):
            chunk = [self.examples[r] for r in rows[lo: lo + 16]]
            ids = [torch.tensor(e.prompt_ids + e.target_ids) for e in chunk]
            labels = [torch.tensor([-100] * len(e.prompt_ids) + e.target_ids) for e in chunk]
            batch = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True, padding_value=self.pad)
            lab = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-100)
            self.model(input_ids=batch, attention_mask=(lab != -100) | (batch != self.pad), labels=lab).loss.backward()
        self.model.zero_grad(set_to_none=True)


def throughput(pairs, batches, defaults: GeneratorTrainConfig) -> dict:
    """(b), interleaved: each sampled batch is trained by the shipped default (DP) and then by the
    straightforward baseline, so both see the same load. The default's one-off cost, caching the frozen
    layers' output for every training example, is measured too and spread over ``defaults.epochs``."""
    units = pairs.units("query")
    gen = load_generator("smollm2-135m", max_doc_tokens=defaults.max_doc_tokens, trained_layers=defaults.trained_layers)
    gen.make_trainable(defaults.trainable, lora_rank=defaults.lora_rank, lora_alpha=2 * defaults.lora_rank)
    examples = [gen.example(pairs.corpus[p.doc_id].full_text, p.query) for p in pairs.pairs]
    start = time.perf_counter()
    items = gen.prepare(examples)
    cache_per_example = (time.perf_counter() - start) / len(examples)
    module = GradSampleModule(gen.loss_module(), batch_first=True, loss_reduction="sum")
    params = gen.trainable_parameters()
    baseline = StraightforwardLoRA(pairs, defaults.max_doc_tokens)
    rng = torch.Generator().manual_seed(0)
    ours = theirs = 0.0
    rows_timed = 0
    for k, chosen in enumerate(batches):
        rows = [r for u in chosen for r in units[u]]
        start = time.perf_counter()
        gtrain._dp_step(gen, module, items, units, chosen, params, defaults, 1.0, float(len(chosen)), rng)
        for p in params.values():
            p.grad = None
        middle = time.perf_counter()
        baseline.step(rows)
        end = time.perf_counter()
        if k > 0:  # the first batch warms both up
            ours += middle - start
            theirs += end - middle
            rows_timed += len(rows)
    ours_row, theirs_row = ours / rows_timed, theirs / rows_timed
    with_cache = ours_row + cache_per_example / defaults.epochs
    return {"default_dp_examples_per_s": 1 / ours_row, "naive_lora_examples_per_s": 1 / theirs_row,
            "speedup": theirs_row / ours_row, "cache_s_per_example": cache_per_example,
            "default_dp_examples_per_s_with_cache": 1 / with_cache, "speedup_with_cache": theirs_row / with_cache,
            "epochs_for_cache": defaults.epochs, "rows_timed": rows_timed}


def few_shot_prefix(dataset, batches: int, batch: int = 32, num_queries: int = 2) -> dict:
    """(d): the prompted row's generation (``configs/scifact.yaml``: 2 queries per document, 32 documents per
    call) with ``reuse_prefix`` on and off, alternating on the same batches and seeds."""
    claims = [line.split("\t") for line in (Path(__file__).parent / "scifact_public_claims.tsv").read_text().splitlines()]
    gen = load_generator("smollm2-135m")
    gen.examples = [(dataset.corpus[doc_id].full_text, claim) for doc_id, claim in claims]
    docs = [d.full_text for d in list(dataset.corpus.values())[1000: 1000 + batches * batch]]
    gen.generate(docs[:2], max_new_tokens=4, seed=0)  # warm-up
    seconds, queries = {True: 0.0, False: 0.0}, {True: [], False: []}
    for lo in range(0, len(docs), batch):
        for reuse in (True, False):
            start = time.perf_counter()
            queries[reuse] += gen.generate(docs[lo: lo + batch], num_queries=num_queries, top_p=0.8,
                                           max_new_tokens=40, seed=lo, reuse_prefix=reuse)
            seconds[reuse] += time.perf_counter() - start
    same = sum(a == b for x, y in zip(queries[True], queries[False]) for a, b in zip(x, y))
    return {"shared_prefix_s_per_doc": seconds[True] / len(docs), "whole_prompts_s_per_doc": seconds[False] / len(docs),
            "speedup": seconds[False] / seconds[True], "identical_queries": same / (len(docs) * num_queries),
            **next_token_logits_gap(gen, docs[:batch]), "documents": len(docs), "batch": batch,
            "num_queries": num_queries}


@torch.no_grad()
def whole_prompts_generate(gen, docs: list[str], *, num_queries: int, seed: int, **sampling) -> list[list[str]]:
    """The obvious implementation ``gen.generate`` replaces: ``transformers``' sampling from the tokenizer's
    left-padded whole prompts, ``num_return_sequences`` rows each (every prompt read once per row)."""
    tok = gen.tokenizer
    enc = tok([gen.prompt(d) for d in docs], return_tensors="pt", padding=True, padding_side="left",
              add_special_tokens=False)
    torch.manual_seed(seed)
    gen.model.eval()
    with gen.autocast():
        out = gen.model.generate(**enc.to(gen.device), do_sample=True, top_k=0, num_return_sequences=num_queries,
                                 pad_token_id=tok.pad_token_id, **sampling)
    texts = [gen._decode(row) for row in out[:, enc["input_ids"].shape[1]:]]
    return [texts[num_queries * i: num_queries * (i + 1)] for i in range(len(docs))]


def prompt_read_once(dataset, batches: int, batch: int = 32, num_queries: int = 2) -> dict:
    """(e): ``configs/scifact.yaml``'s sampling (2 queries a document, 32 documents a call, 40 new tokens at
    most, top-p 0.8), privret's ``generate`` against :func:`whole_prompts_generate`, alternating on the same
    batches and seeds, for the plain prompt and the few-shot one."""
    claims = [line.split("\t") for line in (Path(__file__).parent / "scifact_public_claims.tsv").read_text().splitlines()]
    gen = load_generator("smollm2-135m")
    docs = [d.full_text for d in list(dataset.corpus.values())[2000: 2000 + batches * batch]]
    sampling = {"top_p": 0.8, "temperature": 1.0, "max_new_tokens": 40}
    result = {}
    for prompt, examples in (("plain", []), ("few_shot", [(dataset.corpus[d].full_text, c) for d, c in claims])):
        gen.examples = examples
        gen.generate(docs[:2], max_new_tokens=4, seed=0)  # warm-up
        seconds, queries = {"ours": 0.0, "whole": 0.0}, {"ours": [], "whole": []}
        for lo in range(0, len(docs), batch):
            for way in ("ours", "whole"):
                start = time.perf_counter()
                run = gen.generate if way == "ours" else partial(whole_prompts_generate, gen)
                queries[way] += run(docs[lo: lo + batch], num_queries=num_queries, seed=lo, **sampling)
                seconds[way] += time.perf_counter() - start
        same = sum(a == b for x, y in zip(queries["ours"], queries["whole"]) for a, b in zip(x, y))
        result[prompt] = {"ours_s_per_doc": seconds["ours"] / len(docs), "whole_s_per_doc": seconds["whole"] / len(docs),
                          "speedup": seconds["whole"] / seconds["ours"],
                          "identical_queries": same / (len(docs) * num_queries)}
    return {**result, "documents": len(docs), "batch": batch, "num_queries": num_queries, "bf16": gen.bf16}


def repeated_prompt_cache(batch, model):
    """The baseline cache of (f): the shared prefix's keys and values computed once and repeated for every row, then
    each row's own prompt tokens but the last."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if batch.shared:
        model.get_decoder()(input_ids=batch.ids[:1, :batch.shared], past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(len(batch.ids))
    rest = slice(batch.shared, batch.ids.shape[1] - 1)
    if rest.stop > rest.start:
        model.get_decoder()(input_ids=batch.ids[:, rest], attention_mask=batch.mask[:, :rest.stop],
                            position_ids=batch.positions[:, rest], past_key_values=cache, use_cache=True)
    return cache


@torch.no_grad()
def generate_keeping_rows(gen, docs: list[str], *, num_queries: int, seed: int, **sampling,
                          ) -> tuple[list[list[str]], int]:
    """The baseline of (f): the shared prefix repeated for every row
    (:func:`repeated_prompt_cache`), then ``transformers``' ``generate``, which keeps a finished row in the batch,
    padded, until all have finished or the cap is reached; with the decoding steps it ran."""
    torch.manual_seed(seed)
    batch = gen.prompt_batch(docs).to(gen.device)
    gen.model.eval()
    with gen.autocast():
        cache = repeated_prompt_cache(batch, gen.model)
        cache.batch_repeat_interleave(num_queries)
        rows = batch.repeat(num_queries)
        out = gen.model.generate(input_ids=rows.ids, attention_mask=rows.mask, past_key_values=cache, do_sample=True,
                                 top_k=0, pad_token_id=gen.tokenizer.pad_token_id, **sampling)
    new = out[:, rows.ids.shape[1]:]
    texts = [gen._decode(row) for row in new]
    return [texts[num_queries * i: num_queries * (i + 1)] for i in range(len(docs))], new.shape[1]


def rows_leave_when_settled(dataset, batches: int, generator: Path | None, batch: int = 32,
                            num_queries: int = 2) -> dict:
    """(f): ``configs/scifact.yaml``'s sampling by privret's ``generate`` (the shared prefix held once, rows leaving
    the batch once settled) against :func:`generate_keeping_rows` (the implementation before), alternating on the same batches and seeds: for a fine-tuned generator
    (``generator``, e.g. a pipeline's DP generator; its plain prompt) and for the prompted row's few-shot one.
    Also the decoding steps each batch ran under ``generate``."""
    from privret.models.generator import load_trained_generator

    claims = [line.split("\t") for line in (Path(__file__).parent / "scifact_public_claims.tsv").read_text().splitlines()]
    docs = [d.full_text for d in list(dataset.corpus.values())[4000: 4000 + batches * batch]]
    sampling = {"top_p": 0.8, "temperature": 1.0, "max_new_tokens": 40}
    result = {}
    setups = [("few_shot", lambda: load_generator("smollm2-135m"), [(dataset.corpus[d].full_text, c) for d, c in claims])]
    if generator is not None:
        setups.insert(0, ("fine_tuned", lambda: load_trained_generator(generator), []))
    for prompt, load, examples in setups:
        gen = load()
        gen.examples = examples
        gen.generate(docs[:2], max_new_tokens=4, seed=0)  # warm-up
        seconds, queries, batch_steps, row_steps = {"ours": 0.0, "kept": 0.0}, {"ours": [], "kept": []}, [], []
        for lo in range(0, len(docs), batch):
            for way in ("ours", "kept"):
                start = time.perf_counter()
                if way == "ours":
                    queries[way] += gen.generate(docs[lo: lo + batch], num_queries=num_queries, seed=lo, **sampling)
                else:
                    texts, steps = generate_keeping_rows(gen, docs[lo: lo + batch], num_queries=num_queries, seed=lo,
                                                         **sampling)
                    queries[way] += texts
                    batch_steps.append(steps)
                seconds[way] += time.perf_counter() - start
        same = sum(a == b for x, y in zip(queries["ours"], queries["kept"]) for a, b in zip(x, y))
        result[prompt] = {"ours_s_per_doc": seconds["ours"] / len(docs), "kept_s_per_doc": seconds["kept"] / len(docs),
                          "speedup": seconds["kept"] / seconds["ours"], "steps_per_batch_kept": batch_steps,
                          "identical_queries": same / (len(docs) * num_queries)}
    return {**result, "documents": len(docs), "batch": batch, "num_queries": num_queries,
            "generator": None if generator is None else str(generator)}


@torch.no_grad()
def next_token_logits_gap(gen, docs: list[str]) -> dict:
    """The largest difference between the two layouts' next-token logits after each prompt (and the logits'
    largest magnitude): sampling draws the same token from both unless the gap moves a draw across a boundary."""
    gen.model.eval()
    whole = gen.prompt_batch(docs, reuse_prefix=False)
    whole_logits = gen.model(input_ids=whole.ids, attention_mask=whole.mask, position_ids=whole.positions).logits[:, -1]
    split = gen.prompt_batch(docs)
    rest = slice(split.shared, None)
    with split.reading(gen.model):
        split_logits = gen.model(input_ids=split.ids[:, rest], attention_mask=split.mask[:, rest],
                                 position_ids=split.positions[:, rest]).logits[:, -1]
    return {"shared_prefix_tokens": split.shared, "max_abs_logit_gap": (whole_logits - split_logits).abs().max().item(),
            "max_abs_logit": whole_logits.abs().max().item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-units", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="timed steps (+1 warm-up)")
    parser.add_argument("--pairs", type=int, default=256, help="training pairs used (cache size)")
    parser.add_argument("--generate-docs", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--only", default="a,b,c", help=(
        "comma list of the measurements to run: (a) DP / non-private step time, LoRA and full fine-tuning of the top "
        "layers; (b) training throughput of the shipped default (DP, cached frozen layers, LM head on query tokens) "
        "over a plain LoRA fine-tune of every layer (fp32, non-private); (c) batched generation over one document at "
        "a time; (d) few-shot generation, the prompts' shared prefix computed once over whole prompts; (e) 2 queries "
        "a document, each prompt read once over transformers' generate(num_return_sequences=2); (f) the few-shot "
        "prefix held once and settled rows leaving the batch, over the prefix repeated per row (--generator)"))
    parser.add_argument("--few-shot-batches", type=int, default=3, help="(d)-(f): timed batches of 32 documents each")
    parser.add_argument("--generator", type=Path, help="(f): a fine-tuned generator directory (its plain prompt)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    only = set(args.only.split(","))
    torch.manual_seed(0)
    dataset = load_beir(args.data, splits=["train"])
    full = pairs_from_beir(dataset, "train")
    pairs = type(full)(full.pairs[: args.pairs], full.corpus)
    batches = sampled_batches(pairs.units("query"), args.batch_units, args.steps + 1)
    defaults = GeneratorTrainConfig()
    # Measurements not run now keep the figures already in --out; each one records the settings it ran with.
    results: dict = json.loads(args.out.read_text()) if args.out.exists() else {}
    setting = {"machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
               "torch": torch.__version__, "batch_units": args.batch_units, "timed_steps": args.steps,
               "pairs": args.pairs, "max_doc_tokens": defaults.max_doc_tokens}

    # (a) DP / non-private, same trainable parameters
    for mode in ("lora", "full") if "a" in only else ():
        row = {}
        for private in (False, True):
            gen = load_generator("smollm2-135m", max_doc_tokens=defaults.max_doc_tokens,
                                 trained_layers=defaults.trained_layers)
            gen.make_trainable(mode, lora_rank=defaults.lora_rank)
            row["dp" if private else "non_private"] = time_steps(gen, pairs, defaults, batches, private)
        row["ratio_dp_over_non_private"] = row["dp"] / row["non_private"]
        row["setting"] = setting
        results[f"a_{mode}"] = row
        print(mode, row, flush=True)

    # (b) shipped default (DP, LoRA) vs the straightforward LoRA fine-tune, interleaved
    if "b" in only:
        results["b_throughput"] = {**throughput(pairs, batches, defaults), "setting": setting}
        print(results["b_throughput"], flush=True)

    # (c) batched generation vs one document at a time
    if "c" in only:
        gen = load_generator("smollm2-135m", max_doc_tokens=defaults.max_doc_tokens)
        docs = [d.full_text for d in list(dataset.corpus.values())[: args.generate_docs]]
        gen.generate(docs[:2], max_new_tokens=4, seed=0)  # warm-up
        start = time.perf_counter()
        gen.generate(docs, num_queries=1, max_new_tokens=32, seed=0)
        batched = (time.perf_counter() - start) / len(docs)
        single_docs = docs[:8]
        start = time.perf_counter()
        for d in single_docs:
            gen.generate([d], num_queries=1, max_new_tokens=32, seed=0)
        single = (time.perf_counter() - start) / len(single_docs)
        results["c_generation"] = {"batched_s_per_doc": batched, "single_s_per_doc": single, "speedup": single / batched,
                                   "batch": len(docs), "setting": setting}
        print(results["c_generation"], flush=True)
    if "d" in only:
        results["d_few_shot_prefix"] = {**few_shot_prefix(dataset, args.few_shot_batches), "setting": setting}
        print(results["d_few_shot_prefix"], flush=True)
    if "e" in only:
        results["e_prompt_read_once"] = {**prompt_read_once(dataset, args.few_shot_batches), "setting": setting}
        print(results["e_prompt_read_once"], flush=True)
    if "f" in only:
        results["f_rows_leave"] = {**rows_leave_when_settled(dataset, args.few_shot_batches, args.generator),
                                   "setting": setting}
        print(results["f_rows_leave"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
