"""DP fine-tuning of the generator: clipping, noise, sampling and accounting against references."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import GENERATOR_DOCS, GENERATOR_QUERIES, generator_pairs, record_first_results, record_updates
from privret.errors import InputError
from privret.models.generator import load_generator
from privret.privacy.accounting import calibrate_noise, default_delta
from privret.privacy.clipping import NORM_MARGIN
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.poisson import PoissonUnitSampler
from privret.train import generator as gtrain
from privret.train.generator import micro_batches, train_generator
from privret.settings.training import GeneratorTrainConfig

torch.set_num_threads(1)

def _assert_cached_losses_are_the_full_models(gen, ex, batch) -> None:
    """Each example's loss from the cached frozen layers equals the whole model's on its prompt and query."""
    with torch.no_grad():
        cached = gen.loss_module()(**batch)
        for row, e in enumerate(ex):
            ids = torch.tensor([e.prompt_ids + e.target_ids])
            logits = gen.model(input_ids=ids).logits[0]
            n = len(e.prompt_ids)
            reference = torch.nn.functional.cross_entropy(logits[n - 1:-1], torch.tensor(e.target_ids))
            assert cached[row].item() == pytest.approx(reference.item(), rel=1e-5)


def test_top_layer_loss_with_a_shared_few_shot_prefix_matches_full_model(tiny_llama_dir, monkeypatch):
    """The frozen layers' output of the few-shot prompts, their common start computed once: each example's loss
    is the full model's, and the start is really shared (prepare runs it once, batch 1)."""
    from privret.models import causal_generator

    gen = load_generator(str(tiny_llama_dir), trained_layers=1, bf16=False)
    gen.examples = [(GENERATOR_DOCS[2], GENERATOR_QUERIES[2]), (GENERATOR_DOCS[3], GENERATOR_QUERIES[3])]
    ex = [gen.example(GENERATOR_DOCS[0], GENERATOR_QUERIES[0]), gen.example(GENERATOR_DOCS[1], GENERATOR_QUERIES[6])]
    shared = causal_generator.shared_prefix_length([e.prompt_ids for e in ex])
    assert shared > 20
    widths = []
    real_pad = causal_generator.right_pad
    monkeypatch.setattr(causal_generator, "right_pad", lambda rows, pad: widths.append(len(rows[0])) or
                        real_pad(rows, pad))
    batch = gen.collate(gen.prepare(ex))
    assert widths[0] == len(ex[0].prompt_ids) + len(ex[0].target_ids) - shared  # only its own tokens ran
    _assert_cached_losses_are_the_full_models(gen, ex, batch)


@pytest.fixture(params=["lora", "full"])
def tiny_setup(tiny_llama_dir, request):
    gen = load_generator(str(tiny_llama_dir), trained_layers=1, bf16=False)
    gen.make_trainable(request.param, lora_rank=4)
    pairs = generator_pairs()
    items = gen.prepare([gen.example(pairs.corpus[p.doc_id].full_text, p.query) for p in pairs.pairs])
    return gen, pairs, items


def test_top_layer_loss_matches_full_model(tiny_llama_dir):
    gen = load_generator(str(tiny_llama_dir), trained_layers=1, bf16=False)
    ex = [gen.example(GENERATOR_DOCS[0], GENERATOR_QUERIES[0]), gen.example(GENERATOR_DOCS[1], GENERATOR_QUERIES[6])]
    batch = gen.collate(gen.prepare(ex))
    _assert_cached_losses_are_the_full_models(gen, ex, batch)


def brute_force_clipped_sum(gen, pairs, items, units, chosen, clip_norm):
    """Per-unit gradients by plain autograd, one unit at a time, clipped as the mechanism states
    (``min(1, C / ((1 + NORM_MARGIN) ||G||))``) and summed."""
    params = gen.trainable_parameters()
    module = gen.loss_module()
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    norms = []
    for u in chosen:
        for p in params.values():
            p.grad = None
        loss = module(**gen.collate([items[r] for r in units[u]])).sum()
        loss.backward()
        norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in params.values()))
        norms.append(norm)
        factor = min(1.0, clip_norm / ((1 + NORM_MARGIN) * norm))
        for n, p in params.items():
            total[n] += factor * p.grad
    for p in params.values():
        p.grad = None
    return total, norms


