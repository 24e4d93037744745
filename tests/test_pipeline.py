"""The pipeline on tiny models: every row appears, ledgers travel, re-running skips finished stages."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from privret.settings.pipeline import DirectDPGrid, GeneratorStage, PipelineConfig, SimilaritySettings
from privret.data.beir import load_beir
from privret.data.pairs import pairs_from_beir
from privret.errors import InputError
from privret.settings.synthesis import DocumentChoice, GenerateConfig, RoundTripFilterConfig
from privret.settings.training import RetrieverTrainConfig


def _tiny_config(dataset, tiny_llama_dir, tiny_bert_dir) -> PipelineConfig:
    return PipelineConfig(
        name="toy", dataset=dataset, epsilons=[math.inf, 4.0], synthetic_documents="corpus",
        generator=GeneratorStage(model=str(tiny_llama_dir), batch_size=2, epochs=1, trained_layers=1, lora_rank=4,
                                 bf16=False),
        generate=GenerateConfig(num_queries=2, max_new_tokens=6, batch_size=4),
        retriever=RetrieverTrainConfig(model=str(tiny_bert_dir), epochs=1, batch_size=4, bf16=False),
        direct_dp=DirectDPGrid(methods=["public-negatives", "batch-clip"], epsilons=[4.0],
                               settings={"model": str(tiny_bert_dir), "batch_size": 2, "epochs": 1, "trainable": "all",
                                         "learning_rate": 2e-5, "public_negatives": 3, "hard_negatives": 0},
                               per_method={"batch-clip": {"trainable": "top:1"}}),
        synthetic_filter=RoundTripFilterConfig(encoder=str(tiny_bert_dir), top_k=2),
        similarity=SimilaritySettings(featurizer=str(tiny_bert_dir)))


@pytest.fixture()
def tiny_config(toy_beir, tiny_llama_dir, tiny_bert_dir) -> PipelineConfig:
    return _tiny_config(toy_beir, tiny_llama_dir, tiny_bert_dir)


def _toy_ndcg_by_hand(model_dir) -> dict[str, float]:
    """NDCG@10 of each toy test query under ``model_dir``: documents ranked by cosine similarity of the model's
    own ``encode``; each query has one relevant document, so NDCG@10 = 1 / log2(1 + its rank) (0 past 10)."""
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from helpers import TOY_DOCS, TOY_TEST

    model = SentenceTransformer(str(model_dir), device="cpu")
    doc_ids = [d for d, _, _ in TOY_DOCS]
    docs = model.encode([f"{title}. {text}" for _, title, text in TOY_DOCS], normalize_embeddings=True)
    out = {}
    for qid, text, (gold,) in TOY_TEST:
        scores = docs @ model.encode([text], normalize_embeddings=True)[0]
        rank = 1 + int(np.sum(scores > scores[doc_ids.index(gold)]))
        out[qid] = 1 / math.log2(1 + rank) if rank <= 10 else 0.0
    return out


@pytest.mark.slow
def test_pipeline_rows_ledgers_and_resume(tiny_config, tmp_path, monkeypatch):
    from privret.pipeline import run as pipeline

    from privret.retrieval import embedding, embedding_cache

    run_dir = tmp_path / "run"
    cached = []  # (cache_dir, whether the corpus embeddings were there already) per corpus encoding
    real_embeddings = embedding.corpus_embeddings

    def spy(model, corpus, *, cache_dir=None, **kwargs):
        key = embedding_cache.corpus_cache_key(model, corpus, bf16=True)
        cached.append((cache_dir, cache_dir is not None and (cache_dir / f"{key}.npy").is_file()))
        return real_embeddings(model, corpus, cache_dir=cache_dir, **kwargs)

    monkeypatch.setattr(embedding, "corpus_embeddings", spy)
    rows = pipeline.run_pipeline(tiny_config, run_dir)
    # the public encoder's corpus embeddings (zero-shot row, then the filter at each epsilon) are computed once;
    # the 7 trained retrievers are not cached
    cache = run_dir / "cache" / "embeddings"
    assert [c for c in cached if c[0] is not None] == [(cache, False), (cache, True), (cache, True)]
    assert len(cached) == 10 and len(list(cache.iterdir())) == 1
    assert [r["row"] for r in rows] == ["zero-shot", "original pairs (non-private)", "DP synthetic (epsilon=inf)",
                                        "DP synthetic, round-trip filtered (epsilon=inf)", "DP synthetic (epsilon=4)",
                                        "DP synthetic, round-trip filtered (epsilon=4)",
                                        "direct DP public-negatives (epsilon=4)", "direct DP batch-clip (epsilon=4)"]
    assert rows[4]["epsilon"] == pytest.approx(4.0, rel=0.01) and rows[4]["delta"] == pytest.approx(1 / (2 * 5))
    assert rows[5]["epsilon"] == rows[4]["epsilon"] and rows[5]["delta"] == rows[4]["delta"]
    filtered = json.loads((run_dir / "eps-4-filtered" / "synthetic" / "manifest.json").read_text())
    assert filtered["queries_in"] == len(load_beir(run_dir / "eps-4" / "synthetic").queries)
    assert json.loads((run_dir / "eps-4-filtered" / "retriever" / "privacy_ledger.json").read_text())[
        "epsilon"] == pytest.approx(rows[4]["epsilon"])
    for r in rows:  # each row's NDCG is that of its own model, recomputed here without privret's search
        model_dir = tiny_config.retriever.model if r["stage"] == "zero_shot" else run_dir / r["stage"] / "retriever"
        assert r["queries"] == 2 and r["per_query"] == pytest.approx(_toy_ndcg_by_hand(model_dir), abs=1e-5), r["row"]
        per_query = json.loads((run_dir / r["stage"] / "per_query.json").read_text())  # kept for the CI
        assert sum(m["ndcg@10"] for m in per_query.values()) / 2 == pytest.approx(r["ndcg@10"])
        assert r["per_query"] == {q: m["ndcg@10"] for q, m in per_query.items()}
    synthetic = load_beir(run_dir / "eps-4" / "synthetic")
    manifest = json.loads((run_dir / "eps-4" / "synthetic" / "manifest.json").read_text())
    assert manifest["ledger"]["epsilon"] == pytest.approx(rows[4]["epsilon"])
    assert len(synthetic.corpus) == 6  # synthetic_documents: corpus
    assert manifest["kept"] + manifest["dropped_blocklisted"] + manifest["dropped_empty"] == 12
    assert "dropped_copies_of_private_queries" not in manifest  # a DP set is never compared with private text
    assert (run_dir / "documents" / "documents.txt").read_text().split() == list(load_beir(tiny_config.dataset).corpus)
    retriever_ledger = json.loads((run_dir / "eps-4" / "retriever" / "privacy_ledger.json").read_text())
    assert retriever_ledger["epsilon"] == pytest.approx(rows[4]["epsilon"])
    assert "epsilon=4" in (run_dir / "summary.md").read_text()
    from privret.privacy import budget

    dataset = retriever_ledger["dataset_id"]  # every DP release of the run is in the dataset's registry
    assert sorted(r.mechanism for r in budget.releases(dataset)) == [
        "direct-batch-clip", "direct-public-negatives", "dp-sgd"]
    # no file of the run names the private data by a digest (privret.privacy.commitment); the budget registry,
    # the operator's, is outside the run directory
    from privret.data.beir import dataset_hash, eval_hash

    beir = load_beir(tiny_config.dataset)
    digests = [dataset_hash(beir, "train"), eval_hash(beir, "test"),
               budget.dataset_id(pairs_from_beir(beir, "train")).removeprefix("sha256-")]
    texts = [p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl", ".md")]
    assert len(texts) > 30 and not [d for d in digests if any(d.encode() in t for t in texts)]

    def must_not_run(*_a, **_k):
        raise AssertionError("finished stage ran again")

    for r in rows[6:]:
        assert r["epsilon"] == pytest.approx(4.0, rel=0.01)
    assert json.loads((run_dir / "direct-batch-clip-eps-4" / "retriever" / "privacy_ledger.json").read_text())[
        "mechanism"] == "direct-batch-clip"
    trained = {m: json.loads((run_dir / f"direct-{m}-eps-4" / "retriever" / "train_config.json").read_text())
               for m in ("batch-clip", "public-negatives")}
    assert trained["batch-clip"]["trainable"] == "top:1" and trained["public-negatives"]["trainable"] == "all"
    for name in ("train_generator", "generate_synthetic", "filter_round_trip", "train_retriever",
                 "train_dp_retriever", "evaluate_per_query"):
        monkeypatch.setattr(_caller(name), name, must_not_run)
    again = pipeline.run_pipeline(tiny_config, run_dir)
    assert [r["ndcg@10"] for r in again] == [r["ndcg@10"] for r in rows]


def _echo_private_queries(monkeypatch, private):
    """Make every generator write, per document, an upper-cased private query and a fresh one."""
    from privret.models import causal_generator as genmod

    def echo(self, docs, *, num_queries=1, **_kw):
        return [[private[i % len(private)].upper() + "  ", f"fresh query {i}"] for i in range(len(docs))]

    monkeypatch.setattr(genmod.CausalQueryGenerator, "generate", echo)


def test_non_private_synthetic_set_drops_copies_of_private_queries(tiny_config, tmp_path, monkeypatch):
    """The epsilon = inf reference (no claim) may drop echoes of the private queries, and counts them."""
    from privret.data.pairs import pairs_from_beir
    from privret.synth.generate import generate_synthetic
    from privret.train.generator import train_generator

    dataset = load_beir(tiny_config.dataset)
    pairs = pairs_from_beir(dataset, "train")
    train_generator(pairs, tmp_path / "gen", tiny_config.generator_config(math.inf), data_hash="h")
    private = [p.query for p in pairs.pairs]
    _echo_private_queries(monkeypatch, private)
    docs = list(dataset.corpus.values())
    manifest = generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn", GenerateConfig(num_queries=2),
                                  private_copies=private)
    texts = set(load_beir(tmp_path / "syn").queries.values())
    normalised_private = {" ".join(q.casefold().split()) for q in private}
    assert not {" ".join(t.casefold().split()) for t in texts} & normalised_private
    assert manifest["dropped_copies_of_private_queries"] == len(docs) and manifest["kept"] == len(docs)


@pytest.mark.slow
def test_dp_synthetic_set_is_never_filtered_by_private_text(tiny_config, tmp_path, monkeypatch):
    """Under a finite epsilon the outputs are kept, counted and numbered without reading the log:
    private text is refused as a filter, echoes stay, only a public blocklist drops outputs."""
    from privret.data.pairs import pairs_from_beir
    from privret.synth.generate import generate_synthetic
    from privret.train.generator import train_generator

    dataset = load_beir(tiny_config.dataset)
    pairs = pairs_from_beir(dataset, "train")
    train_generator(pairs, tmp_path / "gen", tiny_config.generator_config(4.0), data_hash="h")
    private = [p.query for p in pairs.pairs]
    _echo_private_queries(monkeypatch, private)
    docs = list(dataset.corpus.values())
    cfg = GenerateConfig(num_queries=2)
    with pytest.raises(InputError, match="leak"):
        generate_synthetic(tmp_path / "gen", docs, tmp_path / "refused", cfg, private_copies=private)
    assert not (tmp_path / "refused").exists()
    manifest = generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn", cfg)
    kept = load_beir(tmp_path / "syn").queries
    assert manifest["kept"] == 2 * len(docs) and set(kept) == {f"syn-{d.id}-{k}" for d in docs for k in (0, 1)}
    assert not any("private" in key for key in manifest)
    blocked = generate_synthetic(tmp_path / "gen", docs, tmp_path / "blocked", cfg, blocklist=[private[0]])
    assert blocked["dropped_blocklisted"] == sum(1 for i in range(len(docs)) if private[i % len(private)] == private[0])


def test_default_documents_do_not_depend_on_the_private_log(tiny_config, tmp_path):
    """The documents stage of two runs whose private logs point at different documents is identical."""
    from privret.data.pairs import QueryDocPair, TrainingPairs
    from privret.pipeline import rows as pipeline_rows
    from privret.pipeline.stages import plan_stages

    dataset = load_beir(tiny_config.dataset)
    corpus = dataset.corpus
    ids = list(corpus)
    chosen = []
    for name, doc in (("a", ids[0]), ("b", ids[-1])):
        pairs = TrainingPairs(pairs=[QueryDocPair(f"query {k}", doc) for k in range(3)], corpus=corpus)
        for cfg in (tiny_config, tiny_config.model_copy(update={"synthetic_documents": DocumentChoice(sample=3)})):
            run_dir = tmp_path / name / str(cfg.synthetic_documents.sample)
            plan = plan_stages(cfg, run_dir, data_hash=name, evaluation="e", corpus="c", few_shot=None)
            run = pipeline_rows.Run(cfg, run_dir, dataset, pairs, name, name, cfg.budget.policy())
            docs, selection = pipeline_rows.synthetic_documents(plan.documents, run)
            assert selection is None
            chosen.append([d.id for d in docs])
    assert chosen[0] == chosen[2] == ids and chosen[1] == chosen[3] and len(chosen[1]) == 3


def test_dp_document_choice_is_a_recorded_release_and_an_empty_one_is_refused(tiny_config, tmp_path):
    """dp-select: the selection is charged to the budget registry, its ledger saved beside documents.txt and
    returned for the synthetic sets; one that keeps nothing still leaves its ledger (the release happened), is
    refused naming the config field, and is not marked done. delta = 1e-9: a document with one vote passes the
    threshold with probability delta, one with 200 votes always does."""
    from privret.data.pairs import QueryDocPair, TrainingPairs
    from privret.errors import InputError
    from privret.pipeline import rows as pipeline_rows
    from privret.pipeline.stages import plan_stages
    from privret.privacy import budget
    from privret.privacy.ledger import PrivacyLedger

    dataset = load_beir(tiny_config.dataset)
    ids = list(dataset.corpus)
    cfg = tiny_config.model_copy(update={"synthetic_documents": DocumentChoice(
        source="dp-select", selection={"epsilon": 1.0, "delta": 1e-9})})

    def choose(name, voted):
        pairs = TrainingPairs(pairs=[QueryDocPair(f"query {k}", doc) for k, doc in enumerate(voted)],
                              corpus=dataset.corpus)
        plan = plan_stages(cfg, tmp_path / name, data_hash=name, evaluation="e", corpus="c", few_shot=None)
        run = pipeline_rows.Run(cfg, tmp_path / name, dataset, pairs, name, name, cfg.budget.policy())
        return plan.documents, lambda: pipeline_rows.synthetic_documents(plan.documents, run)

    stage, select = choose("popular", [ids[0]] * 200)
    docs, selection = select()
    assert [d.id for d in docs] == [ids[0]]
    assert selection == PrivacyLedger.load(stage.output) and selection.is_private
    assert json.loads(stage.record.read_text())["fingerprint"] == stage.fingerprint
    assert [(r.epsilon, r.steps) for r in budget.releases("popular")] == [(selection.epsilon, selection.steps)]
    stage, select = choose("spread", ids)  # one vote per document
    with pytest.raises(InputError, match="kept no document") as err:
        select()
    assert err.value.field == "synthetic_documents.selection.epsilon"
    assert PrivacyLedger.load(stage.output).is_private and len(budget.releases("spread")) == 1
    assert not stage.done.exists() and not stage.record.exists()
    cfg = cfg.model_copy(update={"synthetic_documents": DocumentChoice(source="dp-select",
                                                                       selection={"epsilon": 1.0, "delta": 0.5})})
    stage, select = choose("delta", ids)  # delta above 1/n: named as the config file names it, nothing charged
    with pytest.raises(InputError, match="must be below 1/n") as err:
        select()
    assert err.value.field == "synthetic_documents.selection.delta" and not budget.releases("delta")
    # a DP selection's settings without source dp-select would silently choose nothing: refused
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="dp-select"):
        DocumentChoice(source="corpus", selection={"epsilon": 2.0})


@pytest.mark.parametrize("section, field", [
    ("generator", "generator.delta"),
    ("per_method", "direct_dp.per_method.batch-clip.delta"),
    ("settings", "direct_dp.settings.delta"),
])
def test_a_dp_rows_delta_of_1_over_n_or_more_is_refused_before_any_stage(tiny_config, tmp_path, section, field):
    """A delta that does not protect a unit (>= 1/n) is refused when the run starts, named as the config names it,
    not when its row's training starts after the references (each trainer checks again): nothing is written."""
    from privret.pipeline.run import run_pipeline

    data = tiny_config.model_dump()
    if section == "generator":
        data["generator"]["delta"] = 0.4
    elif section == "per_method":
        data["direct_dp"]["per_method"]["batch-clip"]["delta"] = 0.4
    else:
        data["direct_dp"]["settings"]["delta"] = 0.4
    with pytest.raises(InputError, match=r"delta must be in \(0, 1/n\)") as err:
        run_pipeline(PipelineConfig.model_validate(data), tmp_path / "run")
    assert err.value.field == field and not (tmp_path / "run").exists()


