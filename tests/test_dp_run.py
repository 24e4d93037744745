"""The one DP training run (:mod:`privret.train.dp_run`): its plan and accounting, and its contract checked
with a toy trainer (one parameter vector, no model to load), so each rule costs milliseconds. The trainers'
own tests (test_dp_generator.py, test_dp_retriever.py, test_reliability.py) check the same run end to end."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import shutil
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from privret.errors import InputError
from privret.privacy import budget
from privret.privacy.accounting import spent_epsilon
from privret.privacy.ledger import PrivacyLedger
from privret.privacy.secure_rng import SecureRandom, noise_like
from privret.train import dp_run
from privret.train.dp_run import DPRun, plan_run, run_training


def _cfg(**kw) -> SimpleNamespace:
    values = dict(epsilon=8.0, delta=None, batch_size=4, epochs=2.0, accountant="rdp")
    return SimpleNamespace(**{**values, **kw})


@pytest.mark.parametrize("batch_size, n, epochs, q, steps", [(4, 10, 2.0, 0.4, 5), (64, 809, 3.0, 64 / 809, 38),
                                                             (50, 10, 1.5, 1.0, 2)])
def test_plan_and_its_accounting(batch_size, n, epochs, q, steps):
    """q = min(1, B / N), T = max(1, ceil(epochs / q)), delta = 1/(2N), sigma calibrated to the target, and the
    ledger's epsilon for S steps is the accountant's at (sigma, q, delta): lost steps raise it."""
    plan = plan_run(_cfg(batch_size=batch_size, epochs=epochs), n)
    assert plan.private and plan.sample_rate == q and plan.steps == steps and plan.delta == 1 / (2 * n)
    assert plan.expected_batch == pytest.approx(batch_size if batch_size < n else n)
    assert 0.99 * 8.0 <= plan.spent(steps) <= 8.0 * 1.0001
    assert plan.spent(steps + 2) == spent_epsilon(noise_multiplier=plan.sigma, sample_rate=q, steps=steps + 2,
                                                  delta=plan.delta, accountant="rdp") > plan.spent(steps)
    assert plan_run(_cfg(delta=1e-4), n).delta == 1e-4


def test_non_private_plan():
    plan = plan_run(_cfg(epsilon=math.inf), 10)
    assert not plan.private and plan.sigma == 0.0 and plan.spent(5) == math.inf and plan.steps == 5


def test_plan_refuses_a_delta_that_protects_no_unit():
    with pytest.raises(InputError, match="delta"):
        plan_run(_cfg(delta=0.2), 10)


# --- the run, with a toy trainer ------------------------------------------------------------------------


class _Kill(BaseException):
    """A kill at a chosen moment (nothing catches a BaseException)."""


class _Toy:
    """One parameter vector; each step sets its gradient to N(0, 1) noise from the run's random source and notes
    the budget registry's statuses at that moment."""

    def __init__(self, seen: list):
        self.params = {"w": torch.nn.Parameter(torch.zeros(4))}
        self.optimizer = torch.optim.Adam(self.params.values(), lr=0.1)
        self.seen = seen

    def prepare(self, progress) -> None:
        self.seen.append("prepare")

    def step(self, chosen, rng) -> float:
        self.seen.append(("step", type(rng).__name__, sorted(r.status for r in budget.releases("toy"))))
        self.params["w"].grad = noise_like(self.params["w"], 1.0, rng)
        return 0.0

    def save(self, staged, *, resumed_at_step: int) -> None:
        staged.mkdir(exist_ok=True)  # the run saved the ledger there first
        (staged / "toy.json").write_text(json.dumps({"resumed_at_step": resumed_at_step,
                                                     "w": self.params["w"].tolist()}))


def _run(tmp_path, *, epsilon=8.0, secure_rng=False, settings=None, name="out", train_config=None) -> DPRun:
    plan = plan_run(_cfg(epsilon=epsilon), 10)  # q = 0.4, T = 5

    def describe(*, steps, epsilon, secure_rng):
        return PrivacyLedger(mechanism="dp-sgd" if plan.private else "none", epsilon=epsilon, delta=plan.delta,
                             noise_multiplier=plan.sigma, sample_rate=plan.sample_rate, steps=steps,
                             planned_steps=plan.steps, accountant=plan.accountant, unit="query", n_units=plan.n_units,
                             n_pairs=plan.n_units, clip_norm=1.0, model="toy", trainable="all", data_hash="h",
                             dataset_id="toy", secure_rng=secure_rng)

    return DPRun(out_dir=tmp_path / name, plan=plan, describe=describe, what="toy", finished_marker="toy.json",
                 label="toy", train_config=train_config or {"toy": True}, seed=3, checkpoint_every=2,
                 secure_rng=secure_rng, settings=settings or {"toy": True}, budget=budget.BudgetPolicy(allow_over=True))