def test_dp_step_equals_brute_force_per_unit_clipping(tiny_setup):
    from opacus import GradSampleModule

    gen, pairs, items = tiny_setup
    units = pairs.units("query")
    assert sorted(len(u) for u in units) == [1, 1, 1, 1, 1, 1, 2, 3]
    chosen = list(range(len(units)))
    _, norms = brute_force_clipped_sum(gen, pairs, items, units, chosen, clip_norm=1e9)
    clip = sorted(norms)[len(norms) // 2]  # half the units get clipped
    reference, _ = brute_force_clipped_sum(gen, pairs, items, units, chosen, clip_norm=clip)
    module = GradSampleModule(gen.loss_module(), batch_first=True, loss_reduction="sum")
    params = gen.trainable_parameters()
    cfg = GeneratorTrainConfig(clip_norm=clip, physical_batch=3, bf16=False)  # units never split
    expected_batch = 4.0
    gtrain._dp_step(gen, module, items, units, chosen, params, cfg, sigma=0.0, expected_batch=expected_batch,
                    rng=torch.Generator().manual_seed(0))
    for n, p in params.items():
        torch.testing.assert_close(p.grad * expected_batch, reference[n], rtol=1e-4, atol=1e-6)


def test_noise_std_is_sigma_times_clip_norm(tiny_setup):
    from opacus import GradSampleModule

    gen, pairs, items = tiny_setup
    module = GradSampleModule(gen.loss_module(), batch_first=True, loss_reduction="sum")
    params = gen.trainable_parameters()
    sigma, clip, expected_batch = 1.7, 0.3, 5.0
    cfg = GeneratorTrainConfig(clip_norm=clip, bf16=False)
    gtrain._dp_step(gen, module, items, pairs.units("query"), [], params, cfg, sigma=sigma,
                    expected_batch=expected_batch, rng=torch.Generator().manual_seed(1))
    noise = torch.cat([p.grad.flatten() for p in params.values()]) * expected_batch
    assert noise.numel() > 1500
    # the sample std of N normals has relative standard error 1/sqrt(2N): allow 5 of them
    assert noise.std().item() == pytest.approx(sigma * clip, rel=5 / math.sqrt(2 * noise.numel()))
    assert abs(noise.mean().item()) < 4 * sigma * clip / math.sqrt(noise.numel())


def test_training_loop_divides_the_clipped_sum_by_the_expected_batch(tiny_llama_dir, tmp_path, monkeypatch):
    """In a real training run the gradient Adam applies is (sum of clipped unit gradients) / (q n), the
    expected batch, a constant: not the realised batch (3 units, 6 rows here; q n = 4) nor n (8). Noise is
    zero and the batch fixed so the update is exact; the clipped sums are the ones the step computed (their
    values are checked against brute force in test_dp_step_equals_brute_force_per_unit_clipping)."""
    pairs = generator_pairs()
    units = pairs.units("query")
    chosen = [0, 6, 7]
    assert [len(units[u]) for u in chosen] == [3, 2, 1]
    applied = record_updates(monkeypatch, chosen)
    clipped = record_first_results(monkeypatch, gtrain, "clip_units")
    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=8.0, batch_size=4, epochs=1, trained_layers=1,
                               lora_rank=4, bf16=False, physical_batch=3)
    train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc")
    expected_batch = cfg.batch_size / len(units) * len(units)
    per_step = len(micro_batches(units, chosen, cfg.physical_batch))
    assert len(applied) == 2 and len(clipped) == 2 * per_step and per_step == 2
    for step, grads in enumerate(applied):
        groups = clipped[step * per_step:(step + 1) * per_step]
        for k, grad in enumerate(grads):
            torch.testing.assert_close(grad, sum(g[k] for g in groups) / expected_batch, rtol=1e-5, atol=1e-9)
        assert max(g.abs().max().item() for g in grads) > 0


