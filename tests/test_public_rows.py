"""Rows without private data (epsilon = 0): prompted and public-pairs generators, and the public warm start."""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
import os
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from transformers import DynamicCache

from helpers import TOY_DOCS, load_script, run_cli
from privret.settings.pipeline import PipelineConfig
from privret.errors import InputError
from privret.models.causal_generator import INSTRUCTION
from privret.models.generator import load_generator, load_trained_generator
from privret.privacy.ledger import PrivacyLedger
from privret.settings.synthesis import GenerateConfig
from privret.settings.training import GeneratorTrainConfig
from privret.train.public import examples_hash, train_public_generator, write_prompted_generator


PUBLIC_PAIRS = [("what does aspirin reduce", "aspirin can reduce the risk of heart disease"),
                ("sleep and the immune response", "sleep and exercise increase the immune response"),
                ("gene in mice", "mice with the gene show low memory")]
EXAMPLES = [(doc, query) for query, doc in PUBLIC_PAIRS[:2]]


@pytest.fixture()
def public_pairs(tmp_path) -> Path:
    path = tmp_path / "public.jsonl"
    path.write_text("".join(json.dumps({"query": q, "doc": d}) + "\n" for q, d in PUBLIC_PAIRS))
    return path


@contextlib.contextmanager
def private_files_unreadable(dataset: Path):
    """While active, any open of ``dataset``'s queries or qrels raises (builtins.open, io.open, os.open)."""
    private = {(dataset / "queries.jsonl").resolve(), (dataset / "qrels").resolve()}

    def guard(opener):
        def guarded(file, *args, **kwargs):
            if isinstance(file, (str, Path)):
                path = Path(file).resolve()
                if path in private or any(p in path.parents for p in private):
                    raise AssertionError(f"read the private file {path}")
            return opener(file, *args, **kwargs)
        return guarded

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(builtins, "open", guard(builtins.open))
        patch.setattr(io, "open", guard(io.open))
        patch.setattr(os, "open", guard(os.open))
        yield


def _fast(tiny_llama_dir) -> GeneratorTrainConfig:
    return GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=math.inf, batch_size=2, epochs=1,
                                trained_layers=1, lora_rank=4, bf16=False)


def _saved(directory: Path) -> dict:
    return PrivacyLedger.load(directory).model_dump(exclude={"created_at"})


def test_public_ledgers_say_epsilon_0_their_mechanism_and_public_data(tiny_llama_dir, public_pairs, tmp_path):
    from privret.io import file_sha256

    prompted = write_prompted_generator(str(tiny_llama_dir), EXAMPLES, tmp_path / "p", unit="query")
    assert _saved(tmp_path / "p") == prompted.model_dump(exclude={"created_at"})
    assert (prompted.mechanism, prompted.epsilon, prompted.delta) == ("public-prompted", 0.0, 0.0)
    assert prompted.provenance["public_data_hash"] == examples_hash(EXAMPLES) and prompted.data_hash == ""
    paired = train_public_generator(public_pairs, tmp_path / "g", _fast(tiny_llama_dir))
    assert (paired.mechanism, paired.epsilon, paired.delta) == ("public-pairs", 0.0, 0.0)
    assert paired.provenance == {"public_data_hash": file_sha256(public_pairs)} and paired.n_pairs == 3
    assert _saved(tmp_path / "g") == paired.model_dump(exclude={"created_at"})
    assert not list((tmp_path / "budget").glob("*.jsonl"))  # nothing recorded in the budget registry
    with pytest.raises(InputError, match="epsilon must be inf"):
        train_public_generator(public_pairs, tmp_path / "dp", _fast(tiny_llama_dir).model_copy(update={"epsilon": 4.0}))


def test_prompt_command_saves_the_first_k_public_pairs_as_an_epsilon_0_generator(tiny_llama_dir, public_pairs,
                                                                                  tmp_path):
    done = run_cli("generator", "prompt", "--out", str(tmp_path / "p"), "--public-pairs", str(public_pairs),
                   "--examples", "2", "--model", str(tiny_llama_dir))
    assert done.returncode == 0, done.stderr
    ledger = PrivacyLedger.load(tmp_path / "p")
    assert (ledger.mechanism, ledger.epsilon, ledger.delta, ledger.data_hash) == ("public-prompted", 0.0, 0.0, "")
    assert ledger.provenance["public_data_hash"] == examples_hash(EXAMPLES)  # exactly the first 2 pairs, shown
    assert load_trained_generator(tmp_path / "p").examples == EXAMPLES
    missing = str(tmp_path / "none.jsonl")
    for bad, says in ((["--examples", "0"], "--examples"), (["--public-pairs", missing], "none.jsonl")):
        args = {"--out": str(tmp_path / "q"), "--public-pairs": str(public_pairs), "--model": str(tiny_llama_dir)}
        args.update(dict(zip(bad[::2], bad[1::2])))
        refused = run_cli("generator", "prompt", *[x for kv in args.items() for x in kv])
        assert refused.returncode == 2 and says in refused.stderr and not (tmp_path / "q").exists()