def test_a_row_that_holds_units_out_is_left_to_its_trainer(tiny_config, tmp_path, monkeypatch):
    """Its trainer's n is the fit part's, smaller than the log's: a delta in [1/n, 1/n_fit) is valid for it, so the
    up-front check must not refuse it (the run goes on to its first stage)."""
    from privret.pipeline import run as pipeline_run

    data = tiny_config.model_dump()
    n = len(pipeline_run.pairs_from_beir(pipeline_run.load_beir(tiny_config.dataset), "train").units(tiny_config.unit))
    data["direct_dp"]["settings"]["delta"] = 1.0 / n  # refused for the whole log, not for a part of it
    data["direct_dp"]["settings"]["hold_out"] = {"heldout_fraction": 0.5}

    class Started(Exception):
        pass

    def first_stage(*args, **kwargs):
        raise Started

    monkeypatch.setattr(pipeline_run, "plan_stages", first_stage)
    with pytest.raises(Started):
        pipeline_run.run_pipeline(PipelineConfig.model_validate(data), tmp_path / "run")


def test_config_refuses_documents_picked_by_the_private_log(toy_beir):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="was removed"):
        PipelineConfig(name="x", dataset=toy_beir, epsilons=[8.0], synthetic_documents="training")


def test_the_generator_section_takes_neither_an_epsilon_nor_a_unit(toy_beir):
    """Each row's epsilon comes from the grid and the unit from the config: a generator section that names either
    is refused, not silently overridden."""
    from pydantic import ValidationError

    for field, value in (("epsilon", 1.0), ("unit", "pair")):
        with pytest.raises(ValidationError, match=f"generator.{field}"):
            PipelineConfig(name="x", dataset=toy_beir, epsilons=[8.0], unit="query", generator={field: value})
    cfg = PipelineConfig(name="x", dataset=toy_beir, epsilons=[8.0], unit="pair", generator={"epochs": 2})
    assert (cfg.generator_config(8.0).epsilon, cfg.generator_config(8.0).unit.value) == (8.0, "pair")