def test_a_unit_at_or_just_above_the_clip_norm_contributes_at_most_c():
    """float32 rounding: 64 units (two parameters, three rows each) whose summed gradients have norm C (1 + e_u),
    e_u from 0 to 1e-6, sit where a factor computed from a rounded norm can leave a clipped unit a hair above C.
    Each unit's contribution, its norm taken in float64, stays within C; the clipped sum is brute force's
    sum_u f_u G_u in float64 with f_u = min(1, C / ((1 + NORM_MARGIN) ||G_u||))."""
    from privret.privacy.clipping import clip_units

    gen = torch.Generator().manual_seed(0)
    clip, n_units, per_unit = 0.7, 64, 3
    owner = torch.arange(n_units).repeat_interleave(per_unit)
    rows = [torch.randn(n_units * per_unit, 40, 30, generator=gen, dtype=torch.float64),
            torch.randn(n_units * per_unit, 500, generator=gen, dtype=torch.float64)]

    def unit_sums(grads):
        return [torch.zeros(n_units, *g.shape[1:], dtype=torch.float64).index_add_(0, owner, g.double())
                for g in grads]

    norms = torch.sqrt(sum(g.reshape(n_units, -1).pow(2).sum(1) for g in unit_sums(rows)))
    target = clip * (1 + torch.linspace(0, 1e-6, n_units, dtype=torch.float64))
    rows = [(g * (target / norms)[owner].view(-1, *[1] * (g.dim() - 1))).float() for g in rows]
    for u in range(n_units):
        mine = owner == u
        alone, _ = clip_units([g[mine] for g in rows], torch.zeros(per_unit, dtype=torch.long), 1, clip)
        assert math.sqrt(sum(float(c.double().pow(2).sum()) for c in alone)) <= clip, u
    got, _ = clip_units(rows, owner, n_units, clip)
    sums = unit_sums(rows)
    exact = torch.sqrt(sum(g.reshape(n_units, -1).pow(2).sum(1) for g in sums))
    factors = (clip / (exact * (1 + NORM_MARGIN))).clamp(max=1.0)
    assert (factors < 1).all()  # every unit is clipped, by a factor within 1e-5 of 1
    for g, s in zip(got, sums, strict=True):
        torch.testing.assert_close(g.double(), torch.einsum("u,u...->...", factors, s), rtol=1e-5, atol=1e-7)


def test_dp_generator_steps_run_without_dropout(tiny_t5_dir, tmp_path, monkeypatch):
    """The tiny T5's config has dropout 0.1. Every DP step computes its per-row gradients without dropout: the loss
    module gives the same losses twice on one batch (every Dropout module and the attention's dropout off), while
    Opacus still records per-row gradients (the step's clipping reads them; the run finishes). The ledger lists no
    dropout among its random draws."""
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tiny_t5_dir).dropout_rate > 0
    repeatable = []
    step = gtrain._dp_step

    def checking(generator, loss_module, items, *args, **kwargs):
        batch = generator.collate([items[r] for r in sorted(items)[:4]])
        with torch.no_grad():
            repeatable.append(torch.equal(loss_module(**batch), loss_module(**batch)))
        return step(generator, loss_module, items, *args, **kwargs)

    monkeypatch.setattr(gtrain, "_dp_step", checking)
    cfg = GeneratorTrainConfig(model=str(tiny_t5_dir), start="pretrained", epsilon=8.0, batch_size=4, epochs=1,
                               trained_layers=None, lora_rank=4, bf16=False)  # no prompt to show examples in
    ledger = train_generator(generator_pairs(), tmp_path / "t5", cfg, data_hash="h")
    assert repeatable == [True] * ledger.steps and ledger.steps == 2
    assert ledger.random_sources == {"sampling": "torch generator seeded from os.urandom",
                                     "noise": "torch generator seeded from os.urandom"}