def test_few_shot_prompt_shows_the_examples_and_the_zero_shot_prompt_is_unchanged(tiny_llama_dir, tmp_path):
    generator = load_generator(str(tiny_llama_dir))
    cut = generator.truncate_doc  # what the prompt shows of a document (the tiny vocabulary lacks some words)
    doc = TOY_DOCS[0][2]
    (d1, q1), (d2, q2) = [(cut(d), q) for d, q in EXAMPLES]
    # the zero-shot prompt, the one DP fine-tuning uses: the instruction and the document, no example
    assert generator.prompt(doc) == f"{INSTRUCTION}\nDocument: {cut(doc)}\nQuery:"
    generator.tokenizer.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert generator.prompt(doc) == f"<system>{INSTRUCTION}\n<user>{cut(doc)}\n<assistant>"
    generator.examples = EXAMPLES
    assert generator.prompt(doc) == (f"<system>{INSTRUCTION}\n<user>{d1}\n<assistant>{q1}\n<user>{d2}\n<assistant>{q2}\n"
                                     f"<user>{cut(doc)}\n<assistant>")
    generator.tokenizer.chat_template = None
    assert generator.prompt(doc) == (f"{INSTRUCTION}\nDocument: {d1}\nQuery: {q1}\nDocument: {d2}\nQuery: {q2}\n"
                                     f"Document: {cut(doc)}\nQuery:")
    write_prompted_generator(str(tiny_llama_dir), EXAMPLES, tmp_path / "p", unit="query")
    assert load_trained_generator(tmp_path / "p").prompt(doc) == generator.prompt(doc)  # saved with the generator


def test_warm_start_is_recorded_and_a_private_one_is_refused(toy_beir, tiny_llama_dir, public_pairs, tmp_path):
    from privret.data.beir import load_beir
    from privret.data.pairs import pairs_from_beir
    from privret.train.generator import train_generator

    public = train_public_generator(public_pairs, tmp_path / "public", _fast(tiny_llama_dir))
    private = pairs_from_beir(load_beir(toy_beir, splits=["train"]), "train")
    dp = train_generator(private, tmp_path / "dp", _fast(tiny_llama_dir), data_hash="h", warm_start=tmp_path / "public")
    assert dp.provenance == {"warm_start": {"mechanism": "public-pairs", "model": str(tiny_llama_dir),
                                            "trainable": public.trainable,
                                            "public_data_hash": public.provenance["public_data_hash"]}}
    warm = load_trained_generator(tmp_path / "public").model.state_dict()
    assert (tmp_path / "dp" / "warm_start" / "generator.json").is_file()
    loaded = load_trained_generator(tmp_path / "dp").model.state_dict()
    base = load_generator(str(tiny_llama_dir)).model.state_dict()
    name = next(n for n in base if "layers.1.mlp.down_proj" in n)
    assert not torch.equal(warm[name], base[name])  # the warm start moved the weights ...
    assert not torch.equal(loaded[name], base[name]) and not torch.equal(loaded[name], warm[name])  # ... and DP too
    name = next(n for n in base if "layers.0.mlp.down_proj" in n)  # below the trained layer: the warm start's
    assert torch.equal(loaded[name], warm[name])
    with pytest.raises(InputError, match="needs a public model") as err:  # a generator trained on the private log
        train_generator(private, tmp_path / "dp2", _fast(tiny_llama_dir), data_hash="h", warm_start=tmp_path / "dp")
    assert len(str(err.value).splitlines()) == 1 and "warm_start" in str(err.value)