def test_direct_dp_rows_take_the_grid_s_method_and_epsilon_and_per_method_sets_only_what_it_gives(toy_beir):
    """``per_method`` overrides ``settings`` only in the fields it gives, also after a dump is read back; a row's
    method, epsilon and unit come from the grid and the config, never from the settings."""
    from pydantic import ValidationError

    grid = DirectDPGrid(methods=["naive", "batch-clip"], epsilons=[3.0],
                        settings={"batch_size": 8, "learning_rate": 1e-3}, per_method={"naive": {"batch_size": 4}})
    for again in (grid, DirectDPGrid.model_validate(grid.model_dump()),
                  DirectDPGrid.model_validate_json(grid.model_dump_json())):
        naive, clip = again.config("naive", 3.0, "pair"), again.config("batch-clip", 3.0, "pair")
        assert (naive.batch_size, naive.learning_rate, naive.method, naive.epsilon, naive.unit.value) == (
            4, 1e-3, "naive", 3.0, "pair")
        assert (clip.batch_size, clip.learning_rate) == (8, 1e-3)
        assert again.section("naive", "batch_size") == "per_method.naive"
        assert again.section("naive", "learning_rate") == again.section("batch-clip", "batch_size") == "settings"
    for section in ({"settings": {"epsilon": 1.0}}, {"per_method": {"naive": {"unit": "query"}}},
                    {"settings": {"method": "naive"}}):
        with pytest.raises(ValidationError, match="each row's own"):
            DirectDPGrid(methods=["naive"], epsilons=[3.0], **section)
    # shared settings may hold one method's options for the methods that take them
    shared = DirectDPGrid(methods=["public-negatives", "batch-clip"], epsilons=[3.0],
                          settings={"physical_batch": 4, "public_negatives": 3})
    assert shared.config("public-negatives", 3.0, "query").physical_batch == 4
    # a grid that would silently make no row, or a method's settings no row reads, is refused
    for rows, match in (({"methods": ["naive"]}, "both `methods` and `epsilons`"),
                        ({"epsilons": [3.0]}, "both `methods` and `epsilons`"),
                        ({"methods": ["naive"], "epsilons": [3.0], "per_method": {"logit-dp": {"batch_size": 4}}},
                         "'logit-dp', which is not among `methods`"),
                        ({"methods": ["naive"], "epsilons": [3.0], "per_method": {"naive": {"physical_batch": 4}}},
                         "gives naive `physical_batch`, which it does not use")):
        with pytest.raises(ValidationError, match=match):
            DirectDPGrid(**rows)


