"""BLEU and MAUVE of synthetic vs original queries agree with sacrebleu and mauve called directly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import write_beir_dir
from typer.testing import CliRunner

from privret.cli import app
from privret.evaluate.similarity import MauveSettings, align, corpus_bleu, evaluate_similarity, featurise


DOCS = [("d1", "aspirin can reduce the risk of heart disease"), ("d2", "mice with the gene show low memory"),
        ("d3", "vitamin levels in blood are high in children"), ("d4", "sleep and exercise increase immune response"),
        ("d5", "the drug trial in patients with cancer"), ("d6", "cells of the immune system respond to the virus")]
# d3 has two original queries, d6 none in train (only in test): its synthetic query has no reference.
PRIVATE_TRAIN = [("q1", "does aspirin reduce heart risk", "d1"), ("q2", "gene memory in mice", "d2"),
                 ("q3", "vitamin blood levels in children", "d3"), ("q3b", "high vitamin levels children", "d3"),
                 ("q4", "sleep exercise immune response", "d4"), ("q5", "cancer drug trial patients", "d5")]
PRIVATE_TEST = [("t1", "immune cells virus", "d6")]
SYNTHETIC = [("syn-d1-0", "what does aspirin reduce", "d1"), ("syn-d2-0", "memory of mice with the gene", "d2"),
             ("syn-d3-0", "vitamin levels in children", "d3"), ("syn-d4-0", "sleep and immune response", "d4"),
             ("syn-d5-0", "drug trial for cancer patients", "d5"), ("syn-d6-0", "how do cells respond to a virus", "d6"),
             ("syn-d1-1", "aspirin heart disease risk", "d1")]


def _corpus():
    return [{"_id": d, "title": "", "text": t} for d, t in DOCS]


@pytest.fixture()
def datasets(tmp_path) -> tuple[Path, Path]:
    private = write_beir_dir(tmp_path / "private", _corpus(),
                             [{"_id": q, "text": t} for q, t, _ in PRIVATE_TRAIN + PRIVATE_TEST],
                             {"train": [(q, d, 1) for q, _, d in PRIVATE_TRAIN],
                              "test": [(q, d, 1) for q, _, d in PRIVATE_TEST]})
    synthetic = write_beir_dir(tmp_path / "synthetic", _corpus(), [{"_id": q, "text": t} for q, t, _ in SYNTHETIC],
                               {"train": [(q, d, 1) for q, _, d in SYNTHETIC]})
    manifest = {"generator": "gen", "ledger": {"epsilon": "Infinity", "delta": 1e-3, "model": "tiny"}}
    (synthetic / "manifest.json").write_text(json.dumps(manifest))
    return private, synthetic


def test_alignment_pairs_each_synthetic_query_with_its_documents_original_queries(datasets):
    from privret.data.beir import load_beir

    private, synthetic = (load_beir(p) for p in datasets)
    aligned = align(private, "train", synthetic)
    by_id = dict(zip(aligned.hypothesis_ids, aligned.references))
    assert by_id["syn-d3-0"] == ["vitamin blood levels in children", "high vitamin levels children"]
    assert by_id["syn-d1-1"] == ["does aspirin reduce heart risk"]
    assert "syn-d6-0" not in by_id and aligned.skipped_no_reference == 1  # d6 has no train query
    assert aligned.synthetic_queries == 7 and len(aligned.hypotheses) == 6
    assert set(aligned.reference_ids) == {"q1", "q2", "q3", "q3b", "q4", "q5"}


def test_bleu_matches_sacrebleu_called_directly(datasets):
    import sacrebleu

    from privret.data.beir import load_beir

    private, synthetic = (load_beir(p) for p in datasets)
    aligned = align(private, "train", synthetic)
    ours = corpus_bleu(aligned.hypotheses, aligned.references)
    # the same pairs written out by hand, in the dataset's order, None padding the second stream
    hyps = ["what does aspirin reduce", "memory of mice with the gene", "vitamin levels in children",
            "sleep and immune response", "drug trial for cancer patients", "aspirin heart disease risk"]
    refs1 = ["does aspirin reduce heart risk", "gene memory in mice", "vitamin blood levels in children",
             "sleep exercise immune response", "cancer drug trial patients", "does aspirin reduce heart risk"]
    refs2 = [None, None, "high vitamin levels children", None, None, None]
    direct = sacrebleu.corpus_bleu(hyps, [refs1, refs2])
    assert ours["score"] == pytest.approx(direct.score, abs=1e-9)
    assert ours["bleu"] == pytest.approx(direct.score / 100)
    assert 0 < ours["bleu"] < 1
    # our BLEU uses every reference of a hypothesis: with the second one dropped it is lower
    assert corpus_bleu(aligned.hypotheses, [refs[:1] for refs in aligned.references])["score"] < ours["score"]


def test_bleu_is_one_for_identical_queries():
    result = corpus_bleu(["the heart risk of aspirin in adults"], [["the heart risk of aspirin in adults"]])
    assert result["bleu"] == pytest.approx(1.0)


def test_mauve_matches_the_library_on_the_same_features(datasets, tiny_bert_dir):
    import mauve

    from privret.models.encoder import load_encoder

    settings = MauveSettings(num_buckets=2, kmeans_num_redo=2, kmeans_max_iter=100)
    result = evaluate_similarity(datasets[0], "train", datasets[1], featurizer=str(tiny_bert_dir), mauve=settings)
    encoder = load_encoder(str(tiny_bert_dir))
    p_texts = [t for _, t, _ in PRIVATE_TRAIN]  # every train query is the reference of some synthetic query
    q_texts = [t for q, t, _ in SYNTHETIC if q != "syn-d6-0"]
    p = featurise(encoder, p_texts)
    q = featurise(encoder, q_texts)
    direct = mauve.compute_mauve(p_features=p, q_features=q, num_buckets=2, kmeans_num_redo=2, kmeans_max_iter=100,
                                 mauve_scaling_factor=5.0, kmeans_explained_var=0.9, seed=25)
    assert result["mauve"] == pytest.approx(direct.mauve, abs=1e-9)
    details = result["mauve_details"]
    assert details["featurizer"] == str(tiny_bert_dir) and details["embedding_dim"] == 32
    assert details["p_texts"] == 6 and details["q_texts"] == 6
    assert result["synthetic"]["epsilon"] == math.inf
    assert result["bleu"] == pytest.approx(corpus_bleu(
        [t for q, t, _ in SYNTHETIC if q != "syn-d6-0"],
        [["does aspirin reduce heart risk"], ["gene memory in mice"],
         ["vitamin blood levels in children", "high vitamin levels children"], ["sleep exercise immune response"],
         ["cancer drug trial patients"], ["does aspirin reduce heart risk"]])["bleu"])


def test_mauve_separates_same_from_different_distributions():
    """On synthetic features: MAUVE near 1 for two samples of one Gaussian, near 0 for far-apart ones."""
    from privret.evaluate.similarity import mauve_from_features

    rng = np.random.default_rng(0)
    settings = MauveSettings(num_buckets=5, kmeans_num_redo=1, kmeans_max_iter=100)
    a, b = rng.normal(size=(200, 8)), rng.normal(size=(200, 8))
    far = rng.normal(size=(200, 8)) + 6.0
    same = mauve_from_features(a, b, settings)["mauve"]
    different = mauve_from_features(a, far, settings)["mauve"]
    assert same > 0.9 and different < 0.1


def test_cli_similarity_writes_json(datasets, tiny_bert_dir, tmp_path):
    out_json = tmp_path / "sim.json"
    result = CliRunner().invoke(app, ["evaluate", "similarity", "--synthetic", str(datasets[1]), "--data",
                                      str(datasets[0]), "--featurizer", str(tiny_bert_dir), "--num-buckets", "2",
                                      "--json", str(out_json)])
    assert result.exit_code == 0, result.output
    saved = json.loads(out_json.read_text())
    assert out_json.read_text().splitlines()[1].lstrip().startswith('"contains_private_data": "PRIVATE DATA: similarity')
    assert "No DP guarantee covers it" in saved["contains_private_data"]
    assert saved["pairs"] == 6 and 0 <= saved["mauve"] <= 1 and saved["mauve_details"]["num_buckets"] == 2
    assert "BLEU" in result.output


def test_cli_similarity_without_overlap_is_an_input_error(datasets, tiny_bert_dir, tmp_path):
    """A synthetic set from another dataset (no shared document with the split) exits 2 with a message."""
    other = write_beir_dir(tmp_path / "other", [{"_id": "x1", "title": "", "text": "unrelated text"}],
                           [{"_id": "syn-x1-0", "text": "unrelated"}], {"train": [("syn-x1-0", "x1", 1)]})
    from helpers import run_cli

    proc = run_cli("evaluate", "similarity", "--synthetic", str(other), "--data", str(datasets[0]), "--featurizer",
                   str(tiny_bert_dir))
    assert proc.returncode == 2
    assert "no synthetic query has a document" in proc.stderr