@pytest.mark.parametrize("epsilon, q, steps", [(8.0, 0.08, 40), (3.0, 0.05, 60), (1.0, 0.2, 10), (16.0, 0.01, 300)])
def test_calibrated_sigma_meets_the_target_under_an_independent_accountant(epsilon, q, steps):
    """The calibrated sigma, checked with Google's dp-accounting (PLD, pessimistic): it spends at most the target
    epsilon, and no more than 2% less (the noise is not wastefully large)."""
    from test_accounting import pld_epsilon

    delta = default_delta(809)
    sigma = calibrate_noise(target_epsilon=epsilon, delta=delta, sample_rate=q, steps=steps)
    reference = pld_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta)
    assert 0.98 * epsilon <= reference <= epsilon * 1.001, (sigma, reference)


def test_calibrated_sigma_without_subsampling_matches_the_closed_form():
    """q = 1: T Gaussian steps of multiplier sigma are one Gaussian mechanism with mu = sqrt(T) / sigma, whose
    exact delta(epsilon) = Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2) (Balle & Wang 2018)."""
    from statistics import NormalDist

    epsilon, steps, delta = 2.0, 5, default_delta(809)
    sigma = calibrate_noise(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=steps)
    mu, phi = math.sqrt(steps) / sigma, NormalDist().cdf
    exact_delta = phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * phi(-epsilon / mu - mu / 2)
    assert 0.8 * delta <= exact_delta <= delta * 1.001, (sigma, exact_delta / delta)


def test_poisson_sampler_matches_accountant_assumption():
    n, q, draws = 50, 0.1, 4000
    sampler = PoissonUnitSampler(n, q, torch.Generator().manual_seed(3))
    counts = torch.zeros(n)
    sizes = []
    for _ in range(draws):
        batch = sampler.sample()
        assert len(set(batch)) == len(batch)  # a unit appears at most once per step
        counts[batch] += 1
        sizes.append(len(batch))
    freq = counts / draws
    assert (freq - q).abs().max() < 4 * math.sqrt(q * (1 - q) / draws)
    sizes = torch.tensor(sizes, dtype=torch.float)
    assert sizes.var().item() == pytest.approx(n * q * (1 - q), rel=0.15)  # not fixed-size batches
    assert (sizes == 0).any()  # empty batches happen and are not skipped by the sampler


def test_micro_batches_keep_units_whole():
    units = [[0, 1, 2], [3], [4, 5], [6]]
    groups = micro_batches(units, [0, 1, 2, 3], max_rows=3)
    assert groups == [[0], [1, 2], [3]]
    assert sorted(u for g in groups for u in g) == [0, 1, 2, 3]