@contextlib.contextmanager
def _killed_at_checkpoint(at_step: int):
    """Kill the run while it writes the checkpoint of ``at_step`` (after the step log announced it)."""
    save = dp_run.save_checkpoint

    def killed(ckpt_dir, *args, step, **kwargs):
        if step == at_step:
            raise _Kill(f"killed writing the checkpoint of step {step}")
        return save(ckpt_dir, *args, step=step, **kwargs)

    with mock.patch.object(dp_run, "save_checkpoint", killed), pytest.raises(_Kill):
        yield


def test_a_run_records_planned_before_its_first_step_and_final_after_it(tmp_path):
    seen: list = []
    run = _run(tmp_path)
    ledger = run_training(run, lambda: _Toy(seen), resume=False)
    assert seen[0] == "prepare" and len(seen) == 1 + 5
    assert all(s[2] == ["planned"] for s in seen[1:])  # the release is on record before any noisy update
    assert ledger.steps == 5 and ledger.epsilon == run.plan.spent(5) and not ledger.secure_rng
    assert [(r.status, r.steps) for r in budget.releases("toy")] == [("final", 5)]
    out = run.out_dir
    assert sorted(p.name for p in out.iterdir()) == ["privacy_ledger.json", "toy.json", "train_config.json"]
    assert PrivacyLedger.load(out).model_copy(update={"created_at": ""}) == ledger.published()


class _Chosen(_Toy):
    """The toy trainer, noting in ``given`` the units and the random source each step is given."""

    def __init__(self, given: list):
        super().__init__([])
        self.given = given

    def step(self, chosen, rng) -> float:
        self.given.append((list(chosen), rng))
        return super().step(chosen, rng)


@pytest.mark.parametrize("secure_rng, sampler_class", [(False, "PoissonUnitSampler"),
                                                       (True, "SecurePoissonUnitSampler")])
def test_every_step_trains_on_the_poisson_sample_drawn_at_the_plans_rate(secure_rng, sampler_class, tmp_path,
                                                                        monkeypatch):
    """The run builds one Poisson sampler over the plan's N units at the plan's rate q, from its own random source
    (the one that draws the noise), and each step's trainer gets exactly the units that sampler drew for it, in
    order: no truncation, no reshuffle, no other source."""
    built, drawn = [], []
    real = getattr(dp_run, sampler_class)

    def spy(n_units, sample_rate, rng):
        sampler = real(n_units, sample_rate, rng)
        built.append((n_units, sample_rate, rng))
        return SimpleNamespace(sample=lambda: drawn.append(sampler.sample()) or list(drawn[-1]))

    monkeypatch.setattr(dp_run, sampler_class, spy)
    steps: list = []
    run = _run(tmp_path, secure_rng=secure_rng)
    run_training(run, lambda: _Chosen(steps), resume=False)
    assert [(n, q) for n, q, _ in built] == [(run.plan.n_units, run.plan.sample_rate)] == [(10, 0.4)]
    assert len(drawn) == len(steps) == run.plan.steps
    assert [chosen for chosen, _ in steps] == drawn
    assert all(rng is built[0][2] for _, rng in steps)


def test_a_finished_output_is_returned_only_to_a_run_with_its_settings(tmp_path):
    seen: list = []
    run = _run(tmp_path, settings={"lr": 0.1}, train_config={"lr": 0.1, "checkpoint_every": 2})
    ledger = run_training(run, lambda: _Toy(seen), resume=False)
    steps_taken = len(seen)
    other = dataclasses.replace(run, settings={"lr": 0.2}, train_config={"lr": 0.2, "checkpoint_every": 2})
    with pytest.raises(InputError, match="already holds a toy trained with lr=0.1 .*0.2"):
        run_training(other, lambda: _Toy(seen), resume=True)
    # a setting privret added after the output was saved is not held against it
    newer = dataclasses.replace(run, settings={"lr": 0.1, "added_since": 1})
    returned = run_training(newer, lambda: _Toy(seen), resume=True)
    assert returned.model_copy(update={"created_at": ""}) == ledger.published()
    assert len(seen) == steps_taken  # returned as it is: nothing trained, nothing spent
    assert [(r.status, r.steps) for r in budget.releases("toy")] == [("final", 5)]


