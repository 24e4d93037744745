"""Approximate FAISS indexes (privret.retrieval.index): exact where the data leave no doubt, a recall
floor against exact search on random data, and option validation."""

from __future__ import annotations

import numpy as np
import pytest

from privret.errors import InputError
from privret.retrieval.index import SearchIndex, build_index, overlap_at_k, top_k


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clustered(rng, clusters: int = 10, per_cluster: int = 40, dim: int = 32):
    """``clusters`` tight groups around orthogonal directions, and one query near each group's centre."""
    centres = np.eye(dim)[:clusters]
    docs = _unit(np.repeat(centres, per_cluster, axis=0) + 0.05 * rng.standard_normal((clusters * per_cluster, dim)))
    queries = _unit(centres + 0.01 * rng.standard_normal((clusters, dim)))
    return docs, queries


@pytest.mark.parametrize("spec", [SearchIndex(index="hnsw", hnsw_m=8, hnsw_ef_search=16),
                                  SearchIndex(index="ivf", ivf_nlist=10, ivf_nprobe=3)])
def test_approximate_index_returns_the_exact_top_k_on_well_separated_data(spec):
    docs, queries = _clustered(np.random.default_rng(0))
    exact_scores, exact_hits = top_k(build_index(docs), queries, 20)
    scores, hits = top_k(build_index(docs, spec), queries, 20)
    assert [set(r) for r in hits.tolist()] == [set(r) for r in exact_hits.tolist()]
    np.testing.assert_allclose(np.sort(scores, axis=1), np.sort(exact_scores, axis=1), atol=1e-5)  # inner products


# measured on this data (seed 0, N 5000, d 32, 100 queries, k 100): hnsw 0.996, ivf (nprobe 64 of 128) 0.923
@pytest.mark.parametrize("spec, floor", [(SearchIndex(index="hnsw"), 0.95),
                                         (SearchIndex(index="ivf", ivf_nprobe=64), 0.85)])
def test_recall_against_exact_search_on_random_data_is_above_a_floor(spec, floor):
    rng = np.random.default_rng(0)
    docs, queries = _unit(rng.standard_normal((5000, 32))), _unit(rng.standard_normal((100, 32)))
    _, exact = top_k(build_index(docs), queries, 100)
    _, approximate = top_k(build_index(docs, spec), queries, 100)
    assert (approximate >= 0).all()
    assert floor < overlap_at_k(exact, approximate) < 1.0  # approximate, yet close


def test_hnsw_searches_with_at_least_k_candidates():
    rng = np.random.default_rng(1)
    docs, queries = _unit(rng.standard_normal((2000, 16))), _unit(rng.standard_normal((10, 16)))
    _, hits = top_k(build_index(docs, SearchIndex(index="hnsw", hnsw_ef_search=1)), queries, 50)
    assert hits.shape == (10, 50) and (hits >= 0).all()  # FAISS alone would return mostly -1 with efSearch 1 < k
    assert all(len(set(row)) == 50 for row in hits)  # 50 distinct documents per query


def test_overlap_at_k_is_the_mean_share_of_exact_ids_found():
    exact = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert overlap_at_k(exact, np.array([[4, 3, 9, -1], [8, 7, 6, 5]])) == pytest.approx((2 / 4 + 1) / 2)


def test_ivf_cell_count_default_and_bounds():
    assert SearchIndex().nlist(1_000_000) == 4000
    assert SearchIndex().nlist(5183) == 5183 // 39  # 4 sqrt(N) = 288 would leave too few training points per cell
    assert SearchIndex().nlist(10) == 1
    with pytest.raises(InputError, match="field 'ivf_nlist'"):
        SearchIndex(index="ivf", ivf_nlist=11).nlist(10)


@pytest.mark.parametrize("fields", [{"index": "annoy"}, {"hnsw_m": 1}, {"hnsw_ef_search": 0}, {"ivf_nprobe": 0},
                                    {"ivf_nlist": 0}, {"nprobe": 4}])
def test_bad_index_options_are_refused(fields):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        SearchIndex(**fields)
    assert [e["loc"] for e in err.value.errors()] == [tuple(fields)]  # the error names the field given


def test_cli_and_pipeline_config_name_the_bad_index_option(tmp_path, toy_beir):
    from test_cli import run_cli

    from privret.settings.pipeline import load_config

    proc = run_cli("evaluate", "retrieval", "--model", "minilm-l6", "--data", str(toy_beir), "--index", "annoy")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "field '--index'" in proc.stderr
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndataset: d\nepsilons: [8]\nsearch: {index: hnsw, hnsw_m: 0}\n")
    with pytest.raises(InputError, match="field 'search.hnsw_m'"):
        load_config(path)
    path.write_text("name: x\ndataset: d\nepsilons: [8]\nsearch: {index: ivf, ivf_nprobe: 8}\n")
    assert load_config(path).search == SearchIndex(index="ivf", ivf_nprobe=8)


def test_pipeline_metrics_fingerprint_names_an_approximate_index_only(tmp_path):
    from privret.settings.pipeline import PipelineConfig
    from privret.pipeline.stages import plan_stages

    def fingerprint(**fields):
        cfg = PipelineConfig(name="x", dataset=tmp_path, epsilons=[8.0], **fields)
        plan = plan_stages(cfg, tmp_path / "run", data_hash="h", evaluation="e", corpus="c", few_shot=None)
        return plan.stages["zero_shot/metrics.json"].fingerprint

    exact = fingerprint()
    assert "search" not in exact  # runs evaluated before approximate search existed stay valid
    assert fingerprint(search=SearchIndex(index="hnsw"))["search"]["index"] == "hnsw"
