"""The public subspace (privret.train.public_subspace): the basis, the projection, that the projection is
post-processing of the released noisy sum (the same noise, the same ledger, the update V V^T of it), that the
basis reads public data only, and the options' validation."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from helpers import WORDS, record_first_results, record_updates, run_cli
from privret.data.beir import Document
from privret.data.pairs import QueryDocPair, TrainingPairs
from privret.errors import InputError
from privret.train import dp_retriever as dptrain
from privret.train.public_subspace import PublicSubspace, fit_subspace
from privret.train.settings import DPRetrieverConfig


def test_fit_subspace_is_orthonormal_and_spans_the_normalised_public_gradients():
    gen = torch.Generator().manual_seed(0)
    grads = torch.randn(6, 20, generator=gen) * torch.tensor([1.0, 5.0, 0.1, 2.0, 3.0, 0.5])[:, None]
    full = fit_subspace(grads, 6)
    torch.testing.assert_close(full.basis.T @ full.basis, torch.eye(6), atol=1e-5, rtol=0)
    rows = grads / grads.norm(dim=1, keepdim=True)  # each unit's direction, whatever its norm
    torch.testing.assert_close(rows @ full.basis @ full.basis.T, rows, atol=1e-5, rtol=0)
    assert full.captured == pytest.approx(1.0, abs=1e-6)
    # two directions hold the top two eigenvalues of the Gram matrix of the directions, of a total of n = 6
    eig = torch.linalg.eigvalsh(rows @ rows.T).sort(descending=True).values
    two = fit_subspace(grads, 2)
    assert two.rank == 2 and two.captured == pytest.approx(float(eig[:2].sum() / 6), rel=1e-4)
    with pytest.raises(InputError, match="subspace rank 7"):
        fit_subspace(grads, 7)


def test_project_keeps_the_gradient_part_in_the_span_across_tensors():
    """V = the first three coordinates of the flattened (2 x 2, 3) gradients: exactly those survive, in place."""
    a, b = torch.zeros(2, 2, requires_grad=True), torch.zeros(3, requires_grad=True)
    a.grad, b.grad = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([5.0, 6.0, 7.0])
    PublicSubspace(basis=torch.eye(7)[:, :3], captured=1.0).project_([a, b])
    assert a.grad.tolist() == [[1.0, 2.0], [3.0, 0.0]] and b.grad.tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="over 6 parameters"):
        PublicSubspace(basis=torch.eye(6)[:, :2], captured=1.0).project_([a, b])


def test_projected_noise_has_k_of_the_d_dimensions_variance():
    """E||V V^T z||^2 = k std^2 for z ~ N(0, std^2 I_d): the noise the optimizer sees, against d std^2 without."""
    gen = torch.Generator().manual_seed(1)
    subspace = fit_subspace(torch.randn(8, 50, generator=gen), 5)
    std, draws = 3.0, 4000
    z = torch.randn(draws, 50, generator=gen) * std
    projected = z @ subspace.basis @ subspace.basis.T
    mean_sq = projected.pow(2).sum(dim=1).mean().item()
    assert mean_sq == pytest.approx(5 * std ** 2, rel=0.05)  # sd of the mean: about 1.4% here


def _private_pairs(offset: int = 0) -> TrainingPairs:
    corpus = {f"d{i}": Document(f"d{i}", "", f"document {w}") for i, w in enumerate(WORDS[:14])}
    rows = [QueryDocPair(query=f"what {WORDS[(i + offset) % 14]}", doc_id=f"d{i}") for i in range(10)]
    return TrainingPairs(pairs=rows, corpus=corpus)


def _public_file(tmp_path, words=WORDS[14:26], name="public.jsonl"):
    """Public pairs naming documents of the public corpus (d0..d13) by id, with queries no private pair has."""
    path = tmp_path / name
    path.write_text("".join(json.dumps({"query": f"which {w}", "doc_id": f"d{i % 14}"}) + "\n"
                            for i, w in enumerate(words)))
    return path


def _cfg(tiny_bert_dir, public, **kw):
    base = dict(method="public-negatives", model=str(tiny_bert_dir), clip_norm=0.02, batch_size=4, epochs=1.0,
                max_query_tokens=32, max_doc_tokens=32, temperature=0.5, trainable="top:1", public_negatives=3,
                learning_rate=1e-3, public_subspace=str(public), subspace_rank=4, subspace_units=8)
    base.update(kw)
    return DPRetrieverConfig(**base)


def _fits(monkeypatch) -> list[PublicSubspace]:
    fitted, real = [], dptrain.fit_subspace

    def recording(grads, rank):
        fitted.append(real(grads, rank))
        return fitted[-1]

    monkeypatch.setattr(dptrain, "fit_subspace", recording)
    return fitted


def test_the_update_is_the_projection_of_the_released_sum(tmp_path, tiny_bert_dir, monkeypatch):
    """With the noise zero and the batch fixed, every gradient Adam applies is V V^T (s(batch) / (q N)): the step's
    own clipped sum (checked against brute force in test_dp_retriever), divided as before, then projected."""
    fitted = _fits(monkeypatch)
    applied = record_updates(monkeypatch, [1, 3, 5, 7])
    clipped = record_first_results(monkeypatch, dptrain, "clipped_sum")
    pairs = _private_pairs()
    cfg = _cfg(tiny_bert_dir, _public_file(tmp_path))
    dptrain.train_dp_retriever(pairs, tmp_path / "r", cfg, data_hash="h", public_corpus=pairs.corpus)
    basis = fitted[0].basis
    steps = math.ceil(1 / (4 / 10))
    assert len(fitted) == 1 and basis.shape[1] == 4 and len(applied) == steps
    step_sums = clipped[-steps:]  # the 8 public units' unclipped gradients came first
    assert len(clipped) == 8 + steps
    for grads, summed in zip(applied, step_sums):
        flat = torch.cat([s.reshape(-1) for s in summed]) / 4.0
        expected = basis @ (basis.T @ flat)
        torch.testing.assert_close(torch.cat([g.reshape(-1) for g in grads]), expected, rtol=1e-4, atol=1e-9)
        assert expected.norm() > 0 and (flat - expected).norm() > 1e-3 * flat.norm()  # the projection did something
    details = json.loads((tmp_path / "r" / "dp_mechanism.json").read_text())
    assert details["subspace_rank"] == 4 and 0 < details["subspace_captured"] <= 1


def test_noise_and_ledger_are_those_of_the_unprojected_run_with_the_public_data_as_provenance(
        tmp_path, tiny_bert_dir, monkeypatch):
    """The projection is post-processing: the run draws the same noise (std sigma Delta, d dimensions, once a step
    per tensor) and its ledger charges the same epsilon as without the subspace; the ledger records the public
    data's hash, k and the number of public units, and another public file is refused on the same output."""
    from privret.train import dp_parallel

    stds, noise_like = [], dp_parallel.noise_like
    monkeypatch.setattr(dp_parallel, "noise_like", lambda t, std, rng: stds.append((std, t.numel())) or noise_like(t, std, rng))
    pairs, public = _private_pairs(), _public_file(tmp_path)
    plain = dptrain.train_dp_retriever(pairs, tmp_path / "plain", _cfg(tiny_bert_dir, public, public_subspace=None),
                                       data_hash="h", dataset_id="plain", public_corpus=pairs.corpus)
    plain_draws, stds[:] = list(stds), []
    projected = dptrain.train_dp_retriever(pairs, tmp_path / "r", _cfg(tiny_bert_dir, public), data_hash="h",
                                           dataset_id="projected", public_corpus=pairs.corpus)
    assert stds == plain_draws and stds[0][0] == pytest.approx(plain.noise_multiplier * 0.02, rel=1e-9)
    assert projected.epsilon == plain.epsilon and projected.noise_multiplier == plain.noise_multiplier
    assert projected.mechanism == plain.mechanism == "direct-public-negatives" and plain.provenance == {}
    record = projected.provenance["public_subspace"]
    assert record["rank"] == 4 and record["units"] == 8 and len(record["sha256"]) == 64
    other = _public_file(tmp_path, words=WORDS[26:38], name="other.jsonl")
    with pytest.raises(InputError, match="provenance"):
        dptrain.train_dp_retriever(pairs, tmp_path / "r", _cfg(tiny_bert_dir, other), data_hash="h",
                                   dataset_id="projected", public_corpus=pairs.corpus, resume=True)


