"""A small slice of SciFact through the real default models (SmolLM2-135M, MiniLM-L6)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import SHARED_DATA
from privret.data.beir import BeirDataset, load_beir
from privret.data.pairs import TrainingPairs, pairs_from_beir
from privret.retrieval.metrics import evaluate_retriever
from privret.models.encoder import load_encoder
from privret.privacy.ledger import PrivacyLedger
from privret.synth.generate import generate_synthetic
from privret.settings.synthesis import GenerateConfig
from privret.train.generator import train_generator
from privret.settings.training import GeneratorTrainConfig
from privret.train.retriever import train_retriever
from privret.settings.training import RetrieverTrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(not (SHARED_DATA / "scifact").is_dir(), reason="../shared/data not present")]


@pytest.fixture(scope="module")
def scifact_slice():
    dataset = load_beir(SHARED_DATA / "scifact", splits=["train", "test"])
    pairs = pairs_from_beir(dataset, "train")
    test_qrels = dict(list(dataset.split("test").items())[:30])
    keep = {d for p in pairs.pairs[:48] for d in [p.doc_id]} | {d for q in test_qrels.values() for d in q}
    keep |= set(list(dataset.corpus)[:200])
    corpus = {d: dataset.corpus[d] for d in keep}
    return TrainingPairs(pairs.pairs[:48], corpus), BeirDataset(corpus, dataset.queries, {"test": test_qrels})


def test_dp_synthetic_pipeline_on_real_models(scifact_slice, tmp_path):
    torch.set_num_threads(2)
    pairs, evalset = scifact_slice
    cfg = GeneratorTrainConfig(epsilon=8.0, batch_size=16, epochs=0.7, trained_layers=2, lora_rank=4,
                               max_doc_tokens=64, physical_batch=8)
    ledger = train_generator(pairs, tmp_path / "gen", cfg, data_hash="slice")
    assert ledger.steps == math.ceil(0.7 / (16 / len(pairs.units("query")))) and ledger.epsilon == pytest.approx(8.0, rel=0.01)
    docs = [pairs.corpus[p.doc_id] for p in pairs.pairs[:6]]
    manifest = generate_synthetic(tmp_path / "gen", docs, tmp_path / "syn",
                                  GenerateConfig(num_queries=2, max_new_tokens=24, batch_size=6))
    synthetic = load_beir(tmp_path / "syn")
    assert manifest["generated"] == 2 * len({d.id for d in docs})
    assert all(isinstance(q, str) and q for q in synthetic.queries.values())
    assert PrivacyLedger.load(tmp_path / "syn") == PrivacyLedger.load(tmp_path / "gen")

    zero = evaluate_retriever(load_encoder("minilm-l6"), evalset.corpus, evalset.queries, evalset.split("test"))
    assert zero["ndcg@10"] > 0.4  # all-MiniLM-L6-v2 is a real retriever on SciFact
    train_retriever(pairs, tmp_path / "ret", RetrieverTrainConfig(epochs=1, batch_size=16),
                    ledger=ledger)
    from sentence_transformers import SentenceTransformer

    reloaded = SentenceTransformer(str(tmp_path / "ret"), device="cpu")
    trained = evaluate_retriever(reloaded, evalset.corpus, evalset.queries, evalset.split("test"))
    assert abs(trained["ndcg@10"] - zero["ndcg@10"]) < 0.2  # a few steps at lr 2e-5 move it only a little
    assert trained["ndcg@10"] != zero["ndcg@10"]  # but it did train