@pytest.mark.parametrize(("section", "value", "field"), [
    ("public_rows", {"prompted": "maybe"}, "public_rows.prompted"),
    ("public_rows", {"prompted": True}, "public_rows.prompted"),
    ("public_rows", {"examples": 0}, "public_rows.examples"),
    ("public_rows", {"public_pairs": 3}, "public_rows.public_pairs"),
    ("public_rows", {"public_examples": [{"doc": "d"}]}, "public_rows.public_examples.0.query"),
    ("public_rows", {"public_examples": [{"doc": "d", "query": ""}]}, "public_rows.public_examples.0.query"),
    ("public_rows", {"public_examples": [{"query": "q"}]}, "public_rows.public_examples.0 Value error, give the "
                                                           "document's text (doc) or its corpus id (doc_id)"),
    ("public_rows", {"public_examples": [{"doc": "d", "doc_id": "x", "query": "q"}]}, "public_rows.public_examples.0"),
    ("public_rows", {"public_examples": [{"doc_id": "", "query": "q"}]}, "public_rows.public_examples.0.doc_id"),
    ("public_rows", {"colour": 1}, "public_rows.colour"),
    ("generator", {"warm_start": "private"}, "generator.warm_start"),
    ("generator", {"warm_start": "public-pairs"}, "generator.warm_start"),
])
def test_public_row_settings_are_validated(section, value, field):
    with pytest.raises(ValidationError) as err:
        PipelineConfig.model_validate({"name": "x", "dataset": "d", "epsilons": [1.0], section: value})
    first = err.value.errors()[0]
    assert field in ".".join(str(p) for p in first["loc"]) + " " + first["msg"]


def test_a_public_example_may_name_a_corpus_document_by_id():
    from privret.settings.pipeline import PublicRows
    from privret.data.beir import Document

    corpus = {"d1": Document("d1", "Aspirin", "aspirin lowers risk"), "d2": Document("d2", "", "no title here")}
    rows = PublicRows(prompted=True, public_examples=[{"doc_id": "d1", "query": "does aspirin help"},
                                                      {"doc": "inline text", "query": "q2"},
                                                      {"doc_id": "d2", "query": "q3"}])
    assert rows.few_shot(corpus) == [("Aspirin. aspirin lowers risk", "does aspirin help"), ("inline text", "q2"),
                                     ("no title here", "q3")]  # as the generator reads every document
    for missing in ({"d2": corpus["d2"]}, None):
        with pytest.raises(InputError, match="'d1' is not in the dataset's corpus") as err:
            rows.few_shot(missing)
        assert err.value.field == "public_rows.public_examples.0.doc_id"


def test_a_prompted_grid_is_planned_only_with_its_examples_as_read(tmp_path):
    """The prompted row's fingerprint holds the hash of the examples the pipeline read (a corpus document's text
    included): planning one without them is refused, and other examples give another fingerprint."""
    from privret.pipeline.stages import PUBLIC_PROMPTED, GENERATOR, plan_stages

    cfg = PipelineConfig(name="x", dataset=tmp_path, epsilons=[8.0], public_rows={
        "prompted": True, "public_examples": [{"doc_id": "d1", "query": "q"}]})
    with pytest.raises(ValueError, match="examples must be read"):
        plan_stages(cfg, tmp_path / "run", data_hash="h", evaluation="e", corpus="c", few_shot=None)

    def fingerprint(shots):
        plan = plan_stages(cfg, tmp_path / "run", data_hash="h", evaluation="e", corpus="c", few_shot=shots)
        return plan.stages[f"{PUBLIC_PROMPTED}/{GENERATOR}"].fingerprint

    assert fingerprint([("doc one", "q")]) == fingerprint([("doc one", "q")]) != fingerprint([("doc two", "q")])


def test_public_rows_refuse_dp_selected_documents():
    with pytest.raises(ValidationError, match="public_rows need public documents"):
        PipelineConfig(name="x", dataset="d", epsilons=[1.0], synthetic_documents="dp-select",
                       public_rows={"public_pairs": "p.jsonl"})