def test_train_ledger_and_resume_after_crash(tiny_llama_dir, tmp_path, monkeypatch):
    pairs = generator_pairs()
    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=4.0, batch_size=4, epochs=2, trained_layers=1,
                               lora_rank=4, bf16=False, checkpoint_every=2, physical_batch=4)
    n_units = len(pairs.units("query"))
    q = 4 / n_units
    steps = math.ceil(2 / q)
    calls = {"n": 0}
    original = gtrain._dp_step

    def crashing_step(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated crash")
        return original(*args, **kwargs)

    monkeypatch.setattr(gtrain, "_dp_step", crashing_step)
    with pytest.raises(KeyboardInterrupt):
        train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc")
    saved = PrivacyLedger.load(tmp_path / "gen" / "checkpoint")
    assert saved.steps == 2 and saved.epsilon > 0
    with pytest.raises(InputError, match="interrupted run") as refused:
        train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc")
    assert refused.value.field == "resume"  # the CLI shows --resume
    with pytest.raises(InputError, match="checkpoint was made with clip_norm=1.0, this run has 2.0; cannot resume"):
        train_generator(pairs, tmp_path / "gen", cfg.model_copy(update={"clip_norm": 2.0}), data_hash="abc",
                        resume=True)
    # a setting outside the ledger's plan too: Adam's restored state would silently keep the checkpoint's
    with pytest.raises(InputError, match="learning_rate=.*cannot resume"):
        train_generator(pairs, tmp_path / "gen", cfg.model_copy(update={"learning_rate": 0.02}), data_hash="abc",
                        resume=True)
    ledger = train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc", resume=True)
    assert calls["n"] == 3 + (steps - 2)  # resumed at the checkpointed step
    assert ledger.steps == steps and ledger.planned_steps == steps
    assert ledger.delta == pytest.approx(1 / (2 * n_units)) and ledger.unit == "query"
    assert ledger.sample_rate == pytest.approx(q)
    assert ledger.epsilon == pytest.approx(4.0, rel=0.01)
    assert not (tmp_path / "gen" / "checkpoint").exists()
    on_disk = PrivacyLedger.load(tmp_path / "gen")
    assert on_disk.created_at and on_disk.model_copy(update={"created_at": ""}) == ledger.published()
    # the finished output is returned to a run with its settings only (physical_batch changes nothing trained)
    with pytest.raises(InputError, match="already holds a generator trained with learning_rate"):
        train_generator(pairs, tmp_path / "gen", cfg.model_copy(update={"learning_rate": 0.02}), data_hash="abc",
                        resume=True)
    again = train_generator(pairs, tmp_path / "gen", cfg.model_copy(update={"physical_batch": 2}), data_hash="abc",
                            resume=True)
    assert again.published() == on_disk.published() and calls["n"] == 3 + (steps - 2)
    from privret.models.generator import load_trained_generator

    trained = load_trained_generator(tmp_path / "gen")
    out = trained.generate(GENERATOR_DOCS[:2], num_queries=2, max_new_tokens=5, seed=0)
    assert len(out) == 2 and all(len(qs) == 2 for qs in out)


def test_seq2seq_generator_behind_the_same_interface(tiny_t5_dir, tmp_path):
    from privret.models.generator import load_trained_generator
    from privret.models.seq2seq_generator import Seq2SeqQueryGenerator

    gen = load_generator(str(tiny_t5_dir), bf16=False)
    assert isinstance(gen, Seq2SeqQueryGenerator)
    ex = gen.example(GENERATOR_DOCS[0], GENERATOR_QUERIES[0])
    assert gen.tokenizer.decode(ex.prompt_ids, skip_special_tokens=True).startswith("generate_query")
    # the per-example loss is the mean cross-entropy of the query tokens, as a direct computation gives
    with torch.no_grad():
        loss = gen.loss_module().eval()(**gen.collate(gen.prepare([ex])))  # no dropout, like the reference
        logits = gen.model(input_ids=torch.tensor([ex.prompt_ids]), labels=torch.tensor([ex.target_ids])).logits[0]
        reference = torch.nn.functional.cross_entropy(logits, torch.tensor(ex.target_ids))
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    pairs = generator_pairs()
    cfg = GeneratorTrainConfig(model=str(tiny_t5_dir), start="pretrained", epsilon=8.0, batch_size=4, epochs=1,
                               trained_layers=None, lora_rank=4, bf16=False)  # no prompt to show examples in
    ledger = train_generator(pairs, tmp_path / "t5", cfg, data_hash="h")
    assert ledger.mechanism == "dp-sgd" and ledger.steps > 0
    # it has no decoder stack to take the top k layers of: k is refused, not ignored under a ledger saying "top k"
    with pytest.raises(InputError, match="trains whole") as refused:
        train_generator(pairs, tmp_path / "t5-top2", cfg.model_copy(update={"trained_layers": 2}), data_hash="h")
    assert refused.value.field == "trained_layers" and not (tmp_path / "t5-top2" / "generator.json").exists()
    out = load_trained_generator(tmp_path / "t5").generate(GENERATOR_DOCS[:3], num_queries=2, max_new_tokens=4, seed=0)
    assert len(out) == 3 and all(len(q) == 2 for q in out)


def test_generator_never_replaces_a_directory_it_did_not_write(tiny_llama_dir, tmp_path):
    """As for the direct DP retriever (one run module, :mod:`privret.train.dp_run`): without resume an existing
    directory is refused; with it, one holding anything but an interrupted run's files (checkpoint, step log, a
    pipeline's stage.json) is refused too. Either way the directory is left as it was."""
    from privret.errors import InputError

    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=math.inf, batch_size=4, epochs=1, trained_layers=1,
                               lora_rank=4, bf16=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for resume, message in ((False, "already exists"), (True, "not an interrupted generator run")):
        with pytest.raises(InputError, match=message):
            train_generator(generator_pairs(), mine, cfg, data_hash="h", resume=resume)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"


def test_non_private_steps_forward_at_most_physical_batch_rows(tiny_llama_dir, tmp_path, monkeypatch):
    """``physical_batch`` bounds the rows of every forward pass of a non-private run too (memory): q = 1 puts all
    11 rows in each of the 2 steps, and no forward pass may take more than 4 of them."""
    from privret.models.causal_generator import CausalQueryGenerator

    forwarded: list[int] = []
    collate = CausalQueryGenerator.collate

    def counting_collate(self, items):
        forwarded.append(len(items))
        return collate(self, items)

    monkeypatch.setattr(CausalQueryGenerator, "collate", counting_collate)
    pairs = generator_pairs()
    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=math.inf, batch_size=64, epochs=2, trained_layers=1,
                               lora_rank=4, bf16=False, physical_batch=4)
    ledger = train_generator(pairs, tmp_path / "gen", cfg, data_hash="h")
    assert ledger.steps == 2 and sum(forwarded) == 2 * len(pairs.pairs) == 22  # every row, in every step
    assert max(forwarded) <= cfg.physical_batch


