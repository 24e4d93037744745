"""Fixtures shared by the whole suite (defined in helpers.py)."""

from helpers import tiny_bert_dir, tiny_llama_dir, tiny_t5_dir, toy_beir  # noqa: F401 - pytest fixtures