def test_a_killed_run_resumes_charging_its_lost_steps_once(tmp_path):
    seen: list = []
    run = _run(tmp_path, settings={"lr": 0.1})
    with _killed_at_checkpoint(4):
        run_training(run, lambda: _Toy(seen), resume=False)
    assert PrivacyLedger.load(run.out_dir / "checkpoint").steps == 2
    with pytest.raises(InputError, match="interrupted run") as refused:
        run_training(run, lambda: _Toy(seen), resume=False)
    assert refused.value.field == "resume"
    other = dataclasses.replace(run, settings={"lr": 0.2})
    with pytest.raises(InputError, match="lr=0.1.*cannot resume"):
        run_training(other, lambda: _Toy(seen), resume=True)
    ledger = run_training(run, lambda: _Toy(seen), resume=True)
    # the killed branch announced steps 1..4 (3 and 4 lost with it), the resumed one 3..5: 4 + 3
    assert ledger.steps == 7 and ledger.planned_steps == 5 and ledger.epsilon == run.plan.spent(7)
    assert json.loads((run.out_dir / "toy.json").read_text())["resumed_at_step"] == 2
    records = budget.releases("toy")
    assert [(r.status, r.steps) for r in records] == [("final", 7)] and len({r.release_id for r in records}) == 1
    # resuming a finished run loads nothing and spends nothing
    assert run_training(run, lambda: pytest.fail("loaded a model"), resume=True).steps == 7
    assert budget.releases("toy") == records


def test_a_ledger_reports_the_csprng_only_if_every_branch_drew_from_it(tmp_path):
    seen: list = []
    with _killed_at_checkpoint(4):
        run_training(_run(tmp_path), lambda: _Toy(seen), resume=False)
    assert run_training(_run(tmp_path, secure_rng=True), lambda: _Toy(seen), resume=True).secure_rng is False
    seen.clear()
    ledger = run_training(_run(tmp_path, secure_rng=True, name="secure"), lambda: _Toy(seen), resume=False)
    assert ledger.secure_rng and {s[1] for s in seen[1:]} == {SecureRandom.__name__}


@pytest.mark.parametrize("secure_rng", [False, True])
def test_a_private_ledger_names_the_source_of_every_draw(secure_rng, tmp_path):
    """``random_sources``: the sample, the noise and the trainer's own draws from the run's source (os.urandom with
    ``secure_rng``, else a torch generator seeded from it), dropout from torch's generator seeded from os.urandom
    whatever ``secure_rng`` says; a resume after a branch without the CSPRNG names the seeded generator; a
    non-private run's ledger names nothing."""
    seeded = "torch generator seeded from os.urandom"
    source = "os.urandom" if secure_rng else seeded
    run = dataclasses.replace(_run(tmp_path, secure_rng=secure_rng), draws=("hard negatives",), dropout=True)
    ledger = run_training(run, lambda: _Toy([]), resume=False)
    assert ledger.random_sources == {"sampling": source, "noise": source, "hard negatives": source,
                                     "dropout": seeded}
    assert PrivacyLedger.load(run.out_dir).random_sources == ledger.random_sources
    assert run_training(_run(tmp_path, epsilon=math.inf, name="plain"), lambda: _Toy([]),
                        resume=False).random_sources == {}
    with _killed_at_checkpoint(4):
        run_training(_run(tmp_path, name="mixed"), lambda: _Toy([]), resume=False)
    resumed = run_training(_run(tmp_path, secure_rng=True, name="mixed"), lambda: _Toy([]), resume=True)
    assert resumed.random_sources == {"sampling": seeded, "noise": seeded}


def test_a_resumed_non_private_run_equals_an_uninterrupted_one(tmp_path):
    plain = run_training(_run(tmp_path, epsilon=math.inf, name="a"), lambda: _Toy([]), resume=False)
    assert plain.steps == 5 and budget.releases("toy") == []  # nothing private: nothing recorded
    with _killed_at_checkpoint(4):
        run_training(_run(tmp_path, epsilon=math.inf, name="b"), lambda: _Toy([]), resume=False)
    run_training(_run(tmp_path, epsilon=math.inf, name="b"), lambda: _Toy([]), resume=True)
    w = [json.loads((tmp_path / name / "toy.json").read_text())["w"] for name in "ab"]
    assert w[0] == w[1]


def test_two_resumptions_of_one_private_checkpoint_draw_fresh_noise(tmp_path):
    with _killed_at_checkpoint(4):
        run_training(_run(tmp_path, name="p"), lambda: _Toy([]), resume=False)
    shutil.copytree(tmp_path / "p", tmp_path / "q")
    for name in "pq":
        run_training(_run(tmp_path, name=name), lambda: _Toy([]), resume=True)
    w = [json.loads((tmp_path / name / "toy.json").read_text())["w"] for name in "pq"]
    assert w[0] != w[1]


def test_directories_the_run_did_not_write_are_refused_and_kept(tmp_path):
    run = _run(tmp_path)
    run.out_dir.mkdir()
    with pytest.raises(InputError, match="already exists"):
        run_training(run, lambda: pytest.fail("loaded a model"), resume=False)
    (run.out_dir / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match=r"not an interrupted toy run \(notes.txt\)"):
        run_training(run, lambda: pytest.fail("loaded a model"), resume=True)
    assert [p.name for p in run.out_dir.iterdir()] == ["notes.txt"]
    (run.out_dir / "notes.txt").unlink()
    (run.out_dir / "stage.json").write_text("{}")  # a pipeline stage's record: the run may start here
    assert run_training(run, lambda: _Toy([]), resume=True).steps == 5