def test_generation_resumes_after_a_torn_write(tiny_config, tmp_path, monkeypatch):
    from privret.data.pairs import pairs_from_beir
    from privret.models import causal_generator as genmod
    from privret.synth.generate import generate_synthetic
    from privret.train.generator import train_generator

    dataset = load_beir(tiny_config.dataset)
    train_generator(pairs_from_beir(dataset, "train"), tmp_path / "gen", tiny_config.generator_config(math.inf),
                    data_hash="h")
    docs = list(dataset.corpus.values())
    partial = tmp_path / "syn.partial"
    partial.mkdir()
    (partial / "generated.jsonl").write_text(json.dumps({"doc_id": "d1", "queries": ["kept from before"]}) + "\n"
                                             + '{"doc_id": "d2", "quer')
    seen = []

    def fake(self, docs, *, num_queries=1, **_kw):
        seen.extend(docs)
        return [["new"] for _ in docs]

    monkeypatch.setattr(genmod.CausalQueryGenerator, "generate", fake)
    with pytest.raises(InputError, match="interrupted generation") as refused:
        generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn", GenerateConfig())
    assert refused.value.field == "resume"
    generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn", GenerateConfig(), resume=True)
    assert len(seen) == 5  # d1 was done; the torn d2 line is regenerated
    queries = load_beir(tmp_path / "syn").queries
    assert queries["syn-d1-0"] == "kept from before" and not partial.exists()


# --- stage fingerprints: a re-run after the config changed never reuses a stale stage ---------------------------

@pytest.fixture(scope="session")
def small_config(tmp_path_factory, tiny_llama_dir, tiny_bert_dir) -> PipelineConfig:
    """The non-private part of the grid only (fast): zero-shot, original, epsilon = inf, on a toy dataset
    shared by the pytest session (a run directory records its dataset's path)."""
    from helpers import TOY_DOCS, TOY_TEST, TOY_TRAIN, write_beir_dir

    dataset = write_beir_dir(tmp_path_factory.mktemp("small-run") / "toy",
                             [{"_id": i, "title": t, "text": x} for i, t, x in TOY_DOCS],
                             [{"_id": q, "text": t} for q, t, _ in TOY_TRAIN + TOY_TEST],
                             {"train": [(q, d, 1) for q, _, ds in TOY_TRAIN for d in ds],
                              "test": [(q, d, 1) for q, _, ds in TOY_TEST for d in ds]})
    return _tiny_config(dataset, tiny_llama_dir, tiny_bert_dir).model_copy(
        update={"epsilons": [math.inf], "direct_dp": DirectDPGrid(), "synthetic_filter": None})


@pytest.fixture(scope="session")
def small_run(small_config, tmp_path_factory) -> Path:
    """The small grid run once per pytest session (its own budget registry); tests take a copy
    (:func:`small_run_dir`)."""
    from privret.pipeline.run import run_pipeline

    root = tmp_path_factory.mktemp("small-run-dir")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRIVRET_BUDGET_DIR", str(root / "budget"))
        run_pipeline(small_config, root / "run")
    return root / "run"


@pytest.fixture()
def small_run_dir(small_run, tmp_path) -> Path:
    """A copy of the pytest session's finished small run, at ``tmp_path / "run"``."""
    return Path(shutil.copytree(small_run, tmp_path / "run"))


def _changed(cfg: PipelineConfig, section: str, **settings) -> PipelineConfig:
    return cfg.model_copy(update={section: getattr(cfg, section).model_copy(update=settings)})


def _caller(name: str):
    """The pipeline module that calls ``name`` (a trainer, a generator, the evaluation), where a test replaces it."""
    from privret.pipeline import evaluation, rows, run

    return next(module for module in (run, rows, evaluation) if hasattr(module, name))


def _forbid_work(monkeypatch, *names):
    def must_not_run(*_a, **_k):
        raise AssertionError("a stage that should have been kept ran again")

    for name in names:
        monkeypatch.setattr(_caller(name), name, must_not_run)


def test_stage_records_and_a_changed_generator_setting_is_refused(small_config, small_run_dir):
    from privret.errors import InputError
    from privret.pipeline.run import run_pipeline

    run_dir = small_run_dir
    for name in ("zero_shot/metrics.stage.json", "original/retriever/stage.json", "original/metrics.stage.json",
                 "eps-inf/generator/stage.json", "eps-inf/synthetic/stage.json", "eps-inf/retriever/stage.json",
                 "eps-inf/metrics.stage.json"):
        record = json.loads((run_dir / name).read_text())
        assert record["format"] == 1 and record["fingerprint"]
    synthetic = json.loads((run_dir / "eps-inf" / "synthetic" / "stage.json").read_text())["fingerprint"]
    assert synthetic["after"]["eps-inf/generator"]["generator"]["learning_rate"] == small_config.generator.learning_rate
    config_before = (run_dir / "config.json").read_text()
    changed = _changed(small_config, "generator", learning_rate=small_config.generator.learning_rate * 2)
    with pytest.raises(InputError) as err:
        run_pipeline(changed, run_dir)
    message = str(err.value)
    assert len(message.splitlines()) == 1
    assert str(run_dir / "eps-inf" / "generator") in message and "generator.learning_rate" in message
    assert f"was {small_config.generator.learning_rate}" in message
    assert "use another `run_dir`" in message and "--run-dir" not in message  # the field; the CLI shows the flag
    assert "eps-inf/synthetic" in message  # what was made from it must go too
    assert (run_dir / "config.json").read_text() == config_before  # nothing written


def test_cli_exit_code_2_on_a_changed_config(small_config, small_run_dir, tmp_path):
    import yaml

    from helpers import run_cli

    run_dir = small_run_dir
    raw = small_config.model_dump(mode="json")
    raw["generator"]["epochs"] = 2
    config = tmp_path / "changed.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = run_cli("pipeline", str(config), "--run-dir", str(run_dir))
    assert result.returncode == 2, result.stderr
    assert "eps-inf/generator" in result.stderr and "generator.epochs" in result.stderr
    assert re.search(r"was 1(\.0)?, now 2(\.0)?", result.stderr), result.stderr
    assert "use another --run-dir," in result.stderr, result.stderr  # the library's `run_dir`, as its flag
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_changed_retriever_setting_invalidates_only_retriever_stages(small_config, small_run_dir, monkeypatch):
    from privret.errors import InputError
    from privret.pipeline.run import run_pipeline

    run_dir = small_run_dir
    changed = _changed(small_config, "retriever", batch_size=2)
    with pytest.raises(InputError, match="retriever.batch_size") as err:
        run_pipeline(changed, run_dir)
    assert str(run_dir / "original" / "retriever") in str(err.value)  # the first stage reached; zero-shot is fine
    assert "original/metrics.json" in str(err.value)
    shutil.rmtree(run_dir / "original" / "retriever")
    with pytest.raises(InputError, match="original/metrics.json.*made from an earlier original/retriever"):
        run_pipeline(changed, run_dir)  # its metrics were made from the retriever that is gone
    (run_dir / "original" / "metrics.json").unlink()
    with pytest.raises(InputError, match="eps-inf/retriever.*retriever.batch_size"):
        run_pipeline(changed, run_dir)
    shutil.rmtree(run_dir / "eps-inf" / "retriever")
    (run_dir / "eps-inf" / "metrics.json").unlink()
    _forbid_work(monkeypatch, "train_generator", "generate_synthetic")  # generator and synthetic set are kept
    rows = run_pipeline(changed, run_dir)
    assert len(rows) == 3
    assert json.loads((run_dir / "eps-inf" / "retriever" / "train_config.json").read_text())["batch_size"] == 2
    _forbid_work(monkeypatch, "train_retriever", "evaluate_per_query")
    run_pipeline(changed, run_dir)  # and now everything is current