def test_the_basis_depends_on_no_private_pair(tmp_path, tiny_bert_dir, monkeypatch):
    """Two runs on different private logs over the same public corpus fit the same basis: it reads the public
    pairs, the public pool and the initial encoder only (and its negatives come from a generator seeded with the
    run's seed, not from the run's private randomness)."""
    fitted = _fits(monkeypatch)
    public = _public_file(tmp_path)
    for k, offset in enumerate((0, 5)):
        pairs = _private_pairs(offset)
        dptrain.train_dp_retriever(pairs, tmp_path / f"r{k}", _cfg(tiny_bert_dir, public, epochs=0.4),
                                   data_hash=f"h{k}", public_corpus=pairs.corpus)
    assert len(fitted) == 2 and torch.equal(fitted[0].basis, fitted[1].basis)


def test_public_pairs_that_name_a_private_inline_document_are_refused(tmp_path, tiny_bert_dir):
    """Documents by id are looked up in the public pool only, which leaves out those that came inline with the
    private pairs: public pairs cannot reach a private document that way."""
    pairs = _private_pairs()
    pairs = TrainingPairs(pairs=pairs.pairs, corpus={**pairs.corpus, "secret": Document("secret", "", "private text")},
                          inline_doc_ids=frozenset({"secret"}))
    public = tmp_path / "p.jsonl"
    public.write_text(json.dumps({"query": "which one", "doc_id": "secret"}) + "\n")
    with pytest.raises(InputError, match="unknown document id 'secret'"):
        dptrain.train_dp_retriever(pairs, tmp_path / "r", _cfg(tiny_bert_dir, public, subspace_rank=1, subspace_units=2),
                                   data_hash="h", public_corpus=pairs.corpus)