def test_prompted_and_public_pairs_rows_never_open_the_private_files(toy_beir, tiny_llama_dir, tiny_bert_dir,
                                                                     public_pairs, tmp_path, monkeypatch):
    """The pipeline with both public rows and a warm start, on a private dataset whose queries and qrels raise
    if opened while the pipeline builds either public row (:func:`privret.pipeline.rows.public_row`)."""
    from privret.settings.pipeline import GeneratorStage
    from privret.pipeline import run as pipeline
    from privret.pipeline.run import run_pipeline
    from privret.settings.training import RetrieverTrainConfig

    cfg = PipelineConfig(
        name="toy", dataset=toy_beir, epsilons=[math.inf], synthetic_documents="corpus",
        generator=GeneratorStage(model=str(tiny_llama_dir), batch_size=2, epochs=1, trained_layers=1, lora_rank=4,
                                 bf16=False, warm_start="public-pairs"),
        generate=GenerateConfig(num_queries=1, max_new_tokens=4, batch_size=4),
        retriever=RetrieverTrainConfig(model=str(tiny_bert_dir), epochs=1, batch_size=4, bf16=False),
        public_rows={"prompted": True, "public_pairs": public_pairs, "examples": 2},
        similarity={"featurizer": str(tiny_bert_dir)})
    built, build_row = [], pipeline.public_row

    def build_without_private_files(run, row, make_generator, documents):
        with private_files_unreadable(run.cfg.dataset):
            with pytest.raises(AssertionError, match="private file"):  # the guard works
                (run.cfg.dataset / "qrels" / "train.tsv").read_text()
            built.append(row.directory.name)
            return build_row(run, row, make_generator, documents)

    monkeypatch.setattr(pipeline, "public_row", build_without_private_files)
    run_dir = tmp_path / "run"
    rows = {r["row"]: r for r in run_pipeline(cfg, run_dir)}
    assert built == ["public-prompted", "public-pairs"]
    private_hash = json.loads((run_dir / "original" / "retriever" / "stage.json").read_text())["fingerprint"]["data_hash"]
    for row in ("no private data (prompted)", "no private data (public pairs)"):
        assert (rows[row]["epsilon"], rows[row]["delta"]) == (0.0, 0.0)
    for name in ("public-prompted", "public-pairs"):
        assert PrivacyLedger.load(run_dir / name / "synthetic").is_public
    assert "| no private data (prompted) | 0 | - |" in (run_dir / "summary.md").read_text()
    mauve = {r["stage"]: r["mauve_vs_private_queries"]["mauve"] for r in json.loads((run_dir / "summary.json").read_text())
             if "mauve_vs_private_queries" in r}  # every synthetic set, the public ones too
    assert sorted(mauve) == ["eps-inf", "public-pairs", "public-prompted"], mauve
    assert all(0 < m <= 1 + 1e-12 for m in mauve.values()), mauve  # MAUVE is an area in the unit square
    for name in ("public-prompted", "public-pairs"):
        record = json.loads((run_dir / name / "synthetic" / "stage.json").read_text())["fingerprint"]
        assert set(record["after"]) == {f"{name}/generator", "documents"} and private_hash not in json.dumps(record)
    assert PrivacyLedger.load(run_dir / "public-prompted" / "generator").provenance == {
        "public_data_hash": examples_hash(EXAMPLES)}  # the first 2 public pairs
    generator = json.loads((run_dir / "eps-inf" / "generator" / "stage.json").read_text())["fingerprint"]
    assert generator["warm_start"] == "public-pairs" and "public-pairs/generator" in generator["after"]
    assert PrivacyLedger.load(run_dir / "eps-inf" / "generator").provenance["warm_start"]["mechanism"] == "public-pairs"
    assert json.loads((run_dir / "budget.json").read_text())["releases"] == []  # public rows spend nothing


def test_prompt_batch_layout_shares_the_prefix_and_pads_after_it():
    from privret.models.prompt_batch import left_pad_after_prefix, shared_prefix_length

    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 1], [5, 6, 2, 3, 4, 4]]
    assert shared_prefix_length(prompts) == 2
    assert shared_prefix_length([[5, 6, 7], [5, 6, 7]]) == 2  # each row keeps a token of its own
    assert shared_prefix_length([[1, 2], [3, 4]]) == 0
    ids, mask = left_pad_after_prefix(prompts, 2, pad=0)
    assert ids.tolist() == [[5, 6, 0, 7, 8, 9], [5, 6, 0, 0, 7, 1], [5, 6, 2, 3, 4, 4]]
    assert mask.tolist() == [[1, 1, 0, 1, 1, 1], [1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1]]
    ids, mask = left_pad_after_prefix(prompts, 0, pad=0)  # plain left padding
    assert ids.tolist()[1] == [0, 0, 5, 6, 7, 1] and mask.tolist()[1] == [0, 0, 1, 1, 1, 1]


def test_generation_reading_each_prompt_once_writes_what_the_whole_prompts_write(tiny_llama_dir):
    """Each prompt's keys and values computed once for its 2 samples (and, with few-shot examples, the shared
    prefix's once for the batch) give the queries that sampling from every row's whole prompt gives: the same
    draws from the same distributions (float noise aside: the layouts compute in other shapes); a cache given to
    the wrong rows, or a wrong position or mask, would change the distributions."""
    from privret.models.prompt_batch import shared_prefix_length

    whole_prompts = load_script("bench/bench_generator.py").whole_prompts_generate  # the obvious implementation
    generator = load_generator(str(tiny_llama_dir), bf16=False)
    docs = [d for _, _, d in TOY_DOCS[:3]] + ["a much longer document " * 6]
    plain = generator.generate(docs, num_queries=2, top_p=0.8, max_new_tokens=6, seed=3)
    assert plain == whole_prompts(generator, docs, num_queries=2, seed=3, top_p=0.8, max_new_tokens=6)

    generator.examples = EXAMPLES
    prompts = [generator.tokenizer(generator.prompt(d), add_special_tokens=False).input_ids for d in docs]
    assert shared_prefix_length(prompts) > 10  # the instruction and the examples
    sampled = {"top_p": 0.8, "max_new_tokens": 8}
    shared = generator.generate(docs, num_queries=2, seed=0, **sampled)
    assert shared == whole_prompts(generator, docs, num_queries=2, seed=0, **sampled)
    assert shared == generator.generate(docs, num_queries=2, seed=0, reuse_prefix=False, **sampled)
    assert len({q for queries in shared for q in queries}) == 2 * len(docs)  # not one degenerate answer