def test_a_finished_stage_without_its_record_is_refused(small_config, small_run_dir, monkeypatch):
    """A finished stage with no stage.json (an older privret's, or cut before its record) is not taken:
    what made it cannot be proven, and the run stops before writing anything."""
    from privret.errors import InputError
    from privret.pipeline.run import run_pipeline

    run_dir = small_run_dir
    _forbid_work(monkeypatch, "train_generator", "generate_synthetic", "train_retriever", "evaluate_per_query")
    rows = run_pipeline(small_config, run_dir)  # the copy is complete: nothing to do
    assert len(rows) == 3
    (run_dir / "eps-inf" / "synthetic" / "stage.json").unlink()
    config_before = (run_dir / "config.json").read_text()
    with pytest.raises(InputError, match="eps-inf/synthetic.*no stage.json") as err:
        run_pipeline(small_config, run_dir)
    assert "eps-inf/retriever" in str(err.value)  # what was made from it must go too
    assert (run_dir / "config.json").read_text() == config_before  # nothing written
    assert not (run_dir / "eps-inf" / "synthetic" / "stage.json").exists()  # and nothing adopted


def test_interrupted_generator_resumes_only_with_its_settings(small_config, tmp_path, monkeypatch):
    from privret.pipeline import run as pipeline
    from privret.errors import InputError

    run_dir = tmp_path / "run"
    real = pipeline.train_generator

    def killed(pairs, out_dir, cfg, **kw):  # leaves a checkpoint and its step log, as a kill would
        (out_dir / "checkpoint").mkdir(parents=True)
        (out_dir / "steps.jsonl").write_text("")
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "train_generator", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline(small_config, run_dir)
    assert (run_dir / "eps-inf" / "generator" / "stage.json").is_file()
    with pytest.raises(InputError, match="eps-inf/generator.*generator.epochs.*interrupted run"):
        pipeline.run_pipeline(_changed(small_config, "generator", epochs=2), run_dir)
    seen = []

    def resumed(pairs, out_dir, cfg, **kw):
        seen.append(kw["resume"])
        (out_dir / "checkpoint").rmdir()
        (out_dir / "steps.jsonl").unlink()
        return real(pairs, out_dir, cfg, **kw)

    monkeypatch.setattr(pipeline, "train_generator", resumed)
    pipeline.run_pipeline(small_config, run_dir)  # the same settings: resumes
    assert seen == [True] and (run_dir / "eps-inf" / "generator" / "stage.json").is_file()


def test_stage_times_survive_a_crash_and_every_row_is_timed(small_config, tmp_path, monkeypatch):
    """Each stage's seconds reach timing.json as the stage ends: a crash in a row's retriever keeps its generator's
    and its generation's, and the resumed run completes the row, so the report times every row."""
    from privret.pipeline import run as pipeline
    from privret.pipeline import rows as pipeline_rows
    from privret.report import collect
    from privret.report.cost import stage_seconds

    run_dir = tmp_path / "run"
    real = pipeline_rows.train_retriever

    def crash_on_synthetic(pairs, out_dir, cfg, **kw):
        if "eps-" in str(out_dir):
            raise KeyboardInterrupt
        return real(pairs, out_dir, cfg, **kw)

    monkeypatch.setattr(pipeline_rows, "train_retriever", crash_on_synthetic)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline(small_config, run_dir)
    assert set(json.loads((run_dir / "eps-inf" / "timing.json").read_text())) == {"generator_seconds",
                                                                                    "generate_seconds"}
    monkeypatch.setattr(pipeline_rows, "train_retriever", real)
    pipeline.run_pipeline(small_config, run_dir)
    rows = collect(run_dir).rows
    assert [r.key for r in rows] == ["zero_shot", "original", "eps-inf"]
    assert all(stage_seconds(r) is not None for r in rows)
    assert set(stage_seconds(rows[2])) == {"generator", "generate", "retriever", "eval"}


