"""The pipeline on tiny models: every row appears, ledgers travel, re-running skips finished stages."""

from __future__ import annotations

import json
import math

import pytest
import torch

from privret.config import DirectDPGrid, GeneratorStage, PipelineConfig
from privret.data.beir import load_beir
from privret.synth.filter import RoundTripFilterConfig
from privret.synth.generate import GenerateConfig
from privret.train.retriever import RetrieverTrainConfig

torch.set_num_threads(1)


@pytest.fixture()
def tiny_config(toy_beir, tiny_llama_dir, tiny_bert_dir) -> PipelineConfig:
    return PipelineConfig(
        name="toy", dataset=toy_beir, epsilons=[math.inf, 4.0], synthetic_documents="corpus",
        generator=GeneratorStage(model=str(tiny_llama_dir), batch_size=2, epochs=1, trained_layers=1, lora_rank=4,
                                 bf16=False),
        generate=GenerateConfig(num_queries=2, max_new_tokens=6, batch_size=4),
        retriever=RetrieverTrainConfig(model=str(tiny_bert_dir), epochs=1, batch_size=4, bf16=False),
        direct_dp=DirectDPGrid(methods=["public-negatives", "batch-clip"], epsilons=[4.0],
                               settings={"model": str(tiny_bert_dir), "batch_size": 2, "public_negatives": 3},
                               per_method={"batch-clip": {"trainable": "top:1"}}),
        synthetic_filter=RoundTripFilterConfig(encoder=str(tiny_bert_dir), top_k=2))


def test_pipeline_rows_ledgers_and_resume(tiny_config, tmp_path, monkeypatch):
    from privret import pipeline

    run_dir = tmp_path / "run"
    rows = pipeline.run_pipeline(tiny_config, run_dir)
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
    for r in rows:
        assert 0.0 <= r["ndcg@10"] <= 1.0 and r["queries"] == 2
    synthetic = load_beir(run_dir / "eps-4" / "synthetic")
    manifest = json.loads((run_dir / "eps-4" / "synthetic" / "manifest.json").read_text())
    assert manifest["ledger"]["epsilon"] == pytest.approx(rows[4]["epsilon"])
    assert len(synthetic.corpus) == 6  # synthetic_documents: corpus
    assert manifest["kept"] + manifest["dropped_copies_of_private_queries"] + manifest["dropped_empty"] == 12
    retriever_ledger = json.loads((run_dir / "eps-4" / "retriever" / "privacy_ledger.json").read_text())
    assert retriever_ledger["epsilon"] == pytest.approx(rows[4]["epsilon"])
    assert "epsilon=4" in (run_dir / "summary.md").read_text()

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
                 "train_dp_retriever", "evaluate_retriever"):
        monkeypatch.setattr(pipeline, name, must_not_run)
    again = pipeline.run_pipeline(tiny_config, run_dir)
    assert [r["ndcg@10"] for r in again] == [r["ndcg@10"] for r in rows]


def test_synthetic_set_never_contains_a_private_query(tiny_config, tmp_path, monkeypatch):
    """The generator is made to echo private queries; every echo is dropped and counted."""
    from privret.models import generator as genmod
    from privret.synth.generate import generate_synthetic
    from privret.train.generator import train_generator
    from privret.data.pairs import pairs_from_beir

    dataset = load_beir(tiny_config.dataset)
    pairs = pairs_from_beir(dataset, "train")
    train_generator(pairs, tmp_path / "gen", tiny_config.generator_config(math.inf), data_hash="h")
    private = [p.query for p in pairs.pairs]

    def echo(self, docs, *, num_queries=1, **_kw):
        return [[private[i % len(private)].upper() + "  ", f"fresh query {i}"] for i in range(len(docs))]

    monkeypatch.setattr(genmod.CausalQueryGenerator, "generate", echo)
    docs = list(dataset.corpus.values())
    manifest = generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn", GenerateConfig(num_queries=2),
                                  private_queries=set(private))
    texts = set(load_beir(tmp_path / "syn").queries.values())
    normalised_private = {" ".join(q.casefold().split()) for q in private}
    assert not {" ".join(t.casefold().split()) for t in texts} & normalised_private
    assert manifest["dropped_copies_of_private_queries"] == len(docs) and manifest["kept"] == len(docs)


def test_generation_resumes_after_a_torn_write(tiny_config, tmp_path, monkeypatch):
    from privret.data.pairs import pairs_from_beir
    from privret.models import generator as genmod
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
    with pytest.raises(Exception, match="--resume"):
        generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn", GenerateConfig(), private_queries=set())
    generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn", GenerateConfig(), private_queries=set(), resume=True)
    assert len(seen) == 5  # d1 was done; the torn d2 line is regenerated
    queries = load_beir(tmp_path / "syn").queries
    assert queries["syn-d1-0"] == "kept from before" and not partial.exists()