def test_hold_out_trains_the_generator_on_the_fit_part_only(tiny_llama_dir, tmp_path, monkeypatch):
    """With ``hold_out`` the generator reads only fit units' rows; q, delta and the ledger count the fit units, the
    ledger records the part, and the release is charged to the whole log's dataset. A non-private generator
    cannot hold units out (there is no guarantee to keep)."""
    from privret.privacy import budget
    from privret.privacy.hold_out import FIT, UnitPartition

    pairs = generator_pairs()
    partition = UnitPartition(salt="held", heldout_fraction=0.4)
    fit, held = partition.split(pairs, "query")
    assert fit.pairs and held.pairs  # the salt splits this log both ways
    read: list[set[str]] = []
    bars: list[dict] = []  # the bars added while preparing
    real_prepare = gtrain._GeneratorTrainer.prepare

    def spy(self, progress):
        read.append({p.query for p in self.pairs.pairs})
        add_task = progress.add_task
        progress.add_task = lambda *a, **k: (bars.append(k), add_task(*a, **k))[1]
        try:
            return real_prepare(self, progress)
        finally:
            del progress.add_task

    monkeypatch.setattr(gtrain._GeneratorTrainer, "prepare", spy)
    cfg = GeneratorTrainConfig(model=str(tiny_llama_dir), epsilon=4.0, batch_size=2, epochs=1, trained_layers=1,
                               lora_rank=4, bf16=False, hold_out=partition)
    ledger = train_generator(pairs, tmp_path / "gen", cfg, data_hash="abc")
    assert read == [{p.query for p in fit.pairs}]
    assert [b.get("private_counts") for b in bars] == [True]  # its pair count reaches no log line
    n_fit = len(fit.units("query"))
    assert ledger.part == partition.part(FIT) and ledger.n_units == n_fit
    assert ledger.sample_rate == pytest.approx(2 / n_fit) and ledger.delta == pytest.approx(1 / (2 * n_fit))
    assert ledger.dataset_id == budget.dataset_id(pairs)
    (release,) = budget.releases(ledger.dataset_id)
    assert release.part == partition.part(FIT)
    with pytest.raises(ValueError, match="non-private"):
        GeneratorTrainConfig(epsilon=math.inf, hold_out=partition)
