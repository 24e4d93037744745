"""Fixtures shared by the whole suite (defined in helpers.py)."""

import pytest

from helpers import tiny_bert_dir, tiny_llama_dir, tiny_t5_dir, toy_beir  # noqa: F401 - pytest fixtures


@pytest.fixture(autouse=True)
def _private_budget_dir(tmp_path, monkeypatch):
    """Every test gets its own privacy-budget registry (never the user's ~/.cache/privret/budget)."""
    monkeypatch.setenv("PRIVRET_BUDGET_DIR", str(tmp_path / "budget"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped, saying why, on a machine without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs CUDA: torch {torch.__version__} sees no CUDA device here")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