@pytest.mark.parametrize("few_shot", [False, True])
def test_the_prompt_cache_gives_the_whole_prompts_next_token_logits(tiny_llama_dir, few_shot):
    """The platform-independent form of the check above: with the shared prefix held once
    (:meth:`PromptBatch.reading`) and each row's own tokens in :meth:`PromptBatch.own_cache`, the last prompt token's
    logits are those of a forward over the whole left-padded prompts, to float rounding; the cache made without
    each row's own positions would not give them (the rows' prompts differ in length; this tiny model is barely
    sensitive to positions, so the margin is set against float rounding)."""
    generator = load_generator(str(tiny_llama_dir), bf16=False)
    generator.examples = EXAMPLES if few_shot else []
    docs = [d for _, _, d in TOY_DOCS[:3]] + ["a much longer document " * 6]
    batch = generator.prompt_batch(docs)
    assert (batch.shared > 10) == few_shot
    last, own = slice(batch.ids.shape[1] - 1, None), slice(batch.shared, None)
    with torch.no_grad():
        whole = generator.prompt_batch(docs, reuse_prefix=False)
        reference = generator.model(input_ids=whole.ids, attention_mask=whole.mask,
                                    position_ids=whole.positions).logits[:, -1]
        with batch.reading(generator.model):
            cached = generator.model(input_ids=batch.ids[:, last], attention_mask=batch.mask[:, own],
                                     position_ids=batch.positions[:, last],
                                     past_key_values=batch.own_cache(generator.model)).logits[:, -1]
            tolerance = 1e-6 * max(1.0, reference.abs().max().item())  # float32 rounding
            assert (cached - reference).abs().max() < tolerance
            unpositioned = DynamicCache()  # the mutation: positions counted over the padding
            rest = slice(batch.shared, batch.ids.shape[1] - 1)
            generator.model(input_ids=batch.ids[:, rest], attention_mask=batch.mask[:, batch.shared:rest.stop],
                            past_key_values=unpositioned)
            wrong = generator.model(input_ids=batch.ids[:, last], attention_mask=batch.mask[:, own],
                                    position_ids=batch.positions[:, last], past_key_values=unpositioned).logits[:, -1]
    assert (wrong - reference).abs().max() > 20 * tolerance  # 1e-4 and more here, against about 1e-8 above


def test_the_shared_prefix_layout_gives_the_whole_prompts_next_token_logits(tiny_llama_dir):
    """The platform-independent form of the check above, through the code the bench measures the gap with
    (bench/bench_generator.py, next_token_logits_gap): both layouts' next-token logits agree to float rounding,
    and a cache that skips the padding mask would not (the rows' prompts differ in length)."""
    bench = load_script("bench/bench_generator.py")
    generator = load_generator(str(tiny_llama_dir), bf16=False)
    generator.examples = EXAMPLES
    docs = [d for _, _, d in TOY_DOCS[:3]] + ["a much longer document " * 6]
    batch = generator.prompt_batch(docs)
    assert batch.shared > 10 and generator.prompt_batch(docs, reuse_prefix=False).shared == 0
    gap = bench.next_token_logits_gap(generator, docs)
    assert gap["shared_prefix_tokens"] == batch.shared
    assert gap["max_abs_logit_gap"] < 1e-4 * max(1.0, gap["max_abs_logit"])
    own = slice(batch.shared, None)
    with torch.no_grad():  # the mutation: padding left unmasked changes what the short rows see
        with batch.reading(generator.model):
            unmasked = generator.model(input_ids=batch.ids[:, own], attention_mask=torch.ones_like(batch.mask[:, own]),
                                       position_ids=batch.positions[:, own]).logits[:, -1]
        whole = generator.prompt_batch(docs, reuse_prefix=False)
        reference = generator.model(input_ids=whole.ids, attention_mask=whole.mask,
                                    position_ids=whole.positions).logits[:, -1]
    assert (unmasked - reference).abs().max() > 1e-3
