"""Fixtures and settings shared by the whole suite (fixtures defined in helpers.py).

* Ledger key (:mod:`privret.privacy.commitment`): one per test run, in a temporary directory.
* Threads: one intra-op thread for torch, set here once (the machines the suite runs on are small
  and shared); subprocesses inherit ``OMP_NUM_THREADS=1`` unless the caller set it.
* Hypothesis profiles: ``thorough`` (the default: what ``make test`` runs, 100 derandomised
  examples per property) and ``dev`` (``make check``: 15 examples), chosen with pytest's
  ``--hypothesis-profile NAME`` option.
* Accountant: the DP training loop's noise calibration and epsilon (:mod:`privret.train.dp_run`'s
  ``calibrate_noise`` and ``spent_epsilon``) and the budget registry's composition
  (:mod:`privret.privacy.budget`'s ``_accountant_epsilon``) are computed once per distinct arguments per test
  run (:func:`_accountant_computed_once`). They are pure functions of their arguments, so every call returns
  exactly what it would compute, but Opacus's PRV accountant takes 1 to 15 s a call for the tiny n here and
  the training tests ask for the same plans again and again. Tests of the accountant itself call
  :mod:`privret.privacy.accounting` directly, uncached.
* Marker ``slow``: real models, the Flower deployment, the multi-process torch.distributed runs, the scale,
  browser and canary memorisation runs; ``make check`` deselects them with ``-m "not slow"``.
"""

import functools
import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")
# One ledger key for the whole run (session fixtures included), never the user's ~/.cache/privret/ledger.key.
os.environ["PRIVRET_LEDGER_KEY"] = os.path.join(tempfile.mkdtemp(prefix="privret-key-"), "ledger.key")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import settings  # noqa: E402

from helpers import tiny_bert_dir, tiny_llama_dir, tiny_t5_dir, toy_beir  # noqa: E402,F401 - pytest fixtures

torch.set_num_threads(1)

settings.register_profile("thorough", max_examples=100, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=15, deadline=None, derandomize=True)
settings.load_profile("thorough")  # pytest's --hypothesis-profile, applied after this file, overrides it


# Slow tests of the two DP trainer test files, marked here so that those files stay as they are (they are being
# rewritten): measured at 17-64 s each on 2 shared cores.
SLOW_DP_TESTS = {
    "test_dp_retriever.py": ("test_killed_direct_dp_run_resumes_and_its_ledger_never_under_counts",
                             "test_public_negatives_refuses_inline_pairs_without_a_public_corpus",
                             "test_train_dp_retriever_end_to_end",
                             "test_cli_dp_flag_draws_negatives_from_data_never_from_inline_pairs"),
}


def _computed_once(function):
    """``function`` memoised on the ``repr`` of its arguments (exact for the floats, ints, strings and lists of
    tuples the accountant takes: equal reprs, equal values)."""
    results = {}

    @functools.wraps(function)
    def once(*args, **kwargs):
        key = repr((args, sorted(kwargs.items())))
        if key not in results:
            results[key] = function(*args, **kwargs)
        return results[key]

    return once


@pytest.fixture(scope="session", autouse=True)
def _accountant_computed_once():
    """The accountant calls of the training loop and of the budget registry, memoised for the pytest session (see the
    module docstring); a test's own monkeypatch of them still wins while it runs."""
    from privret.privacy import budget
    from privret.train import dp_run

    with pytest.MonkeyPatch.context() as patch:
        for module, name in ((dp_run, "calibrate_noise"), (dp_run, "spent_epsilon"), (budget, "_accountant_epsilon")):
            patch.setattr(module, name, _computed_once(getattr(module, name)))
        yield


@pytest.fixture(autouse=True)
def _private_budget_dir(tmp_path, monkeypatch):
    """Every test gets its own privacy-budget registry (never the user's ~/.cache/privret/budget)."""
    monkeypatch.setenv("PRIVRET_BUDGET_DIR", str(tmp_path / "budget"))


def pytest_collection_modifyitems(config, items):
    """Marks :data:`SLOW_DP_TESTS` ``slow``; skips tests marked ``gpu``, saying why, on a machine without CUDA.

    (One hook: a second function of this name would silently replace the first.)"""
    skip_gpu = None if torch.cuda.is_available() else pytest.mark.skip(
        reason=f"needs CUDA: torch {torch.__version__} sees no CUDA device here")
    for item in items:
        if item.originalname in SLOW_DP_TESTS.get(item.path.name, ()):
            item.add_marker(pytest.mark.slow)
        if skip_gpu is not None and item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)