def test_config_validation(tiny_bert_dir, tmp_path):
    public = str(_public_file(tmp_path))
    with pytest.raises(ValueError, match="public-negatives only"):
        DPRetrieverConfig(method="batch-clip", public_subspace=public)
    with pytest.raises(ValueError, match="LoRA"):
        DPRetrieverConfig(method="public-negatives", public_subspace=public, trainable="lora")
    with pytest.raises(ValueError, match="exceeds `subspace_units`"):
        DPRetrieverConfig(method="public-negatives", public_subspace=public, subspace_rank=9, subspace_units=8)
    for field, value in (("subspace_rank", 0), ("subspace_units", 1)):
        with pytest.raises(ValueError, match=field):
            DPRetrieverConfig(method="public-negatives", public_subspace=public, **{field: value})
    plain = DPRetrieverConfig(method="public-negatives")
    assert plain.unused(["subspace_rank", "subspace_units"]) == ["subspace_rank", "subspace_units"]
    # unset without a subspace, so that a run without one keeps the settings its older checkpoints were saved with
    assert plain.subspace_rank is None and plain.subspace_units is None
    with_defaults = DPRetrieverConfig(method="public-negatives", public_subspace=public)
    assert (with_defaults.subspace_rank, with_defaults.subspace_units) == (64, 512)
    too_few = _cfg(tiny_bert_dir, public, subspace_rank=20, subspace_units=30)
    with pytest.raises(InputError, match="fewer than subspace_rank 20"):
        dptrain.public_subspace_units(too_few, [Document(f"d{i}", "", "x") for i in range(14)])


def test_cli_refuses_subspace_options_where_they_do_nothing(tmp_path, toy_beir, tiny_bert_dir):
    base = ["retriever", "train", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--out", str(tmp_path / "r")]
    refused = run_cli(*base, "--dp", "public-negatives", "--subspace-rank", "4")
    assert refused.returncode == 2 and "--subspace-rank" in refused.stderr
    refused = run_cli(*base, "--public-subspace", str(toy_beir))
    assert refused.returncode == 2 and "--public-subspace" in refused.stderr
    refused = run_cli(*base, "--dp", "public-negatives", "--public-subspace", str(toy_beir))
    assert refused.returncode == 2 and "private training data" in refused.stderr
    refused = run_cli(*base, "--dp", "batch-clip", "--public-subspace", str(tmp_path))
    assert refused.returncode == 2 and "public-negatives only" in refused.stderr
    assert not (tmp_path / "r").exists()


def test_cli_trains_with_a_public_subspace_and_records_it(tmp_path, toy_beir, tiny_bert_dir):
    """From the command line: a BEIR directory as the public pairs (its train split), the ledger's provenance and
    the mechanism file name the subspace, and the epsilon is the run's target."""
    out, public = tmp_path / "r", tmp_path / "public"
    shutil.copytree(toy_beir, public)  # the same pairs, standing in for a public set (the same path is refused)
    done = run_cli("retriever", "train", "--data", str(toy_beir), "--model", str(tiny_bert_dir), "--out", str(out),
                   "--dp", "public-negatives", "--trainable", "top:1", "--batch-size", "3", "--public-negatives", "2",
                   "--max-doc-tokens", "32", "--public-subspace", str(public), "--subspace-rank", "2",
                   "--subspace-units", "3")
    assert done.returncode == 0, done.stderr
    ledger = json.loads((out / "privacy_ledger.json").read_text())
    assert ledger["provenance"]["public_subspace"]["rank"] == 2 and ledger["epsilon"] <= 8.0 + 0.05
    assert json.loads((out / "dp_mechanism.json").read_text())["subspace_rank"] == 2


def test_a_checkpoint_saved_before_the_subspace_fields_existed_still_resumes(tmp_path):
    """Settings saved by an older privret lack the three fields; a run without a subspace must match them (and one
    with a subspace must not)."""
    from privret.train.dp_run import _check_settings, resume_settings

    plain = DPRetrieverConfig(method="public-negatives")
    older = {k: v for k, v in resume_settings(plain).items()
             if k not in ("public_subspace", "subspace_rank", "subspace_units")}
    _check_settings(older, resume_settings(plain), tmp_path)
    with pytest.raises(InputError, match="public_subspace"):
        _check_settings(older, resume_settings(DPRetrieverConfig(method="public-negatives",
                                                                 public_subspace=str(tmp_path))), tmp_path)