@pytest.mark.slow
def test_interrupted_direct_dp_stage_resumes_with_its_settings_only(small_config, tmp_path, monkeypatch):
    """A direct-DP row killed mid-training resumes from its checkpoint on the next run (charging the lost
    steps), and is refused, not restarted, when its settings changed."""
    from privret.pipeline import run as pipeline
    from privret.pipeline import rows as pipeline_rows
    from privret.errors import InputError
    from privret.privacy import budget
    from privret.privacy.ledger import PrivacyLedger
    from privret.train import dp_retriever, dp_run
    from privret.settings.training import DPRetrieverSettings

    cfg = small_config.model_copy(update={"direct_dp": small_config.direct_dp.model_copy(update={
        "methods": ["batch-clip"], "epsilons": [4.0],
        "settings": DPRetrieverSettings(model=small_config.retriever.model, batch_size=2, epochs=1, trainable="top:1",
                                        checkpoint_every=1)})})
    stage = tmp_path / "run" / "direct-batch-clip-eps-4" / "retriever"
    real = dp_run.save_checkpoint

    def killed(ckpt_dir, params, optimizer, ledger, *, step, **kw):  # dies writing the checkpoint of step 2
        if step == 2:
            raise KeyboardInterrupt
        return real(ckpt_dir, params, optimizer, ledger, step=step, **kw)

    monkeypatch.setattr(dp_run, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline(cfg, tmp_path / "run")
    monkeypatch.setattr(dp_run, "save_checkpoint", real)
    assert (stage / "stage.json").is_file() and (stage / "checkpoint").is_dir() and (stage / "steps.jsonl").is_file()
    faster = cfg.direct_dp.settings.model_copy(update={"learning_rate": 1e-3})
    with pytest.raises(InputError, match="direct-batch-clip-eps-4/retriever.*learning_rate.*interrupted run"):
        pipeline.run_pipeline(_changed(cfg, "direct_dp", settings=faster), tmp_path / "run")
    seen = []
    monkeypatch.setattr(pipeline_rows, "train_dp_retriever", lambda *a, **kw: seen.append(kw["resume"]) or
                        dp_retriever.train_dp_retriever(*a, **kw))
    rows = pipeline.run_pipeline(cfg, tmp_path / "run")  # the same settings: resumes
    ledger = PrivacyLedger.load(stage)
    assert seen == [True] and ledger.steps == ledger.planned_steps + 1  # step 2 was announced, then lost
    assert rows[-1]["epsilon"] == ledger.epsilon and (stage / "stage.json").is_file()
    assert not (stage / "checkpoint").exists() and (stage / "dp_mechanism.json").is_file()
    assert [(r.status, r.steps) for r in budget.releases(ledger.dataset_id)] == [("final", ledger.steps)]
    pipeline.run_pipeline(cfg, tmp_path / "run")  # finished: kept as it is
    assert PrivacyLedger.load(stage) == ledger


def _finished_rows(run_dir, stages) -> list[dict]:
    """Finished metrics stages written by hand: (directory, label, epsilon, delta, NDCG@10, per-query NDCG@10
    or None, as an older privret left it) -> the pipeline's rows."""
    from privret.pipeline.evaluation import evaluate_stage
    from privret.pipeline.stages import make_stage

    rows = []
    for name, label, epsilon, delta, ndcg, per_query in stages:
        (run_dir / name).mkdir(parents=True)
        (run_dir / name / "metrics.json").write_text(json.dumps({
            "row": label, "epsilon": epsilon, "delta": delta, "ndcg@10": ndcg, "recall@10": 0.5, "recall@100": 0.75,
            "mrr@10": 0.5, "queries": len(per_query or [0, 0]), "eval_seconds": 1.5}))
        if per_query is not None:
            (run_dir / name / "per_query.json").write_text(json.dumps(
                {f"t{i}": {"ndcg@10": v} for i, v in enumerate(per_query)}))
        rows.append(evaluate_stage(make_stage(run_dir, f"{name}/metrics.json", {}), "no model: the stage is done",
                                    None, "test", {}))
    return rows


def test_summary_shows_retention_and_the_interval(tmp_path):
    from rich.console import Console

    from privret.evaluate.statistics import BAR_HEADER
    from privret.pipeline.summary import summary_markdown, summary_table, write_summary

    run_dir = tmp_path / "run"
    rows = _finished_rows(run_dir, [("zero_shot", "zero-shot", None, None, 0.375, [0.25, 0.5]),
                                    ("original", "original pairs (non-private)", math.inf, 0.0, 0.875, [0.75, 1.0]),
                                    ("eps-8", "DP synthetic (epsilon=8)", 8.0, 1e-3, 0.625, [0.5, 0.75]),
                                    ("eps-4", "DP synthetic (epsilon=4)", 4.0, 1e-3, 0.5, None)])
    cfg = PipelineConfig(name="fake", dataset=tmp_path, epsilons=[8.0, 4.0])
    markdown = summary_markdown(rows, cfg)
    assert "| NDCG@10 | retention | ΔNDCG@10 vs zero-shot [95% CI] | Recall@10 |" in markdown
    assert "| zero-shot | - | - | 0.3750 | - | - | 0.5000 |" in markdown
    assert "| original pairs (non-private) | inf | - | 0.8750 | - | +0.5000 [+0.5000, +0.5000] |" in markdown
    assert "| DP synthetic (epsilon=8) | 8 | 0.001 | 0.6250 | 50.0% | +0.2500 [+0.2500, +0.2500] |" in markdown
    assert "| DP synthetic (epsilon=4) | 4 | 0.001 | 0.5000 | 25.0% | +0.1250 [-] |" in markdown
    assert BAR_HEADER not in markdown and "epsilon = 0 bar" not in markdown  # no row without private data
    console = Console(record=True, width=80)  # a plain terminal: the numbers are whole on their row, labels wrap
    console.print(summary_table(rows))
    table = console.export_text()
    header = next(line for line in table.splitlines() if "training data" in line)
    assert "Δ vs zero-shot [95% CI]" in header and "Recall@10" not in header
    assert "Every metric: summary.md" in " ".join(table.split())
    row = next(line for line in table.splitlines() if line.startswith("│ DP synthetic"))
    assert all(cell in row for cell in ("│   8 │", "0.6250", "50.0%", "+0.2500 [+0.2500, +0.2500]")), row
    assert "+0.1250 [-]" in table and "…" not in table
    assert "No guarantee covers the original row" in markdown and "retention divides by" in markdown
    write_summary(run_dir, rows, cfg, {})
    summary = (run_dir / "summary.json").read_text()
    assert "per_query" not in json.loads(summary)[0]
    assert "seconds" not in summary  # no timing in what a run releases by default (privret report's opt-in)
    assert "| 50.0% |" in (run_dir / "summary.md").read_text()


def test_summary_compares_every_row_with_the_best_epsilon_0_row(tmp_path):
    """The bar is the best row made without private data; a DP row clears it only with its interval above 0."""
    from rich.console import Console

    from privret.evaluate.statistics import BAR_HEADER
    from privret.pipeline.summary import summary_markdown, summary_table

    base = [0.2, 0.4, 0.6, 0.8]

    def shifted(d: float) -> list[float]:
        return [b + d for b in base]

    rows = _finished_rows(tmp_path / "run", [
        ("zero_shot", "zero-shot", None, None, 0.5, base),
        ("original", "original pairs (non-private)", math.inf, 0.0, 0.8, shifted(0.3)),
        ("public-prompted", "no private data (prompted)", 0.0, 0.0, 0.55, shifted(0.05)),
        ("public-pairs", "no private data (public pairs)", 0.0, 0.0, 0.45, shifted(-0.05)),
        ("eps-8", "DP synthetic (epsilon=8)", 8.0, 1e-3, 0.65, shifted(0.15)),
        ("eps-4", "DP synthetic (epsilon=4)", 4.0, 1e-3, 0.55, shifted(0.05)),
        ("direct-naive-eps-8", "direct naive (epsilon=8)", 8.0, 1e-3, 0.7, None)])
    markdown = summary_markdown(rows, PipelineConfig(name="fake", dataset=tmp_path, epsilons=[8.0, 4.0]))
    assert f"| MRR@10 | {BAR_HEADER} |" in markdown
    lines = {line.split(" | ")[0].lstrip("| "): line for line in markdown.splitlines() if line.startswith("| ")}
    assert lines["DP synthetic (epsilon=8)"].endswith("| +0.1000 [+0.1000, +0.1000] |")  # against prompted
    assert lines["DP synthetic (epsilon=4)"].endswith("| +0.0000 [+0.0000, +0.0000] |")
    assert lines["direct naive (epsilon=8)"].endswith("| +0.1500 [-] |")  # no per-query scores: no interval
    assert lines["original pairs (non-private)"].endswith("| +0.2500 [+0.2500, +0.2500] |")
    assert lines["no private data (prompted)"].endswith("| - |") and lines["zero-shot"].endswith("| - |")
    assert "The epsilon = 0 bar is 'no private data (prompted)' (NDCG@10 0.5500)" in markdown
    assert ("Not cleared by: DP synthetic (epsilon=4); direct naive (epsilon=8) (no gain a public recipe would "
            "not give).") in markdown
    console = Console(record=True, width=400)
    console.print(summary_table(rows))
    assert "Not cleared by: DP synthetic (epsilon=4)" in " ".join(console.export_text().split())


def test_direct_dp_fingerprint_leaves_out_only_what_changes_nothing_trained():
    from privret.pipeline.stages import direct_dp_fingerprint
    from privret.settings.training import DPRetrieverConfig

    base = DPRetrieverConfig(method="batch-clip", epsilon=8.0)
    plain = direct_dp_fingerprint(base)
    assert "checkpoint_every" not in plain and "secure_rng" not in plain
    assert direct_dp_fingerprint(base.model_copy(update={"checkpoint_every": 3})) == plain
    assert direct_dp_fingerprint(base.model_copy(update={"physical_batch": 8})) == plain  # memory only
    assert direct_dp_fingerprint(base.model_copy(update={"learning_rate": 1e-4})) != plain
    assert direct_dp_fingerprint(base.model_copy(update={"dropout": True})) != plain  # trains another model
    assert direct_dp_fingerprint(base.model_copy(update={"secure_rng": True})) == {**plain, "secure_rng": True}


@pytest.mark.slow
def test_selected_row_composes_one_generator_ledger_with_the_choice(tiny_config, tmp_path, monkeypatch):
    """private_selection adds eps-<e>-selected: a DP choice among the public encoder, the row's two retrievers
    (unfiltered, filtered: one generator release between them) and their interpolations; its ledger is the
    generator's epsilon plus the choice's, it is a recorded release, its metrics are its own model's, the report
    shows it, and a re-run skips it."""
    from privret.pipeline import run as pipeline
    from privret.pipeline import rows as pipeline_rows
    from privret.privacy import budget
    from privret.report.collect import collect
    from privret.settings.training import SelectionSettings

    cfg = tiny_config.model_copy(update={"epsilons": [4.0], "direct_dp": DirectDPGrid(),
                                         "private_selection": SelectionSettings(epsilon=0.5, weights=[0.5, 1])})
    run_dir = tmp_path / "run"
    rows = pipeline.run_pipeline(cfg, run_dir)
    by_stage = {r["stage"]: r for r in rows}
    selected = by_stage["eps-4-selected"]
    assert selected["row"] == "DP synthetic, retriever chosen with DP (epsilon=4 + 0.5)"
    assert selected["epsilon"] == pytest.approx(by_stage["eps-4"]["epsilon"] + 0.5)
    assert selected["delta"] == pytest.approx(by_stage["eps-4"]["delta"])
    record = json.loads((run_dir / "eps-4-selected" / "retriever" / "private_selection.json").read_text())
    assert record["candidates"] == ["base", f"{run_dir}/eps-4/retriever@0.5", f"{run_dir}/eps-4/retriever",
                                    f"{run_dir}/eps-4-filtered/retriever@0.5", f"{run_dir}/eps-4-filtered/retriever"]
    assert selected["per_query"] == pytest.approx(_toy_ndcg_by_hand(run_dir / "eps-4-selected" / "retriever"),
                                                  abs=1e-5)
    dataset = json.loads((run_dir / "eps-4" / "retriever" / "privacy_ledger.json").read_text())["dataset_id"]
    assert sorted(r.mechanism for r in budget.releases(dataset)) == ["dp-sgd", "exponential-mechanism"]
    joint = json.loads((run_dir / "budget.json").read_text())  # releasing every row together: both releases
    assert joint["releases"] == ["eps-4", "eps-4-selected"]
    assert joint["composition"]["query"]["epsilon"] == pytest.approx(selected["epsilon"], rel=1e-3)
    assert "Releasing all 2 DP models of this run together" in (run_dir / "summary.md").read_text()
    report = {r.key: r for r in collect(run_dir).rows}
    assert report["eps-4-selected"].method == "dp-synthetic-selected"
    assert report["eps-4-selected"].epsilon == pytest.approx(selected["epsilon"])
    monkeypatch.setattr(pipeline_rows, "select_retriever", lambda *a, **k: pytest.fail("finished choice ran again"))
    again = pipeline.run_pipeline(cfg, run_dir)
    assert [r["ndcg@10"] for r in again] == [r["ndcg@10"] for r in rows]


def _scored_queries(monkeypatch) -> list[set[str]]:
    """The query texts of each log a DP choice scores its candidates on, one set per candidate, as they come."""
    from privret.train import private_selection

    scored, real_scores = [], private_selection.unit_scores

    def spy(model, pairs, *args, **kwargs):
        scored.append({p.query for p in pairs.pairs})
        return real_scores(model, pairs, *args, **kwargs)

    monkeypatch.setattr(private_selection, "unit_scores", spy)
    return scored


@pytest.mark.slow
def test_a_direct_row_that_holds_units_out_is_followed_by_a_free_choice_on_them(tiny_config, tmp_path, monkeypatch):
    """A direct method with ``hold_out`` trains on the fit part and adds direct-<m>-eps-<e>-selected: a DP choice on
    the held-out units only, at the row's epsilon, among the public encoder and the row's retriever interpolated
    with it. Its ledger and the run's joint release cost the row's epsilon, not twice it (parallel composition);
    a config with a choice but no held-out units is refused; a re-run skips the finished choice."""
    from privret.settings.pipeline import load_config
    from privret.pipeline import run as pipeline
    from privret.pipeline import rows as pipeline_rows
    from privret.privacy.hold_out import UnitPartition
    from privret.report.collect import collect

    partition = UnitPartition(salt="held", heldout_fraction=0.4)
    fit, held = partition.split(pairs_from_beir(load_beir(tiny_config.dataset), "train"), "query")
    assert fit.pairs and held.pairs  # the salt splits the toy log both ways
    grid = DirectDPGrid.model_validate({
        **tiny_config.direct_dp.model_dump(), "methods": ["batch-clip"],
        "per_method": {"batch-clip": {"trainable": "top:1", "hold_out": partition.model_dump()}},
        "held_out_choice": {"weights": [0.5, 1.0]}})
    cfg = tiny_config.model_copy(update={"epsilons": [4.0], "synthetic_filter": None, "direct_dp": grid})
    scored = _scored_queries(monkeypatch)
    run_dir = tmp_path / "run"
    rows = pipeline.run_pipeline(cfg, run_dir)
    by_stage = {r["stage"]: r for r in rows}
    trained, chosen = by_stage["direct-batch-clip-eps-4"], by_stage["direct-batch-clip-eps-4-selected"]
    assert chosen["row"] == "direct DP batch-clip, chosen with DP on held-out units (epsilon=4)"
    assert scored == [{p.query for p in held.pairs}] * 3  # each candidate scored on the held-out units only
    assert trained["epsilon"] == pytest.approx(4.0, rel=0.01)
    assert (chosen["epsilon"], chosen["delta"]) == pytest.approx((max(trained["epsilon"], 4.0), trained["delta"]))
    record = json.loads((run_dir / "direct-batch-clip-eps-4-selected" / "retriever" / "private_selection.json")
                        .read_text())
    retriever = f"{run_dir}/direct-batch-clip-eps-4/retriever"
    assert record["candidates"] == ["base", f"{retriever}@0.5", retriever] and record["part"]["side"] == "heldout"
    assert chosen["per_query"] == pytest.approx(
        _toy_ndcg_by_hand(run_dir / "direct-batch-clip-eps-4-selected" / "retriever"), abs=1e-5)
    joint = json.loads((run_dir / "budget.json").read_text())
    assert joint["releases"] == ["eps-4", "direct-batch-clip-eps-4", "direct-batch-clip-eps-4-selected"]
    generator = by_stage["eps-4"]["epsilon"]
    assert joint["composition"]["query"]["epsilon"] == pytest.approx(generator + chosen["epsilon"], rel=0.02)
    report = {r.key: r for r in collect(run_dir).rows}
    assert report["direct-batch-clip-eps-4-selected"].method == "direct-batch-clip-selected"
    assert report["direct-batch-clip-eps-4-selected"].label.startswith("direct batch-clip, chosen with DP on held-out")
    monkeypatch.setattr(pipeline_rows, "select_retriever", lambda *a, **k: pytest.fail("finished choice ran again"))
    assert [r["ndcg@10"] for r in pipeline.run_pipeline(cfg, run_dir)] == [r["ndcg@10"] for r in rows]
    config = tmp_path / "c.yaml"
    config.write_text(f"name: t\ndataset: {tiny_config.dataset}\nepsilons: [4]\ndirect_dp:\n  methods: [batch-clip]\n"
                      "  epsilons: [4]\n  held_out_choice: {weights: [1]}\n")
    with pytest.raises(InputError, match="hold_out"):
        load_config(config)


@pytest.mark.slow
def test_a_generator_that_holds_units_out_makes_the_choice_of_its_retrievers_free(tiny_config, tmp_path, monkeypatch):
    """generator.hold_out: the DP generator trains on the fit part, and eps-<e>-selected scores only the held-out
    units, so the chosen retriever costs the larger epsilon, not the sum; the non-private row (epsilon inf) trains
    on the whole log."""
    from privret.pipeline import run as pipeline
    from privret.privacy.hold_out import UnitPartition
    from privret.settings.pipeline import load_config
    from privret.settings.training import SelectionSettings

    partition = UnitPartition(salt="held", heldout_fraction=0.4)
    fit, held = partition.split(pairs_from_beir(load_beir(tiny_config.dataset), "train"), "query")
    assert fit.pairs and held.pairs
    cfg = tiny_config.model_copy(update={
        "epsilons": [math.inf, 4.0], "direct_dp": DirectDPGrid(), "synthetic_filter": None,
        "generator": tiny_config.generator.model_copy(update={"hold_out": partition}),
        "private_selection": SelectionSettings(epsilon=4.0, weights=[1.0])})
    scored = _scored_queries(monkeypatch)
    run_dir = tmp_path / "run"
    by_stage = {r["stage"]: r for r in pipeline.run_pipeline(cfg, run_dir)}
    generator = json.loads((run_dir / "eps-4" / "generator" / "privacy_ledger.json").read_text())
    assert generator["part"]["side"] == "fit" and generator["n_units"] == len(fit.units("query"))
    assert json.loads((run_dir / "eps-inf" / "generator" / "train_config.json").read_text())["hold_out"] is None
    config = tmp_path / "c.yaml"  # a config file says it the same way
    text = (f"name: t\ndataset: {tiny_config.dataset}\nepsilons: [.inf, 4]\n"
            "generator: {hold_out: {salt: held, heldout_fraction: 0.4}}\n")
    config.write_text(text)  # held-out units that nothing would use: refused
    with pytest.raises(InputError, match="generator.hold_out needs private_selection"):
        load_config(config)
    config.write_text(text.replace("epsilons:", "eval_split: train\nepsilons:"))  # scoring the private log itself
    with pytest.raises(InputError, match="eval_split is the private log"):
        load_config(config)
    config.write_text(text + "private_selection: {epsilon: 4, weights: [1]}\n")
    loaded = load_config(config)
    assert loaded.generator_config(4.0).hold_out == partition and loaded.generator_config(math.inf).hold_out is None
    assert scored[-2:] == [{p.query for p in held.pairs}] * 2  # eps-4-selected: base and the retriever
    selected = by_stage["eps-4-selected"]
    assert selected["epsilon"] == pytest.approx(max(by_stage["eps-4"]["epsilon"], 4.0))
    joint = json.loads((run_dir / "budget.json").read_text())  # eps-inf-selected chose on the whole log: it adds
    assert joint["releases"] == ["eps-4", "eps-4-selected", "eps-inf-selected"]
    assert joint["composition"]["query"]["epsilon"] == pytest.approx(4.0 + selected["epsilon"], rel=1e-3)


# --- MAUVE of each synthetic set against the private queries: an operator's measurement, not DP ------------------

def _mauve_in_summary(run_dir: Path) -> dict[str, float]:
    return {r["stage"]: r["mauve_vs_private_queries"]["mauve"] for r in
            json.loads((run_dir / "summary.json").read_text()) if "mauve_vs_private_queries" in r}


def test_each_synthetic_set_has_its_mauve_in_the_summary_and_the_report_and_nowhere_released(small_run_dir):
    from privret.evaluate.similarity import MAUVE_HEADER, MAUVE_NOTE
    from privret.report.collect import collect
    from privret.report.render import render_html, render_markdown

    run_dir = small_run_dir
    measured = _mauve_in_summary(run_dir)
    assert list(measured) == ["eps-inf"] and 0 < measured["eps-inf"] <= 1 + 1e-12  # zero-shot, original: no set
    stored = json.loads((run_dir / "eps-inf" / "mauve.json").read_text())
    assert next(iter(stored)) == "contains_private_data" and stored["mauve"] == measured["eps-inf"]
    assert stored["p_texts"] == 5 and stored["max_texts"] == 1000 and stored["private_split"] == "train"
    record = json.loads((run_dir / "eps-inf" / "mauve.stage.json").read_text())["fingerprint"]
    assert record["similarity"]["max_texts"] == 1000 and "eps-inf/synthetic" in record["after"]
    markdown = (run_dir / "summary.md").read_text()
    assert MAUVE_HEADER in markdown and MAUVE_NOTE in markdown and f"| {measured['eps-inf']:.4f} |" in markdown
    run = collect(run_dir)
    assert {r.key: r.mauve for r in run.rows if r.mauve is not None} == measured
    for page in (render_markdown(run), render_html(run)):
        assert MAUVE_HEADER in page and f"{measured['eps-inf']:.4f}" in page and "without DP" in page
    released = [p for d in ("generator", "synthetic", "retriever") for p in (run_dir / "eps-inf" / d).rglob("*")
                if p.is_file() and p.suffix in (".json", ".jsonl", ".md", ".txt", ".tsv")]
    assert len(released) > 5 and not [p for p in released if b"mauve" in p.read_bytes().lower()]
    assert "mauve" not in (run_dir / "budget.json").read_text().lower()


def test_mauve_is_kept_on_a_rerun_and_a_changed_setting_is_refused(small_config, small_run_dir, monkeypatch):
    from privret.pipeline import similarity
    from privret.pipeline.run import run_pipeline

    before = _mauve_in_summary(small_run_dir)
    _forbid_work(monkeypatch, "train_generator", "generate_synthetic", "train_retriever", "evaluate_per_query")
    monkeypatch.setattr(similarity, "mauve_of_texts", lambda *a, **k: pytest.fail("MAUVE was computed again"))
    run_pipeline(small_config, small_run_dir)
    assert _mauve_in_summary(small_run_dir) == before
    with pytest.raises(InputError) as err:
        run_pipeline(_changed(small_config, "similarity", max_texts=500), small_run_dir)
    assert err.value.field == "similarity.max_texts" and "eps-inf/mauve.json" in str(err.value)
    run_pipeline(_changed(small_config, "similarity", mauve=False), small_run_dir)  # off: not computed, not shown
    assert _mauve_in_summary(small_run_dir) == {}
    assert "MAUVE" not in (small_run_dir / "summary.md").read_text()


def test_a_synthetic_set_of_the_private_queries_themselves_scores_mauve_1(small_config, small_run_dir):
    from helpers import TOY_TRAIN

    from privret.pipeline.run import run_pipeline

    synthetic = small_run_dir / "eps-inf" / "synthetic"
    (synthetic / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t, _ in TOY_TRAIN))
    (synthetic / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{ds[0]}\t1\n" for q, _, ds in TOY_TRAIN))
    (small_run_dir / "eps-inf" / "mauve.json").unlink()
    run_pipeline(small_config, small_run_dir)
    assert _mauve_in_summary(small_run_dir)["eps-inf"] == pytest.approx(1.0)


def test_synthetic_fingerprint_names_the_repetition_penalty_only_when_on(tmp_path):
    """A synthetic set recorded before the penalty existed (no field: sampled without one) matches a config with
    penalty 1 and is stale under any other penalty, the default 1.2 included."""
    from privret.pipeline.stages import first_difference, plan_stages

    def fingerprint(penalty):
        cfg = PipelineConfig(name="x", dataset=tmp_path, epsilons=[8.0],
                             generate=GenerateConfig(repetition_penalty=penalty))
        plan = plan_stages(cfg, tmp_path / "run", data_hash="h", evaluation="e", corpus="c", few_shot=None)
        return plan.stages["eps-8/synthetic"].fingerprint

    recorded_before = fingerprint(1.0)
    assert "repetition_penalty" not in recorded_before["generate"]
    assert first_difference(recorded_before, fingerprint(1.0)) is None
    assert first_difference(recorded_before, fingerprint(1.2)) == ("generate.repetition_penalty", "<absent>", 1.2)
    assert GenerateConfig().repetition_penalty == 1.2
